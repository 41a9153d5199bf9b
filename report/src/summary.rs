//! The report as data: what the terminal, the HTML page and `--json` show.
//! A figure the log does not hold is `null` with the reason in `missing`.

use serde::Serialize;
use throttlewatch_core::logfmt::{ColdStart, Runq, Start, ThreadCpu};

use crate::heatmap::Grid;
use crate::histogram::Quantiles;
pub use crate::levels::{is_pod_cgroup, levels, LevelShare};
use crate::model::{Container, ThreadFreezes};
use crate::reader::ReadStats;
use crate::recommend::{recommend, Recommendation};

pub const TOP_THREADS: usize = 10;

/// Where a container's CPU time went: running, waiting for a CPU, frozen by the quota.
#[derive(Debug, Clone, Serialize)]
pub struct CpuSplit {
    pub running_ns: Option<u64>,
    pub runqueue_wait_ns: Option<u64>,
    pub frozen_ns: Option<u64>,
    /// Figures that are null, and why.
    pub missing: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ThreadRow {
    #[serde(flatten)]
    pub freezes: ThreadFreezes,
    pub split: CpuSplit,
}

#[derive(Debug, Clone, Serialize)]
pub struct ContainerReport {
    pub log: String,
    pub container_id: String,
    pub container_name: String,
    pub complete: bool,
    pub read: ReadStats,
    pub quota_us: Option<u64>,
    pub period_us: u64,
    pub burst_us: Option<u64>,
    pub cpus: Option<String>,
    pub throttle_model: String,
    pub wall_ns: u64,
    pub kernel_throttled_ns: Option<u64>,
    /// Kernel throttled time / (wall time x CPUs): the share of the CPUs' time the group was frozen.
    pub frozen_share: Option<f64>,
    pub nr_periods: Option<u64>,
    pub nr_throttled: Option<u64>,
    pub freezes: Quantiles,
    pub queued_freezes: u64,
    pub top_threads: Vec<ThreadRow>,
    pub runq: Option<Runq>,
    pub split: CpuSplit,
    /// Which level's quota froze it, most first (one line: its own limit).
    pub frozen_by_level: Vec<LevelShare>,
    /// The threads grouped by process, most frozen first (at most 20).
    pub processes: Vec<crate::model::ProcessFreezes>,
    /// Where its runnable time went, the dominant cause first (diagnosis.rs).
    pub diagnosis: crate::diagnosis::Diagnosis,
    /// Things the reader should know first (a limit above the machine's CPUs).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    pub cold_start: Option<ColdStart>,
    /// The dynamic CPU controller's changes on the timeline (docs/control.md).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub controls: Vec<ControlAt>,
    pub recommendations: Vec<Recommendation>,
    /// `--what-if`: the settings asked about and the predicted throttled time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub what_if: Option<crate::what_if::WhatIfResult>,
    pub heatmaps: Heatmaps,
    /// The container's GPUs while frozen and not (absent without GPU samples).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<crate::gpu::GpuReport>,
    /// Who woke the container's threads, and the critical path of a
    /// periodic pipeline (absent without wake-up edges; set by
    /// `report_one`, wakeups.rs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wakeups: Option<crate::wakeups::WakeReport>,
}

/// A limit above the CPUs the container may use is no limit: the kernel
/// takes it and never throttles.
fn warnings(start: &throttlewatch_core::logfmt::Start) -> Vec<String> {
    let mut w = Vec::new();
    let cpus = start
        .cpus
        .as_deref()
        .and_then(|s| throttlewatch_core::cpulist::CpuList::parse("cpus", s).ok())
        .map(|l| l.len())
        .filter(|n| *n > 0);
    if let (Some(q), Some(n)) = (start.quota_us, cpus) {
        let limit = q as f64 / start.period_us.max(1) as f64;
        if limit > n as f64 + 1e-9 {
            w.push(format!(
                "the limit of {} CPUs is above the {n} CPUs the container may use (cpus {}): it can never be reached",
                crate::format::trim_float(limit),
                start.cpus.as_deref().unwrap_or("")
            ));
        }
    }
    w
}

/// A `control` record and when it came, ns after the log's start.
#[derive(Debug, Clone, Serialize)]
pub struct ControlAt {
    pub at_ns: u64,
    #[serde(flatten)]
    pub record: throttlewatch_core::logfmt::Control,
}

#[derive(Debug, Clone, Serialize)]
pub struct Heatmaps {
    pub latency: Grid,
    pub offset: Grid,
    pub threads: Grid,
}

const NO_RUNNING: &str =
    "running: the log has no end.thread_cpu (an agent before it, the raw_tp probe, or no end record yet)";

pub fn container(log: String, c: &Container, read: ReadStats) -> ContainerReport {
    let start = c.start.clone().unwrap_or_default();
    let wall = c.wall_ns();
    let kernel = c.kernel_throttled_ns();
    let frozen_share = frozen_share(&start, wall, kernel);
    let (nr_periods, nr_throttled) = c.periods_throttled().unzip();
    let runq = c.runq();
    let thread_cpu = c.end.as_ref().and_then(|e| e.thread_cpu.as_ref());
    let split = cpu_split(c, thread_cpu, runq.as_ref());
    let top = c.top_threads(TOP_THREADS);
    let names: Vec<(u32, String)> = top.iter().map(|t| (t.tid, t.comm.clone())).collect();
    let top_threads = thread_rows(top, thread_cpu);
    ContainerReport {
        log,
        container_id: start.container_id.clone(),
        container_name: start.container_name.clone(),
        complete: c.end.is_some(),
        read,
        quota_us: start.quota_us,
        period_us: start.period_us,
        burst_us: start.burst_us,
        cpus: start.cpus.clone(),
        throttle_model: start.throttle_model.clone(),
        wall_ns: wall,
        kernel_throttled_ns: kernel,
        frozen_share,
        nr_periods,
        nr_throttled,
        freezes: c.freezes.quantiles(),
        queued_freezes: c.queued_freezes,
        top_threads,
        runq,
        split,
        frozen_by_level: levels(c),
        processes: {
            let mut p = c.processes();
            p.truncate(20);
            p
        },
        diagnosis: crate::diagnosis::diagnose(c, &levels(c)),
        warnings: warnings(&start),
        cold_start: c.cold_start.clone(),
        controls: controls_at(c),
        recommendations: recommend(c),
        what_if: None,
        heatmaps: Heatmaps {
            latency: c.heat.latency(),
            offset: c.heat.offset(),
            threads: c.heat.threads(&names),
        },
        gpu: crate::gpu::report(c),
        wakeups: None,
    }
}

/// The kernel's throttled time over the wall time of the CPUs the container
/// may use (one when the start record names none).
fn frozen_share(start: &Start, wall: u64, kernel: Option<u64>) -> Option<f64> {
    let ncpus = start
        .cpus
        .as_deref()
        .and_then(|s| throttlewatch_core::cpulist::CpuList::parse("cpus", s).ok())
        .map_or(1, |l| l.len().max(1)) as f64;
    kernel
        .filter(|_| wall > 0)
        .map(|k| k as f64 / (wall as f64 * ncpus))
}

/// The container's running, run-queue wait and frozen time, with the reason
/// for each figure the log does not hold.
fn cpu_split(c: &Container, thread_cpu: Option<&ThreadCpu>, runq: Option<&Runq>) -> CpuSplit {
    let mut missing = vec![];
    if thread_cpu.is_none() {
        missing.push(NO_RUNNING.to_string());
    }
    if runq.is_none() {
        missing.push(
            "runqueue_wait: no run-queue figures (raw_tp probe, or no runq record yet)".into(),
        );
    }
    CpuSplit {
        running_ns: thread_cpu.map(|t| t.running_ns),
        runqueue_wait_ns: runq.map(|r| r.total_ns),
        frozen_ns: Some(c.frozen_ns()),
        missing,
    }
}

/// The top threads' freezes, each with its own CPU split from
/// `end.thread_cpu` where that holds the thread.
fn thread_rows(top: Vec<ThreadFreezes>, thread_cpu: Option<&ThreadCpu>) -> Vec<ThreadRow> {
    top.into_iter()
        .map(|t| {
            let sched = thread_cpu.and_then(|c| c.top.iter().find(|x| x.tid == t.tid));
            ThreadRow {
                split: CpuSplit {
                    running_ns: sched.map(|x| x.running_ns),
                    runqueue_wait_ns: sched.map(|x| x.runq_ns),
                    frozen_ns: Some(t.frozen_ns),
                    missing: match (thread_cpu, sched) {
                        (_, Some(_)) => vec![],
                        (None, _) => vec![NO_RUNNING.to_string()],
                        (Some(_), None) => vec![
                            "running, runqueue_wait: the thread is not in end.thread_cpu.top"
                                .into(),
                        ],
                    },
                },
                freezes: t,
            }
        })
        .collect()
}

/// The processes as a tree: each with its depth under the first of its
/// ancestors in the list, parents before their children (by pid); a
/// process whose parent is not in the list is a root.
pub fn process_tree(
    list: &[crate::model::ProcessFreezes],
) -> Vec<(usize, &crate::model::ProcessFreezes)> {
    let pids: std::collections::BTreeSet<u32> = list.iter().map(|p| p.pid).collect();
    let mut children: std::collections::BTreeMap<u32, Vec<&crate::model::ProcessFreezes>> =
        Default::default();
    let mut roots = Vec::new();
    for p in list {
        match p.ppid.filter(|pp| pids.contains(pp) && *pp != p.pid) {
            Some(pp) => children.entry(pp).or_default().push(p),
            None => roots.push(p),
        }
    }
    roots.sort_by_key(|p| (!p.main, p.pid));
    let mut out = Vec::with_capacity(list.len());
    let mut stack: Vec<(usize, &crate::model::ProcessFreezes)> =
        roots.into_iter().rev().map(|p| (0, p)).collect();
    let mut seen = std::collections::BTreeSet::new();
    while let Some((depth, p)) = stack.pop() {
        if !seen.insert(p.pid) {
            continue;
        }
        out.push((depth, p));
        let mut kids = children.remove(&p.pid).unwrap_or_default();
        kids.sort_by_key(|k| std::cmp::Reverse(k.pid));
        stack.extend(kids.into_iter().map(|k| (depth + 1, k)));
    }
    // A cycle in the parents (pid reuse across the log): nothing is dropped.
    for p in list {
        if !seen.contains(&p.pid) {
            out.push((0, p));
            seen.insert(p.pid);
        }
    }
    out
}

/// What the controller did to the limit over the log: how many changes,
/// the quota in CPUs at the start, at most and at the end.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimitChanges {
    pub changes: usize,
    pub start_cpus: f64,
    pub peak_cpus: f64,
    pub end_cpus: f64,
}

