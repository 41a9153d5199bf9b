//! Shared vocabulary of throttlewatch: units, the per-container log format,
//! configuration and the agent protocol. No BPF, no async runtime: the hook
//! and the runtime wrapper link this and stay small.

pub mod bad_value;
pub mod config;
pub mod config_cache;
pub mod config_check;
pub mod container_key;
pub mod control_config;
pub mod cpulist;
pub mod end_reason;
pub mod keys;
pub mod logfmt;
pub mod metrics_detail;
pub mod printable;
pub mod protocol;
pub mod state_dir;
pub mod timing;
pub mod units;

pub use container_key::{BadScope, ContainerKey, Scope};
pub use cpulist::CpuList;
pub use end_reason::EndReason;
pub use state_dir::StateDir;
