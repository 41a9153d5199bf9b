//! One container's life as the front ends see it — the OCI hook
//! (`throttlewatch-hook`), the runc wrapper (`throttlewatch-runtime`) and the
//! containerd shim — so that each of them is a thin command over this crate
//! and none imports another:
//!
//! - reading the OCI state ([`oci_state`]) and the bundle's `config.json`
//!   ([`spec_file`] keeps unknown fields on write, [`bundle_spec`] is the
//!   typed reading of what throttlewatch needs);
//! - the spec modifiers applied at `create` ([`modifiers`]);
//! - the work between create and start, whoever does it ([`created`]: the
//!   QoS steps of [`qos`], then the register; errors through [`report`]),
//!   and the CFS burst kept across `update` ([`burst_record`],
//!   [`held_burst`]) and shared with a pod cgroup's quota ([`pod_burst`]);
//! - the one client of the agent's socket ([`agent_client`]) and starting
//!   an agent ([`agent_start`]);
//! - the hook stages ([`HookStage`]), where binaries are ([`binaries`]), phase
//!   timings ([`timing`]) and timestamps ([`timefmt`]).
//!
//! The state directory's layout and the vocabulary shared with the agent
//! (end reasons, the protocol) live in `throttlewatch-core`, which the
//! agent and the QoS crate link too; they are re-exported here.
//!
//! No BPF, no async runtime: the hook and the wrapper run inside every
//! container start.

pub mod agent_client;
pub mod agent_start;
pub mod arena;
pub mod binaries;
pub mod bundle_spec;
pub mod burst_record;
pub mod create_marks;
pub mod created;
pub mod held_burst;
pub mod modifiers;
pub mod oci_state;
pub mod pending;
pub mod pod_burst;
pub mod qos;
pub mod report;
pub mod scope;
pub mod spec_file;
pub mod stage;
pub mod timefmt;
pub use throttlewatch_core::timing;
mod unwatched;

pub use agent_client::{AgentClient, AgentError, Unregistered};
pub use bundle_spec::BundleSpec;
pub use oci_state::OciState;
pub use spec_file::{SpecError, SpecFile};
pub use stage::HookStage;
pub use throttlewatch_core::state_dir::{write_atomic, StateDir, WriteOptions};
pub use throttlewatch_core::{ContainerKey, EndReason, Scope};
