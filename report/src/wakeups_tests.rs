//! The wake-up graph, its layers and critical path on hand-built graphs.

use throttlewatch_core::logfmt::wakeups::{WakeEdge, Wakee, Waker, Wakeups};
use throttlewatch_core::logfmt::{End, Record, Runq};

use super::*;
use crate::wakeups_path::{path_rounds, round_candidates};

const US: u64 = 1_000;
const MS: u64 = 1_000_000;

/// An edge `waker -> wakee` (tids; comm `t<tid>`), `count` wake-ups each
/// waiting `wait` and `frozen` in all, `frozen_hops` of them frozen.
fn e(
    kind: &str,
    waker: u32,
    wakee: u32,
    count: u64,
    wait: u64,
    frozen: u64,
    hops: u64,
) -> WakeEdge {
    let comm = |t: u32| match t {
        0 => String::new(),
        t => format!("t{t}"),
    };
    WakeEdge {
        waker: Waker {
            kind: kind.into(),
            tid: waker,
            pid: waker,
            comm: comm(waker),
        },
        wakee: Wakee {
            tid: wakee,
            pid: wakee,
            comm: comm(wakee),
        },
        count,
        wait_ns: wait * count,
        p50_ns: Some(wait),
        p99_ns: Some(wait * 2),
        max_ns: wait * 3,
        freezes: hops,
        frozen_ns: frozen,
        frozen_hops: hops,
    }
}

fn of(edges: Vec<WakeEdge>) -> WakeReport {
    graph(
        "end",
        Wakeups {
            edges,
            ..Default::default()
        },
        0,
    )
    .expect("a graph")
}

fn path_names(r: &WakeReport) -> Vec<String> {
    let p = r.critical_path.as_ref().expect("a critical path");
    let mut v: Vec<String> = p.hops.iter().map(|h| h.waker.clone()).collect();
    v.extend(p.hops.last().map(|h| h.wakee.clone()));
    v
}

fn layer_of(r: &WakeReport, tid: u32, kind: NodeKind) -> usize {
    r.nodes
        .iter()
        .find(|n| n.tid == tid && n.kind == kind)
        .map(|n| n.layer)
        .expect("the node")
}

#[test]
fn a_chain_from_an_interrupt_is_one_path_and_one_layer_per_hop() {
    // interrupt -> 1 -> 2 -> 3 -> 4, 200 rounds; 2 -> 3 frozen in 160 of them.
    let r = of(vec![
        e("interrupt", 0, 1, 200, 20 * US, 0, 0),
        e("same", 1, 2, 200, 10 * US, 0, 0),
        e("same", 2, 3, 199, 30 * US, 240 * MS, 160),
        e("same", 3, 4, 201, 40 * US, 0, 0),
        // The parent woken once by its child's exit: not a hop of the rounds.
        e("same", 4, 9, 1, 5 * MS, 0, 0),
    ]);
    assert_eq!(r.nodes.len(), 6);
    assert_eq!(layer_of(&r, 0, NodeKind::Interrupt), 0);
    assert_eq!(layer_of(&r, 4, NodeKind::Same), 4);
    assert_eq!(layer_of(&r, 9, NodeKind::Same), 5);
    let p = r.critical_path.as_ref().unwrap();
    assert_eq!((p.rounds, p.rounds_edges), (200, 4));
    assert_eq!(path_names(&r), ["interrupt", "t1", "t2", "t3", "t4"]);
    // 20 + 10 + (30 * 199 / 200 + 1.2 ms) + 40 * 201 / 201 µs.
    assert_eq!(p.hops[2].frozen_per_round_ns, 1_200_000);
    assert_eq!(p.frozen_per_round_ns, 1_200_000);
    assert_eq!(p.hops[3].costed_per, "wake-up");
    assert_eq!(
        p.per_round_ns,
        20_000 + 10_000 + 29_850 + 1_200_000 + 40_000
    );
    assert!(
        p.sentence.starts_with(
            "critical path per round (200 rounds): interrupt -> t1 -> t2 -> t3 -> t4, 1.3ms of which 1.2ms frozen by the limit (t2 -> t3: frozen in 80 % of rounds, 1.2ms a round)"
        ),
        "{}",
        p.sentence
    );
    assert_eq!(r.edges.iter().filter(|e| e.on_critical_path).count(), 4);
    let frozen = r.edges.iter().find(|e| e.edge.frozen_ns > 0).unwrap();
    assert_eq!(
        r.describe(frozen),
        "t2/2 -> t3/3  199 wake-ups, wait p50 30µs p99 60µs, frozen 240ms (160 of 199 wake-ups)"
    );
}

