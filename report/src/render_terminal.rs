//! The summary a person reads first. Colours and block characters only when
//! writing to a terminal and NO_COLOR is unset; plain ASCII otherwise.

use std::fmt::Write;

use crate::heatmap::{short, Grid};
use crate::summary::ContainerReport;

pub mod fit;
mod style;
mod wake_chains;
mod waterfall;
pub use style::Style;
use waterfall::waterfall;

fn opt(v: Option<u64>) -> String {
    v.map_or("-".into(), short)
}

fn pct(v: f64) -> String {
    format!("{:.1}%", v * 100.0)
}

/// Containers ranked by frozen share (a node report), before the details.
pub fn ranking(reports: &[ContainerReport], st: Style) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{}", st.bold("containers by frozen share"));
    let _ = writeln!(
        s,
        "  {:>7}  {:>10}  {:>9}  {:<24} log",
        "frozen", "throttled", "periods", "container"
    );
    for r in reports {
        let name = if r.container_name.is_empty() {
            &r.container_id
        } else {
            &r.container_name
        };
        let _ = writeln!(
            s,
            "  {:>7}  {:>10}  {:>9}  {:<24} {}",
            r.frozen_share.map_or("-".into(), pct),
            opt(r.kernel_throttled_ns),
            match (r.nr_throttled, r.nr_periods) {
                (Some(t), Some(p)) => format!("{t}/{p}"),
                _ => "-".into(),
            },
            clip(name, 24),
            r.log
        );
    }
    s
}

fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n - 1).collect::<String>() + "~"
    }
}

pub fn container(r: &ContainerReport, st: Style) -> String {
    let mut s = String::new();
    header(&mut s, r, st);
    totals(&mut s, r, st);
    frozen_by_level(&mut s, r);
    latencies(&mut s, r);
    cpu_split(&mut s, r, st);
    top_threads(&mut s, r, st);
    processes(&mut s, r, st);
    if let Some(cs) = &r.cold_start {
        s.push_str(&waterfall(cs, st));
    }
    controls(&mut s, &r.controls, st);
    gpus(&mut s, r, st);
    wake_chains::wake_chains(&mut s, r.wakeups.as_ref(), st);
    if r.freezes.count > 0 {
        s.push_str(&offset_heatmap(&r.heatmaps.offset, st));
    }
    what_if(&mut s, r, st);
    recommendations(&mut s, r, st);
    s
}

/// The container's GPUs while it was frozen and while not (gpu.rs).
fn gpus(s: &mut String, r: &ContainerReport, st: Style) {
    let Some(g) = &r.gpu else { return };
    let _ = writeln!(s, "\n  {}", st.bold("GPUs while frozen"));
    for a in &g.gpus {
        let _ = writeln!(s, "  {}", crate::gpu::describe(a));
    }
    if g.dropped_samples > 0 {
        let _ = writeln!(
            s,
            "  ({} GPU samples past the caps left out)",
            g.dropped_samples
        );
    }
}

/// The container's name and log, its limits, and how the log was read.
fn header(s: &mut String, r: &ContainerReport, st: Style) {
    let name = if r.container_name.is_empty() {
        r.container_id.clone()
    } else {
        r.container_name.clone()
    };
    let state = if r.complete {
        ""
    } else {
        "  (no end record: still being written, or cut)"
    };
    let _ = writeln!(
        s,
        "{}  {}{}",
        st.bold(&clip(&name, 60)),
        st.dim(&r.log),
        state
    );
    let quota = match r.quota_us {
        Some(q) => format!(
            "quota {} CPUs ({} per {})",
            q as f64 / r.period_us.max(1) as f64,
            short(q * 1000),
            short(r.period_us * 1000)
        ),
        None => "no quota".into(),
    };
    let _ = writeln!(
        s,
        "  {quota}, burst {}, cpus {}, throttle model {}",
        short(r.burst_us.unwrap_or(0) * 1000),
        r.cpus.as_deref().unwrap_or("-"),
        if r.throttle_model.is_empty() {
            "-"
        } else {
            &r.throttle_model
        }
    );
    if let Some(c) = crate::summary::LimitChanges::of(&r.controls) {
        let _ = writeln!(s, "  {c}");
    }
    if r.read.truncated_lines > 0 || r.read.older_version_lines > 0 {
        let _ = writeln!(
            s,
            "  {} truncated last line(s) skipped, {} line(s) of an older schema",
            r.read.truncated_lines, r.read.older_version_lines
        );
    }
}

