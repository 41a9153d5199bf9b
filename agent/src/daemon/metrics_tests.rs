//! Unit tests of metrics.rs: bucket mapping, series per container, grace period.
use std::sync::Arc;

use throttlewatch_core::logfmt::{ColdStart, ColdStartStage, Runq};

use super::*;
use crate::output::Output;
use throttlewatch_bpf::runq::RUNQ_SLOTS;
use throttlewatch_core::metrics_detail::MetricsDetail;

fn labels(id: &str) -> Arc<ContainerLabels> {
    Arc::new(ContainerLabels::plain(id, "n"))
}

fn lines_of<'a>(body: &'a str, id: &str) -> Vec<&'a str> {
    let key = format!("container_id=\"{id}\"");
    body.lines().filter(|l| l.contains(&key)).collect()
}

#[test]
fn runq_slots_become_buckets_and_preemptions_by_who() {
    let m = Metrics::with_detail(MetricsDetail::Full);
    let mut slots = [0u64; RUNQ_SLOTS];
    slots[21] = 3; // [2.1, 4.2) ms
    m.observe(&Output::Runq {
        container: labels("a"),
        record: Runq {
            count: 3,
            total_ns: 7_000_000,
            preempted_by_other: 2,
            preempted_by_host: 1,
            ..Default::default()
        },
        slots,
    });
    let body = m.encode();
    let a = lines_of(&body, "a");
    let has = |prefix: &str| a.iter().any(|l| l.starts_with(prefix));
    assert!(
        has("throttlewatch_runq_latency_seconds_count{")
            && a.iter().any(
                |l| l.starts_with("throttlewatch_runq_latency_seconds_count{") && l.ends_with(" 3")
            ),
        "{body}"
    );
    assert!(
        a.iter()
            .any(|l| l.starts_with("throttlewatch_runq_latency_seconds_sum{")
                && l.ends_with(" 0.007")),
        "{body}"
    );
    let bucket = |le: &str| {
        a.iter()
            .find(|l| {
                l.starts_with("throttlewatch_runq_latency_seconds_bucket{")
                    && l.contains(&format!("le=\"{le}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .unwrap_or_else(|| panic!("le {le}: {body}"))
            .to_string()
    };
    assert_eq!(bucket("0.002097152"), "0", "2^21 ns holds values under it");
    assert_eq!(bucket("0.004194304"), "3", "2^22 ns");
    assert_eq!(bucket("+Inf"), "3");
    for (by, n) in [("same", "0.0"), ("other", "2.0"), ("host", "1.0")] {
        assert!(
            a.iter()
                .any(|l| l.starts_with("throttlewatch_runq_preemptions_total{")
                    && l.contains(&format!("by=\"{by}\""))
                    && l.ends_with(&format!(" {n}"))),
            "{by}: {body}"
        );
    }
}

#[test]
fn cold_starts_aggregate_by_namespace_class_and_stage() {
    let m = Metrics::new();
    let mut l = ContainerLabels::plain("c", "n");
    l.namespace = "ns".into();
    l.qos_class = "burstable".into();
    let stage = |s: &str, ns: i64| ColdStartStage {
        stage: s.into(),
        since_create_ns: Some(ns),
        ..Default::default()
    };
    m.observe(&Output::ColdStart {
        container: Arc::new(l),
        record: ColdStart {
            stages: vec![
                stage("create", 0),
                stage("exec", 40_000_000),
                stage("bogus\"x", 1),
                stage("cpu", 200_000_000),
            ],
            ..Default::default()
        },
    });
    let body = m.encode();
    let count = |stage: &str| {
        body.lines()
            .find(|l| {
                l.starts_with("throttlewatch_cold_start_seconds_count{")
                    && l.contains(&format!("stage=\"{stage}\""))
            })
            .map(|l| l.to_string())
    };
    let exec = count("exec").unwrap_or_else(|| panic!("{body}"));
    assert!(
        exec.contains("namespace=\"ns\"")
            && exec.contains("qos_class=\"burstable\"")
            && exec.ends_with(" 1"),
        "{exec}"
    );
    assert!(
        !exec.contains("container_id"),
        "no per-container label: {exec}"
    );
    assert!(count("cpu").is_some());
    assert!(
        count("create").is_none(),
        "the origin is no stage to observe"
    );
    assert!(!body.contains("bogus"), "only the six stage names: {body}");
}

#[test]
fn ended_containers_go_after_the_grace_period() {
    let m = Metrics::new();
    let t0 = Instant::now();
    for id in ["gone", "back", "now"] {
        m.observe(&Output::Freeze {
            container: labels(id),
            frozen_ns: 50_000_000,
            record: None,
        });
    }
    m.retire(&labels("gone"), Duration::from_secs(300), t0);
    m.retire(&labels("back"), Duration::from_secs(300), t0);
    m.retire(&labels("now"), Duration::ZERO, t0);
    m.keep(&labels("back"));
    let body = m.encode();
    assert!(lines_of(&body, "now").is_empty(), "grace 0: gone at once");
    assert!(
        !lines_of(&body, "gone").is_empty(),
        "kept during the grace period"
    );
    assert_eq!(m.sweep(t0 + Duration::from_secs(299)), 0);
    assert_eq!(m.sweep(t0 + Duration::from_secs(300)), 1);
    let body = m.encode();
    assert!(lines_of(&body, "gone").is_empty(), "{body}");
    assert!(!lines_of(&body, "back").is_empty(), "watched again: kept");
}

#[test]
fn proc_stat_idle_and_cpus() {
    let text = "cpu  100 0 50 1000 20 0 0 0 0 0\ncpu0 50 0 25 500 10 0 0 0 0 0\ncpu1 50 0 25 500 10 0 0 0 0 0\nintr 1\n";
    assert_eq!(parse_proc_stat(text, 100.0), Some((10.2, 2)));
    assert_eq!(parse_proc_stat("intr 1\n", 100.0), None);
    let m = Metrics::new();
    let body = m.encode();
    assert!(
        body.contains("throttlewatch_node_idle_cpu_seconds_total "),
        "{body}"
    );
    assert!(
        !body.contains("throttlewatch_node_cpus 0"),
        "this machine has CPUs: {body}"
    );
}

#[test]
fn runnable_time_is_split_by_cause_as_the_report_does() {
    let m = Metrics::new();
    m.observe(&Output::Runq {
        container: labels("w"),
        record: Runq {
            count: 4,
            total_ns: 8_000_000,
            preempted_by_same: 1,
            preempted_by_host: 3,
            ..Default::default()
        },
        slots: [0u64; RUNQ_SLOTS],
    });
    let freeze = |by: u64| throttlewatch_core::logfmt::Throttle {
        cgroup_id: 7,
        throttled_cgroup_id: by,
        ..Default::default()
    };
    for (by, ns) in [(7, 5_000_000), (5, 2_000_000)] {
        m.observe(&Output::Freeze {
            container: labels("w"),
            frozen_ns: ns,
            record: Some(freeze(by)),
        });
    }
    m.observe(&Output::Freeze {
        container: labels("w"),
        frozen_ns: 1_000_000,
        record: None,
    });
    let body = m.encode();
    let value = |cause: &str| -> f64 {
        lines_of(&body, "w")
            .into_iter()
            .find(|l| {
                l.starts_with("throttlewatch_runnable_waiting_seconds_total{")
                    && l.contains(&format!("cause=\"{cause}\""))
            })
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("{cause}: {body}"))
    };
    assert!((value("own_threads") - 0.002).abs() < 1e-9);
    assert!((value("host") - 0.006).abs() < 1e-9);
    assert!(
        (value("own_limit") - 0.006).abs() < 1e-9,
        "folded freezes are the container's own"
    );
    assert!((value("ancestor_limit") - 0.002).abs() < 1e-9);
    m.forget(&labels("w"));
    assert!(
        lines_of(&m.encode(), "w").is_empty(),
        "forgotten with the container"
    );
}

#[test]
fn gpu_utilisation_per_container_gpu_and_forgotten_with_it() {
    let m = Metrics::with_detail(MetricsDetail::Full);
    for (gpu, util, sm) in [(0, 90, Some(38)), (3, 5, None)] {
        m.observe(&Output::Gpu {
            container: labels("g"),
            gpu,
            reading: crate::gpu::GpuReading {
                util_pct: util,
                mem_used_bytes: 1 << 30,
                sm_active_pct: sm,
                ..Default::default()
            },
        });
    }
    let body = m.encode();
    let g = lines_of(&body, "g");
    let util = |gpu: &str| {
        g.iter()
            .find(|l| {
                l.starts_with("throttlewatch_gpu_utilization_ratio{")
                    && l.contains(&format!("gpu=\"{gpu}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_string)
    };
    assert_eq!(util("0").as_deref(), Some("0.9"), "{body}");
    assert_eq!(util("3").as_deref(), Some("0.05"), "{body}");
    let sm: Vec<&&str> = g
        .iter()
        .filter(|l| l.starts_with("throttlewatch_gpu_sm_active_ratio{"))
        .collect();
    assert_eq!(sm.len(), 1, "only the GPU with GPM: {body}");
    assert!(
        sm[0].contains("gpu=\"0\"") && sm[0].ends_with(" 0.38"),
        "{}",
        sm[0]
    );
    assert!(
        g.iter()
            .any(|l| l.starts_with("throttlewatch_gpu_memory_used_bytes{")
                && l.contains("namespace=")
                && l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) == Some(1073741824.0)),
        "{body}"
    );
    m.forget(&labels("g"));
    assert!(lines_of(&m.encode(), "g").is_empty());
    let basic = Metrics::new();
    basic.observe(&Output::Gpu {
        container: labels("g"),
        gpu: 0,
        reading: crate::gpu::GpuReading {
            util_pct: 90,
            sm_active_pct: Some(38),
            ..Default::default()
        },
    });
    let g = basic.encode();
    let g = lines_of(&g, "g");
    assert!(
        g.len() == 1 && g[0].starts_with("throttlewatch_gpu_utilization_ratio{"),
        "basic: utilisation alone: {g:?}"
    );
}

#[test]
fn wakeups_are_counted_by_who_woke_and_removed_with_the_container() {
    use throttlewatch_core::logfmt::wakeups::{WakeTotals, Wakeups};
    let m = Metrics::with_detail(MetricsDetail::Full);
    let mut w = Wakeups::default();
    w.by_waker.insert(
        "interrupt".into(),
        WakeTotals {
            count: 10,
            wait_ns: 2_000_000_000,
            frozen_ns: 500_000_000,
        },
    );
    w.by_waker.insert(
        "same".into(),
        WakeTotals {
            count: 3,
            ..Default::default()
        },
    );
    m.observe(&Output::Runq {
        container: labels("wk"),
        record: Runq {
            wakeups: Some(w),
            ..Default::default()
        },
        slots: [0u64; RUNQ_SLOTS],
    });
    let body = m.encode();
    let line = |name: &str, by: &str| {
        body.lines()
            .find(|l| {
                l.starts_with(name) && l.contains("\"wk\"") && l.contains(&format!("by=\"{by}\""))
            })
            .unwrap_or_else(|| panic!("no {name} by={by} in {body}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .parse::<f64>()
            .unwrap()
    };
    assert_eq!(line("throttlewatch_wakeups_total", "interrupt"), 10.0);
    assert_eq!(line("throttlewatch_wakeups_total", "same"), 3.0);
    assert_eq!(
        line("throttlewatch_wakeup_wait_seconds_total", "interrupt"),
        2.0
    );
    assert_eq!(
        line("throttlewatch_wakeup_frozen_seconds_total", "interrupt"),
        0.5
    );
    m.forget(&labels("wk"));
    assert!(
        !m.encode().contains("throttlewatch_wakeups_total{"),
        "removed with the container"
    );
}
