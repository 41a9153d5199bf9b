//! The wake-up graph's critical path and its layers (docs/report.md,
//! "Wake-up chains").
//!
//! Rounds: a count of edges, those within 2 % (or one wake-up) of it taken
//! together, of at least 5. For a number of
//! rounds, the pipeline's hops are the edges with at least 80 % of its
//! wake-ups, their cycles broken (below, along the edges nearest once a
//! round first); each costs (wait + frozen) /
//! max(count, rounds) a round: per round, or per wake-up where a hop woke
//! more often than once a round; its path is the path of pipeline hops
//! that is longest, then nearest once a round, then costliest. The critical path is the path, of all
//! the candidate rounds, that explains the most latency (each hop's wait +
//! frozen, in full where it woke once a round, else by the ratio of its
//! wake-ups to the rounds) times its hops; its rounds are then the count
//! most of its hops share (the smallest on a tie).
//!
//! Back-edges: a depth-first search (from the critical path's first node
//! along its edges, then from the sources, nodes nothing woke, then from
//! the rest, each by its wake-ups out; the edges with the most wake-ups
//! first) marks an edge to a node still on the stack; without those (and
//! self-edges) the graph is a DAG. A node's layer is the longest path to
//! it in hops.

use crate::heatmap::short;
use crate::wake_graph::{ChainEdge, CriticalPath, PathHop, WakeReport};

/// Counts within this share of each other are the same number of rounds.
const SAME_ROUNDS: f64 = 0.02;
/// A hop of the pipeline wakes at least this share of the rounds.
const IN_PIPELINE: f64 = 0.8;
/// Fewer rounds are no periodic pipeline (one-off edges of a start-up).
pub const MIN_ROUNDS: u64 = 5;

/// Back-edges among the edges `allowed`: a depth-first search from the
/// edges `first` lead along (the critical path's, in order), then from the
/// sources (most wake-ups out first), then from the rest, along the
/// `first` edges and then the edges with the most wake-ups; an edge to a
/// node still on the stack is a back-edge.
fn back_edges(
    r: &WakeReport,
    allowed: &dyn Fn(usize) -> bool,
    first: &[usize],
    rounds: Option<u64>,
) -> Vec<bool> {
    let n = r.nodes.len();
    let mut out: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut indeg = vec![0usize; n];
    let mut out_count = vec![0u64; n];
    for (i, e) in r.edges.iter().enumerate() {
        if allowed(i) && !e.self_edge {
            out[e.from].push(i);
            indeg[e.to] += 1;
            out_count[e.from] += e.edge.count;
        }
    }
    for o in out.iter_mut() {
        o.sort_by_key(|&i| {
            let c = r.edges[i].edge.count;
            (
                !first.contains(&i),
                rounds.map_or(0, |n| c.abs_diff(n)),
                std::cmp::Reverse(c),
                i,
            )
        });
    }
    let lead = first.first().map(|&i| r.edges[i].from);
    let mut starts: Vec<usize> = (0..n).collect();
    starts.sort_by_key(|&v| {
        (
            Some(v) != lead,
            indeg[v] > 0,
            std::cmp::Reverse(out_count[v]),
            v,
        )
    });
    // 0 new, 1 on the stack, 2 done.
    let mut state = vec![0u8; n];
    let mut back = vec![false; r.edges.len()];
    for s in starts {
        if state[s] != 0 {
            continue;
        }
        let mut stack: Vec<(usize, usize)> = vec![(s, 0)];
        state[s] = 1;
        while let Some((v, k)) = stack.pop() {
            let Some(&ei) = out[v].get(k) else {
                state[v] = 2;
                continue;
            };
            stack.push((v, k + 1));
            let w = r.edges[ei].to;
            match state[w] {
                0 => {
                    state[w] = 1;
                    stack.push((w, 0));
                }
                1 => back[ei] = true,
                _ => {}
            }
        }
    }
    back
}

/// Flags back-edges (the critical path's edges `first` are never one)
/// and gives each node its layer: the longest path to it over the rest.
pub fn layer(r: &mut WakeReport, first: &[usize]) {
    let back = back_edges(r, &|_| true, first, None);
    for (e, b) in r.edges.iter_mut().zip(back) {
        e.back_edge = b;
    }
    let dag = |i: usize| !r.edges[i].self_edge && !r.edges[i].back_edge;
    let order = topo_order(r, &dag);
    let mut layers = vec![0usize; r.nodes.len()];
    for v in order {
        for (i, e) in r.edges.iter().enumerate() {
            if e.from == v && dag(i) {
                layers[e.to] = layers[e.to].max(layers[v] + 1);
            }
        }
    }
    for (n, l) in r.nodes.iter_mut().zip(layers) {
        n.layer = l;
    }
}

