//! A container as the plugin sees it, in lifecycle's terms: the bundle
//! spec NRI's pod and container make, the burst it asks for, and what is
//! released or restored around its events.

use std::collections::BTreeMap;

use throttlewatch_core::config::Config;
use throttlewatch_core::keys::PREFIX;
use throttlewatch_core::ContainerKey;
use throttlewatch_lifecycle::bundle_spec::{BundleSpec, Cpu, Linux, Resources, SpecProcess};
use throttlewatch_lifecycle::burst_record::{self, BurstRecord, RECORD_VERSION};
use throttlewatch_lifecycle::held_burst::HeldBurst;
use throttlewatch_lifecycle::{qos, StateDir};

use crate::api;
use crate::diag::say;

/// The burst record and the exclusive cores of a container that ended.
pub(crate) fn release(cfg: &Config, key: &ContainerKey) {
    let state = StateDir::new(&cfg.state_dir);
    let cpusets = state.cpusets_dir();
    if cpusets
        .join(throttlewatch_qos::exclusive::STATE_FILE)
        .exists()
    {
        let released = throttlewatch_qos::ExclusiveAllocator::open(&cpusets).and_then(|a| {
            a.with_lock_timeout(cfg.cpuset_lock_timeout())
                .release(&key.qualified())
        });
        if let Err(e) = released {
            say(&format!(
                "cannot release the exclusive cpuset of {key}: {e}"
            ));
        }
    }
    let had = burst_record::load(&state, key).ok().flatten();
    burst_record::remove(&state, key);
    if let Some(r) = had.filter(|r| r.applied_us > 0) {
        for w in throttlewatch_lifecycle::pod_burst::share_here(&state, &r.cgroup_path, 0).warnings
        {
            say(&w);
        }
    }
}

/// A held burst written back (for the quota now) at `event`: the burst
/// written (µs); what went wrong is said.
pub(crate) fn restore(cfg: &Config, event: &str, id: &str, h: HeldBurst) -> Option<u64> {
    let mut warn = |m: &str| say(&format!("{event} of {id:?}: {m}"));
    h.restore(cfg, &mut warn)
        .map_err(|e| say(&format!("{event}: {e}")))
        .ok()
}

/// The burst `spec` asks for, as a record to size it for a quota (none
/// without a burst).
pub(crate) fn burst_request(cfg: &Config, spec: &BundleSpec) -> Option<BurstRecord> {
    let (req, _) = qos::request(cfg, spec);
    let asked = req.burst?;
    Some(BurstRecord {
        v: RECORD_VERSION,
        container_id: String::new(),
        scope: None,
        cgroup_path: String::new(),
        request: asked.into(),
        cap_percent: req.burst_cap_percent,
        applied_us: 0,
    })
}

/// The burst in µs `spec` asks for under its quota (none without a quota
/// or a burst).
pub fn burst_for(cfg: &Config, spec: &BundleSpec) -> Option<u64> {
    burst_request(cfg, spec)?
        .burst_for_quota(spec.cpu_quota().0)
        .filter(|us| *us > 0)
}

/// The container as throttlewatch reads a bundle: its annotations with the
/// pod's `throttlewatch.io/` ones under them (the container's win), its
/// environment, its CPU resources.
pub fn spec_of(pod: &api::PodSandbox, c: &api::Container) -> BundleSpec {
    let mut annotations: BTreeMap<String, String> = pod
        .annotations
        .iter()
        .filter(|(k, _)| k.starts_with(PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    annotations.extend(c.annotations.iter().map(|(k, v)| (k.clone(), v.clone())));
    let linux = c.linux.as_ref();
    let cpu = linux
        .and_then(|l| l.resources.as_ref())
        .and_then(|r| r.cpu.as_ref())
        .map(|cpu| Cpu {
            quota: cpu.quota.as_ref().map(|q| q.value),
            period: cpu.period.as_ref().map(|p| p.value),
            cpus: Some(cpu.cpus.clone()).filter(|s| !s.is_empty()),
        });
    BundleSpec {
        annotations,
        process: Some(SpecProcess { env: c.env.clone() }),
        linux: Some(Linux {
            cgroups_path: linux
                .map(|l| l.cgroups_path.clone())
                .filter(|p| !p.is_empty()),
            resources: Some(Resources { cpu }),
        }),
        ..Default::default()
    }
}
