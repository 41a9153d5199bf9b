//! The wake-up graph as plain SVG text: layered left to right (a node's
//! column is its layer, wakeups_path.rs), a box per thread (the container's
//! blue, another container's purple and dashed, the host's grey, the
//! interrupts an orange ellipse), an arrow per edge whose width grows with
//! its cost, the critical path's in red, back-edges and self-edges as arcs.

use std::fmt::Write;

use crate::heatmap::short;
use crate::html_escape::esc;
use crate::wakeups::{NodeKind, WakeReport};
use crate::wakeups_path::MIN_ROUNDS;

const NODE_W: f64 = 130.0;
const NODE_H: f64 = 34.0;
/// Column pitch (room for the edges' labels) and row pitch.
const COL: f64 = 260.0;
const ROW: f64 = 62.0;
const MARGIN: f64 = 16.0;
const LEGEND_H: f64 = 30.0;

/// Two boxes' top-left corners.
type Pos2 = ((f64, f64), (f64, f64));

/// The edges drawn: those of the critical path and those with at least
/// [`MIN_ROUNDS`] wake-ups (one-off edges of a start-up are in the table);
/// all of them where that leaves none.
pub fn drawn(r: &WakeReport) -> Vec<bool> {
    let keep: Vec<bool> = r
        .edges
        .iter()
        .map(|e| e.on_critical_path || e.edge.count >= MIN_ROUNDS)
        .collect();
    match keep.iter().any(|k| *k) {
        true => keep,
        false => vec![true; r.edges.len()],
    }
}

/// The drawn nodes' columns: the longest path to each over the drawn DAG
/// edges (the graph's layers without the edges left out); none for a node
/// without a drawn edge.
fn columns(r: &WakeReport, drawn: &[bool]) -> Vec<Option<usize>> {
    let dag = |i: usize| drawn[i] && !r.edges[i].back_edge && !r.edges[i].self_edge;
    let mut col: Vec<Option<usize>> = vec![None; r.nodes.len()];
    for (e, _) in r.edges.iter().zip(drawn).filter(|(_, d)| **d) {
        col[e.from].get_or_insert(0);
        col[e.to].get_or_insert(0);
    }
    // The graph's layers are a topological order of its DAG edges.
    let mut order: Vec<usize> = (0..r.nodes.len()).collect();
    order.sort_by_key(|&v| r.nodes[v].layer);
    for v in order {
        let Some(c) = col[v] else { continue };
        for i in (0..r.edges.len()).filter(|&i| dag(i) && r.edges[i].from == v) {
            let to = r.edges[i].to;
            col[to] = Some(col[to].unwrap_or(0).max(c + 1));
        }
    }
    col
}

/// The drawn nodes' positions: (x, y) of each box's top-left corner.
fn positions(r: &WakeReport, drawn: &[bool]) -> Vec<Option<(f64, f64)>> {
    let cols = columns(r, drawn);
    let layers = cols.iter().flatten().max().map_or(0, |m| m + 1);
    let mut rows: Vec<Vec<usize>> = vec![Vec::new(); layers];
    for (i, c) in cols.iter().enumerate() {
        if let Some(c) = c {
            rows[*c].push(i);
        }
    }
    let mut at = vec![None; r.nodes.len()];
    let mut row_of = vec![0.0f64; r.nodes.len()];
    for (l, col) in rows.iter_mut().enumerate() {
        // Each node under the mean row of what woke it (fewer crossings).
        let key = |v: usize| {
            let ins: Vec<f64> = (0..r.edges.len())
                .filter(|&i| drawn[i] && r.edges[i].to == v)
                .map(|i| &r.edges[i])
                .filter(|e| !e.back_edge && !e.self_edge)
                .map(|e| row_of[e.from])
                .collect();
            match ins.is_empty() {
                true => v as f64,
                false => ins.iter().sum::<f64>() / ins.len() as f64,
            }
        };
        let mut keyed: Vec<(f64, usize)> = col.iter().map(|&v| (key(v), v)).collect();
        keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        for (k, (_, v)) in keyed.into_iter().enumerate() {
            row_of[v] = k as f64;
            at[v] = Some((MARGIN + l as f64 * COL, MARGIN + k as f64 * ROW));
        }
    }
    at
}

