//! Wake-up chains per session: the kernel keeps cumulative figures per
//! edge (wakee cgroup, wakee, waker, kind); each `runq` record carries the
//! interval's differences (its costliest edges), `end` the whole watch's.

use std::collections::HashMap;

use throttlewatch_bpf::runq::RUNQ_SLOTS;
use throttlewatch_bpf::{RunqTotals, WakeEdgeTotals, WakeKey};
use throttlewatch_core::logfmt::wakeups::{
    WakeEdge as LogEdge, WakeRest, WakeTotals, Wakee, Waker, Wakeups, EDGES_AT_END,
    EDGES_PER_INTERVAL,
};

/// Edges a session keeps whole-watch figures for; past it they add to `rest`.
const KEPT_EDGES: usize = 4096;

/// Cumulative (or differenced) figures of one edge.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Figures {
    count: u64,
    wait_ns: u64,
    freezes: u64,
    frozen_ns: u64,
    frozen_hops: u64,
    slots: [u64; RUNQ_SLOTS],
}

impl Figures {
    fn of(e: &WakeEdgeTotals) -> Figures {
        Figures {
            count: e.count,
            wait_ns: e.wait_ns,
            freezes: e.freezes,
            frozen_ns: e.frozen_ns,
            frozen_hops: e.frozen_hops,
            slots: e.slots,
        }
    }

    /// `self - base`; a kernel edge that went and came back (its counts
    /// below the base) starts again from zero.
    fn since(&self, base: &Figures) -> Figures {
        if self.count < base.count || self.freezes < base.freezes {
            return *self;
        }
        let mut d = Figures {
            count: self.count - base.count,
            wait_ns: self.wait_ns.saturating_sub(base.wait_ns),
            freezes: self.freezes - base.freezes,
            frozen_ns: self.frozen_ns.saturating_sub(base.frozen_ns),
            frozen_hops: self.frozen_hops.saturating_sub(base.frozen_hops),
            slots: self.slots,
        };
        for (a, b) in d.slots.iter_mut().zip(base.slots.iter()) {
            *a = a.saturating_sub(*b);
        }
        d
    }

    fn add(&mut self, o: &Figures) {
        self.count += o.count;
        self.wait_ns += o.wait_ns;
        self.freezes += o.freezes;
        self.frozen_ns += o.frozen_ns;
        self.frozen_hops += o.frozen_hops;
        for (a, b) in self.slots.iter_mut().zip(o.slots.iter()) {
            *a += *b;
        }
    }

    fn is_empty(&self) -> bool {
        self.count == 0 && self.freezes == 0
    }

    fn cost(&self) -> u64 {
        self.wait_ns.saturating_add(self.frozen_ns)
    }
}

/// What names an edge in the log.
#[derive(Debug, Clone, Default)]
struct Names {
    wakee_pid: u32,
    waker_comm: String,
    wakee_comm: String,
}

