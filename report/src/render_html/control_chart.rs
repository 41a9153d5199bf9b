//! The dynamic CPU controller's changes in the HTML page: a step chart of the
//! limit over the container's timeline, and a table of the changes.

use std::fmt::Write;

use throttlewatch_core::logfmt::control::Bandwidth;
use throttlewatch_core::logfmt::Control;

use crate::heatmap::short;
use crate::html_escape::esc;
use crate::summary::ControlAt;

const W: f64 = 600.0;
const H: f64 = 120.0;

fn cpus(quota_us: u64, period_us: u64) -> f64 {
    quota_us as f64 / period_us.max(1) as f64
}

/// Quota + burst in CPUs.
fn limit(b: &Bandwidth) -> f64 {
    cpus(b.quota_us + b.burst_us, b.period_us)
}

/// The chart's axes: the time since the container's start across (to the
/// last change or the end of the log), CPUs up (to a tenth above the peak).
struct Axes {
    end: f64,
    top: f64,
}

impl Axes {
    fn new(list: &[ControlAt], wall_ns: u64) -> Axes {
        let end = list
            .iter()
            .map(|c| c.at_ns)
            .max()
            .unwrap_or(0)
            .max(wall_ns)
            .max(1) as f64;
        let top = list
            .iter()
            .flat_map(|c| [limit(&c.record.before), limit(&c.record.after)])
            .fold(0.0f64, f64::max)
            .max(0.01)
            * 1.1;
        Axes { end, top }
    }
    fn x(&self, ns: u64) -> f64 {
        ns as f64 * W / self.end
    }
    fn y(&self, v: f64) -> f64 {
        H - v * H / self.top
    }
}

/// The dynamic CPU controller's changes on the container's timeline
/// (docs/control.md): a step chart of the quota and of quota + burst in
/// CPUs against the time since the container's start, a mark per change
/// (raise, lower, restore, adopt), and every change in a table with the
/// signal that caused it.
pub(super) fn controls(s: &mut String, i: usize, list: &[ControlAt], wall_ns: u64) {
    if list.is_empty() {
        return;
    }
    let axes = Axes::new(list, wall_ns);
    chart_head(s, i, list, &axes);
    points(s, list, &axes);
    time_axis(s, &axes);
    table(s, list);
}

/// Steps: the value before the first change from 0, each change at its time.
fn steps(list: &[ControlAt], axes: &Axes, v: &dyn Fn(&Bandwidth) -> f64) -> String {
    let mut pts = format!("0,{:.1}", axes.y(v(&list[0].record.before)));
    for c in list {
        let _ = write!(
            pts,
            " {0:.1},{1:.1} {0:.1},{2:.1}",
            axes.x(c.at_ns),
            axes.y(v(&c.record.before)),
            axes.y(v(&c.record.after))
        );
    }
    let _ = write!(
        pts,
        " {W:.1},{:.1}",
        axes.y(v(&list[list.len() - 1].record.after))
    );
    pts
}

/// The heading, the chart's frame, the quota's and the limit's steps and the
/// CPU axis's labels.
fn chart_head(s: &mut String, i: usize, list: &[ControlAt], axes: &Axes) {
    let (end, top) = (axes.end, axes.top);
    let _ = writeln!(
        s,
        "<h3>CPU control</h3><p>{} changes by the dynamic controller (docs/control.md): quota \
         <span style=\"color:#47a\">&#9472;</span> and quota + burst \
         <span style=\"color:#2a7\">&#9476;</span> in CPUs over {}; peak {:.2} CPUs.</p>\
         <figure class=\"control\" id=\"c{i}-control\" data-changes=\"{}\">\
         <svg class=\"control\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{}\" viewBox=\"0 0 {W} {}\">\
         <polyline class=\"quota\" points=\"{}\"/><polyline class=\"limit\" points=\"{}\"/>\
         <text x=\"2\" y=\"10\" font-size=\"11\">{:.2} CPUs</text><text x=\"2\" y=\"{:.0}\" font-size=\"11\">0 CPUs</text>",
        list.len(),
        short(end as u64),
        top / 1.1,
        list.len(),
        H + 14.0,
        H + 14.0,
        steps(list, axes, &|b| cpus(b.quota_us, b.period_us)),
        steps(list, axes, &limit),
        top,
        H - 2.0,
    );
}

/// A mark per change (raise, lower, restore, adopt) at its time and the
/// limit after it.
fn points(s: &mut String, list: &[ControlAt], axes: &Axes) {
    for c in list {
        let r = &c.record;
        let _ = write!(
            s,
            "<circle class=\"{}\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\"><title>{} {} ({}): quota {} -> {}, burst {} -> {}</title></circle>",
            esc(&r.action),
            axes.x(c.at_ns),
            axes.y(limit(&r.after)),
            short(c.at_ns),
            esc(&r.action),
            esc(&r.cause),
            short(r.before.quota_us * 1000),
            short(r.after.quota_us * 1000),
            short(r.before.burst_us * 1000),
            short(r.after.burst_us * 1000)
        );
    }
}

/// The time axis's labels, and the chart's end.
fn time_axis(s: &mut String, axes: &Axes) {
    let _ = writeln!(
        s,
        "<text x=\"0\" y=\"{:.0}\" font-size=\"11\">0</text><text x=\"{W}\" y=\"{:.0}\" font-size=\"11\" text-anchor=\"end\">{}</text></svg></figure>",
        H + 12.0,
        H + 12.0,
        short(axes.end as u64)
    );
}

