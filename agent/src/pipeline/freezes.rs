//! The per-thread view of a session: every freeze counted, aggregated per
//! thread for the `end` record's `top_threads`.

use std::collections::HashMap;

use throttlewatch_bpf::FreezeEvent;
use throttlewatch_core::logfmt::ThreadSummary;

/// How many threads the `end` record lists.
pub(crate) const TOP_THREADS: usize = 10;

#[derive(Debug, Clone, Default)]
struct ThreadAgg {
    comm: String,
    count: u64,
    total_ns: u64,
    max_ns: u64,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct FreezeTally {
    threads: HashMap<u32, ThreadAgg>,
    pub freezes: u64,
    pub frozen_ns: u64,
    /// Freezes counted but under the log's threshold.
    pub below_threshold: u64,
}

impl FreezeTally {
    /// Count one freeze; true when it is at or above `threshold_ns` (a record is due).
    pub(crate) fn add(&mut self, ev: &FreezeEvent, threshold_ns: u64) -> bool {
        let ns = ev.frozen_ns();
        self.freezes += 1;
        self.frozen_ns += ns;
        let t = self.threads.entry(ev.tid).or_default();
        if t.comm != ev.comm {
            t.comm = ev.comm.clone();
        }
        t.count += 1;
        t.total_ns += ns;
        t.max_ns = t.max_ns.max(ns);
        if ns < threshold_ns {
            self.below_threshold += 1;
            return false;
        }
        true
    }

    pub(crate) fn threads(&self) -> u64 {
        self.threads.len() as u64
    }

    /// One thread's frozen time summed (0 when never frozen).
    pub(crate) fn frozen_of(&self, tid: u32) -> u64 {
        self.threads.get(&tid).map_or(0, |t| t.total_ns)
    }

    /// The threads with the most frozen time (ties: lower tid first).
    pub(crate) fn top(&self) -> Vec<ThreadSummary> {
        let mut top: Vec<ThreadSummary> = self
            .threads
            .iter()
            .map(|(tid, a)| ThreadSummary {
                tid: *tid,
                comm: a.comm.clone(),
                count: a.count,
                total_frozen_ns: a.total_ns,
                max_frozen_ns: a.max_ns,
            })
            .collect();
        top.sort_by(|a, b| {
            b.total_frozen_ns
                .cmp(&a.total_frozen_ns)
                .then(a.tid.cmp(&b.tid))
        });
        top.truncate(TOP_THREADS);
        top
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(tid: u32, ns: u64) -> FreezeEvent {
        FreezeEvent {
            tid,
            tgid: 1,
            comm: format!("t{tid}"),
            cpu_out: 0,
            cpu_in: 0,
            start_ns: 1000,
            end_ns: 1000 + ns,
            cgroup_id: 7,
            task_cgroup_id: 7,
            throttled_cgroup_id: 7,
            throttled_level: 1,
            queued: false,
        }
    }

    #[test]
    fn threshold_and_top_threads() {
        let mut t = FreezeTally::default();
        assert!(!t.add(&ev(1, 50), 100));
        assert!(t.add(&ev(2, 100), 100));
        assert!(t.add(&ev(2, 300), 100));
        for tid in 10..30 {
            t.add(&ev(tid, 10), 100);
        }
        assert_eq!((t.freezes, t.below_threshold, t.threads()), (23, 21, 22));
        let top = t.top();
        assert_eq!(top.len(), TOP_THREADS);
        assert_eq!(
            (top[0].tid, top[0].count, top[0].max_frozen_ns),
            (2, 2, 300)
        );
        assert_eq!(
            (top[1].tid, top[2].tid),
            (1, 10),
            "then by time, ties by tid"
        );
    }
}