/// Wall time, frozen share, throttled time, warnings and the diagnosis.
fn totals(s: &mut String, r: &ContainerReport, st: Style) {
    let share = r.frozen_share.map_or("-".into(), pct);
    let periods = match (r.nr_throttled, r.nr_periods) {
        (Some(t), Some(p)) if p > 0 => format!(
            "{t} of {p} periods throttled ({})",
            pct(t as f64 / p as f64)
        ),
        _ => "periods: -".into(),
    };
    let _ = writeln!(
        s,
        "  wall {}   frozen {} of the CPUs' time   throttled {}   {periods}",
        short(r.wall_ns),
        if r.frozen_share.unwrap_or(0.0) > 0.05 {
            st.warn(&share)
        } else {
            share
        },
        opt(r.kernel_throttled_ns),
    );
    for w in &r.warnings {
        let _ = writeln!(s, "  {}", st.warn(&format!("warning: {w}")));
    }
    let _ = writeln!(
        s,
        "  {}",
        st.bold(&format!("diagnosis: {}", r.diagnosis.sentence))
    );
}

/// Which level of the cgroup tree froze the threads, when it was not only the
/// container's own limit.
fn frozen_by_level(s: &mut String, r: &ContainerReport) {
    if r.frozen_by_level.iter().any(|l| l.level != "container") {
        let parts: Vec<String> = r
            .frozen_by_level
            .iter()
            .map(|l| {
                let what = match l.level {
                    "container" => "its own limit".to_string(),
                    "pod" => format!("the pod's limit ({})", l.cgroup_path),
                    _ => format!("an ancestor's limit ({})", l.cgroup_path),
                };
                let cpus = l
                    .quota_us
                    .filter(|_| l.period_us > 0)
                    .map(|q| format!(", {:.2} CPUs", q as f64 / l.period_us as f64))
                    .unwrap_or_default();
                format!("{what}{cpus}: {}", pct(l.share))
            })
            .collect();
        let _ = writeln!(s, "  frozen by {}", parts.join("; "));
    }
}

/// The freezes' and the run-queue waits' distributions.
fn latencies(s: &mut String, r: &ContainerReport) {
    let f = &r.freezes;
    let _ = writeln!(
        s,
        "  freezes {} (records): p50 {}  p99 {}  max {}{}",
        f.count,
        opt(f.p50_ns),
        opt(f.p99_ns),
        opt(f.max_ns),
        if r.queued_freezes > 0 {
            format!("  ({} queued)", r.queued_freezes)
        } else {
            String::new()
        }
    );
    match &r.runq {
        Some(q) => {
            let _ = writeln!(
                s,
                "  run-queue: {} waits, p50 {}  p99 {}  max {}; preempted by same container {} / other container {} / host {}",
                q.count,
                opt(q.p50_ns),
                opt(q.p99_ns),
                short(q.max_ns),
                q.preempted_by_same,
                q.preempted_by_other,
                q.preempted_by_host
            );
        }
        None => {
            let _ = writeln!(
                s,
                "  run-queue: not in this log (raw_tp probe, or no runq record yet)"
            );
        }
    }
}

