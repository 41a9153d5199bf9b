//! One container's log folded into figures, in one pass and in memory that
//! depends on the number of threads and CPUs, plus 16 bytes per throttled
//! period and the GPU samples (at most `gpu::MAX_SAMPLES`), never on the
//! number of records.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use throttlewatch_core::logfmt::{
    ColdStart, CpuStatSnapshot, End, Record, Runq, Start, Throttle, ThrottleSummary,
};

use crate::heatmap::HeatmapBins;
use crate::histogram::LogHistogram;

/// Per-thread freeze figures.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ThreadFreezes {
    pub tid: u32,
    /// Its process (thread group); 0 when the records do not say.
    pub pid: u32,
    pub comm: String,
    pub freezes: u64,
    pub frozen_ns: u64,
    pub longest_ns: u64,
}

/// One process's freezes (its threads summed).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ProcessFreezes {
    pub pid: u32,
    pub comm: String,
    /// The container's main process (`start.pid`).
    pub main: bool,
    /// Its parent is the main process.
    pub child_of_main: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ppid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exe: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cmdline: Option<String>,
    pub threads: u32,
    pub freezes: u64,
    pub frozen_ns: u64,
}

/// One CFS period with throttling, as the records show it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PeriodThrottle {
    /// Sum over CPUs of the span from the first freeze on that CPU to the last thaw.
    pub throttled_ns: u64,
    /// Distinct threads frozen in it.
    pub threads: u32,
    /// CPUs with a freeze in it.
    pub cpus: u32,
}

/// One throttled period: CPU -> (first freeze start, last thaw), and the threads frozen.
type PeriodSpans = (HashMap<u32, (u64, u64)>, Vec<u32>);

/// Periods kept open for late records (the agent flushes every second: 10 periods of
/// 100 ms; 64 leaves room for slower flushes and shorter periods).
const OPEN_PERIODS: u64 = 64;

fn close((cpus, tids): &PeriodSpans, period_ns: u64) -> PeriodThrottle {
    PeriodThrottle {
        throttled_ns: cpus.values().map(|(a, b)| (b - a).min(period_ns)).sum(),
        threads: tids.len() as u32,
        cpus: cpus.len() as u32,
    }
}

/// `control` records kept for the report.
pub const MAX_CONTROLS: usize = 10_000;

/// Everything the report needs from one log.
#[derive(Debug, Default)]
pub struct Container {
    pub start: Option<Start>,
    pub start_ts: Option<u64>,
    pub last_ts: u64,
    pub end: Option<End>,
    pub resumes: u64,
    pub cold_start: Option<ColdStart>,
    /// The dynamic CPU controller's changes, with their `ts` (docs/control.md).
    pub controls: Vec<(u64, throttlewatch_core::logfmt::Control)>,
    pub last_cpu_stat: Option<CpuStatSnapshot>,
    /// The `cpu_stat` records' GPU samples (gpu.rs).
    pub gpu: crate::gpu_samples::GpuSamples,
    /// Interval `runq` records summed (used while there is no `end`).
    pub runq_intervals: Runq,
    pub runq_p99_max: Option<u64>,
    pub freezes: LogHistogram,
    pub queued_freezes: u64,
    /// Freezes read from `throttle_summary` records (folded past the budget).
    pub folded_freezes: u64,
    pub threads: HashMap<u32, ThreadFreezes>,
    /// `process` records by pid.
    pub process_info: HashMap<u32, throttlewatch_core::logfmt::Process>,
    /// Frozen time by the cgroup whose quota froze it (`throttled_cgroup_id`).
    pub frozen_by_group: BTreeMap<u64, u64>,
    pub heat: HeatmapBins,
    /// The CPUs its threads were frozen on, over the whole log (bounded by
    /// the machine's CPU ids): the CPUs it can run on.
    pub frozen_on_cpus: std::collections::BTreeSet<u32>,
    /// period index -> CPU -> (first freeze start, last thaw), and its threads.
    periods: BTreeMap<u64, PeriodSpans>,
    /// Periods no longer open, 16 bytes each (memory grows with the log's duration, not its records).
    closed: Vec<(u64, PeriodThrottle)>,
    /// Where thaws fall in the period (from the first freeze): periods are
    /// counted from half a period before it, so one period's thaws share an index.
    thaw_phase: Option<u64>,
}

