//! The wake-up graph as the report holds it: nodes (threads, the
//! interrupts), edges waker -> wakee, and the critical path through them.
//! Built in wakeups.rs, laid out and searched in wakeups_path.rs.

use std::collections::BTreeMap;

use serde::Serialize;
use throttlewatch_core::logfmt::wakeups::{WakeEdge, WakeRest, WakeTotals};

/// What a node is: a thread of the container (a wakee, or a waker of kind
/// `same`), a thread of another watched container, of the host, or the
/// interrupts (one node for all of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeKind {
    Same,
    Other,
    Host,
    Interrupt,
}

impl NodeKind {
    /// The log's `waker.kind`; an unknown one is the host's (not ours).
    pub fn of_waker(kind: &str) -> NodeKind {
        match kind {
            "same" => NodeKind::Same,
            "other" => NodeKind::Other,
            "interrupt" => NodeKind::Interrupt,
            _ => NodeKind::Host,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            NodeKind::Same => "same",
            NodeKind::Other => "other",
            NodeKind::Host => "host",
            NodeKind::Interrupt => "interrupt",
        }
    }
}

/// One thread of the graph (or the interrupts).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WakeNode {
    pub kind: NodeKind,
    pub tid: u32,
    pub pid: u32,
    pub comm: String,
    /// Its column in the drawing: the longest path to it from a source,
    /// back-edges left out.
    pub layer: usize,
}

impl WakeNode {
    /// `comm/tid`, `interrupt`, with the kind for threads not the container's.
    pub fn label(&self) -> String {
        match self.kind {
            NodeKind::Interrupt => "interrupt".into(),
            NodeKind::Same => format!("{}/{}", self.comm, self.tid),
            NodeKind::Other => format!("{}/{} (other container)", self.comm, self.tid),
            NodeKind::Host => format!("{}/{} (host)", self.comm, self.tid),
        }
    }

    /// The name in a path sentence: its comm (`interrupt` for those).
    pub fn name(&self) -> String {
        match self.kind {
            NodeKind::Interrupt => "interrupt".into(),
            _ if self.comm.is_empty() => format!("tid {}", self.tid),
            _ => self.comm.clone(),
        }
    }
}

/// One edge of the graph: the log's figures, its nodes, and how the graph
/// treats it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChainEdge {
    /// Indices into `nodes`.
    pub from: usize,
    pub to: usize,
    #[serde(flatten)]
    pub edge: WakeEdge,
    /// wait_ns / count (null without wake-ups).
    pub mean_wait_ns: Option<u64>,
    /// A thread woken by itself (another of its wake-ups' paths): no hop.
    pub self_edge: bool,
    /// Closes a cycle: left out of the layers and the critical path.
    pub back_edge: bool,
    pub on_critical_path: bool,
}

/// The report's wake-up chains (`wakeups` in `--json`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WakeReport {
    /// `end` (end.runq.wakeups: the whole watch's costliest edges) or
    /// `intervals` (the runq records' edges summed: each interval's
    /// costliest only).
    pub source: &'static str,
    pub nodes: Vec<WakeNode>,
    /// Costliest (wait + frozen) first, at most [`EDGES_AT_END`](throttlewatch_core::logfmt::wakeups::EDGES_AT_END).
    pub edges: Vec<ChainEdge>,
    /// What the log's edges left out, summed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rest: Option<WakeRest>,
    /// Wake-ups the kernel could not count (its edge map was full).
    pub dropped: u64,
    /// All the wake-ups (the edges listed or not) by the waker's kind
    /// (empty in logs of agents before it).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub by_waker: BTreeMap<String, WakeTotals>,
    /// Edges past [`EDGES_AT_END`](throttlewatch_core::logfmt::wakeups::EDGES_AT_END) (or [`MAX_SUMMED_EDGES`](crate::wakeups::MAX_SUMMED_EDGES)) left out here.
    pub left_out: u64,
    pub critical_path: Option<CriticalPath>,
}

/// One hop of the critical path.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PathHop {
    /// Index into `edges`.
    pub edge: usize,
    pub waker: String,
    pub wakee: String,
    pub count: u64,
    /// (wait + frozen) / max(count, rounds), and its two parts.
    pub per_round_ns: u64,
    pub wait_per_round_ns: u64,
    pub frozen_per_round_ns: u64,
    /// `round`, or `wake-up` where the hop woke more often than once a round.
    pub costed_per: &'static str,
    /// Its wake-ups that saw a freeze of the wakee (frozen_hops / count).
    pub frozen_share: f64,
}

/// The path through the graph whose hops add the most latency a round.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CriticalPath {
    pub rounds: u64,
    /// How many edges share that count (within 2 %).
    pub rounds_edges: usize,
    pub hops: Vec<PathHop>,
    pub per_round_ns: u64,
    pub frozen_per_round_ns: u64,
    /// The terminal's sentence.
    pub sentence: String,
}

impl WakeReport {
    /// A node's name in a sentence: its comm, with its tid where another
    /// of `among` has the same comm.
    pub fn name(&self, n: usize, among: &[usize]) -> String {
        let node = &self.nodes[n];
        let base = node.name();
        let twins = among
            .iter()
            .filter(|&&m| m != n && self.nodes[m].name() == base)
            .count();
        match (twins > 0, node.kind) {
            (true, k) if k != NodeKind::Interrupt => format!("{base}/{}", node.tid),
            _ => base,
        }
    }

    /// `tw-src/123 -> tw-pipe/124  200 wake-ups, wait p50 12µs p99 60µs,
    /// frozen 0ms` (the terminal's and the table's line for an edge).
    pub fn describe(&self, e: &ChainEdge) -> String {
        let opt = |v: Option<u64>| v.map_or("-".into(), crate::heatmap::short);
        let mut s = format!(
            "{} -> {}  {} wake-up{}, wait p50 {} p99 {}, frozen {}",
            self.nodes[e.from].label(),
            self.nodes[e.to].label(),
            e.edge.count,
            if e.edge.count == 1 { "" } else { "s" },
            opt(e.edge.p50_ns),
            opt(e.edge.p99_ns),
            crate::heatmap::short(e.edge.frozen_ns)
        );
        if e.edge.frozen_hops > 0 {
            s.push_str(&format!(
                " ({} of {} wake-ups)",
                e.edge.frozen_hops, e.edge.count
            ));
        }
        s
    }
}