/// Running, run-queue wait and frozen time for the container and its top
/// threads.
fn cpu_split(s: &mut String, r: &ContainerReport, st: Style) {
    let _ = writeln!(
        s,
        "\n  {}",
        st.bold("CPU split (what docker stats cannot show)")
    );
    let _ = writeln!(
        s,
        "  {:<22} {:>10} {:>14} {:>10}",
        "", "running", "run-queue wait", "frozen"
    );
    let sp = &r.split;
    let _ = writeln!(
        s,
        "  {:<22} {:>10} {:>14} {:>10}",
        "container",
        opt(sp.running_ns),
        opt(sp.runqueue_wait_ns),
        opt(sp.frozen_ns)
    );
    for t in r.top_threads.iter().take(5) {
        let _ = writeln!(
            s,
            "  {:<22} {:>10} {:>14} {:>10}",
            clip(&format!("{} {}", t.freezes.tid, t.freezes.comm), 22),
            opt(t.split.running_ns),
            opt(t.split.runqueue_wait_ns),
            opt(t.split.frozen_ns)
        );
    }
    for m in sp.missing.iter().chain(
        r.top_threads
            .first()
            .map(|t| t.split.missing.iter().filter(|m| !sp.missing.contains(m)))
            .into_iter()
            .flatten(),
    ) {
        let _ = writeln!(s, "  {}", st.dim(&format!("- {m}")));
    }
}

/// The threads that were frozen the most.
fn top_threads(s: &mut String, r: &ContainerReport, st: Style) {
    if !r.top_threads.is_empty() {
        let _ = writeln!(s, "\n  {}", st.bold("top threads"));
        let _ = writeln!(
            s,
            "  {:>8}  {:>8}  {:<16} {:>8} {:>10} {:>10}",
            "tid", "pid", "comm", "freezes", "frozen", "longest"
        );
        for t in &r.top_threads {
            let t = &t.freezes;
            let _ = writeln!(
                s,
                "  {:>8}  {:>8}  {:<16} {:>8} {:>10} {:>10}",
                t.tid,
                t.pid,
                clip(&t.comm, 16),
                t.freezes,
                short(t.frozen_ns),
                short(t.longest_ns)
            );
        }
    }
}

/// The processes, when there are more than one.
fn processes(s: &mut String, r: &ContainerReport, st: Style) {
    if r.processes.len() > 1 {
        let _ = writeln!(s, "\n  {}", st.bold("processes"));
        let _ = writeln!(
            s,
            "  {:>8}  {:>8}  {:<16} {:>7} {:>8} {:>10}  command",
            "pid", "parent", "comm", "threads", "freezes", "frozen"
        );
        // The tree: a child indented under its parent.
        for (depth, p) in crate::summary::process_tree(&r.processes) {
            let comm = match depth {
                0 => p.comm.clone(),
                d => format!("{}└ {}", "  ".repeat(d.min(4) - 1), p.comm),
            };
            let _ = writeln!(
                s,
                "  {:>8}  {:>8}  {:<16} {:>7} {:>8} {:>10}  {}{}",
                p.pid,
                p.ppid.map_or("-".into(), |x| x.to_string()),
                clip(&comm, 16),
                p.threads,
                p.freezes,
                short(p.frozen_ns),
                clip(p.cmdline.as_deref().or(p.exe.as_deref()).unwrap_or("-"), 60),
                if p.main {
                    "  (main process)"
                } else if p.child_of_main {
                    "  (child of the main process)"
                } else {
                    ""
                }
            );
        }
    }
}

/// The `--what-if` prediction.
fn what_if(s: &mut String, r: &ContainerReport, st: Style) {
    if let Some(w) = &r.what_if {
        let _ = writeln!(
            s,
            "\n  {} quota {} per {}, burst {}: predicted throttled {} (observed {})",
            st.bold("what if"),
            opt(w.quota_ns),
            short(w.period_ns),
            opt(w.burst_ns),
            opt(w.predicted_throttled_ns),
            opt(w.observed_throttled_ns)
        );
    }
}

