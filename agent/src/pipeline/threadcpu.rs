//! Per-thread CPU of a session: what the scheduler counted for each thread
//! (`/proc/<tid>/schedstat`: run time and run delay). A thread that exits
//! while watched reports its figures from the kernel at its exit (the
//! probe's thread-CPU event: the file goes with the thread); the threads
//! alive at the end are read from /proc. With the per-thread frozen time
//! this gives the split the `end` record's `thread_cpu` carries: running,
//! waiting on a run-queue (run delay less frozen: the kernel's run delay
//! includes the time frozen by the quota), frozen.
//!
//! Why this source: the scheduler already keeps both counters per thread,
//! so the cost is one event per thread exit and one file read per live
//! thread at the end, nothing per context switch.

use std::collections::HashMap;

use throttlewatch_bpf::ThreadCpuEvent;
use throttlewatch_cgroup::CpuCgroup;
use throttlewatch_core::logfmt::{ThreadCpu, ThreadCpuFigures};

/// How many threads by CPU time `thread_cpu.top` lists (besides the most frozen).
pub(crate) const TOP_BY_CPU: usize = 10;
/// Exited threads kept one by one; past it the half with the least CPU is
/// folded into the totals (memory stays flat under thread churn).
const KEEP_EXITED: usize = 4096;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Sched {
    comm: String,
    running_ns: u64,
    run_delay_ns: u64,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct ThreadCpuTally {
    exited: HashMap<u32, Sched>,
    /// Exited threads no longer kept one by one: count, CPU, run delay.
    folded: (u64, u64, u64),
}

impl ThreadCpuTally {
    pub(crate) fn on_exit(&mut self, ev: &ThreadCpuEvent) {
        self.exited.insert(
            ev.tid,
            Sched {
                comm: ev.comm.clone(),
                running_ns: ev.running_ns,
                run_delay_ns: ev.run_delay_ns,
            },
        );
        if self.exited.len() > KEEP_EXITED {
            let mut v: Vec<(u32, Sched)> = self.exited.drain().collect();
            v.sort_by_key(|e| std::cmp::Reverse(e.1.running_ns));
            for (_, s) in v.split_off(KEEP_EXITED / 2) {
                self.folded.0 += 1;
                self.folded.1 += s.running_ns;
                self.folded.2 += s.run_delay_ns;
            }
            self.exited = v.into_iter().collect();
        }
    }

    /// The figures of the exited threads and of those alive in `cgroup` now;
    /// `frozen(tid)` is a thread's frozen time, `most_frozen` the tids the
    /// `end` record lists by frozen time (listed here too).
    pub(crate) fn summary(
        &self,
        cgroup: &CpuCgroup,
        frozen: impl Fn(u32) -> u64,
        most_frozen: &[u32],
    ) -> ThreadCpu {
        let mut all = self.exited.clone();
        for (tid, s) in live_threads(cgroup) {
            all.insert(tid, s);
        }
        let mut t = summarise(all, frozen, most_frozen);
        t.threads += self.folded.0;
        t.running_ns += self.folded.1;
        t.run_delay_ns += self.folded.2;
        t
    }
}

fn summarise(
    all: HashMap<u32, Sched>,
    frozen: impl Fn(u32) -> u64,
    most_frozen: &[u32],
) -> ThreadCpu {
    let mut v: Vec<(u32, Sched)> = all.into_iter().collect();
    v.sort_by(|a, b| b.1.running_ns.cmp(&a.1.running_ns).then(a.0.cmp(&b.0)));
    let out = ThreadCpu {
        threads: v.len() as u64,
        running_ns: v.iter().map(|(_, s)| s.running_ns).sum(),
        run_delay_ns: v.iter().map(|(_, s)| s.run_delay_ns).sum(),
        top: vec![],
    };
    let top = v
        .iter()
        .enumerate()
        .filter(|(i, (tid, _))| *i < TOP_BY_CPU || most_frozen.contains(tid))
        .map(|(_, (tid, s))| {
            let f = frozen(*tid);
            ThreadCpuFigures {
                tid: *tid,
                comm: s.comm.clone(),
                running_ns: s.running_ns,
                runq_ns: s.run_delay_ns.saturating_sub(f),
                frozen_ns: f,
            }
        })
        .collect();
    ThreadCpu { top, ..out }
}

/// Every thread of every process in the group, with its schedstat.
fn live_threads(cgroup: &CpuCgroup) -> Vec<(u32, Sched)> {
    let mut out = vec![];
    for pid in cgroup.pids().unwrap_or_default() {
        let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for e in dir.flatten() {
            let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(s) = read_sched(pid, tid) {
                out.push((tid, s));
            }
        }
    }
    out
}

fn read_sched(pid: u32, tid: u32) -> Option<Sched> {
    let dir = format!("/proc/{pid}/task/{tid}");
    let stat = std::fs::read_to_string(format!("{dir}/schedstat")).ok()?;
    let (running_ns, run_delay_ns) = parse_schedstat(&stat)?;
    let comm = std::fs::read_to_string(format!("{dir}/comm")).unwrap_or_default();
    Some(Sched {
        comm: comm.trim_end().to_string(),
        running_ns,
        run_delay_ns,
    })
}

/// `/proc/<tid>/schedstat`: "run_time_ns run_delay_ns timeslices".
fn parse_schedstat(s: &str) -> Option<(u64, u64)> {
    let mut it = s.split_whitespace().map(|x| x.parse::<u64>().ok());
    Some((it.next()??, it.next()??))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_parses_and_rejects_garbage() {
        assert_eq!(parse_schedstat("123 45 6\n"), Some((123, 45)));
        assert_eq!(parse_schedstat("123\n"), None);
        assert_eq!(parse_schedstat("x 1 2"), None);
    }

    #[test]
    fn split_per_thread_and_the_most_frozen_listed() {
        let mut all = HashMap::new();
        for tid in 1..=12u32 {
            all.insert(
                tid,
                Sched {
                    comm: format!("t{tid}"),
                    running_ns: tid as u64 * 100,
                    run_delay_ns: 50,
                },
            );
        }
        // tid 1 has the least CPU but is the most frozen.
        let s = summarise(all, |tid| if tid == 1 { 30 } else { 0 }, &[1]);
        assert_eq!(s.threads, 12);
        assert_eq!(s.running_ns, (1..=12).map(|t| t * 100).sum::<u64>());
        assert_eq!(s.run_delay_ns, 600);
        assert_eq!(s.top.len(), TOP_BY_CPU + 1);
        assert_eq!(s.top[0].tid, 12, "most CPU first");
        let one = s.top.iter().find(|t| t.tid == 1).unwrap();
        assert_eq!((one.runq_ns, one.frozen_ns), (20, 30));
    }

    #[test]
    fn thread_churn_keeps_memory_flat_and_the_totals_whole() {
        let mut t = ThreadCpuTally::default();
        let n = 3 * KEEP_EXITED as u32;
        for tid in 1..=n {
            t.on_exit(&ThreadCpuEvent {
                cgroup_id: 1,
                tid,
                tgid: 1,
                comm: "w".into(),
                running_ns: tid as u64,
                run_delay_ns: 1,
            });
        }
        assert!(t.exited.len() <= KEEP_EXITED, "{}", t.exited.len());
        assert!(t.exited.contains_key(&n), "the busiest thread is kept");
        let kept: u64 = t.exited.values().map(|s| s.running_ns).sum();
        assert_eq!(t.folded.0 + t.exited.len() as u64, n as u64);
        assert_eq!(t.folded.1 + kept, (1..=n as u64).sum::<u64>());
        assert_eq!(t.folded.2 + t.exited.len() as u64, n as u64);
    }

    #[test]
    fn own_threads_from_proc() {
        let pid = std::process::id();
        let s = read_sched(pid, pid).expect("own schedstat");
        assert!(s.running_ns > 0 && !s.comm.is_empty(), "{s:?}");
    }
}
