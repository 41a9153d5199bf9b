//! Wake-up chains: who woke the container's threads and what each hop cost,
//! from `end.runq.wakeups` (the whole watch) or, without it, the `runq`
//! records' edges summed (docs/log-format.md), drawn as a graph whose nodes
//! are threads (and the interrupts) and whose edges are waker -> wakee. The
//! critical path of a periodic pipeline is in wakeups_path.rs, the SVG in
//! wakeups_svg.rs.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use throttlewatch_core::logfmt::wakeups::{WakeEdge, WakeRest, WakeTotals, Wakeups, EDGES_AT_END};
use throttlewatch_core::logfmt::Record;

use crate::model::Container;
pub use crate::wakeups_path::{CriticalPath, PathHop};

/// Distinct edges kept while the intervals are summed (each record brings
/// at most 8; the rest are counted in `left_out`).
pub const MAX_SUMMED_EDGES: usize = 4096;

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
    /// Costliest (wait + frozen) first, at most [`EDGES_AT_END`].
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
    /// Edges past [`EDGES_AT_END`] (or [`MAX_SUMMED_EDGES`]) left out here.
    pub left_out: u64,
    pub critical_path: Option<CriticalPath>,
}

/// An edge summed over intervals: the p50s weighted by wake-ups.
#[derive(Debug, Clone, Default)]
struct Summed {
    edge: WakeEdge,
    p50_weighted: u128,
    p50_count: u64,
}

/// The `runq` records' edges as the log is read.
#[derive(Debug, Default)]
pub struct IntervalEdges {
    edges: HashMap<(String, u32, u32), Summed>,
    by_waker: BTreeMap<String, WakeTotals>,
    rest: Option<WakeRest>,
    dropped: u64,
    left_out: u64,
}

impl IntervalEdges {
    /// A record: a `runq` one's edges are summed, the rest ignored.
    pub fn add(&mut self, rec: &Record) {
        let Record::Runq(r) = rec else { return };
        let Some(w) = &r.wakeups else { return };
        self.dropped += w.dropped;
        for (kind, x) in &w.by_waker {
            // A bounded map: the kinds are four.
            let t = self.by_waker.entry(kind.clone()).or_default();
            t.count += x.count;
            t.wait_ns = t.wait_ns.saturating_add(x.wait_ns);
            t.frozen_ns = t.frozen_ns.saturating_add(x.frozen_ns);
        }
        if let Some(x) = &w.rest {
            add_rest(self.rest.get_or_insert_with(WakeRest::default), x);
        }
        for e in &w.edges {
            let key = (e.waker.kind.clone(), e.waker.tid, e.wakee.tid);
            if !self.edges.contains_key(&key) && self.edges.len() >= MAX_SUMMED_EDGES {
                self.left_out += 1;
                continue;
            }
            add_edge(self.edges.entry(key).or_default(), e);
        }
    }

    /// The graph: from `end.runq.wakeups` when the log has it, else from
    /// the intervals; none without edges.
    pub fn report(self, c: &Container) -> Option<WakeReport> {
        let end = c
            .end
            .as_ref()
            .and_then(|e| e.runq.as_ref())
            .and_then(|r| r.wakeups.as_ref());
        match end {
            Some(w) => graph("end", w.clone(), 0),
            None => {
                let edges = self.edges.into_values().map(Summed::finish).collect();
                let w = Wakeups {
                    edges,
                    rest: self.rest,
                    dropped: self.dropped,
                    by_waker: self.by_waker,
                };
                graph("intervals", w, self.left_out)
            }
        }
    }
}

impl Summed {
    fn finish(mut self) -> WakeEdge {
        self.edge.p50_ns = (self.p50_count > 0)
            .then(|| (self.p50_weighted / self.p50_count as u128) as u64)
            .map(|p| p.min(self.edge.max_ns));
        self.edge
    }
}

