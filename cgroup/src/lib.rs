//! cgroup facts for throttlewatch: which hierarchy holds the cpu controller,
//! the kernel's file names and formats, and transient groups for `throttlewatch run`.
//!
//! Every function that touches cgroupfs takes its root as a `&Path`, so the
//! parsers and layouts are unit-tested against temporary directories shaped
//! like cgroupfs; the real hierarchy is only used by root tests.

pub mod error;
pub mod file_error;
pub mod files;
pub mod group;
pub mod hierarchy;
pub mod parse;
pub mod proc;
pub mod stat;
pub mod transient;

pub use error::{CgroupError, Result};
pub use file_error::FileError;
pub use group::{CpuCgroup, CpuLimits};
pub use hierarchy::{memory_dir_of, oom_kills, CgroupMode, Hierarchies};
pub use stat::CpuStat;
pub use transient::TransientCgroup;