#[test]
fn a_fan_out_takes_the_costliest_branch() {
    // 1 wakes 2 and 3; 2 -> 4 cheap, 3 -> 5 dear.
    let r = of(vec![
        e("host", 7, 1, 100, 10 * US, 0, 0),
        e("same", 1, 2, 100, 10 * US, 0, 0),
        e("same", 1, 3, 100, 50 * US, 0, 0),
        e("same", 2, 4, 100, 10 * US, 0, 0),
        e("same", 3, 5, 100, 100 * US, 0, 0),
    ]);
    assert_eq!(path_names(&r), ["t7", "t1", "t3", "t5"]);
    let host = r.nodes.iter().find(|n| n.kind == NodeKind::Host).unwrap();
    assert_eq!(host.label(), "t7/7 (host)");
    assert_eq!(layer_of(&r, 4, NodeKind::Same), 3);
    let p = r.critical_path.as_ref().unwrap();
    assert_eq!(p.per_round_ns, 160 * US);
    assert!(
        p.sentence.ends_with("none of it frozen by the limit"),
        "{}",
        p.sentence
    );
}

#[test]
fn a_cycle_loses_its_back_edge_and_a_self_edge_is_no_hop() {
    // 1 -> 2 -> 3 -> 1 (a ring with no source), 3 woken by itself too.
    let r = of(vec![
        e("same", 1, 2, 50, 10 * US, 0, 0),
        e("same", 2, 3, 50, 20 * US, 0, 0),
        e("same", 3, 1, 50, 30 * US, 0, 0),
        e("same", 3, 3, 50, 900 * US, 0, 0),
    ]);
    let selfs: Vec<_> = r.edges.iter().filter(|e| e.self_edge).collect();
    assert_eq!(selfs.len(), 1);
    assert_eq!(r.edges.iter().filter(|e| e.back_edge).count(), 1);
    let p = r.critical_path.as_ref().unwrap();
    // Two hops of the ring: the back-edge closes it.
    assert_eq!(p.hops.len(), 2);
    assert!(p.hops.iter().all(|h| !r.edges[h.edge].self_edge));
    // Drawn: the self-edge a dashed loop, the back-edge a dashed arc.
    let svg = crate::wakeups_svg::svg(&r);
    assert_eq!(svg.matches("stroke-dasharray=\"4 3\"").count(), 2, "{svg}");
    assert_eq!(svg.matches("<g class=\"edge").count(), 4, "{svg}");
    let layers: Vec<usize> = r.nodes.iter().map(|n| n.layer).collect();
    let mut sorted = layers.clone();
    sorted.sort();
    assert_eq!(sorted, [0, 1, 2], "{layers:?}");
}

#[test]
fn a_hand_off_back_up_the_chain_is_the_back_edge() {
    // Threads sharing a lock (Python's GIL): the pipe's reader wakes the
    // source more often than the source wakes it; a rare, dear interrupt
    // reaches the reader first by cost, not by wake-ups.
    let r = of(vec![
        e("interrupt", 0, 1, 41, 250 * US, 0, 0),
        e("interrupt", 0, 2, 2, 40 * MS, 0, 0),
        e("same", 2, 1, 56, 40 * US, 0, 0),
        e("same", 1, 2, 40, 10 * US, 150 * MS, 2),
        e("same", 2, 3, 40, 10 * US, 2_000 * MS, 26),
        e("same", 3, 4, 52, 10 * US, 2_400 * MS, 30),
    ]);
    let back: Vec<(u32, u32)> = r
        .edges
        .iter()
        .filter(|e| e.back_edge)
        .map(|e| (e.edge.waker.tid, e.edge.wakee.tid))
        .collect();
    assert_eq!(back, [(2, 1)]);
    assert_eq!(path_names(&r), ["interrupt", "t1", "t2", "t3", "t4"]);
}