impl Container {
    pub fn period_ns(&self) -> u64 {
        self.start
            .as_ref()
            .map(|s| s.period_us * 1000)
            .filter(|p| *p > 0)
            .unwrap_or(100_000_000)
    }

    pub fn add(&mut self, ts: u64, rec: Record) {
        self.last_ts = self.last_ts.max(ts);
        match rec {
            Record::Start(s) => {
                if self.start.is_none() {
                    self.start_ts = Some(ts);
                    self.heat = HeatmapBins::new(ts, s.period_us * 1000);
                    self.start = Some(s);
                }
            }
            Record::Resume(_) => self.resumes += 1,
            Record::Throttle(t) => self.add_throttle(t),
            Record::Process(p) => {
                if self.process_info.len() < 4096 {
                    self.process_info.insert(p.pid, p);
                }
            }
            Record::ThrottleSummary(t) => self.add_summary(t),
            Record::CpuStat(mut c) => {
                self.gpu.add(&mut c);
                self.last_cpu_stat = Some(c);
            }
            Record::Runq(r) => {
                let s = &mut self.runq_intervals;
                s.interval_ns += r.interval_ns;
                s.count += r.count;
                s.total_ns += r.total_ns;
                s.max_ns = s.max_ns.max(r.max_ns);
                s.preempted_by_same += r.preempted_by_same;
                s.preempted_by_other += r.preempted_by_other;
                s.preempted_by_host += r.preempted_by_host;
                s.excluded_thaws += r.excluded_thaws;
                if let Some(p) = r.p99_ns {
                    self.runq_p99_max = Some(self.runq_p99_max.unwrap_or(0).max(p));
                }
            }
            Record::ColdStart(c) => self.cold_start = Some(c),
            Record::Control(c) => {
                // A bounded list: the controller acts at most every cooldown.
                if self.controls.len() < MAX_CONTROLS {
                    self.controls.push((ts, c));
                }
            }
            Record::End(e) => self.end = Some(e),
        }
    }

    /// Freezes the agent's byte budget folded: in the per-thread totals
    /// (tid 0: the threads folded together), not in the freeze histogram.
    fn add_summary(&mut self, t: ThrottleSummary) {
        self.folded_freezes += t.freezes;
        let th = self.threads.entry(t.tid).or_insert_with(|| ThreadFreezes {
            tid: t.tid,
            comm: t.comm.clone(),
            ..Default::default()
        });
        th.freezes += t.freezes;
        th.frozen_ns += t.frozen_ns;
        th.longest_ns = th.longest_ns.max(t.max_frozen_ns);
    }

    fn add_throttle(&mut self, t: Throttle) {
        if self.start.is_none() && self.heat.is_empty() {
            // A log whose start part is gone (rotated away): time from the first freeze.
            self.heat = HeatmapBins::new(t.start_ns, 100_000_000);
        }
        self.freezes.add(t.frozen_ns);
        if t.queued {
            self.queued_freezes += 1;
        }
        self.heat.add(&t);
        let th = self.threads.entry(t.tid).or_insert_with(|| ThreadFreezes {
            tid: t.tid,
            ..Default::default()
        });
        th.pid = t.pid;
        if th.comm != t.comm {
            th.comm = t.comm.clone();
        }
        th.freezes += 1;
        th.frozen_ns += t.frozen_ns;
        if self.frozen_on_cpus.len() < 8192 {
            self.frozen_on_cpus.insert(t.cpu);
        }
        *self
            .frozen_by_group
            .entry(t.throttled_cgroup_id)
            .or_default() += t.frozen_ns;
        th.longest_ns = th.longest_ns.max(t.frozen_ns);
        let p = self.period_ns();
        let end = t.start_ns + t.frozen_ns;
        self.thaw_phase.get_or_insert(end % p);
        let index = self.period_index(end).unwrap_or(0);
        let (cpus, tids) = self.periods.entry(index).or_default();
        let span = cpus.entry(t.cpu).or_insert((t.start_ns, end));
        span.0 = span.0.min(t.start_ns);
        span.1 = span.1.max(end);
        if !tids.contains(&t.tid) && tids.len() < 4096 {
            tids.push(t.tid);
        }
        // Records come in time order give or take a flush: periods well behind
        // the newest are final and shrink to a `PeriodThrottle`.
        while let Some((&k, _)) = self.periods.first_key_value() {
            if k + OPEN_PERIODS > index {
                break;
            }
            let (k, spans) = self.periods.pop_first().unwrap_or_default();
            let done = close(&spans, p);
            self.closed.push((k, done));
        }
    }

