//! Annotation-driven CPU QoS: CFS burst and NUMA/GPU-topology cpusets.
//!
//! The hook calls, in order: [`parse_request`] (annotations and environment
//! → [`QosRequest`] and refusals), [`Topology::discover`], [`plan`] (→ [`Plan`],
//! holding exclusive cores in an [`ExclusiveAllocator`]), and [`apply_plan`].
//! Nothing is fatal: every value that cannot be honoured becomes a
//! [`Refusal`] naming the key, the value and what is accepted. The keys are
//! documented in `docs/annotations.md`.

pub mod apply;
mod choice;
pub mod exclusive;
pub mod gpu;
mod gpu_devices;
pub mod plan;
mod planning;
pub mod policy;
pub mod refusal;
pub mod render;
pub mod request;
mod ser;
mod sysfs;
pub mod targets;
pub mod topology;
pub mod values;

#[cfg(test)]
mod fixtures;

// The keys and the configuration check are the front ends' vocabulary too
// (core); here by their old paths.
pub use throttlewatch_core::{config_check, keys};

pub use apply::apply_plan;
pub use exclusive::{AllocError, ExclusiveAllocator, Holding};
pub use gpu::{container_gpus, Gpu};
pub use keys::{Key, ENV_PREFIX, PREFIX};
pub use plan::{plan, Plan, PlanInput};
pub use policy::{Policy, PolicyError};
pub use refusal::Refusal;
pub use render::{render_plan, render_text};
pub use request::{
    parse_request, BurstSpec, CpuControl, CpusetTarget, GpuSelection, Origin, QosClass, QosRequest,
};
pub use topology::{NumaNode, Topology, TopologyError};
pub use values::{GpuDevices, ValueError};
