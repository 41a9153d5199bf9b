//! The cold start's waterfall in the terminal summary: one bar per stage,
//! then what held the start back between `exec` and `cpu`.

use std::fmt::Write;

use super::style::Style;
use crate::heatmap::short;

/// The cold start as bars from `create` (or the first stage known).
pub(super) fn waterfall(cs: &throttlewatch_core::logfmt::ColdStart, st: Style) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n  {} ({}, CPU target {}){}",
        st.bold("cold start"),
        cs.comm,
        short(cs.cpu_target_ns),
        if cs.complete {
            String::new()
        } else {
            format!("  incomplete: {}", cs.note.as_deref().unwrap_or(""))
        }
    );
    let Some(first) = cs.stages.iter().map(|x| x.unix_ns).min() else {
        return s;
    };
    // The scale takes the exec→cpu split too: a start that never reached
    // its CPU target has a split longer than its stages (20 s of a
    // sleeping process), and its bar must fit the same 40 columns.
    let split_end = cs.exec_to_cpu.as_ref().and_then(|sp| {
        let exec = cs.stages.iter().find(|x| x.stage == "exec")?.unix_ns - first;
        Some(exec + sp.running_ns + sp.runq_ns + sp.frozen_ns + sp.blocked_ns)
    });
    let span = cs
        .stages
        .iter()
        .map(|x| x.unix_ns - first)
        .chain(split_end)
        .max()
        .unwrap_or(0)
        .max(1);
    const W: u64 = 40;
    for x in &cs.stages {
        let at = x.unix_ns - first;
        let n = (at * W).div_ceil(span) as usize;
        let bar = if st.unicode {
            "█".repeat(n)
        } else {
            "#".repeat(n)
        };
        let _ = writeln!(s, "  {:<10} {:>10}  |{bar}", x.stage, short(at));
    }
    if let Some(line) = split_bar(cs, first, span, W, st) {
        s.push_str(&line);
    }
    s
}

/// What held the start back between `exec` and `cpu`: one bar segment per
/// state (running, run-queue wait, frozen by the quota, blocked), under the
/// stages' bars, with the figures.
fn split_bar(
    cs: &throttlewatch_core::logfmt::ColdStart,
    first: u64,
    span: u64,
    width: u64,
    st: Style,
) -> Option<String> {
    let sp = cs.exec_to_cpu?;
    let exec = cs.stages.iter().find(|x| x.stage == "exec")?.unix_ns - first;
    let parts = [
        ("running", sp.running_ns, "█", "R"),
        ("run-queue", sp.runq_ns, "▓", "Q"),
        ("frozen", sp.frozen_ns, "▒", "F"),
        ("blocked", sp.blocked_ns, "░", "B"),
    ];
    let total: u64 = parts.iter().map(|p| p.1).sum();
    // Columns as the stages' bars count them: from the end of exec's bar to
    // the end of cpu's.
    let lead = (exec * width).div_ceil(span);
    let cols = ((exec + total) * width)
        .div_ceil(span)
        .saturating_sub(lead)
        .max(1);
    let lead = lead as usize;
    let mut bar = " ".repeat(lead);
    let mut used = 0u64;
    let mut acc = 0u64;
    for (_, ns, uni, ascii) in parts {
        acc += ns;
        // Cumulative rounding: the segments fill exactly `cols` columns.
        let upto = (acc * cols).div_ceil(total.max(1));
        let n = upto.saturating_sub(used) as usize;
        used = upto.max(used);
        bar.push_str(&if st.unicode { uni } else { ascii }.repeat(n));
    }
    let legend: Vec<String> = parts
        .iter()
        .map(|(name, ns, uni, ascii)| {
            format!(
                "{} {name} {}",
                if st.unicode { uni } else { ascii },
                short(*ns)
            )
        })
        .collect();
    Some(format!(
        "  {:<10} {:>10}  |{bar}\n  {}\n",
        if st.unicode {
            "exec→cpu"
        } else {
            "exec..cpu"
        },
        short(total),
        legend.join("  ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use throttlewatch_core::logfmt::{ColdStart, ColdStartSplit, ColdStartStage};

    /// A stage `ms` after create.
    fn at(stage: &str, ms: u64) -> ColdStartStage {
        ColdStartStage {
            stage: stage.into(),
            unix_ns: 1_000_000_000 + ms * 1_000_000,
            since_create_ns: Some(ms as i64 * 1_000_000),
        }
    }

    #[test]
    fn waterfall_draws_the_split_from_exec_to_the_target() {
        let cs = ColdStart {
            comm: "app".into(),
            cpu_target_ns: 10_000_000,
            stages: vec![
                at("create", 0),
                at("exec", 40),
                at("first_run", 40),
                at("cpu", 200),
            ],
            complete: true,
            exec_to_cpu: Some(ColdStartSplit {
                running_ns: 20_000_000,
                runq_ns: 20_000_000,
                frozen_ns: 100_000_000,
                blocked_ns: 20_000_000,
            }),
            ..Default::default()
        };
        let s = waterfall(&cs, Style::plain());
        let line = s
            .lines()
            .find(|l| l.contains("exec..cpu"))
            .unwrap_or_else(|| panic!("{s}"));
        let bar = line.split('|').nth(1).unwrap();
        // 40 columns for 200 ms: exec at column 8, then 160 ms in 32 columns
        // split 4 R, 4 Q, 20 F, 4 B.
        assert_eq!(
            bar,
            format!(
                "{}{}{}{}{}",
                " ".repeat(8),
                "R".repeat(4),
                "Q".repeat(4),
                "F".repeat(20),
                "B".repeat(4)
            ),
            "{s}"
        );
        assert!(
            s.contains("F frozen 100ms") || s.contains("F frozen 100.0ms"),
            "{s}"
        );
        // Without the split (older logs), only the stages.
        let old = ColdStart {
            exec_to_cpu: None,
            ..cs
        };
        assert!(!waterfall(&old, Style::plain()).contains("exec..cpu"));
    }

    /// A start that never reached its CPU target (a process that slept
    /// 20 s): the split is longer than the stages, and still fits.
    #[test]
    fn a_split_longer_than_the_stages_fits_the_bars() {
        let cs = ColdStart {
            comm: "sleeper".into(),
            cpu_target_ns: 10_000_000,
            stages: vec![at("create", 0), at("exec", 40), at("first_run", 41)],
            exec_to_cpu: Some(ColdStartSplit {
                running_ns: 1_000_000,
                runq_ns: 2_000_000,
                frozen_ns: 0,
                blocked_ns: 20_000_000_000,
            }),
            ..Default::default()
        };
        let s = waterfall(&cs, Style::plain());
        for l in s.lines() {
            assert!(
                l.chars().count() <= 80,
                "{} columns: {l}",
                l.chars().count()
            );
        }
        let bar = s.lines().find(|l| l.contains("exec..cpu")).unwrap();
        assert!(bar.split('|').nth(1).unwrap().len() <= 40, "{s}");
    }
}
