//! From a request and the machine to the values to write: burst and cpuset.

use crate::choice::plan_cpuset;
use crate::keys::Key;
pub use crate::planning::{cpus_for_quota, Plan, PlanInput};
use crate::request::{BurstSpec, QosRequest};

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

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