/// The graph as a standalone SVG document.
pub fn svg(r: &WakeReport) -> String {
    let drawn = drawn(r);
    let at = positions(r, &drawn);
    let placed: Vec<(f64, f64)> = at.iter().flatten().copied().collect();
    let right = placed.iter().map(|p| p.0).fold(0.0, f64::max);
    let tallest = placed.iter().map(|p| p.1).fold(0.0, f64::max);
    let w = (right + NODE_W + MARGIN).max(560.0);
    let h = tallest + NODE_H + 2.0 * MARGIN + ROW / 2.0 + LEGEND_H;
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg class=\"wakeups\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{w:.0}\" height=\"{h:.0}\" viewBox=\"0 0 {w:.0} {h:.0}\" font-family=\"sans-serif\">\
         <defs><marker id=\"tw-arrow\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerUnits=\"userSpaceOnUse\" markerWidth=\"10\" markerHeight=\"10\" orient=\"auto-start-reverse\"><path d=\"M0,0L10,5L0,10z\" fill=\"#888\"/></marker>\
         <marker id=\"tw-arrow-crit\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerUnits=\"userSpaceOnUse\" markerWidth=\"10\" markerHeight=\"10\" orient=\"auto-start-reverse\"><path d=\"M0,0L10,5L0,10z\" fill=\"#c40\"/></marker></defs>"
    );
    let max_cost = r
        .edges
        .iter()
        .map(|e| e.edge.cost_ns())
        .max()
        .unwrap_or(1)
        .max(1);
    for (i, e) in r.edges.iter().enumerate().filter(|(i, _)| drawn[*i]) {
        if let (Some(a), Some(b)) = (at[e.from], at[e.to]) {
            edge(&mut s, r, i, (a, b), max_cost);
        }
    }
    for (i, p) in at.iter().enumerate() {
        if let Some(p) = p {
            node(&mut s, r, i, *p);
        }
    }
    let hidden = drawn.iter().filter(|d| !**d).count();
    legend(&mut s, h - LEGEND_H + 6.0, hidden);
    s.push_str("</svg>\n");
    s
}

/// A box (an ellipse for the interrupts) with the comm and the ids.
fn node(s: &mut String, r: &WakeReport, i: usize, (x, y): (f64, f64)) {
    let n = &r.nodes[i];
    let (fill, stroke, dash) = match n.kind {
        NodeKind::Same => ("#e8f0fa", "#47a", ""),
        NodeKind::Other => ("#f3ecfa", "#85c", " stroke-dasharray=\"5 3\""),
        NodeKind::Host => ("#eee", "#777", " stroke-dasharray=\"2 2\""),
        NodeKind::Interrupt => ("#fdf0e0", "#e90", ""),
    };
    let _ = write!(
        s,
        "<g class=\"node {}\" data-tid=\"{}\"><title>{}</title>",
        n.kind.as_str(),
        n.tid,
        esc(&n.label())
    );
    match n.kind {
        NodeKind::Interrupt => {
            let _ = write!(
                s,
                "<ellipse cx=\"{:.1}\" cy=\"{:.1}\" rx=\"{:.1}\" ry=\"{:.1}\" fill=\"{fill}\" stroke=\"{stroke}\" stroke-width=\"1.5\"/>",
                x + NODE_W / 2.0,
                y + NODE_H / 2.0,
                NODE_W / 2.0,
                NODE_H / 2.0
            );
        }
        _ => {
            let _ = write!(
                s,
                "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{NODE_W}\" height=\"{NODE_H}\" rx=\"5\" fill=\"{fill}\" stroke=\"{stroke}\" stroke-width=\"1.5\"{dash}/>"
            );
        }
    }
    let (top, bottom) = match n.kind {
        NodeKind::Interrupt => ("interrupt".to_string(), "hard or soft irq".to_string()),
        NodeKind::Same => (n.comm.clone(), format!("tid {} · pid {}", n.tid, n.pid)),
        NodeKind::Other => (n.comm.clone(), format!("tid {} · other container", n.tid)),
        NodeKind::Host => (n.comm.clone(), format!("tid {} · host", n.tid)),
    };
    let _ = write!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"middle\" font-weight=\"bold\">{}</text>\
         <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"middle\" fill=\"#555\">{}</text></g>",
        x + NODE_W / 2.0,
        y + 14.0,
        esc(&clip(&top, 18)),
        x + NODE_W / 2.0,
        y + 28.0,
        esc(&bottom)
    );
}

fn clip(s: &str, n: usize) -> String {
    match s.chars().count() <= n {
        true => s.to_string(),
        false => s.chars().take(n - 1).collect::<String>() + "~",
    }
}