    /// The period a thaw at `ts` ends (counted as the throttled periods are).
    pub fn period_index(&self, ts: u64) -> Option<u64> {
        let p = self.period_ns();
        let phase = self.thaw_phase?;
        Some((ts + p + p / 2 - phase) / p)
    }

    /// When period `index`'s thaws come (Unix ns): [`Self::period_index`]
    /// numbers a thaw at the phase of the first one, give or take half a period.
    pub fn period_thaw_ns(&self, index: u64) -> Option<u64> {
        let p = self.period_ns();
        Some((index.checked_sub(1)? * p).saturating_add(self.thaw_phase?))
    }

    /// The index of the CFS period `ts` falls in (that of the refill that
    /// ends it, as [`Self::period_index`] numbers a freeze by its thaw).
    pub fn period_containing(&self, ts: u64) -> Option<u64> {
        let p = self.period_ns();
        let phase = self.thaw_phase?;
        let into = (ts + p - phase % p) % p;
        self.period_index(ts + p - into)
    }

    /// Throttled periods in order, each capped at what the CPUs can hold.
    pub fn throttled_periods(&self) -> Vec<(u64, PeriodThrottle)> {
        let p = self.period_ns();
        let mut all: Vec<(u64, PeriodThrottle)> = self
            .closed
            .iter()
            .copied()
            .chain(self.periods.iter().map(|(k, s)| (*k, close(s, p))))
            .collect();
        all.sort_by_key(|(k, _)| *k);
        // A record later than the window reopened its period: merge the parts.
        all.dedup_by(|later, first| {
            if later.0 != first.0 {
                return false;
            }
            first.1.throttled_ns = (first.1.throttled_ns + later.1.throttled_ns)
                .min(p * first.1.cpus.max(later.1.cpus) as u64);
            first.1.threads = first.1.threads.max(later.1.threads);
            first.1.cpus = first.1.cpus.max(later.1.cpus);
            true
        });
        all
    }

    /// Threads grouped by process, most frozen first: (pid, threads, frozen
    /// ns, freezes, the name of the process's main thread or its first).
    pub fn processes(&self) -> Vec<ProcessFreezes> {
        let mut by: BTreeMap<u32, ProcessFreezes> = BTreeMap::new();
        // In tid order: a process whose main thread never froze is named
        // after its lowest thread, the same on every read.
        let mut threads: Vec<&ThreadFreezes> = self.threads.values().collect();
        threads.sort_by_key(|t| t.tid);
        for t in threads {
            let p = by.entry(t.pid).or_insert_with(|| ProcessFreezes {
                pid: t.pid,
                comm: t.comm.clone(),
                ..Default::default()
            });
            p.threads += 1;
            p.frozen_ns += t.frozen_ns;
            p.freezes += t.freezes;
            if t.tid == t.pid {
                p.comm = t.comm.clone();
            }
        }
        // The container's main process: `start.pid`; without it (`run`,
        // `watch`) the one whose parent is outside and that has children here.
        let main = self.start.as_ref().and_then(|s| s.pid).or_else(|| {
            let ppid = |pid: &u32| self.process_info.get(pid).and_then(|i| i.ppid);
            by.keys()
                .find(|p| {
                    ppid(p).is_some_and(|pp| !by.contains_key(&pp))
                        && by.keys().any(|c| ppid(c) == Some(**p))
                })
                .copied()
        });
        let mut v: Vec<ProcessFreezes> = by
            .into_values()
            .map(|mut p| {
                p.main = main == Some(p.pid);
                if let Some(i) = self.process_info.get(&p.pid) {
                    p.ppid = i.ppid;
                    p.exe = i.exe.clone();
                    p.cmdline = i.cmdline.clone();
                }
                p.child_of_main = main.is_some() && p.ppid == main;
                p
            })
            .collect();
        v.sort_by(|a, b| b.frozen_ns.cmp(&a.frozen_ns).then(a.pid.cmp(&b.pid)));
        v
    }

