//! Wake-up chains in the log: who woke the container's threads, how long
//! each woken thread then waited to run, and how much of the work each
//! wakeup started was frozen by the quota (`runq.wakeups`, `end.runq.wakeups`;
//! docs/log-format.md).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Edges in a `runq` record: the interval's costliest by wait + frozen time
/// (three quarters of them), then its most frequent of the others.
pub const EDGES_PER_INTERVAL: usize = 8;
/// Edges in `end.runq.wakeups`, chosen the same way over the whole watch.
pub const EDGES_AT_END: usize = 32;

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// The wake-ups of one span.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wakeups {
    /// The span's listed edges, costliest first.
    pub edges: Vec<WakeEdge>,
    /// What the edges left out add up to (absent when none was).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rest: Option<WakeRest>,
    /// Wake-ups not counted: the kernel's edge map was full.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dropped: u64,
    /// All the span's edges (listed or not) by the waker's kind.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_waker: BTreeMap<String, WakeTotals>,
}

/// Wake-ups of one kind of waker, summed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WakeTotals {
    pub count: u64,
    pub wait_ns: u64,
    pub frozen_ns: u64,
}

/// Who woke: `kind` is `same` (a thread of this container), `other`
/// (another watched container), `host` (any other thread) or `interrupt`
/// (hard or soft interrupt: tid and pid 0, no comm).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waker {
    pub kind: String,
    pub tid: u32,
    pub pid: u32,
    #[serde(default)]
    pub comm: String,
}

/// The woken thread (always the container's).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wakee {
    pub tid: u32,
    pub pid: u32,
    #[serde(default)]
    pub comm: String,
}

/// One edge waker -> wakee over the span.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WakeEdge {
    pub waker: Waker,
    pub wakee: Wakee,
    /// Wake-ups (from `sched_waking`) that ended in a switch-in of the wakee.
    pub count: u64,
    /// Their wake -> switch-in times, summed (a part frozen before the
    /// wakee first ran included).
    pub wait_ns: u64,
    /// From the kernel's log2 histogram of those times; null without wake-ups.
    pub p50_ns: Option<u64>,
    pub p99_ns: Option<u64>,
    pub max_ns: u64,
    /// Freezes of the wakee in the work these wake-ups started (until its
    /// next wake-up), their summed time, and the wake-ups that saw one.
    pub freezes: u64,
    pub frozen_ns: u64,
    pub frozen_hops: u64,
}

impl WakeEdge {
    /// What the edge cost the wakee: waiting to run plus frozen in the work.
    pub fn cost_ns(&self) -> u64 {
        self.wait_ns.saturating_add(self.frozen_ns)
    }
}

/// The sum of the edges a record left out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WakeRest {
    pub edges: u64,
    pub count: u64,
    pub wait_ns: u64,
    pub freezes: u64,
    pub frozen_ns: u64,
    pub frozen_hops: u64,
}
