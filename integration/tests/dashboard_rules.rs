//! Issue 13, the parts that need no running agent: promtool checks and
//! unit-tests the Prometheus rules (configs/prometheus/), and the Grafana
//! dashboard JSON's structure is checked (Grafana is not installable here;
//! integration/tests/prometheus.rs runs every query against a real Prometheus).

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::Value;
use throttlewatch_integration::prometheus::{
    count_rules, dashboard, label_values, repo, targets, RULES, RULES_TEST,
};

#[test]
fn promtool_checks_and_unit_tests_the_rules() {
    assert!(count_rules(&repo().join(RULES)) >= 11);
    let o = Command::new("promtool")
        .args(["test", "rules", RULES_TEST])
        .current_dir(repo())
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        o.status.success() && said.contains("SUCCESS"),
        "promtool test rules: {said}"
    );
    // The unit tests cover every alert, firing and not firing.
    let tests = std::fs::read_to_string(repo().join(RULES_TEST)).unwrap();
    let rules = std::fs::read_to_string(repo().join(RULES)).unwrap();
    for alert in rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
    {
        let cases: Vec<&str> = tests
            .split("alertname: ")
            .skip(1)
            .filter(|c| c.starts_with(alert))
            .collect();
        assert!(
            cases.iter().any(|c| c.contains("exp_alerts: []")),
            "{alert}: no not-firing case"
        );
        assert!(
            cases.iter().any(|c| c.contains("exp_labels")),
            "{alert}: no firing case"
        );
    }
}

#[test]
fn dashboard_structure_matches_what_is_tested() {
    let d = dashboard();
    let vars = d["templating"]["list"].as_array().unwrap();
    let ds = vars
        .iter()
        .find(|v| v["type"] == "datasource")
        .expect("a datasource variable");
    assert_eq!(ds["query"], "prometheus");
    let ds_ref = format!("${{{}}}", ds["name"].as_str().unwrap());
    for name in ["namespace", "pod", "container"] {
        let v = vars
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("${name}"));
        assert_eq!(v["type"], "query");
        assert_eq!(v["datasource"]["uid"], ds_ref.as_str(), "${name}");
        label_values(v["query"]["query"].as_str().unwrap());
    }
    let panels = d["panels"].as_array().unwrap();
    let types: BTreeSet<&str> = panels.iter().map(|p| p["type"].as_str().unwrap()).collect();
    let known: BTreeSet<&str> = ["timeseries", "heatmap", "table", "bargauge"].into();
    assert!(types.is_subset(&known), "{types:?}");
    let heatmaps: Vec<&Value> = panels.iter().filter(|p| p["type"] == "heatmap").collect();
    assert_eq!(heatmaps.len(), 2, "freeze durations and run-queue latency");
    for h in &heatmaps {
        assert_eq!(
            h["options"]["calculate"], false,
            "from the le buckets, not recalculated"
        );
        for t in h["targets"].as_array().unwrap() {
            assert_eq!(t["format"], "heatmap");
            let e = t["expr"].as_str().unwrap();
            assert!(
                e.starts_with("sum by (le)") && e.contains("_bucket{"),
                "{e}"
            );
            assert!(
                e.contains(" or sum(increase(throttlewatch_"),
                "the native histogram where Prometheus stores one: {e}"
            );
        }
    }
    for title in [
        "Frozen share per container",
        "Freeze durations",
        "Run-queue latency",
        "Periods throttled vs burst used",
        "Run-queue p99 and whom it waited behind",
        "Cold-start stages (p50, p99)",
        "Top throttled pods",
        "Probe health",
        "GPU utilisation while frozen",
    ] {
        assert!(
            panels.iter().any(|p| p["title"] == title),
            "panel {title:?}"
        );
    }
    // Every target is one the live test runs (targets() is what it walks),
    // uses the datasource variable, and names only metrics the agent serves.
    let all = targets(&d);
    let counted: usize = panels
        .iter()
        .map(|p| p["targets"].as_array().map_or(0, |t| t.len()))
        .sum();
    assert_eq!(all.len(), counted);
    let docs = std::fs::read_to_string(repo().join("docs/metrics.md")).unwrap();
    for (p, t) in &all {
        let e = t["expr"].as_str().unwrap();
        assert_both_modes(e, &format!("panel {}", p["title"]));
    }
    for (p, t) in all {
        assert_eq!(p["datasource"]["uid"], ds_ref.as_str(), "{}", p["title"]);
        assert_eq!(t["datasource"]["uid"], ds_ref.as_str(), "{}", p["title"]);
        assert!(t["hide"] != true, "a hidden target is never tested: {t}");
        let e = t["expr"].as_str().unwrap();
        for m in e
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("throttlewatch_"))
        {
            let family = ["_bucket", "_total"]
                .iter()
                .fold(m, |m, s| m.strip_suffix(s).unwrap_or(m));
            assert!(
                docs.contains(&format!("`{family}")),
                "{m} (panel {}) not in docs/metrics.md",
                p["title"]
            );
        }
    }
}

/// Series that only `metrics_detail = "full"` serves (docs/metrics.md,
/// "Series budget"): no panel or rule may need them.
const FULL_ONLY: [&str; 6] = [
    "throttlewatch_throttled_seconds_total",
    "throttlewatch_bursts_total",
    "throttlewatch_runq_preemptions_total",
    "throttlewatch_wakeups_total",
    "throttlewatch_wakeup_wait_seconds_total",
    "throttlewatch_gpu_memory_used_bytes",
];

/// An expression over a freeze or run-queue histogram reads it in both
/// modes: the classic `_bucket` series and the native histogram, one
/// `or` the other; and it reads no `full`-only series.
fn assert_both_modes(e: &str, what: &str) {
    let words: Vec<&str> = e
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .collect();
    for f in FULL_ONLY {
        assert!(
            !words.contains(&f),
            "{what}: {f} is served at metrics_detail = full only: {e}"
        );
    }
    for h in [
        "throttlewatch_freeze_duration_seconds",
        "throttlewatch_runq_latency_seconds",
    ] {
        let classic = words.contains(&format!("{h}_bucket").as_str());
        let native = words.contains(&h);
        assert_eq!(classic, native, "{what}: {h} in one mode only: {e}");
        if classic {
            assert!(e.contains(" or"), "{what}: {e}");
        }
    }
}

#[test]
fn rules_read_both_histogram_modes_and_basic_series_only() {
    let text = std::fs::read_to_string(repo().join(RULES)).unwrap();
    let rules: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let mut n = 0;
    for g in rules["groups"].as_sequence().unwrap() {
        for r in g["rules"].as_sequence().unwrap() {
            let e = r["expr"].as_str().unwrap();
            let name = r
                .get("record")
                .or(r.get("alert"))
                .and_then(|v| v.as_str())
                .unwrap();
            assert_both_modes(e, name);
            n += 1;
        }
    }
    assert_eq!(n, count_rules(&repo().join(RULES)));
}
