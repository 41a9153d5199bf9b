//! What a request asks for beyond its class: a CFS burst and where its
//! cpuset comes from.

use std::fmt;

use serde::Serialize;
use throttlewatch_core::CpuList;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BurstSpec {
    Micros(u64),
    /// Percent of the quota.
    Percent(u32),
}

/// Where the cpuset should come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CpusetTarget {
    List(CpuList),
    Numa(u32),
    GpuLocal,
    /// gpu-local when the container has GPUs, otherwise one NUMA node.
    Auto,
}

impl fmt::Display for CpusetTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CpusetTarget::List(l) => write!(f, "{l}"),
            CpusetTarget::Numa(n) => write!(f, "numa:{n}"),
            CpusetTarget::GpuLocal => f.write_str("gpu-local"),
            CpusetTarget::Auto => f.write_str("auto"),
        }
    }
}
