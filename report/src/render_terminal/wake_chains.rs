//! The wake-up chains in the terminal summary: the costliest edges as
//! lines, then the critical path of a periodic pipeline in one sentence
//! (wakeups.rs, wakeups_path.rs).

use std::fmt::Write;

use super::style::Style;
use crate::wakeups::WakeReport;

/// Edges shown (the rest are in `--json` and the HTML page).
const SHOWN: usize = 10;

pub(super) fn wake_chains(s: &mut String, w: Option<&WakeReport>, st: Style) {
    let Some(w) = w else { return };
    let _ = writeln!(
        s,
        "\n  {} ({} edges: * the critical path's, then the costliest{})",
        st.bold("Wake-up chains"),
        w.edges.len(),
        match w.source {
            "end" => "",
            _ => "; summed from the intervals' costliest",
        }
    );
    // The critical path's hops in order (marked), then the costliest others.
    let path: Vec<usize> = w
        .critical_path
        .iter()
        .flat_map(|p| p.hops.iter().map(|h| h.edge))
        .collect();
    let others = (0..w.edges.len()).filter(|i| !path.contains(i));
    for i in path
        .iter()
        .copied()
        .chain(others)
        .take(SHOWN.max(path.len()))
    {
        let e = &w.edges[i];
        let mark = if e.on_critical_path { "*" } else { " " };
        let _ = writeln!(s, "  {mark} {}", w.describe(e));
    }
    if w.edges.len() > SHOWN.max(path.len()) {
        let _ = writeln!(
            s,
            "    {}",
            st.dim(&format!(
                "{} more edges in --json and the HTML page",
                w.edges.len() - SHOWN.max(path.len())
            ))
        );
    }
    left_out(s, w, st);
    if let Some(p) = &w.critical_path {
        let _ = writeln!(s, "  {}", st.bold(&p.sentence));
    }
}

/// What the edges shown leave out: the log's smaller edges, every
/// wake-up by its waker's kind, and those the kernel could not count.
fn left_out(s: &mut String, w: &WakeReport, st: Style) {
    if let Some(r) = &w.rest {
        let _ = writeln!(
            s,
            "    {}",
            st.dim(&format!(
                "{} smaller edges not in the log: {} wake-ups, wait {}, frozen {}",
                r.edges,
                r.count,
                crate::heatmap::short(r.wait_ns),
                crate::heatmap::short(r.frozen_ns)
            ))
        );
    }
    if !w.by_waker.is_empty() {
        let parts: Vec<String> = w
            .by_waker
            .iter()
            .map(|(kind, t)| {
                format!(
                    "{kind} {} (wait {}, frozen {})",
                    t.count,
                    crate::heatmap::short(t.wait_ns),
                    crate::heatmap::short(t.frozen_ns)
                )
            })
            .collect();
        let _ = writeln!(
            s,
            "    {}",
            st.dim(&format!("all wake-ups by waker: {}", parts.join(", ")))
        );
    }
    if w.dropped > 0 {
        let _ = writeln!(
            s,
            "    {}",
            st.warn(&format!(
                "{} wake-ups not counted (the kernel's edge map was full)",
                w.dropped
            ))
        );
    }
}