/// The nodes in an order where every edge `dag` takes goes forward (Kahn's).
fn topo_order(r: &WakeReport, dag: &dyn Fn(usize) -> bool) -> Vec<usize> {
    let n = r.nodes.len();
    let mut indeg = vec![0usize; n];
    for (i, e) in r.edges.iter().enumerate() {
        if dag(i) {
            indeg[e.to] += 1;
        }
    }
    let mut ready: Vec<usize> = (0..n).rev().filter(|&v| indeg[v] == 0).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(v) = ready.pop() {
        order.push(v);
        for (i, e) in r.edges.iter().enumerate() {
            if e.from == v && dag(i) {
                indeg[e.to] -= 1;
                if indeg[e.to] == 0 {
                    ready.push(e.to);
                }
            }
        }
    }
    order
}

fn near(a: u64, c: u64) -> bool {
    a.abs_diff(c) as f64 <= (c as f64 * SAME_ROUNDS).max(1.0)
}

/// The rounds of a path: the count most of its hops share (within 2 % or
/// one wake-up; the smallest of such groups on a tie: extra wake-ups, a
/// lock handed back and forth, only add), at least 1.
pub fn path_rounds(counts: &[u64]) -> u64 {
    counts
        .iter()
        .map(|&c| {
            let mut g: Vec<u64> = counts.iter().copied().filter(|&a| near(a, c)).collect();
            g.sort_unstable();
            (g.len(), std::cmp::Reverse(g[(g.len() - 1) / 2]))
        })
        .max()
        .map_or(1, |(_, std::cmp::Reverse(m))| m.max(1))
}

/// Candidate numbers of rounds, each with how many edges agree on it: the
/// median of each group of counts within 2 % (or one wake-up) of each
/// other, at least [`MIN_ROUNDS`].
pub fn round_candidates(counts: &[u64]) -> Vec<(u64, usize)> {
    let mut out: Vec<(u64, usize)> = Vec::new();
    for &c in counts.iter().filter(|c| **c > 0) {
        let mut group: Vec<u64> = counts.iter().copied().filter(|&a| near(a, c)).collect();
        group.sort_unstable();
        let cand = (group[group.len() / 2], group.len());
        if cand.0 >= MIN_ROUNDS && !out.contains(&cand) {
            out.push(cand);
        }
    }
    out.sort_unstable();
    out
}

/// A hop's cost a round: (wait + frozen) / max(count, rounds).
fn hop_cost(e: &ChainEdge, rounds: u64) -> u64 {
    e.edge.cost_ns() / e.edge.count.max(rounds).max(1)
}

/// The costliest path of pipeline hops for `rounds` (the edges with at
/// least 80 % of its wake-ups, their cycles broken as [`back_edges`]
/// does): its edges in order and its cost a round.
fn best_path(r: &WakeReport, rounds: u64) -> Option<(Vec<usize>, u64)> {
    let hop = |i: usize| {
        let e = &r.edges[i];
        !e.self_edge && e.edge.count as f64 >= rounds as f64 * IN_PIPELINE
    };
    // The search takes the edges nearest once a round first: a stage's
    // hand-off is kept and a shortcut back against it broken, not the
    // stage (fc19 in CI: a GIL wait's timer edge, 85 wake-ups in 44
    // rounds, went first and broke tw-src -> tw-pipe).
    let back = back_edges(r, &hop, &[], Some(rounds));
    let dag = |i: usize| hop(i) && !back[i];
    // best[v]: the longest path of hops ending in v (a pipeline is the
    // chain of hand-offs that each happen about once a round: a shortcut
    // such as a lock's timed wait woken by a timer is not one of its
    // stages), of those the one whose hops are nearest once a round, the
    // costliest of those, and its last edge.
    type Score = (usize, std::cmp::Reverse<u64>, u64);
    let mut best: Vec<(Score, Option<usize>)> =
        vec![((0, std::cmp::Reverse(0), 0), None); r.nodes.len()];
    for v in topo_order(r, &dag) {
        for (i, e) in r.edges.iter().enumerate().filter(|(_, e)| e.from == v) {
            let (len, std::cmp::Reverse(off), cost) = best[v].0;
            let c = (
                len + 1,
                std::cmp::Reverse(off + e.edge.count.abs_diff(rounds)),
                cost + hop_cost(e, rounds),
            );
            if dag(i) && (best[e.to].1.is_none() || c > best[e.to].0) {
                best[e.to] = (c, Some(i));
            }
        }
    }
    let end = (0..r.nodes.len())
        .filter(|&v| best[v].1.is_some())
        .max_by_key(|&v| best[v].0)?;
    let mut path = Vec::new();
    let mut v = end;
    while let Some(i) = best[v].1 {
        if path.contains(&i) {
            break;
        }
        path.push(i);
        v = r.edges[i].from;
    }
    path.reverse();
    Some((path, best[end].0 .2))
}

