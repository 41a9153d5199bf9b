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

    /// [`ProbeTotals::read`] at a tick, after `prev` (the last tick's): the
    /// run-queue histogram first (one lookup), and the episode maps (one
    /// lookup per CPU each) only when something may have moved them: events
    /// came (`news`), a run-queue wait ended (every switch-in after a
    /// throttle ends one, `excluded`), or an episode was open. Otherwise
    /// `prev`'s episodes are carried: an idle container costs one lookup
    /// per tick, not one per CPU. The snapshot and the end read everything.
    pub(crate) fn read_after(
        probe: &ThrottleProbe,
        cgroup_id: u64,
        map_full: MapFull,
        prev: &ProbeTotals,
        news: bool,
    ) -> ProbeTotals {
        if news || prev.episodes.open > 0 || prev.fentry.is_some_and(|f| f.open > 0) {
            return ProbeTotals::read(probe, cgroup_id, map_full);
        }
        let runq = probe.runq_totals(cgroup_id);
        let waits = |r: &Option<RunqTotals>| r.map(|r| (r.count, r.excluded));
        if waits(&runq).is_none_or(|w| Some(w) != waits(&prev.runq)) {
            return ProbeTotals::read(probe, cgroup_id, map_full);
        }
        ProbeTotals {
            runq,
            lost_events: probe.lost_events(),
            map_full,
            mono_ns: Clock::monotonic_ns(),
            ..*prev
        }
    }
}

impl ProbeTotals {
    /// Whether the watched threads were seen to run between `before` and
    /// these totals: a run-queue wait ended (every switch-in after a
    /// wake-up or a preemption ends one; `excluded`: those that ended in a
    /// thaw), or a throttle episode began, ended or is still open. None:
    /// the probe cannot tell (no run-queue view).
    pub(crate) fn activity_since(&self, before: &ProbeTotals) -> Option<bool> {
        let (now, then) = (self.runq?, before.runq?);
        Some(
            now.count != then.count
                || now.excluded != then.excluded
                || self.episodes != before.episodes
                || self.episodes.open > 0
                || self.fentry != before.fentry,
        )
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

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(runq_count: u64, episodes: u64) -> ProbeTotals {
        ProbeTotals {
            runq: Some(RunqTotals {
                count: runq_count,
                ..Default::default()
            }),
            episodes: EpisodeTotals {
                count: episodes,
                total_ns: episodes * 1000,
                open: 0,
            },
            ..Default::default()
        }
    }

    #[test]
    fn activity_is_a_wait_ended_or_an_episode() {
        let idle = totals(5, 2);
        assert_eq!(totals(5, 2).activity_since(&idle), Some(false));
        assert_eq!(
            totals(6, 2).activity_since(&idle),
            Some(true),
            "a wait ended"
        );
        assert_eq!(
            totals(5, 3).activity_since(&idle),
            Some(true),
            "an episode ended"
        );
        let mut open = idle;
        open.episodes.open = 1;
        assert_eq!(
            open.activity_since(&open),
            Some(true),
            "throttled right now"
        );
        let mut thawed = idle;
        thawed.runq.as_mut().unwrap().excluded += 1;
        assert_eq!(
            thawed.activity_since(&idle),
            Some(true),
            "a wait ended in a thaw"
        );
        let blind = ProbeTotals::default();
        assert_eq!(
            blind.activity_since(&blind),
            None,
            "no run-queue view: cannot tell"
        );
    }
}
