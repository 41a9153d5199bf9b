//! Run-queue latency totals of one watched cgroup, summed over the per-CPU
//! entries of the kernel's `runq_hist` map (see `bpf/runq.bpf.h`).

use crate::skel::types::tw_runq;

/// log2 buckets: slot i counts waits in [2^i, 2^(i+1)) ns.
pub const RUNQ_SLOTS: usize = 32;

/// Cumulative since the cgroup was watched, except `interval_max_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RunqTotals {
    pub slots: [u64; RUNQ_SLOTS],
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    /// The longest wait since the last `ThrottleProbe::next_runq_interval`.
    pub interval_max_ns: u64,
    pub preempt_same: u64,
    pub preempt_other: u64,
    pub preempt_host: u64,
    /// Waits that ended in a thaw (freezes, not queueing).
    pub excluded: u64,
    /// Wake-up edges the full `wake_edges` map could not take.
    pub wake_dropped: u64,
}

impl RunqTotals {
    pub(crate) fn add_cpu(&mut self, v: &tw_runq, epoch: u64) {
        for (a, b) in self.slots.iter_mut().zip(v.slots.iter()) {
            *a += *b;
        }
        self.count += v.count;
        self.total_ns += v.total_ns;
        self.max_ns = self.max_ns.max(v.max_ns);
        if v.epoch == epoch {
            self.interval_max_ns = self.interval_max_ns.max(v.epoch_max_ns);
        }
        self.preempt_same += v.preempt_same;
        self.preempt_other += v.preempt_other;
        self.preempt_host += v.preempt_host;
        self.excluded += v.excluded;
        self.wake_dropped += v.wake_dropped;
    }

    /// What happened between `base` and `self` (max fields are kept).
    pub fn since(&self, base: &RunqTotals) -> RunqTotals {
        let mut d = *self;
        for (a, b) in d.slots.iter_mut().zip(base.slots.iter()) {
            *a = a.saturating_sub(*b);
        }
        d.count = self.count.saturating_sub(base.count);
        d.total_ns = self.total_ns.saturating_sub(base.total_ns);
        d.preempt_same = self.preempt_same.saturating_sub(base.preempt_same);
        d.preempt_other = self.preempt_other.saturating_sub(base.preempt_other);
        d.preempt_host = self.preempt_host.saturating_sub(base.preempt_host);
        d.excluded = self.excluded.saturating_sub(base.excluded);
        d.wake_dropped = self.wake_dropped.saturating_sub(base.wake_dropped);
        d
    }

    /// The q-quantile (0..=1) in ns, interpolated inside its log2 bucket and
    /// never above `max` (when known, i.e. non-zero). None without samples.
    pub fn quantile(&self, q: f64, max: u64) -> Option<u64> {
        let n: u64 = self.slots.iter().sum();
        if n == 0 {
            return None;
        }
        let rank = (q.clamp(0.0, 1.0) * n as f64).ceil().max(1.0) as u64;
        let mut seen = 0u64;
        for (i, c) in self.slots.iter().enumerate() {
            if *c == 0 {
                continue;
            }
            if seen + c >= rank {
                let lo = if i == 0 { 0.0 } else { (1u64 << i) as f64 };
                let hi = (1u64 << (i + 1)) as f64;
                let frac = (rank - seen) as f64 / *c as f64;
                let v = (lo + (hi - lo) * frac) as u64;
                return Some(if max > 0 { v.min(max) } else { v });
            }
            seen += c;
        }
        Some(max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_from_log2_buckets() {
        let mut t = RunqTotals::default();
        t.slots[10] = 98; // [1024, 2048) ns
        t.slots[20] = 2; // [1 Mi, 2 Mi) ns
        let p50 = t.quantile(0.5, 0).unwrap();
        assert!((1024..2048).contains(&p50), "{p50}");
        let p99 = t.quantile(0.99, 1_500_000).unwrap();
        assert!((1 << 20..=1_500_000).contains(&p99), "{p99}");
        assert_eq!(RunqTotals::default().quantile(0.5, 0), None);
    }

    #[test]
    fn since_subtracts_counters_keeps_max() {
        let mut a = RunqTotals {
            count: 10,
            total_ns: 100,
            max_ns: 50,
            preempt_host: 3,
            ..Default::default()
        };
        a.slots[3] = 10;
        let mut b = RunqTotals {
            count: 4,
            total_ns: 40,
            max_ns: 20,
            preempt_host: 1,
            ..Default::default()
        };
        b.slots[3] = 4;
        let d = a.since(&b);
        assert_eq!(
            (d.count, d.total_ns, d.max_ns, d.preempt_host, d.slots[3]),
            (6, 60, 50, 2, 6)
        );
    }
}
