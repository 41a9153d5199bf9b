//! A new container's counters held back until a scrape has seen them at 0.

use std::time::{Duration, Instant};

/// How long a new container's counters wait for a first scrape at most;
/// past it they are applied (nobody scrapes: the zero is nobody's to see).
/// Longer than any scrape interval in use (15 s to 1 min).
pub(crate) const HELD_AT_MOST: Duration = Duration::from_secs(300);

/// A new container's cpu.stat deltas and probe time since its register,
/// kept back until a scrape has seen its counters at 0.
#[derive(Debug)]
pub(crate) struct Held {
    pub(super) kernel: throttlewatch_cgroup::CpuStat,
    pub(super) probe_ns: u64,
    pub(super) since: Instant,
}

impl Default for Held {
    fn default() -> Self {
        Held {
            kernel: Default::default(),
            probe_ns: 0,
            since: Instant::now(),
        }
    }
}

impl Held {
    pub(super) fn add(&mut self, d: &throttlewatch_cgroup::CpuStat, probe_ns: u64) {
        let k = &mut self.kernel;
        k.nr_periods += d.nr_periods;
        k.nr_throttled += d.nr_throttled;
        k.throttled_ns += d.throttled_ns;
        k.nr_bursts += d.nr_bursts;
        k.burst_ns += d.burst_ns;
        self.probe_ns += probe_ns;
    }
}
