//! One self-contained HTML page: the summary tables, the recommendations and
//! the heatmaps as inline SVG. No script, no stylesheet or font from the
//! network: it opens from a file.

use std::fmt::Write;

use crate::heatmap::short;
use crate::render_svg;
use crate::summary::ContainerReport;

pub use crate::html_escape::esc;

mod control_chart;
mod gpu_chart;
mod wake_chart;
use control_chart::controls;

const CSS: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222}\
.wf{display:inline-block;height:11px;vertical-align:middle}.wf.stage{background:#47a}\
.wf.running{background:#2a7}.wf.runq{background:#e90}.wf.frozen{background:#c40}.wf.blocked{background:#aaa}\
table{border-collapse:collapse;margin:.5em 0}td,th{padding:2px 10px;text-align:right}\
th{border-bottom:1px solid #999}td.l,th.l{text-align:left}.missing{color:#777;font-size:12px}\
figure{margin:1em 0}section{border-top:2px solid #c40;margin-top:2em}code{background:#f3f3f3}\
svg.control .quota{stroke:#47a;fill:none;stroke-width:1.5}svg.control .limit{stroke:#2a7;fill:none;stroke-dasharray:4 2}\
svg.control .raise{fill:#2a7}svg.control .lower{fill:#e90}svg.control .restore,svg.control .adopt{fill:#777}";

fn opt(v: Option<u64>) -> String {
    v.map_or("-".into(), short)
}

pub fn page(reports: &[ContainerReport]) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>throttlewatch report</title><style>{CSS}</style></head><body>\n\
         <h1>throttlewatch report</h1>\n"
    );
    if reports.len() > 1 {
        s.push_str("<h2>Containers by frozen share</h2><table id=\"ranking\"><tr><th>frozen share</th><th>throttled</th><th>periods throttled</th><th class=\"l\">container</th></tr>\n");
        for r in reports {
            let _ = writeln!(
                s,
                "<tr><td>{}</td><td>{}</td><td>{}/{}</td><td class=\"l\">{}</td></tr>",
                r.frozen_share
                    .map_or("-".into(), |f| format!("{:.1}%", f * 100.0)),
                opt(r.kernel_throttled_ns),
                r.nr_throttled.unwrap_or(0),
                r.nr_periods.unwrap_or(0),
                esc(&r.container_name)
            );
        }
        s.push_str("</table>\n");
    }
    for (i, r) in reports.iter().enumerate() {
        container(&mut s, i, r);
    }
    s.push_str("</body></html>\n");
    s
}

fn container(s: &mut String, i: usize, r: &ContainerReport) {
    header(s, i, r);
    summary_table(s, r);
    cpu_split(s, r);
    diagnosis(s, r);
    top_threads(s, r);
    processes(s, r);
    if let Some(cs) = &r.cold_start {
        cold_start(s, cs);
        if let Some(n) = &cs.note {
            let _ = writeln!(s, "<p class=\"missing\">{}</p>", esc(n));
        }
    }
    recommendations(s, r);
    controls(s, i, &r.controls, r.wall_ns);
    gpu_chart::gpus(s, i, r.gpu.as_ref());
    wake_chart::wakeups(s, i, r.wakeups.as_ref());
    heatmaps(s, i, r);
    s.push_str("</section>\n");
}

/// The section's heading: the container, its log and its limits.
fn header(s: &mut String, i: usize, r: &ContainerReport) {
    let _ = writeln!(
        s,
        "<section id=\"c{i}\"><h2>{}</h2><p><code>{}</code> · quota {} per {} · burst {} · cpus {} · model {}{}</p>",
        esc(if r.container_name.is_empty() { &r.container_id } else { &r.container_name }),
        esc(&r.log),
        r.quota_us.map_or("none".into(), |q| short(q * 1000)),
        short(r.period_us * 1000),
        short(r.burst_us.unwrap_or(0) * 1000),
        esc(r.cpus.as_deref().unwrap_or("-")),
        esc(&r.throttle_model),
        if r.complete { "" } else { " · <b>no end record</b>" }
    );
    if let Some(c) = crate::summary::LimitChanges::of(&r.controls) {
        let _ = writeln!(
            s,
            "<p class=\"limits\">{} (<a href=\"#c{i}-control\">chart</a>)</p>",
            esc(&c.to_string())
        );
    }
}

/// Wall time, frozen share, throttled time and the freezes' distribution,
/// then the run-queue waits.
fn summary_table(s: &mut String, r: &ContainerReport) {
    let _ = writeln!(
        s,
        "<table class=\"summary\"><tr><th class=\"l\">wall</th><th class=\"l\">frozen share</th><th class=\"l\">throttled</th><th class=\"l\">periods throttled</th><th class=\"l\">freezes</th><th class=\"l\">p50</th><th class=\"l\">p99</th><th class=\"l\">max</th></tr>\
         <tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{} of {}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td></tr></table>",
        short(r.wall_ns),
        r.frozen_share.map_or("-".into(), |f| format!("{:.1}%", f * 100.0)),
        opt(r.kernel_throttled_ns),
        r.nr_throttled.unwrap_or(0),
        r.nr_periods.unwrap_or(0),
        r.freezes.count,
        opt(r.freezes.p50_ns),
        opt(r.freezes.p99_ns),
        opt(r.freezes.max_ns)
    );
    if let Some(q) = &r.runq {
        let _ = writeln!(
            s,
            "<p>Run-queue: {} waits, p50 {}, p99 {}, max {}; preempted by the same container {}, another container {}, the host {}.</p>",
            q.count, opt(q.p50_ns), opt(q.p99_ns), short(q.max_ns),
            q.preempted_by_same, q.preempted_by_other, q.preempted_by_host
        );
    }
}

/// Running, run-queue wait and frozen time for the container and its top
/// threads, and what the log could not tell.
fn cpu_split(s: &mut String, r: &ContainerReport) {
    s.push_str("<h3>CPU split</h3><table class=\"split\"><tr><th class=\"l\"></th><th>running</th><th>run-queue wait</th><th>frozen</th></tr>\n");
    let _ = writeln!(
        s,
        "<tr><td class=\"l\">container</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        opt(r.split.running_ns),
        opt(r.split.runqueue_wait_ns),
        opt(r.split.frozen_ns)
    );
    for t in &r.top_threads {
        let _ = writeln!(
            s,
            "<tr><td class=\"l\">{} {}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            t.freezes.tid,
            esc(&t.freezes.comm),
            opt(t.split.running_ns),
            opt(t.split.runqueue_wait_ns),
            opt(t.split.frozen_ns)
        );
    }
    s.push_str("</table>\n");
    for m in r.split.missing.iter().chain(
        r.top_threads
            .first()
            .map(|t| {
                t.split
                    .missing
                    .iter()
                    .filter(|m| !r.split.missing.contains(m))
            })
            .into_iter()
            .flatten(),
    ) {
        let _ = writeln!(s, "<p class=\"missing\">{}</p>", esc(m));
    }
}

/// The diagnosis sentence and the warnings.
fn diagnosis(s: &mut String, r: &ContainerReport) {
    let _ = writeln!(
        s,
        "<p class=\"diagnosis\"><b>Diagnosis:</b> {}</p>",
        esc(&r.diagnosis.sentence)
    );
    for w in &r.warnings {
        let _ = writeln!(s, "<p class=\"warning\"><b>Warning:</b> {}</p>", esc(w));
    }
}

/// The threads that were frozen the most.
fn top_threads(s: &mut String, r: &ContainerReport) {
    s.push_str("<h3>Top threads</h3><table class=\"threads\"><tr><th>tid</th><th>pid</th><th class=\"l\">comm</th><th>freezes</th><th>frozen</th><th>longest</th></tr>\n");
    for t in &r.top_threads {
        let t = &t.freezes;
        let _ = writeln!(
            s,
            "<tr><td>{}</td><td>{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            t.tid,
            t.pid,
            esc(&t.comm),
            t.freezes,
            short(t.frozen_ns),
            short(t.longest_ns)
        );
    }
    s.push_str("</table>\n");
}

/// The container's processes as a tree (a child indented under its
/// parent), where it has more than one.
fn processes(s: &mut String, r: &ContainerReport) {
    if r.processes.len() < 2 {
        return;
    }
    s.push_str("<h3>Processes</h3><table class=\"processes\"><tr><th>pid</th><th>parent</th><th class=\"l\">process</th><th>threads</th><th>freezes</th><th>frozen</th><th class=\"l\">command</th></tr>\n");
    for (depth, p) in crate::summary::process_tree(&r.processes) {
        let role = if p.main {
            " <small>(main process)</small>"
        } else if p.child_of_main {
            " <small>(child of the main process)</small>"
        } else {
            ""
        };
        let _ = writeln!(
            s,
            "<tr data-depth=\"{depth}\"><td>{}</td><td>{}</td><td class=\"l\" style=\"padding-left:{}em\">{}{}{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"l\"><code>{}</code></td></tr>",
            p.pid,
            p.ppid.map_or("-".into(), |x| x.to_string()),
            0.3 + 1.2 * depth.min(6) as f64,
            if depth > 0 { "└ " } else { "" },
            esc(&p.comm),
            role,
            p.threads,
            p.freezes,
            short(p.frozen_ns),
            esc(p.cmdline.as_deref().or(p.exe.as_deref()).unwrap_or("-"))
        );
    }
    s.push_str("</table>\n");
}

/// The recommended settings, with their predictions and what they cover.
fn recommendations(s: &mut String, r: &ContainerReport) {
    if !r.recommendations.is_empty() {
        s.push_str("<h3>Recommendations</h3><ul class=\"recommendations\">\n");
        for x in &r.recommendations {
            let _ = writeln!(
                s,
                "<li><code>{}={}</code> (<code>{}</code>): {}{}<br><small>Prediction covers: {}</small></li>",
                esc(&x.key),
                esc(&x.value),
                esc(&x.run_flag),
                esc(&x.reason),
                x.predicted_throttled_ns
                    .map(|p| format!(
                        "; predicted throttled time {} (was {})",
                        short(p),
                        short(x.observed_throttled_ns)
                    ))
                    .or_else(|| x
                        .predicted_effect
                        .as_ref()
                        .map(crate::recommendation::Effect::describe))
                    .unwrap_or_default(),
                esc(x.covers)
            );
        }
        s.push_str("</ul>\n");
    }
}

/// The heatmaps as inline SVG, each with its colour legend.
fn heatmaps(s: &mut String, i: usize, r: &ContainerReport) {
    for (name, svg) in render_svg::all(r) {
        let g = match name {
            "latency" => &r.heatmaps.latency,
            "offset" => &r.heatmaps.offset,
            _ => &r.heatmaps.threads,
        };
        let _ = writeln!(
            s,
            "<figure class=\"heatmap\" id=\"c{i}-{name}\" data-cells=\"{}\">{}</figure>",
            g.nonzero_cells(),
            svg.trim_start_matches(|c| c != '<')
        );
        let max = g.max();
        let most = if g.value == "frozen ns" {
            short(max)
        } else {
            format!("{max} {}", g.value)
        };
        let _ = writeln!(
            s,
            "<p class=\"legend\">Colour: white = none, <span style=\"background:linear-gradient(90deg,#ffe082,#8c0014);color:#fff;padding:0 2em\">&nbsp;</span> yellow to dark red = up to {} per cell (square-root scale).{}</p>",
            esc(&most),
            if name == "offset" {
                " Rows: where in the CFS period the freezes began. A band just after +0 ms: the quota runs out right after each refill (many threads at once: fewer workers or a higher limit); a band late in the period: the quota lasts most of it (a small raise, or a burst for spikes, covers it)."
            } else {
                ""
            }
        );
    }
}

/// The cold-start waterfall: one bar per stage from the first one known, and
/// under them the time from `exec` to the CPU target split into running,
/// run-queue wait, frozen by the quota and blocked.
fn cold_start(s: &mut String, cs: &throttlewatch_core::logfmt::ColdStart) {
    const PX: f64 = 400.0;
    let first = cs.stages.iter().map(|x| x.unix_ns).min().unwrap_or(0);
    let span = cs
        .stages
        .iter()
        .map(|x| x.unix_ns - first)
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let px = |ns: u64| format!("{:.1}px", ns as f64 * PX / span);
    let _ = writeln!(
        s,
        "<h3>Cold start</h3><p>{} to {} of CPU (its threads and processes together)</p>\
         <table class=\"coldstart\"><tr><th class=\"l\">stage</th><th>since create</th><th class=\"l\"></th></tr>",
        esc(&cs.comm),
        short(cs.cpu_target_ns)
    );
    for x in &cs.stages {
        let _ = writeln!(
            s,
            "<tr><td class=\"l\">{}</td><td>{}</td><td class=\"l\"><span class=\"wf stage\" style=\"width:{}\"></span></td></tr>",
            esc(&x.stage),
            x.since_create_ns
                .map_or("-".into(), |n| short(n.max(0) as u64)),
            px(x.unix_ns - first)
        );
    }
    let exec = cs.stages.iter().find(|x| x.stage == "exec");
    if let (Some(sp), Some(exec)) = (cs.exec_to_cpu, exec) {
        let parts = [
            ("running", "running", sp.running_ns),
            ("runq", "run-queue wait", sp.runq_ns),
            ("frozen", "frozen by the quota", sp.frozen_ns),
            ("blocked", "blocked", sp.blocked_ns),
        ];
        let total: u64 = parts.iter().map(|p| p.2).sum();
        let _ = write!(
            s,
            "<tr class=\"split\"><td class=\"l\">exec&#8594;cpu</td><td>{}</td><td class=\"l\"><span class=\"wf\" style=\"width:{}\"></span>",
            short(total),
            px(exec.unix_ns - first)
        );
        for (class, name, ns) in parts {
            let _ = write!(
                s,
                "<span class=\"wf {class}\" style=\"width:{}\" title=\"{name} {}\"></span>",
                px(ns),
                short(ns)
            );
        }
        s.push_str("</td></tr>\n</table>\n<p class=\"legend\">");
        for (class, name, ns) in parts {
            let _ = write!(
                s,
                "<span class=\"wf {class}\" style=\"width:11px\"></span> {name} {} &nbsp; ",
                short(ns)
            );
        }
        s.push_str("</p>\n");
    } else {
        s.push_str("</table>\n");
    }
}