#[derive(Debug, Clone, Default)]
struct Kept {
    figures: Figures,
    max_ns: u64,
    names: Names,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct WakeTracker {
    /// The kernel's cumulative figures at the last look.
    last: HashMap<WakeKey, Figures>,
    /// Since the watch began.
    total: HashMap<WakeKey, Kept>,
    /// Edges past `KEPT_EDGES`, summed, and how many.
    overflow: (Figures, u64),
}

fn log_edge(k: &WakeKey, f: &Figures, max_ns: u64, n: &Names) -> LogEdge {
    let q = RunqTotals {
        slots: f.slots,
        ..Default::default()
    };
    let max_ns = if f.count == 0 { 0 } else { max_ns };
    LogEdge {
        waker: Waker {
            kind: k.kind.as_str().into(),
            tid: k.waker_tid,
            pid: k.waker_tgid,
            comm: n.waker_comm.clone(),
        },
        wakee: Wakee {
            tid: k.wakee_tid,
            pid: n.wakee_pid,
            comm: n.wakee_comm.clone(),
        },
        count: f.count,
        wait_ns: f.wait_ns,
        p50_ns: q.quantile(0.50, max_ns),
        p99_ns: q.quantile(0.99, max_ns),
        max_ns,
        freezes: f.freezes,
        frozen_ns: f.frozen_ns,
        frozen_hops: f.frozen_hops,
    }
}

/// The record of `edges` (figures, max, names): the costliest `keep`, the
/// rest summed. None when nothing happened and nothing was dropped.
fn record(
    mut edges: Vec<(WakeKey, Figures, u64, Names)>,
    keep: usize,
    extra_rest: (Figures, u64),
    dropped: u64,
) -> Option<Wakeups> {
    if edges.is_empty() && extra_rest.1 == 0 && dropped == 0 {
        return None;
    }
    let mut by_waker = std::collections::BTreeMap::<String, WakeTotals>::new();
    for (k, f, _, _) in &edges {
        let t = by_waker.entry(k.kind.as_str().into()).or_default();
        t.count += f.count;
        t.wait_ns += f.wait_ns;
        t.frozen_ns += f.frozen_ns;
    }
    if extra_rest.1 > 0 {
        let t = by_waker.entry("unlisted".into()).or_default();
        t.count += extra_rest.0.count;
        t.wait_ns += extra_rest.0.wait_ns;
        t.frozen_ns += extra_rest.0.frozen_ns;
    }
    // Three quarters of the places go to the costliest edges, the rest to
    // the most frequent of the others: a periodic pipeline's cheap hops
    // (a timer's wake-up every round) stay listed beside start-up's
    // one-off costly ones. Listed costliest first.
    edges.sort_by(|a, b| b.1.cost().cmp(&a.1.cost()).then(a.0.cmp(&b.0)));
    let by_cost = keep - keep / 4;
    if edges.len() > keep {
        edges[by_cost..]
            .sort_by(|a, b| b.1.count.cmp(&a.1.count).then(b.1.cost().cmp(&a.1.cost())));
        edges[by_cost..keep].sort_by(|a, b| b.1.cost().cmp(&a.1.cost()).then(a.0.cmp(&b.0)));
    }
    let (mut rest, mut n) = extra_rest;
    for (_, f, _, _) in edges.iter().skip(keep) {
        rest.add(f);
        n += 1;
    }
    edges.truncate(keep);
    Some(Wakeups {
        edges: edges
            .iter()
            .map(|(k, f, m, names)| log_edge(k, f, *m, names))
            .collect(),
        rest: (n > 0).then_some(WakeRest {
            edges: n,
            count: rest.count,
            wait_ns: rest.wait_ns,
            freezes: rest.freezes,
            frozen_ns: rest.frozen_ns,
            frozen_hops: rest.frozen_hops,
        }),
        dropped,
        by_waker,
    })
}

impl WakeTracker {
    /// Take in the kernel's cumulative edges of this session's cgroup: the
    /// whole-watch figures grow; returns what changed since the last look
    /// (with the interval's longest wait and the names).
    fn absorb(&mut self, edges: &[WakeEdgeTotals]) -> Vec<(WakeKey, Figures, u64, Names)> {
        let mut changed = Vec::new();
        for e in edges {
            let now = Figures::of(e);
            let d = now.since(self.last.get(&e.key).unwrap_or(&Figures::default()));
            self.last.insert(e.key, now);
            if d.is_empty() {
                continue;
            }
            let names = Names {
                wakee_pid: e.wakee_tgid,
                waker_comm: e.waker_comm.clone(),
                wakee_comm: e.wakee_comm.clone(),
            };
            let full = self.total.len() >= KEPT_EDGES;
            match self.total.get_mut(&e.key) {
                Some(k) => {
                    k.figures.add(&d);
                    k.max_ns = k.max_ns.max(e.max_ns);
                }
                None if full => {
                    self.overflow.0.add(&d);
                    self.overflow.1 += 1;
                }
                None => {
                    self.total.insert(
                        e.key,
                        Kept {
                            figures: d,
                            max_ns: e.max_ns,
                            names: names.clone(),
                        },
                    );
                }
            }
            changed.push((e.key, d, e.interval_max_ns, names));
        }
        changed
    }

    /// The interval's `runq.wakeups`. `dropped`: wake-ups the kernel could
    /// not count in the interval.
    pub(crate) fn interval(&mut self, edges: &[WakeEdgeTotals], dropped: u64) -> Option<Wakeups> {
        let changed = self.absorb(edges);
        record(changed, EDGES_PER_INTERVAL, Default::default(), dropped)
    }

