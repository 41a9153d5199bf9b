//! Wake-up chains: who woke the container's threads and what each hop cost,
//! from `end.runq.wakeups` (the whole watch) or, without it, the `runq`
//! records' edges summed (docs/log-format.md), drawn as a graph whose nodes
//! are threads (and the interrupts) and whose edges are waker -> wakee. The
//! critical path of a periodic pipeline is in wakeups_path.rs, the SVG in
//! wakeups_svg.rs.

use std::collections::{BTreeMap, HashMap};

use throttlewatch_core::logfmt::wakeups::{WakeEdge, WakeRest, WakeTotals, Wakeups, EDGES_AT_END};
use throttlewatch_core::logfmt::Record;

use crate::model::Container;
pub use crate::wake_graph::{ChainEdge, CriticalPath, NodeKind, PathHop, WakeNode, WakeReport};

/// Distinct edges kept while the intervals are summed (each record brings
/// at most 8; the rest are counted in `left_out`).
pub const MAX_SUMMED_EDGES: usize = 4096;

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
    let (nodes, edges) = nodes_and_edges(w.edges);
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

/// The graph's nodes (one per thread, one for the interrupts) and its
/// edges between them, in the log's order.
fn nodes_and_edges(log_edges: Vec<WakeEdge>) -> (Vec<WakeNode>, Vec<ChainEdge>) {
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
    let mut edges = Vec::with_capacity(log_edges.len());
    for e in log_edges {
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
    (nodes, edges)
}

#[cfg(test)]
#[path = "wakeups_tests.rs"]
mod tests;