impl LimitChanges {
    pub fn of(list: &[ControlAt]) -> Option<LimitChanges> {
        let cpus = |b: &throttlewatch_core::logfmt::control::Bandwidth| {
            b.quota_us as f64 / b.period_us.max(1) as f64
        };
        let (first, last) = (list.first()?, list.last()?);
        Some(LimitChanges {
            changes: list.len(),
            start_cpus: cpus(&first.record.before),
            peak_cpus: list
                .iter()
                .map(|c| cpus(&c.record.after))
                .fold(0.0, f64::max),
            end_cpus: cpus(&last.record.after),
        })
    }
}

impl std::fmt::Display for LimitChanges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the controller changed the limit {} times: {:.2} CPUs at the start, {:.2} at most, {:.2} at the end (the figures below are for the whole log)",
            self.changes, self.start_cpus, self.peak_cpus, self.end_cpus
        )
    }
}

/// The controller's changes, each at its time since the log's start.
fn controls_at(c: &Container) -> Vec<ControlAt> {
    c.controls
        .iter()
        .map(|(ts, r)| ControlAt {
            at_ns: ts.saturating_sub(c.start_ts.unwrap_or(*ts)),
            record: r.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use throttlewatch_core::logfmt::{LimitAbove, Record, Start, Throttle};

    use super::*;

    #[test]
    fn processes_are_drawn_as_a_tree() {
        let p = |pid, ppid: Option<u32>, main| crate::model::ProcessFreezes {
            pid,
            ppid,
            main,
            ..Default::default()
        };
        // 10 the main process, 11 and 12 its children, 13 a grandchild,
        // 20 one whose parent is outside the container; 30 and 31 each
        // other's parent (pid reuse).
        let list = vec![
            p(13, Some(12), false),
            p(20, Some(1), false),
            p(12, Some(10), false),
            p(10, Some(1), true),
            p(11, Some(10), false),
            p(30, Some(31), false),
            p(31, Some(30), false),
        ];
        let tree: Vec<(usize, u32)> = process_tree(&list)
            .into_iter()
            .map(|(d, p)| (d, p.pid))
            .collect();
        assert_eq!(
            tree,
            vec![
                (0, 10),
                (1, 11),
                (1, 12),
                (2, 13),
                (0, 20),
                (0, 30),
                (0, 31)
            ]
        );
    }

    fn freeze(by: u64, frozen_ns: u64) -> Record {
        Record::Throttle(Throttle {
            tid: 1,
            cgroup_id: 7,
            throttled_cgroup_id: by,
            start_ns: 1_000,
            frozen_ns,
            ..Default::default()
        })
    }

    #[test]
    fn frozen_time_is_split_by_the_level_whose_quota_froze_it() {
        let mut c = Container::default();
        c.add(
            0,
            Record::Start(Start {
                cgroup_path: "/kubepods/burstable/pod1/c".into(),
                cgroup_id: 7,
                quota_us: Some(50_000),
                period_us: 100_000,
                limits_above: vec![LimitAbove {
                    cgroup_path: "/kubepods/burstable/pod1".into(),
                    cgroup_id: 5,
                    quota_us: 30_000,
                    period_us: 100_000,
                    burst_us: Some(0),
                }],
                ..Default::default()
            }),
        );
        c.add(1, freeze(5, 30));
        c.add(2, freeze(7, 10));
        c.add(3, freeze(5, 40));
        let l = levels(&c);
        assert_eq!(l.len(), 2, "{l:?}");
        assert_eq!((l[0].level, l[0].frozen_ns), ("pod", 70));
        assert_eq!(l[0].cgroup_path, "/kubepods/burstable/pod1");
        assert!((l[0].share - 0.875).abs() < 1e-9);
        assert_eq!((l[1].level, l[1].frozen_ns), ("container", 10));
        assert!(is_pod_cgroup(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1_2.slice"
        ));
        assert!(!is_pod_cgroup("/system.slice/docker-1.scope"));
    }

    #[test]
    fn a_log_without_limits_above_is_all_the_containers_own() {
        let mut c = Container::default();
        c.add(
            0,
            Record::Start(Start {
                cgroup_id: 7,
                ..Default::default()
            }),
        );
        c.add(1, freeze(7, 30));
        c.add(2, freeze(0, 10));
        let l = levels(&c);
        assert_eq!(l.len(), 1, "{l:?}");
        assert_eq!((l[0].level, l[0].frozen_ns), ("container", 40));
    }
}
