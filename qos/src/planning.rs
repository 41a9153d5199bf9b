//! What planning takes and gives: a [`PlanInput`] (the request and the
//! machine) and a [`Plan`] (the values to write), and the CPUs a quota needs.

use serde::Serialize;
use throttlewatch_core::CpuList;

use crate::exclusive::ExclusiveAllocator;
use crate::refusal::Refusal;
use crate::request::QosRequest;
use crate::ser::opt_cpulist_str;
use crate::topology::Topology;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// Microseconds for `cpu.cfs_burst_us` / `cpu.max.burst`.
    pub burst_us: Option<u64>,
    #[serde(serialize_with = "opt_cpulist_str")]
    pub cpus: Option<CpuList>,
    #[serde(serialize_with = "opt_cpulist_str")]
    pub mems: Option<CpuList>,
    /// `cpus` are held exclusively in the allocator: release them when the
    /// container goes away (or when applying fails).
    pub exclusive: bool,
    /// The container's GPU indices, when they were looked at.
    pub gpus: Vec<usize>,
    /// Why this choice, in words.
    pub notes: Vec<String>,
    pub refused: Vec<Refusal>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.burst_us.is_none() && self.cpus.is_none() && self.mems.is_none()
    }
}

/// What [`plan`] plans from: one container and the machine.
#[derive(Clone, Copy)]
pub struct PlanInput<'a> {
    pub req: &'a QosRequest,
    pub topo: &'a Topology,
    /// Exclusive allocations record `alloc.holder()` as their holder pid.
    pub alloc: Option<&'a ExclusiveAllocator>,
    pub container_id: &'a str,
    /// The CPUs the parent cgroup allows (`cpuset.cpus.effective`); an
    /// empty list means unknown, and the online CPUs are used.
    pub parent_cpus: &'a CpuList,
    /// The container's CFS bandwidth (None: no quota).
    pub quota_us: Option<u64>,
    pub period_us: u64,
    /// The container's environment, for NVIDIA_VISIBLE_DEVICES.
    pub env: &'a [String],
}

/// Plan the burst and cpuset of one container.
/// ceil(quota / period) CPUs; None without a quota.
pub fn cpus_for_quota(quota_us: Option<u64>, period_us: u64) -> Option<usize> {
    let q = quota_us?;
    if period_us == 0 {
        return None;
    }
    Some(q.div_ceil(period_us).max(1) as usize)
}