#[test]
fn rare_edges_into_the_middle_do_not_turn_a_hop_back() {
    // The main thread, woken by its timer more often than the source, wakes
    // tw-sock now and then, which wakes tw-pipe now and then: the depth-first
    // search along the most frequent edges meets tw-sock before tw-pipe.
    let mut v = vec![
        e("interrupt", 0, 9, 43, 10 * US, 500 * MS, 7),
        e("same", 9, 3, 5, 10 * US, 90 * MS, 1),
        e("same", 3, 2, 5, 10 * US, 0, 0),
        e("interrupt", 0, 1, 40, 30 * US, 0, 0),
        e("same", 1, 2, 40, 30 * US, 350 * MS, 13),
        e("same", 2, 3, 41, 30 * US, 3_500 * MS, 39),
        e("same", 3, 4, 45, 30 * US, 160 * MS, 10),
    ];
    // tw-src's own name comes as a wakee; as a waker it was still python3.
    v[4].waker.comm = "python3".into();
    let r = of(v);
    assert_eq!(path_names(&r), ["interrupt", "t1", "t2", "t3", "t4"]);
    let p = r.critical_path.as_ref().unwrap();
    assert_eq!(p.rounds, 40);
    assert!(r
        .edges
        .iter()
        .filter(|e| e.on_critical_path)
        .all(|e| !e.back_edge));
    let back: Vec<(u32, u32)> = r
        .edges
        .iter()
        .filter(|e| e.back_edge)
        .map(|e| (e.edge.waker.tid, e.edge.wakee.tid))
        .collect();
    assert_eq!(back, [(3, 2)]);
}

#[test]
fn a_dear_edge_of_another_frequency_does_not_take_the_path() {
    // tw-pipe also woken by a timer (the GIL's 5 ms timed wait) 23 times,
    // dear, and two edges near 23: the path still starts at the source.
    let r = of(vec![
        e("interrupt", 0, 1, 40, 30 * US, 0, 0),
        e("same", 1, 2, 44, 30 * US, 300 * MS, 4),
        e("interrupt", 0, 2, 23, 30 * US, 620 * MS, 8),
        e("same", 4, 1, 22, 30 * US, 0, 0),
        e("same", 2, 3, 46, 30 * US, 2_650 * MS, 33),
        e("same", 3, 4, 63, 30 * US, 2_730 * MS, 34),
    ]);
    assert_eq!(path_names(&r), ["interrupt", "t1", "t2", "t3", "t4"]);
    assert_eq!(r.critical_path.as_ref().unwrap().rounds, 40);
}

#[test]
fn interrupts_are_one_node_and_other_containers_their_own() {
    let r = of(vec![
        e("interrupt", 0, 1, 10, US, 0, 0),
        e("interrupt", 0, 2, 10, US, 0, 0),
        e("other", 1, 2, 10, US, 0, 0),
        e("same", 1, 2, 10, US, 0, 0),
    ]);
    let kinds: Vec<NodeKind> = r.nodes.iter().map(|n| n.kind).collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == NodeKind::Interrupt).count(),
        1
    );
    assert_eq!(kinds.iter().filter(|k| **k == NodeKind::Other).count(), 1);
    assert_eq!(r.nodes.len(), 4);
    let svg = crate::wakeups_svg::svg(&r);
    assert_eq!(svg.matches("<g class=\"node ").count(), 4, "{svg}");
    assert_eq!(svg.matches("<ellipse").count(), 1);
    assert_eq!(svg.matches("<g class=\"node other\"").count(), 1);
    assert_eq!(svg.matches("<g class=\"edge").count(), 4);
    assert!(svg.contains("class=\"edge critical\""), "{svg}");
}

#[test]
fn rounds_are_counts_edges_share() {
    // Groups within 2 % (or one wake-up), of at least 5 wake-ups.
    let c = [1, 1, 2, 5, 107, 200, 199, 204, 200, 10, 11];
    assert_eq!(
        round_candidates(&c),
        [(5, 1), (11, 2), (107, 1), (200, 3), (200, 4)]
    );
    assert_eq!(round_candidates(&[5, 90, 33]), [(5, 1), (33, 1), (90, 1)]);
    assert!(round_candidates(&[]).is_empty());
    assert_eq!(path_rounds(&[56, 42, 42, 51]), 42);
    assert_eq!(path_rounds(&[200, 199, 201, 200]), 200);
    assert_eq!(path_rounds(&[10, 11, 24, 25]), 10);
    assert_eq!(path_rounds(&[7]), 7);
}

