//! From a request and the machine to the values to write: burst and cpuset.

use serde::Serialize;
use throttlewatch_core::CpuList;

use crate::choice::plan_cpuset;
use crate::exclusive::ExclusiveAllocator;
use crate::keys::Key;
use crate::refusal::Refusal;
use crate::request::{BurstSpec, QosRequest};
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
pub fn plan(input: &PlanInput) -> Plan {
    let mut p = Plan {
        notes: input.req.notes.clone(),
        ..Default::default()
    };
    plan_burst(input.req, input.quota_us, &mut p);
    plan_cpuset(input, &mut p);
    p
}

fn plan_burst(req: &QosRequest, quota_us: Option<u64>, p: &mut Plan) {
    let Some(spec) = req.burst else { return };
    let Some(quota) = quota_us else {
        let why = "a burst needs a CPU quota and the container has none (under kubelet: a container with exclusive CPUs from the static CPU manager, DisableCPUQuotaWithExclusiveCPUs); nothing to do";
        if req.from_preset(Key::CpuBurst) {
            p.notes.push(format!("qos-class: {why}"));
        } else {
            p.refused.push(req.refusal(Key::CpuBurst, why));
        }
        return;
    };
    let (mut us, how) = match spec {
        BurstSpec::Micros(us) => (us, format!("{us}us")),
        BurstSpec::Percent(pct) => (
            quota * pct as u64 / 100,
            format!("{pct}% of the quota {quota}us"),
        ),
    };
    let cap_pct = req.burst_cap_percent.min(100) as u64;
    let cap = quota * cap_pct / 100;
    if us > cap {
        let limit = if cap_pct == 100 {
            format!("the quota ({quota}us; the kernel refuses more)")
        } else {
            format!("the policy maximum {cap_pct}% of the quota ({cap}us)")
        };
        p.notes
            .push(format!("burst {us}us is above {limit}: clamped to {cap}us"));
        us = cap;
    }
    p.notes.push(format!("burst {us}us ({how})"));
    p.burst_us = Some(us);
}

/// ceil(quota / period) CPUs; None without a quota.
pub fn cpus_for_quota(quota_us: Option<u64>, period_us: u64) -> Option<usize> {
    let q = quota_us?;
    if period_us == 0 {
        return None;
    }
    Some(q.div_ceil(period_us).max(1) as usize)
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
