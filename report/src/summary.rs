//! The report as data: what the terminal, the HTML page and `--json` show.
//! A figure the log does not hold is `null` with the reason in `missing`.

use serde::Serialize;
use throttlewatch_core::logfmt::{ColdStart, Runq};

use crate::heatmap::Grid;
use crate::histogram::Quantiles;
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
    pub cold_start: Option<ColdStart>,
    /// The dynamic CPU controller's changes on the timeline (docs/control.md).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub controls: Vec<ControlAt>,
    pub recommendations: Vec<Recommendation>,
    /// `--what-if`: the settings asked about and the predicted throttled time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub what_if: Option<crate::recommend::WhatIfResult>,
    pub heatmaps: Heatmaps,
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
    let ncpus = start
        .cpus
        .as_deref()
        .and_then(|s| throttlewatch_core::cpulist::CpuList::parse("cpus", s).ok())
        .map_or(1, |l| l.len().max(1)) as f64;
    let kernel = c.kernel_throttled_ns();
    let frozen_share = kernel
        .filter(|_| wall > 0)
        .map(|k| k as f64 / (wall as f64 * ncpus));
    let (nr_periods, nr_throttled) = c.periods_throttled().unzip();
    let runq = c.runq();
    let thread_cpu = c.end.as_ref().and_then(|e| e.thread_cpu.as_ref());
    let mut missing = vec![];
    if thread_cpu.is_none() {
        missing.push(NO_RUNNING.to_string());
    }
    if runq.is_none() {
        missing.push(
            "runqueue_wait: no run-queue figures (raw_tp probe, or no runq record yet)".into(),
        );
    }
    let split = CpuSplit {
        running_ns: thread_cpu.map(|t| t.running_ns),
        runqueue_wait_ns: runq.as_ref().map(|r| r.total_ns),
        frozen_ns: Some(c.frozen_ns()),
        missing,
    };
    let top = c.top_threads(TOP_THREADS);
    let names: Vec<(u32, String)> = top.iter().map(|t| (t.tid, t.comm.clone())).collect();
    let top_threads = top
        .into_iter()
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
        .collect();
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
        cold_start: c.cold_start.clone(),
        controls: c
            .controls
            .iter()
            .map(|(ts, r)| ControlAt {
                at_ns: ts.saturating_sub(c.start_ts.unwrap_or(*ts)),
                record: r.clone(),
            })
            .collect(),
        recommendations: recommend(c),
        what_if: None,
        heatmaps: Heatmaps {
            latency: c.heat.latency(),
            offset: c.heat.offset(),
            threads: c.heat.threads(&names),
        },
    }
}