    /// The whole watch's, for `end.runq.wakeups`.
    pub(crate) fn total(&self, dropped: u64) -> Option<Wakeups> {
        let all = self
            .total
            .iter()
            .map(|(k, v)| (*k, v.figures, v.max_ns, v.names.clone()))
            .collect();
        record(all, EDGES_AT_END, self.overflow, dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use throttlewatch_bpf::WakerKind;

    fn edge(wakee: u32, waker: u32, kind: WakerKind, count: u64, wait: u64) -> WakeEdgeTotals {
        let mut slots = [0; RUNQ_SLOTS];
        slots[10] = count;
        WakeEdgeTotals {
            key: WakeKey {
                cgroup_id: 7,
                wakee_tid: wakee,
                waker_tid: waker,
                waker_tgid: waker,
                kind,
            },
            wakee_tgid: wakee,
            waker_cgroup_id: 7,
            waker_comm: format!("w{waker}"),
            wakee_comm: format!("e{wakee}"),
            count,
            wait_ns: wait,
            max_ns: 1500,
            interval_max_ns: 1500,
            freezes: 0,
            frozen_ns: 0,
            frozen_hops: 0,
            slots,
        }
    }

    #[test]
    fn intervals_are_differences_and_the_end_sums_them() {
        let mut t = WakeTracker::default();
        let a = edge(2, 1, WakerKind::Same, 10, 10_000);
        let r = t.interval(std::slice::from_ref(&a), 0).unwrap();
        assert_eq!((r.edges.len(), r.edges[0].count), (1, 10));
        assert_eq!(r.edges[0].waker.kind, "same");
        assert_eq!(r.edges[0].wakee.comm, "e2");
        let mut b = a.clone();
        b.count = 15;
        b.wait_ns = 16_000;
        b.slots[10] = 15;
        b.frozen_ns = 9_000;
        b.freezes = 2;
        b.frozen_hops = 1;
        let r = t.interval(&[b.clone()], 3).unwrap();
        assert_eq!(
            (
                r.edges[0].count,
                r.edges[0].wait_ns,
                r.edges[0].frozen_ns,
                r.dropped
            ),
            (5, 6_000, 9_000, 3)
        );
        assert!(t.interval(&[b.clone()], 0).is_none(), "nothing changed");
        let end = t.total(3).unwrap();
        assert_eq!((end.edges[0].count, end.edges[0].wait_ns), (15, 16_000));
    }

    #[test]
    fn a_recreated_kernel_edge_starts_from_zero() {
        let mut t = WakeTracker::default();
        t.interval(&[edge(2, 1, WakerKind::Host, 10, 10_000)], 0);
        // The agent removed the kernel's edge; it came back with 4.
        let r = t
            .interval(&[edge(2, 1, WakerKind::Host, 4, 4_000)], 0)
            .unwrap();
        assert_eq!(r.edges[0].count, 4);
        assert_eq!(t.total(0).unwrap().edges[0].count, 14);
    }

    #[test]
    fn frequent_cheap_edges_keep_places_beside_costly_one_offs() {
        let mut t = WakeTracker::default();
        // 20 one-off edges of 1 ms each, and a timer's 100 wake-ups of 5 us.
        let mut edges: Vec<WakeEdgeTotals> = (0..20)
            .map(|i| edge(100 + i, 1, WakerKind::Same, 1, 1_000_000))
            .collect();
        edges.push(edge(7, 0, WakerKind::Interrupt, 100, 500_000));
        let r = t.interval(&edges, 0).unwrap();
        assert_eq!(r.edges.len(), EDGES_PER_INTERVAL);
        assert!(
            r.edges
                .iter()
                .any(|e| e.waker.kind == "interrupt" && e.count == 100),
            "the periodic edge is listed: {:?}",
            r.edges
        );
        let costs: Vec<u64> = r.edges.iter().map(|e| e.cost_ns()).collect();
        assert!(
            costs.windows(2).all(|w| w[0] >= w[1]),
            "costliest first: {costs:?}"
        );
    }

    #[test]
    fn records_keep_the_costliest_edges_and_sum_the_rest() {
        let mut t = WakeTracker::default();
        let edges: Vec<WakeEdgeTotals> = (0..20)
            .map(|i| edge(100 + i, 1, WakerKind::Same, 1, 1_000 * (u64::from(i) + 1)))
            .collect();
        let r = t.interval(&edges, 0).unwrap();
        assert_eq!(r.edges.len(), EDGES_PER_INTERVAL);
        assert_eq!(r.edges[0].wait_ns, 20_000, "costliest first");
        let rest = r.rest.unwrap();
        assert_eq!((rest.edges, rest.count), (12, 12));
        let shown: u64 = r.edges.iter().map(|e| e.wait_ns).sum();
        assert_eq!(
            shown + rest.wait_ns,
            (1..=20).map(|i| i * 1_000).sum::<u64>()
        );
    }
}