/// Sums `e` into `s`: counts and times add, max and p99 are the largest
/// (p99 so an upper bound), p50 the intervals' weighted by their wake-ups.
fn add_edge(s: &mut Summed, e: &WakeEdge) {
    let t = &mut s.edge;
    if t.count == 0 && t.wait_ns == 0 && t.waker.kind.is_empty() {
        t.waker = e.waker.clone();
        t.wakee = e.wakee.clone();
    }
    if !e.wakee.comm.is_empty() {
        t.wakee.comm.clone_from(&e.wakee.comm);
    }
    if !e.waker.comm.is_empty() {
        t.waker.comm.clone_from(&e.waker.comm);
    }
    t.count += e.count;
    t.wait_ns = t.wait_ns.saturating_add(e.wait_ns);
    t.max_ns = t.max_ns.max(e.max_ns);
    t.p99_ns = t.p99_ns.max(e.p99_ns);
    t.freezes += e.freezes;
    t.frozen_ns = t.frozen_ns.saturating_add(e.frozen_ns);
    t.frozen_hops += e.frozen_hops;
    if let Some(p) = e.p50_ns {
        s.p50_weighted += p as u128 * e.count.max(1) as u128;
        s.p50_count += e.count.max(1);
    }
}

fn add_rest(t: &mut WakeRest, x: &WakeRest) {
    t.edges += x.edges;
    t.count += x.count;
    t.wait_ns = t.wait_ns.saturating_add(x.wait_ns);
    t.freezes += x.freezes;
    t.frozen_ns = t.frozen_ns.saturating_add(x.frozen_ns);
    t.frozen_hops += x.frozen_hops;
}

/// The node key: the container's threads by tid (as wakee or `same`
/// waker), other wakers by kind and tid, the interrupts as one.
fn node_key(kind: NodeKind, tid: u32) -> (NodeKind, u32) {
    match kind {
        NodeKind::Interrupt => (kind, 0),
        _ => (kind, tid),
    }
}

/// The graph of `w`'s edges (costliest first, at most [`EDGES_AT_END`]),
/// its layers and its critical path; none without edges.
pub fn graph(source: &'static str, mut w: Wakeups, left_out: u64) -> Option<WakeReport> {
    w.edges
        .sort_by(|a, b| b.cost_ns().cmp(&a.cost_ns()).then(b.count.cmp(&a.count)));
    let left_out = left_out + w.edges.len().saturating_sub(EDGES_AT_END) as u64;
    w.edges.truncate(EDGES_AT_END);
    if w.edges.is_empty() {
        return None;
    }
    let mut nodes: Vec<WakeNode> = Vec::new();
    // A node's comm: as a wakee before as a waker (the waker's can be the
    // name before the thread set its own), from the edge with the most
    // wake-ups: (is a wakee, count) of the comm taken.
    let mut named: Vec<(bool, u64)> = Vec::new();
    let mut index: HashMap<(NodeKind, u32), usize> = HashMap::new();
    let mut node = |kind: NodeKind, tid: u32, pid: u32, comm: &str, rank: (bool, u64)| {
        let at = *index.entry(node_key(kind, tid)).or_insert_with(|| {
            nodes.push(WakeNode {
                kind,
                tid,
                pid,
                comm: String::new(),
                layer: 0,
            });
            named.push((false, 0));
            nodes.len() - 1
        });
        if kind != NodeKind::Interrupt
            && !comm.is_empty()
            && (nodes[at].comm.is_empty() || rank > named[at])
        {
            nodes[at].comm = comm.to_string();
            named[at] = rank;
        }
        at
    };
    let mut edges = Vec::with_capacity(w.edges.len());
    for e in w.edges {
        let kind = NodeKind::of_waker(&e.waker.kind);
        let from = node(
            kind,
            e.waker.tid,
            e.waker.pid,
            &e.waker.comm,
            (false, e.count),
        );
        let to = node(
            NodeKind::Same,
            e.wakee.tid,
            e.wakee.pid,
            &e.wakee.comm,
            (true, e.count),
        );
        edges.push(ChainEdge {
            from,
            to,
            mean_wait_ns: (e.count > 0).then(|| e.wait_ns / e.count),
            edge: e,
            self_edge: from == to,
            back_edge: false,
            on_critical_path: false,
        });
    }
    let mut r = WakeReport {
        source,
        nodes,
        edges,
        rest: w.rest,
        dropped: w.dropped,
        by_waker: w.by_waker,
        left_out,
        critical_path: None,
    };
    r.critical_path = crate::wakeups_path::critical_path(&r);
    let path: Vec<usize> = r
        .critical_path
        .iter()
        .flat_map(|p| p.hops.iter().map(|h| h.edge))
        .collect();
    for &i in &path {
        r.edges[i].on_critical_path = true;
    }
    crate::wakeups_path::layer(&mut r, &path);
    Some(r)
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

#[cfg(test)]
#[path = "wakeups_tests.rs"]
mod tests;