#[test]
fn the_rounds_are_those_whose_path_explains_the_most_latency() {
    // The pipeline's 4 hops at 200 wake-ups; one-off start-up edges (one
    // of them frozen long) and a busy one that is no pipeline.
    let r = of(vec![
        e("interrupt", 0, 1, 200, 20 * US, 0, 0),
        e("same", 1, 2, 200, 10 * US, 0, 0),
        e("same", 2, 3, 201, 30 * US, 0, 0),
        e("same", 3, 4, 199, 40 * US, 0, 0),
        e("interrupt", 0, 8, 107, 5 * US, 41 * MS, 1),
        e("same", 20, 21, 1, 900 * US, 0, 0),
        e("same", 22, 21, 1, 100 * US, 0, 0),
        e("same", 21, 23, 2, 50 * US, 80 * MS, 1),
        e("same", 24, 23, 2, 60 * US, 0, 0),
    ]);
    let p = r.critical_path.as_ref().unwrap();
    assert_eq!((p.rounds, p.rounds_edges), (200, 4));
    assert_eq!(path_names(&r), ["interrupt", "t1", "t2", "t3", "t4"]);
    // Backed up: counts below the rounds, the hops' pairs apart.
    let r = of(vec![
        e("interrupt", 0, 1, 10, 30 * US, 5_000 * MS, 8),
        e("same", 1, 2, 11, 30 * US, 5_300 * MS, 8),
        e("same", 2, 3, 24, 45 * US, 5_100 * MS, 18),
        e("same", 3, 4, 25, 50 * US, 4_900 * MS, 18),
        e("same", 4, 5, 2, 10 * US, 0, 0),
        e("same", 6, 7, 2, 10 * US, 0, 0),
    ]);
    assert_eq!(path_names(&r), ["interrupt", "t1", "t2", "t3", "t4"]);
    // The rounds: the smaller of the two pairs of hops that agree.
    assert_eq!(r.critical_path.as_ref().unwrap().rounds, 10);
}