    /// Threads by frozen time, most first.
    pub fn top_threads(&self, n: usize) -> Vec<ThreadFreezes> {
        let mut v: Vec<_> = self.threads.values().cloned().collect();
        v.sort_by(|a, b| b.frozen_ns.cmp(&a.frozen_ns).then(a.tid.cmp(&b.tid)));
        v.truncate(n);
        v
    }

    /// Wall time the log covers: `end.duration_ns`, else first to last record.
    pub fn wall_ns(&self) -> u64 {
        if let Some(e) = &self.end {
            return e.duration_ns;
        }
        self.start_ts
            .map(|s| self.last_ts.saturating_sub(s))
            .unwrap_or(0)
    }

    /// The kernel's throttled time: `end`, else the `cpu_stat` deltas.
    pub fn kernel_throttled_ns(&self) -> Option<u64> {
        if let Some(e) = &self.end {
            return Some(e.kernel_throttled_ns);
        }
        // The counters are cumulative from the group's creation.
        self.last_cpu_stat.as_ref().map(|c| c.throttled_ns)
    }

    /// (periods, throttled periods): `end`, else the last `cpu_stat`.
    pub fn periods_throttled(&self) -> Option<(u64, u64)> {
        if let Some(e) = &self.end {
            return Some((e.nr_periods, e.nr_throttled));
        }
        self.last_cpu_stat
            .as_ref()
            .map(|c| (c.nr_periods, c.nr_throttled))
    }

    /// Run-queue figures for the whole watch: `end.runq`, else the intervals summed
    /// (their percentiles are not additive: p50 is unknown, p99 is the worst interval's).
    pub fn runq(&self) -> Option<Runq> {
        if let Some(r) = self.end.as_ref().and_then(|e| e.runq.clone()) {
            return Some(r);
        }
        if self.runq_intervals.interval_ns == 0 {
            return None;
        }
        let mut r = self.runq_intervals.clone();
        r.p50_ns = None;
        r.p99_ns = self.runq_p99_max;
        Some(r)
    }

    /// Per-thread frozen time summed (the `end` figure when present: it counts
    /// freezes under the threshold too).
    pub fn frozen_ns(&self) -> u64 {
        self.end
            .as_ref()
            .map(|e| e.frozen_ns)
            .unwrap_or_else(|| self.threads.values().map(|t| t.frozen_ns).sum())
    }

    pub fn name(&self) -> String {
        match &self.start {
            Some(s) if !s.container_name.is_empty() => s.container_name.clone(),
            Some(s) => s.container_id.clone(),
            None => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn freeze(tid: u32, cpu: u32, start_ns: u64, frozen_ns: u64) -> Record {
        Record::Throttle(Throttle {
            tid,
            cpu,
            start_ns,
            frozen_ns,
            ..Default::default()
        })
    }

    #[test]
    fn periods_close_behind_the_newest_and_late_records_merge() {
        let p = 100_000_000;
        let mut c = Container::default();
        for k in 0..500u64 {
            // CPU 0 frozen from +60 ms to the refill (two threads), CPU 1 from +70 ms.
            c.add(0, freeze(1, 0, k * p + 60_000_000, 40_000_000));
            c.add(0, freeze(2, 0, k * p + 61_000_000, 39_000_000));
            c.add(0, freeze(3, 1, k * p + 70_000_000, 30_000_000));
        }
        assert!(
            c.periods.len() <= OPEN_PERIODS as usize + 1,
            "{}",
            c.periods.len()
        );
        // A record for period 3 arriving long after it closed.
        c.add(0, freeze(4, 1, 3 * p + 50_000_000, 50_000_000));
        let v = c.throttled_periods();
        assert_eq!(v.len(), 500);
        assert!(v.windows(2).all(|w| w[0].0 + 1 == w[1].0));
        let normal = PeriodThrottle {
            throttled_ns: 70_000_000,
            threads: 3,
            cpus: 2,
        };
        assert_eq!(v[0].1, normal);
        assert_eq!(v[499].1, normal);
        // Period 3: its CPU 1 part came twice (30 ms, then 50 ms): summed.
        assert_eq!(v[3].1.throttled_ns, 40_000_000 + 30_000_000 + 50_000_000);
    }
}