/// The recommended settings, with their predictions and what they cover.
fn recommendations(s: &mut String, r: &ContainerReport, st: Style) {
    if !r.recommendations.is_empty() {
        let _ = writeln!(s, "\n  {}", st.bold("recommendations"));
        for x in &r.recommendations {
            let pred = x
                .predicted_throttled_ns
                .map(|p| {
                    format!(
                        " -> predicted throttled {} (was {})",
                        short(p),
                        short(x.observed_throttled_ns)
                    )
                })
                .or_else(|| {
                    x.predicted_effect
                        .as_ref()
                        .map(crate::recommendation::Effect::describe)
                })
                .unwrap_or_default();
            let _ = writeln!(s, "  * {}={}  ({}){pred}", x.key, x.value, x.run_flag);
            let _ = writeln!(s, "    {}", x.reason);
            let _ = writeln!(
                s,
                "    {}",
                st.dim(&format!("prediction covers: {}", x.covers))
            );
        }
    }
}

/// The time x period-offset heatmap in at most 60 columns and 10 rows.
pub fn offset_heatmap(g: &Grid, st: Style) -> String {
    let mut s = String::new();
    let mut cells = g.cells.clone();
    let mut bin = g.bin_ns;
    while cells.len() > 60 {
        cells = cells
            .chunks(2)
            .map(|c| {
                (0..c[0].len())
                    .map(|r| c.iter().map(|x| x[r]).sum())
                    .collect()
            })
            .collect();
        bin *= 2;
    }
    let rows = g.row_labels.len();
    let merged: Vec<Vec<u64>> = cells
        .iter()
        .map(|c| c.chunks(2).map(|p| p.iter().sum()).collect())
        .collect();
    let max = merged.iter().flatten().copied().max().unwrap_or(0).max(1);
    let shades: Vec<&str> = if st.unicode {
        vec![" ", "░", "▒", "▓", "█"]
    } else {
        vec![" ", ".", ":", "*", "#"]
    };
    let _ = writeln!(
        s,
        "\n  {} (column = {}, row = {} of the period; darker = more frozen)",
        st.bold("frozen time by offset in the CFS period"),
        short(bin),
        short(g.row_ns * 2)
    );
    for r in 0..rows.div_ceil(2) {
        let line: String = merged
            .iter()
            .map(|c| {
                let v = c.get(r).copied().unwrap_or(0);
                let i = if v == 0 {
                    0
                } else {
                    1 + ((v * 4 - 1) / max) as usize
                };
                shades[i.min(4)]
            })
            .collect();
        let _ = writeln!(s, "  {:>7} |{line}|", g.row_labels[r * 2]);
    }
    s
}

/// The dynamic CPU controller's changes on the timeline: the first and the
/// last ones when there are many.
fn controls(s: &mut String, list: &[crate::summary::ControlAt], st: Style) {
    const SHOWN: usize = 12;
    if list.is_empty() {
        return;
    }
    let _ = writeln!(s, "\n  {} ({} changes)", st.bold("cpu control"), list.len());
    let row = |s: &mut String, c: &crate::summary::ControlAt| {
        let r = &c.record;
        let _ = writeln!(
            s,
            "  {:>9}  {:<7} {:<15} quota {} -> {}  burst {} -> {}",
            short(c.at_ns),
            r.action,
            r.cause,
            short(r.before.quota_us * 1000),
            short(r.after.quota_us * 1000),
            short(r.before.burst_us * 1000),
            short(r.after.burst_us * 1000)
        );
    };
    if list.len() <= SHOWN {
        list.iter().for_each(|c| row(s, c));
        return;
    }
    list[..SHOWN / 2].iter().for_each(|c| row(s, c));
    let _ = writeln!(s, "  {:>9}  ({} more)", "...", list.len() - SHOWN);
    list[list.len() - SHOWN / 2..]
        .iter()
        .for_each(|c| row(s, c));
}