/// Every change in a table, with the signal that caused it.
fn table(s: &mut String, list: &[ControlAt]) {
    s.push_str(
        "<table class=\"controls\"><tr><th>at</th><th class=\"l\">action</th><th class=\"l\">cause</th>\
         <th>quota</th><th>burst</th><th>original quota / burst</th><th class=\"l\">signal</th></tr>\n",
    );
    for c in list {
        let r = &c.record;
        let _ = writeln!(
            s,
            "<tr class=\"{}\"><td>{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{} &#8594; {}</td><td>{} &#8594; {}</td><td>{} / {}</td><td class=\"l\">{}</td></tr>",
            esc(&r.action),
            short(c.at_ns),
            esc(&r.action),
            esc(&r.cause),
            short(r.before.quota_us * 1000),
            short(r.after.quota_us * 1000),
            short(r.before.burst_us * 1000),
            short(r.after.burst_us * 1000),
            short(r.original.quota_us * 1000),
            short(r.original.burst_us * 1000),
            esc(&signal(r))
        );
    }
    s.push_str("</table>\n");
}

/// What the controller saw: the throttling, the quiet time before a `calm`
/// lowering, the node's pressure and idle share.
fn signal(r: &Control) -> String {
    let g = &r.signal;
    let mut sig = vec![];
    if g.throttled_ns > 0 {
        sig.push(format!(
            "throttled {} in {} ({} episodes)",
            short(g.throttled_ns),
            short(g.interval_ns),
            g.episodes
        ));
    }
    if g.quiet_ns > 0 && r.cause == "calm" {
        sig.push(format!("quiet {}", short(g.quiet_ns)));
    }
    if let Some(p) = g.psi_some_percent {
        sig.push(format!("PSI some {p:.0}%"));
    }
    if let Some(p) = g.idle_percent {
        sig.push(format!("idle {p:.0}%"));
    }
    sig.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use throttlewatch_core::logfmt::control::{Bandwidth, Control, ControlSignal};

    fn at(ms: u64, action: &str, cause: &str, before: (u64, u64), after: (u64, u64)) -> ControlAt {
        let bw = |(quota_us, burst_us)| Bandwidth {
            quota_us,
            period_us: 100_000,
            burst_us,
        };
        ControlAt {
            at_ns: ms * 1_000_000,
            record: Control {
                action: action.into(),
                cause: cause.into(),
                before: bw(before),
                after: bw(after),
                original: bw((50_000, 0)),
                signal: ControlSignal {
                    throttled_ns: if cause == "throttled" { 30_000_000 } else { 0 },
                    episodes: 2,
                    interval_ns: 50_000_000,
                    psi_some_percent: (cause == "node_pressure").then_some(97.0),
                    idle_percent: Some(1.0),
                    ..Default::default()
                },
            },
        }
    }

    #[test]
    fn control_changes_are_on_the_timeline_and_in_the_table() {
        let list = vec![
            at(500, "raise", "throttled", (50_000, 0), (50_000, 50_000)),
            at(
                650,
                "raise",
                "throttled",
                (50_000, 50_000),
                (150_000, 50_000),
            ),
            at(
                3_000,
                "lower",
                "node_pressure",
                (150_000, 50_000),
                (100_000, 50_000),
            ),
            at(
                9_000,
                "restore",
                "container_end",
                (100_000, 50_000),
                (50_000, 0),
            ),
        ];
        let mut s = String::new();
        controls(&mut s, 0, &list, 10_000_000_000);
        assert!(s.contains("<h3>CPU control</h3><p>4 changes"), "{s}");
        assert!(s.contains("data-changes=\"4\""), "{s}");
        // One mark per change, placed on the time axis: 3 s of 10 s is x=180.
        assert_eq!(s.matches("<circle ").count(), 4);
        assert!(s.contains("<circle class=\"lower\" cx=\"180.0\""), "{s}");
        // The peak (1.5 + 0.5 CPUs) sets the scale; the quota steps to 1.5.
        assert!(s.contains("peak 2.00 CPUs"), "{s}");
        let quota = s.split("class=\"quota\" points=\"").nth(1).unwrap();
        let quota = &quota[..quota.find('"').unwrap()];
        let ys: Vec<f64> = quota
            .split(' ')
            .map(|p| p.split(',').nth(1).unwrap().parse().unwrap())
            .collect();
        let lowest_y = ys.iter().cloned().fold(f64::MAX, f64::min);
        assert!(
            (lowest_y - (120.0 - 1.5 * 120.0 / 2.2)).abs() < 0.1,
            "{quota}"
        );
        // The table: every change with its cause, values and signal.
        assert_eq!(s.matches("<tr class=").count(), 4);
        assert!(
            s.contains("<td class=\"l\">node_pressure</td><td>150ms &#8594; 100ms</td>"),
            "{s}"
        );
        assert!(s.contains("PSI some 97%, idle 1%"), "{s}");
        assert!(s.contains("throttled 30ms in 50ms (2 episodes)"), "{s}");
        assert!(s.contains("<td class=\"l\">container_end</td>"), "{s}");
        // The header's line: 0.5 CPUs at the start, 1.5 at most, 0.5 at the end.
        let c = crate::summary::LimitChanges::of(&list).unwrap();
        assert_eq!(
            (c.changes, c.start_cpus, c.peak_cpus, c.end_cpus),
            (4, 0.5, 1.5, 0.5)
        );
        assert!(
            c.to_string().starts_with("the controller changed the limit 4 times: 0.50 CPUs at the start, 1.50 at most, 0.50 at the end"),
            "{c}"
        );
        assert_eq!(crate::summary::LimitChanges::of(&[]), None);
        // Nothing without changes.
        let mut empty = String::new();
        controls(&mut empty, 0, &[], 1);
        assert!(empty.is_empty());
    }
}