#[test]
fn intervals_are_summed_when_the_log_has_no_end_edges() {
    let rec = |edges: Vec<WakeEdge>| {
        let totals = WakeTotals {
            count: 5,
            wait_ns: US,
            frozen_ns: 0,
        };
        Record::Runq(Runq {
            wakeups: Some(Wakeups {
                edges,
                rest: None,
                dropped: 1,
                by_waker: [("same".to_string(), totals)].into(),
            }),
            ..Default::default()
        })
    };
    let mut w = IntervalEdges::default();
    w.add(&rec(vec![e("same", 1, 2, 10, 10 * US, MS, 1)]));
    w.add(&rec(vec![
        e("same", 1, 2, 30, 30 * US, 0, 0),
        e("interrupt", 0, 1, 40, US, 0, 0),
    ]));
    let mut c = Container::default();
    assert!(IntervalEdges::default().report(&c).is_none());
    let r = w.report(&c).expect("a graph");
    assert_eq!(r.source, "intervals");
    assert_eq!(r.dropped, 2);
    assert_eq!(r.by_waker["same"].count, 10);
    assert_eq!(r.by_waker["same"].wait_ns, 2 * US);
    let x = r.edges.iter().find(|x| x.edge.waker.tid == 1).unwrap();
    assert_eq!(x.edge.count, 40);
    assert_eq!(x.edge.wait_ns, 10 * 10 * US + 30 * 30 * US);
    // p50 weighted by wake-ups; p99 the largest.
    assert_eq!(x.edge.p50_ns, Some(25 * US));
    assert_eq!(x.edge.p99_ns, Some(60 * US));
    assert_eq!((x.edge.frozen_ns, x.edge.frozen_hops), (MS, 1));
    // With end.runq.wakeups, that is the graph.
    c.end = Some(End {
        runq: Some(Runq {
            wakeups: Some(Wakeups {
                edges: vec![e("same", 5, 6, 3, US, 0, 0)],
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let mut w3 = IntervalEdges::default();
    w3.add(&rec(vec![e("same", 1, 2, 10, 10 * US, MS, 1)]));
    let r = w3.report(&c).expect("a graph");
    assert_eq!(r.source, "end");
    assert_eq!(r.edges.len(), 1);
    assert_eq!(r.edges[0].edge.wakee.tid, 6);
}

#[test]
fn the_terminal_and_the_page_show_the_edges_and_the_path() {
    let r = of(vec![
        e("interrupt", 0, 1, 20, 20 * US, 0, 0),
        e("same", 1, 2, 20, 10 * US, 0, 0),
    ]);
    let mut log = Container::default();
    let start = throttlewatch_core::logfmt::Start {
        period_us: 100_000,
        ..Default::default()
    };
    log.add(1_000_000_000, Record::Start(start));
    let mut c = crate::summary::container("x".into(), &log, Default::default());
    c.wakeups = Some(r);
    let t = crate::render_terminal::container(&c, crate::render_terminal::Style::plain());
    assert!(t.contains("Wake-up chains (2 edges"), "{t}");
    assert!(
        t.contains("* interrupt -> t1/1  20 wake-ups, wait p50 20µs p99 40µs, frozen 0ns"),
        "{t}"
    );
    assert!(
        t.contains("critical path per round (20 rounds): interrupt -> t1 -> t2, 30µs"),
        "{t}"
    );
    let html = crate::render_html::page(std::slice::from_ref(&c));
    assert!(html.contains("<h3>Wake-up chains</h3>"), "{html}");
    assert!(
        html.contains("id=\"c0-wakeups\" data-edges=\"2\" data-nodes=\"3\""),
        "{html}"
    );
    assert!(html.contains("Critical path per round"), "{html}");
    let json = serde_json::to_value(&c).unwrap();
    let w = &json["wakeups"];
    assert_eq!(w["edges"].as_array().unwrap().len(), 2);
    assert_eq!(w["edges"][0]["waker"]["kind"], "interrupt");
    assert_eq!(w["critical_path"]["rounds"], 20);
    assert_eq!(w["critical_path"]["hops"][1]["wakee"], "t2");
}

/// Seen in a CI run of threads under a quota: a lock's timed waits woke the
/// second stage from the timer (64 wake-ups in 42 rounds, 1.2 ms frozen a
/// round), a shortcut past the first stage. The pipeline is the longer
/// chain of hand-offs, not the shortcut.
#[test]
fn a_timers_shortcut_past_a_stage_does_not_take_the_path() {
    let r = of(vec![
        e("interrupt", 0, 1, 40, 20 * US, 0, 0),
        e("same", 1, 2, 40, 10 * US, 0, 0),
        e("interrupt", 0, 2, 64, 30 * US, 77 * MS, 1),
        e("same", 2, 3, 42, 30 * US, 40 * MS, 10),
        e("same", 3, 4, 50, 40 * US, 0, 0),
    ]);
    assert_eq!(path_names(&r), ["interrupt", "t1", "t2", "t3", "t4"]);
}

/// CI, stop 44: Python's 5 ms GIL interval under a quota. The timer's edge
/// into the second stage (85 wake-ups in 44 rounds) and the GIL handed
/// back up from it to the first (50) made the search for cycles take the
/// shortcut first and break the first stage's hand-off (41). The search
/// goes along the edges nearest once a round first, and the hand-off back
/// up is the one broken.
#[test]
fn a_lock_handed_back_past_a_timers_shortcut_breaks_the_hand_back() {
    let r = of(vec![
        e("interrupt", 0, 1, 40, 20 * US, 0, 0),
        e("same", 1, 2, 41, 10 * US, 0, 0),
        e("interrupt", 0, 2, 85, 30 * US, 0, 0),
        e("same", 2, 1, 50, 10 * US, 0, 0),
        e("same", 2, 3, 44, 60 * US, 70 * MS * 44 / 10, 36),
        e("same", 3, 4, 56, 27 * US, 55 * MS * 44 / 10, 36),
    ]);
    assert_eq!(path_names(&r), ["interrupt", "t1", "t2", "t3", "t4"]);
}