/// The latency `path` explains over `rounds`: each hop's wait + frozen,
/// in full where it woke once a round, else by the ratio of its wake-ups
/// to the rounds (a hop that woke twice as often, or half as often, half).
fn explained(r: &WakeReport, path: &[usize], rounds: u64) -> u128 {
    path.iter()
        .map(|&i| {
            let e = &r.edges[i].edge;
            let (lo, hi) = (e.count.min(rounds), e.count.max(rounds).max(1));
            e.cost_ns() as u128 * lo as u128 / hi as u128
        })
        .sum()
}

/// The critical path; none without a pipeline hop. Of the candidate
/// rounds, the one whose path explains the most latency ([`explained`])
/// times its hops (a pipeline is a chain: one dear hop of a frequency of
/// its own does not outweigh four that agree);
/// then the rounds are those of its hops ([`path_rounds`]).
pub fn critical_path(r: &WakeReport) -> Option<CriticalPath> {
    let counts: Vec<u64> = r
        .edges
        .iter()
        .filter(|e| !e.self_edge)
        .map(|e| e.edge.count)
        .collect();
    let (_, path) = round_candidates(&counts)
        .into_iter()
        .filter_map(|c| {
            best_path(r, c.0).map(|(p, _)| (explained(r, &p, c.0) * p.len() as u128, p))
        })
        .max_by_key(|(score, _)| *score)?;
    let on_path: Vec<u64> = path.iter().map(|&i| r.edges[i].edge.count).collect();
    let rounds = path_rounds(&on_path);
    let rounds_edges = counts.iter().filter(|c| near(**c, rounds)).count();
    let cost = |e: &ChainEdge| hop_cost(e, rounds);
    let mut on_path: Vec<usize> = path.iter().map(|&i| r.edges[i].from).collect();
    on_path.extend(path.last().map(|&i| r.edges[i].to));
    let hops: Vec<PathHop> = path
        .iter()
        .map(|&i| {
            let e = &r.edges[i];
            let per = e.edge.count.max(rounds).max(1);
            PathHop {
                edge: i,
                waker: r.name(e.from, &on_path),
                wakee: r.name(e.to, &on_path),
                count: e.edge.count,
                per_round_ns: cost(e),
                wait_per_round_ns: e.edge.wait_ns / per,
                frozen_per_round_ns: e.edge.frozen_ns / per,
                costed_per: if e.edge.count > rounds {
                    "wake-up"
                } else {
                    "round"
                },
                frozen_share: e.edge.frozen_hops as f64 / e.edge.count.max(1) as f64,
            }
        })
        .collect();
    let mut p = CriticalPath {
        rounds,
        rounds_edges,
        per_round_ns: hops.iter().map(|h| h.per_round_ns).sum(),
        frozen_per_round_ns: hops.iter().map(|h| h.frozen_per_round_ns).sum(),
        hops,
        sentence: String::new(),
    };
    p.sentence = sentence(&p);
    Some(p)
}

/// "critical path per round: a -> b -> c, 1.9ms of which 1.2ms frozen by
/// the limit (b -> c: frozen in 80 % of rounds)".
fn sentence(p: &CriticalPath) -> String {
    let mut names: Vec<&str> = p.hops.iter().map(|h| h.waker.as_str()).collect();
    names.extend(p.hops.last().map(|h| h.wakee.as_str()));
    let mut s = format!(
        "critical path per round ({} rounds): {}, {}",
        p.rounds,
        names.join(" -> "),
        short(p.per_round_ns)
    );
    let mut frozen: Vec<&PathHop> = p.hops.iter().filter(|h| h.frozen_share > 0.0).collect();
    if frozen.is_empty() {
        s.push_str(", none of it frozen by the limit");
        return s;
    }
    frozen.sort_by_key(|h| std::cmp::Reverse(h.frozen_per_round_ns));
    let parts: Vec<String> = frozen
        .iter()
        .take(3)
        .map(|h| {
            let of = match h.count.abs_diff(p.rounds) as f64 <= p.rounds as f64 * SAME_ROUNDS {
                true => "rounds".to_string(),
                false => format!("its {} wake-ups", h.count),
            };
            format!(
                "{} -> {}: frozen in {} % of {of}, {} a round",
                h.waker,
                h.wakee,
                percent(h.frozen_share),
                short(h.frozen_per_round_ns)
            )
        })
        .collect();
    s.push_str(&format!(
        " of which {} frozen by the limit ({})",
        short(p.frozen_per_round_ns),
        parts.join("; ")
    ));
    s
}

/// A share in percent: one decimal under 10 %.
pub fn percent(share: f64) -> String {
    match share < 0.1 {
        true => format!("{:.1}", share * 100.0),
        false => format!("{:.0}", share * 100.0),
    }
}