/// An arrow: a curve from the waker's right side to the wakee's left for
/// an edge forward; an arc under the boxes for a back- or same-layer edge;
/// a loop over the box for a self-edge. Its label at the middle.
fn edge(s: &mut String, r: &WakeReport, i: usize, (a, b): Pos2, max_cost: u64) {
    let e = &r.edges[i];
    let (d, mid) = if e.self_edge {
        let (x, y) = (a.0 + NODE_W - 20.0, a.1);
        (
            format!(
                "M{x:.1},{y:.1} C{:.1},{:.1} {:.1},{:.1} {:.1},{y:.1}",
                x - 10.0,
                y - 26.0,
                x + 24.0,
                y - 26.0,
                x + 14.0
            ),
            (x + 6.0, y - 22.0),
        )
    } else if b.0 > a.0 {
        let (x1, y1) = (a.0 + NODE_W, a.1 + NODE_H / 2.0);
        let (x2, y2) = (b.0, b.1 + NODE_H / 2.0);
        let cx = (x2 - x1) / 2.0;
        (
            format!(
                "M{x1:.1},{y1:.1} C{:.1},{y1:.1} {:.1},{y2:.1} {x2:.1},{y2:.1}",
                x1 + cx,
                x2 - cx
            ),
            ((x1 + x2) / 2.0, (y1 + y2) / 2.0 - 4.0),
        )
    } else {
        let (x1, y1) = (a.0 + NODE_W / 2.0, a.1 + NODE_H);
        let (x2, y2) = (b.0 + NODE_W / 2.0, b.1 + NODE_H);
        let low = y1.max(y2) + ROW / 2.0;
        (
            format!("M{x1:.1},{y1:.1} C{x1:.1},{low:.1} {x2:.1},{low:.1} {x2:.1},{y2:.1}"),
            ((x1 + x2) / 2.0, low - 4.0),
        )
    };
    let width = 1.0 + 4.0 * e.edge.cost_ns() as f64 / max_cost as f64;
    let (colour, marker) = match e.on_critical_path {
        true => ("#c40", "tw-arrow-crit"),
        false => ("#888", "tw-arrow"),
    };
    let dash = match e.back_edge || e.self_edge {
        true => " stroke-dasharray=\"4 3\"",
        false => "",
    };
    let _ = write!(
        s,
        "<g class=\"edge{}\" data-count=\"{}\"><title>{}</title><path d=\"{d}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"{width:.1}\"{dash} marker-end=\"url(#{marker})\"/>",
        if e.on_critical_path { " critical" } else { "" },
        e.edge.count,
        esc(&r.describe(e))
    );
    // Two lines: the wake-ups and the p99 wait, then the frozen time.
    let frozen = match e.edge.frozen_ns {
        0 => String::new(),
        f => format!(
            "<tspan x=\"{:.1}\" dy=\"11\">frozen {}</tspan>",
            mid.0,
            esc(&short(f))
        ),
    };
    let _ = write!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"middle\" fill=\"{}\" stroke=\"#fff\" stroke-width=\"3\" paint-order=\"stroke\">{}× · p99 {}{frozen}</text></g>",
        mid.0,
        // Both lines above the arrow.
        if frozen.is_empty() { mid.1 } else { mid.1 - 11.0 },
        if e.on_critical_path { "#a30" } else { "#444" },
        e.edge.count,
        e.edge.p99_ns.map_or("-".into(), short),
    );
}

/// The node styles and the critical path's colour.
fn legend(s: &mut String, y: f64, hidden: usize) {
    let items = [
        ("#e8f0fa", "#47a", "", "this container's thread"),
        (
            "#f3ecfa",
            "#85c",
            " stroke-dasharray=\"5 3\"",
            "another container's",
        ),
        ("#eee", "#777", " stroke-dasharray=\"2 2\"", "the host's"),
        ("#fdf0e0", "#e90", "", "interrupts"),
    ];
    let mut x = MARGIN;
    for (fill, stroke, dash, name) in items {
        let _ = write!(
            s,
            "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"14\" height=\"10\" fill=\"{fill}\" stroke=\"{stroke}\"{dash}/>\
             <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\">{name}</text>",
            x + 18.0,
            y + 9.0
        );
        x += 24.0 + name.len() as f64 * 5.6;
    }
    let _ = write!(
        s,
        "<line x1=\"{x:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#c40\" stroke-width=\"3\"/>\
         <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\">critical path (dashed: back- and self-edges){}</text>",
        y + 5.0,
        x + 18.0,
        y + 5.0,
        x + 22.0,
        y + 9.0,
        match hidden {
            0 => String::new(),
            n => format!("; {n} edges of under {MIN_ROUNDS} wake-ups not drawn (in the table)"),
        }
    );
}
