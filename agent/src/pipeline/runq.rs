//! Run-queue latency per session: the kernel keeps cumulative log2
//! histograms per (cgroup, CPU); each `runq` record is the difference
//! since the previous one, the `end` record the difference since the start.

use throttlewatch_bpf::runq::RUNQ_SLOTS;
use throttlewatch_bpf::{RunqTotals, WakeEdgeTotals};
use throttlewatch_core::logfmt::Runq;

use crate::wakeups::WakeTracker;

#[derive(Debug, Clone, Default)]
pub(crate) struct RunqTracker {
    base: RunqTotals,
    last: RunqTotals,
    started_mono: u64,
    last_mono: u64,
    wakes: WakeTracker,
}

/// The record for what happened between `base` and `now`; `max` is the
/// longest wait of that span as the kernel reports it.
pub(crate) fn record(now: &RunqTotals, base: &RunqTotals, interval_ns: u64, max: u64) -> Runq {
    let d = now.since(base);
    let max = if d.count == 0 { 0 } else { max };
    Runq {
        interval_ns,
        count: d.count,
        total_ns: d.total_ns,
        p50_ns: d.quantile(0.50, max),
        p99_ns: d.quantile(0.99, max),
        max_ns: max,
        preempted_by_same: d.preempt_same,
        preempted_by_other: d.preempt_other,
        preempted_by_host: d.preempt_host,
        excluded_thaws: d.excluded,
        wakeups: None,
    }
}

impl RunqTracker {
    /// `now`: the kernel totals when watching starts (a histogram created
    /// at watch time is zero, a resumed one is not).
    pub(crate) fn new(now: RunqTotals, mono_ns: u64) -> RunqTracker {
        RunqTracker {
            base: now,
            last: now,
            started_mono: mono_ns,
            last_mono: mono_ns,
            wakes: WakeTracker::default(),
        }
    }

    /// The kernel's log2 slot counts since the last interval (call before
    /// [`RunqTracker::interval`] closes it).
    pub(crate) fn slots_since_last(&self, now: &RunqTotals) -> [u64; RUNQ_SLOTS] {
        now.since(&self.last).slots
    }

    /// The `runq` record of the interval that ends now; `edges`: the
    /// kernel's wake-up edges of the session's cgroup, cumulative.
    pub(crate) fn interval(
        &mut self,
        now: RunqTotals,
        mono_ns: u64,
        edges: &[WakeEdgeTotals],
    ) -> Runq {
        let mut r = record(
            &now,
            &self.last,
            mono_ns.saturating_sub(self.last_mono),
            now.interval_max_ns,
        );
        r.wakeups = self
            .wakes
            .interval(edges, now.since(&self.last).wake_dropped);
        self.last = now;
        self.last_mono = mono_ns;
        r
    }

    /// Over the whole watch (for `end`).
    pub(crate) fn total(&self, now: RunqTotals, mono_ns: u64) -> Runq {
        let mut r = record(
            &now,
            &self.base,
            mono_ns.saturating_sub(self.started_mono),
            now.max_ns,
        );
        r.wakeups = self.wakes.total(now.since(&self.base).wake_dropped);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_are_differences() {
        let mut t = RunqTracker::new(RunqTotals::default(), 0);
        let mut a = RunqTotals {
            count: 3,
            total_ns: 3000,
            max_ns: 1500,
            interval_max_ns: 1500,
            preempt_other: 2,
            ..Default::default()
        };
        a.slots[9] = 2;
        a.slots[10] = 1;
        let r = t.interval(a, 1_000_000_000, &[]);
        assert_eq!(
            (
                r.count,
                r.total_ns,
                r.max_ns,
                r.preempted_by_other,
                r.interval_ns
            ),
            (3, 3000, 1500, 2, 1_000_000_000)
        );
        assert!(r.p50_ns.unwrap() >= 512 && r.p99_ns.unwrap() <= 1500);
        let quiet = t.interval(
            RunqTotals {
                interval_max_ns: 0,
                ..a
            },
            2_000_000_000,
            &[],
        );
        assert_eq!((quiet.count, quiet.p50_ns, quiet.max_ns), (0, None, 0));
        let end = t.total(a, 2_000_000_000);
        assert_eq!(
            (end.count, end.max_ns, end.interval_ns),
            (3, 1500, 2_000_000_000)
        );
    }
}
