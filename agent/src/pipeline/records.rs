//! The records a session writes about itself and its threads, built from
//! what the session knows: `start`, `resume`, `throttle`.

use throttlewatch_bpf::FreezeEvent;
use throttlewatch_cgroup::{CpuCgroup, CpuLimits};
use throttlewatch_core::logfmt::{LimitAbove, Resume, Start, Throttle};

use crate::clock::Clock;
use crate::probe_facts::ProbeFacts;
use crate::spec::SessionSpec;

/// `process` records per container log at most (a fork bomb writes no more).
pub(crate) const MAX_PROCESSES: usize = 4096;

pub(crate) fn throttle_record(ev: &FreezeEvent, clock: &Clock) -> Throttle {
    Throttle {
        tid: ev.tid,
        pid: ev.tgid,
        comm: ev.comm.clone(),
        cpu: ev.cpu_out,
        cpu_in: ev.cpu_in,
        start_ns: clock.to_unix_ns(ev.start_ns),
        frozen_ns: ev.frozen_ns(),
        cgroup_id: ev.cgroup_id,
        throttled_cgroup_id: ev.throttled_cgroup_id,
        throttled_level: ev.throttled_level,
        queued: ev.queued,
    }
}

pub(crate) fn start_record(
    spec: &SessionSpec,
    cgroup: &CpuCgroup,
    cgroup_id: u64,
    limits: &CpuLimits,
    facts: &ProbeFacts,
) -> Start {
    Start {
        container_id: spec.labels.container_id.0.clone(),
        container_name: spec.labels.container_name.0.clone(),
        pid: spec.pid,
        cgroup_path: cgroup.rel.clone(),
        cgroup_id,
        cgroup_mode: cgroup.mode.to_string(),
        quota_us: limits.quota_us,
        period_us: limits.period_us,
        burst_us: limits.burst_us,
        cpus: limits.cpus.clone().or_else(|| cgroup.effective_cpus()),
        mems: limits.mems.clone().or_else(|| cgroup.effective_mems()),
        kernel_release: kernel_release(),
        throttle_model: facts.model.as_str().into(),
        probe: facts.description.clone(),
        threshold_ns: spec.threshold_ns,
        labels: spec.labels.as_map(),
        qos: spec.qos.clone(),
        topology: crate::placement::start_topology(spec.pid),
        limits_above: cgroup
            .limited_ancestors()
            .into_iter()
            .filter_map(|(g, l)| {
                Some(LimitAbove {
                    cgroup_id: g.id().ok()?,
                    cgroup_path: g.rel,
                    quota_us: l.quota_us?,
                    period_us: l.period_us,
                    burst_us: l.burst_us,
                })
            })
            .collect(),
    }
}

pub(crate) fn resume_record(
    spec: &SessionSpec,
    cgroup_id: u64,
    facts: &ProbeFacts,
    gap_ns: u64,
) -> Resume {
    Resume {
        container_id: spec.labels.container_id.0.clone(),
        cgroup_id,
        probe: facts.description.clone(),
        unwatched_throttled_ns: gap_ns,
        note: "agent restarted: freezes while no agent ran were not seen; the kernel's time for that gap is unwatched_throttled_ns".into(),
    }
}

/// The running kernel's release, read once (every `start` record has it).
pub(crate) fn kernel_release() -> String {
    static RELEASE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    RELEASE
        .get_or_init(|| {
            std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        })
        .clone()
}
