//! What a session is fed at each poll: one typed reading of the probe.

use throttlewatch_bpf::{EpisodeTotals, Event, RunqTotals, ThrottleProbe};

use throttlewatch_core::logfmt::MapFull;

use crate::clock::Clock;

/// How much a poll does, each step including the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Due {
    /// Drain the kernel's events into the logs (every poll interval).
    Events,
    /// Also read the totals: metrics counters, logs flushed (every second).
    Tick,
    /// Also write the `cpu_stat` and `runq` records (every snapshot interval).
    Snapshot,
}

/// The probe's cumulative totals for one watched cgroup at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct ProbeTotals {
    /// (cgroup, CPU) throttle episodes, from the kernel map.
    pub episodes: EpisodeTotals,
    /// The same from the optional fentry view, where loaded.
    pub fentry: Option<EpisodeTotals>,
    /// Run-queue latency histograms, where measured.
    pub runq: Option<RunqTotals>,
    /// Events the ring buffer could not take, node-wide.
    pub lost_events: u64,
    /// Inserts the kernel maps refused because they were full, node-wide.
    pub map_full: MapFull,
    /// When they were read, CLOCK_MONOTONIC.
    pub mono_ns: u64,
}

impl ProbeTotals {
    /// `map_full`: read once per poll for every session ([`map_full`]).
    pub(crate) fn read(probe: &ThrottleProbe, cgroup_id: u64, map_full: MapFull) -> ProbeTotals {
        ProbeTotals {
            episodes: probe.episode_totals(cgroup_id),
            fentry: probe.fentry_totals(cgroup_id),
            runq: probe.runq_totals(cgroup_id),
            lost_events: probe.lost_events(),
            map_full,
            mono_ns: Clock::monotonic_ns(),
        }
    }
}

/// The probe's failed-insert counts (three per-CPU map lookups).
pub(crate) fn map_full(probe: &ThrottleProbe) -> MapFull {
    let c = probe.map_full();
    MapFull {
        episodes: c.episodes,
        frozen_by_tid: c.frozen_by_tid,
        bandwidth_timers: c.bandwidth_timers,
    }
}

/// One poll's reading for one session.
#[derive(Debug, Clone, Default)]
pub(crate) struct Reading {
    /// Freeze and cold-start events of its cgroup, in the kernel's order.
    pub events: Vec<Event>,
    /// Present from `Due::Tick` on.
    pub totals: Option<ProbeTotals>,
    /// `Due::Snapshot`: write `cpu_stat` and `runq` records.
    pub snapshot: bool,
    /// `Due::Snapshot`: the kernel's wake-up edges of the cgroup.
    pub wakes: Option<Vec<throttlewatch_bpf::WakeEdgeTotals>>,
    /// From `Due::Tick` on where GPUs are sampled: the node's GPU readings
    /// and when they were taken (Unix ns).
    pub gpu: Option<(
        u64,
        std::sync::Arc<std::collections::BTreeMap<usize, crate::gpu::GpuReading>>,
    )>,
}
