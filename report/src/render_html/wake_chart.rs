//! The wake-up chains in the HTML page: the graph (wakeups_svg.rs), the
//! critical path's sentence and a table of the edges (each hop's wake-ups,
//! waits, frozen time and cost a round on the critical path).

use std::fmt::Write;

use crate::heatmap::short;
use crate::html_escape::esc;
use crate::wakeups::WakeReport;

fn opt(v: Option<u64>) -> String {
    v.map_or("-".into(), short)
}

/// The panel: nothing without wake-up edges.
pub(super) fn wakeups(s: &mut String, i: usize, w: Option<&WakeReport>) {
    let Some(w) = w else { return };
    let _ = writeln!(
        s,
        "<h3>Wake-up chains</h3><p>Who woke the container's threads: an arrow per waker &#8594; wakee \
         ({} edges, the costliest by wait + frozen time{}), wider the more it cost; \
         the label: wake-ups, p99 wait, frozen time in the work the wake-ups started.</p>",
        w.edges.len(),
        match w.source {
            "end" => " over the whole watch",
            _ => ", summed from each interval's costliest",
        }
    );
    if let Some(p) = &w.critical_path {
        let _ = writeln!(
            s,
            "<p class=\"critical-path\"><b>{}.</b></p>",
            esc(&upper_first(&p.sentence))
        );
    }
    let _ = writeln!(
        s,
        "<figure class=\"wakeups\" id=\"c{i}-wakeups\" data-edges=\"{}\" data-nodes=\"{}\" style=\"overflow-x:auto\">{}</figure>",
        w.edges.len(),
        w.nodes.len(),
        crate::wakeups_svg::svg(w).trim_end()
    );
    table(s, w);
}

fn upper_first(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
        .unwrap_or_default()
}

/// The edges, costliest first; those of the critical path with their cost a round.
fn table(s: &mut String, w: &WakeReport) {
    s.push_str(
        "<table class=\"wakeups\"><tr><th class=\"l\">waker</th><th class=\"l\">wakee</th><th>wake-ups</th>\
         <th>mean wait</th><th>p50</th><th>p99</th><th>max</th><th>freezes</th><th>frozen</th>\
         <th>wake-ups frozen</th><th>a round (critical path)</th></tr>\n",
    );
    let path = w.critical_path.as_ref();
    for (k, e) in w.edges.iter().enumerate() {
        let hop = path.and_then(|p| p.hops.iter().find(|h| h.edge == k));
        let x = &e.edge;
        let _ = writeln!(
            s,
            "<tr{}><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            if hop.is_some() { " class=\"critical\"" } else { "" },
            esc(&w.nodes[e.from].label()),
            esc(&w.nodes[e.to].label()),
            x.count,
            opt(e.mean_wait_ns),
            opt(x.p50_ns),
            opt(x.p99_ns),
            short(x.max_ns),
            x.freezes,
            short(x.frozen_ns),
            match x.count {
                0 => "-".to_string(),
                n => format!("{:.0}%", x.frozen_hops as f64 * 100.0 / n as f64),
            },
            hop.map_or(String::new(), |h| format!(
                "{} (frozen {}) per {}",
                short(h.per_round_ns),
                short(h.frozen_per_round_ns),
                h.costed_per
            ))
        );
    }
    s.push_str("</table>\n");
    let mut notes = Vec::new();
    if !w.by_waker.is_empty() {
        let parts: Vec<String> = w
            .by_waker
            .iter()
            .map(|(kind, t)| {
                format!(
                    "{kind} {} (wait {}, frozen {})",
                    t.count,
                    short(t.wait_ns),
                    short(t.frozen_ns)
                )
            })
            .collect();
        notes.push(format!("All wake-ups by waker: {}.", parts.join(", ")));
    }
    if let Some(r) = &w.rest {
        notes.push(format!(
            "{} smaller edges not in the log: {} wake-ups, wait {}, frozen {}.",
            r.edges,
            r.count,
            short(r.wait_ns),
            short(r.frozen_ns)
        ));
    }
    if w.dropped > 0 {
        notes.push(format!(
            "{} wake-ups not counted: the kernel's edge map was full.",
            w.dropped
        ));
    }
    if w.left_out > 0 {
        notes.push(format!(
            "{} edges past the report's cap left out.",
            w.left_out
        ));
    }
    for n in notes {
        let _ = writeln!(s, "<p class=\"missing\">{}</p>", esc(&n));
    }
}
