//! Unit tests of metrics.rs: the series budget at both levels and in both
//! formats, a container's own level, the advice's series, a new
//! container's first scrape, and forged label values.
use std::sync::Arc;

use throttlewatch_bpf::runq::RUNQ_SLOTS;
use throttlewatch_core::logfmt::Runq;
use throttlewatch_core::metrics_detail::MetricsDetail;

use super::*;
use crate::output::Output;

fn labels(id: &str) -> Arc<ContainerLabels> {
    Arc::new(ContainerLabels::plain(id, "n"))
}

fn lines_of<'a>(body: &'a str, id: &str) -> Vec<&'a str> {
    let key = format!("container_id=\"{id}\"");
    body.lines().filter(|l| l.contains(&key)).collect()
}

/// Everything a busy container can be seen doing: freezes by its own and an
/// ancestor's quota, run-queue waits preempted by all three kinds and woken
/// by all five, the counters, the controller, two GPUs.
fn everything(m: &Metrics, l: &Arc<ContainerLabels>) {
    use throttlewatch_core::logfmt::wakeups::{WakeTotals, Wakeups};
    for by in [7, 5] {
        m.observe(&Output::Freeze {
            container: l.clone(),
            frozen_ns: 30_000_000,
            record: Some(throttlewatch_core::logfmt::Throttle {
                cgroup_id: 7,
                throttled_cgroup_id: by,
                ..Default::default()
            }),
        });
    }
    let mut w = Wakeups::default();
    for k in WAKERS {
        w.by_waker.insert(
            k.into(),
            WakeTotals {
                count: 1,
                ..Default::default()
            },
        );
    }
    let mut slots = [0u64; RUNQ_SLOTS];
    slots[20] = 3;
    m.observe(&Output::Runq {
        container: l.clone(),
        record: Runq {
            count: 3,
            total_ns: 3_000_000,
            preempted_by_same: 1,
            preempted_by_other: 1,
            preempted_by_host: 1,
            wakeups: Some(w),
            ..Default::default()
        },
        slots,
    });
    m.observe(&Output::Counters {
        container: l.clone(),
        kernel: Default::default(),
        probe_throttled_ns: 0,
    });
    m.control_changes.get_or_create(l).inc();
    m.set_advice(l, Some(&advice("0.7")));
    for gpu in [0, 1] {
        m.observe(&Output::Gpu {
            container: l.clone(),
            gpu,
            reading: crate::gpu::GpuReading {
                util_pct: 50,
                sm_active_pct: Some(20),
                ..Default::default()
            },
        });
    }
}

fn advice(v: &str) -> crate::daemon::advice::Advice {
    crate::daemon::advice::Advice {
        key: "resources.limits.cpu".into(),
        value: v.into(),
        number: v.parse().unwrap(),
        throttled_ratio: Some(0.05),
    }
}

/// The container's series as a Prometheus stores them: from the protobuf
/// exposition, a native histogram is one series; from the text, a classic
/// one is a series per bucket, `_sum` and `_count`.
fn series(m: &Metrics, id: &str, native: bool) -> usize {
    if !native {
        return lines_of(&m.encode(), id).len();
    }
    let families = prometheus_client::encoding::prometheus_protobuf::encode(&m.registry).unwrap();
    families
        .iter()
        .flat_map(|f| &f.metric)
        .filter(|s| {
            s.label
                .iter()
                .any(|l| l.name == "container_id" && l.value == id)
        })
        .map(|s| match &s.histogram {
            Some(h) => {
                assert!(h.zero_threshold > 0.0, "a native histogram, also empty");
                1
            }
            None => 1,
        })
        .sum()
}

/// docs/metrics.md's budget: per container, 14 series of its own and one
/// per GPU at `basic` with native histograms (two GPUs here: 16); the
/// classic exposition of the same, and `full`.
#[test]
fn per_container_series_are_within_the_budget() {
    for (detail, native, want) in [
        (MetricsDetail::Basic, true, 2 + 4 + 5 + 1 + 2 + 2),
        (MetricsDetail::Basic, false, 2 * 21 + 4 + 5 + 1 + 2 + 2),
        (
            MetricsDetail::Full,
            true,
            2 + 6 + 5 + 1 + 2 + 3 + 15 + 2 * 3,
        ),
        (
            MetricsDetail::Full,
            false,
            2 * 21 + 6 + 5 + 1 + 2 + 3 + 15 + 2 * 3,
        ),
    ] {
        let m = Metrics::with_detail(detail);
        let l = labels("x");
        everything(&m, &l);
        let n = series(&m, "x", native);
        assert_eq!(n, want, "{detail:?} native {native}:\n{}", m.encode());
        if detail == MetricsDetail::Basic && native {
            assert!(n <= 16, "the budget: {n}");
        }
    }
    // An idle container: its histograms, the cpu.stat counters.
    let m = Metrics::new();
    m.observe(&Output::Runq {
        container: labels("idle"),
        record: Runq::default(),
        slots: [0; RUNQ_SLOTS],
    });
    m.observe(&Output::Counters {
        container: labels("idle"),
        kernel: Default::default(),
        probe_throttled_ns: 0,
    });
    // (The freeze histogram appears with the first freeze.)
    assert_eq!(series(&m, "idle", true), 1 + 4, "{}", m.encode());
}

/// A pod's annotation over the node's level, in both directions, and
/// forgotten with the container.
#[test]
fn a_container_may_have_its_own_level() {
    let m = Metrics::new();
    let (a, b) = (labels("a"), labels("b"));
    m.set_detail(&a, MetricsDetail::Full);
    everything(&m, &a);
    everything(&m, &b);
    assert_eq!(series(&m, "a", true), 40);
    assert_eq!(series(&m, "b", true), 16);
    let full = Metrics::with_detail(MetricsDetail::Full);
    full.set_detail(&b, MetricsDetail::Basic);
    everything(&full, &b);
    assert_eq!(series(&full, "b", true), 16);
    m.forget(&a);
    everything(&m, &a);
    assert_eq!(series(&m, "a", true), 16, "the level went with the series");
}

/// A label value a container chose reaches the protobuf exposition as it
/// is (no escapes, nothing else to parse) and the text one escaped.
#[test]
fn chosen_label_values_cannot_forge_a_series() {
    let m = Metrics::new();
    let forged = "x\"} 1\nforged{a=\"b\\";
    let mut l = ContainerLabels::plain("p", "n");
    l.pod = forged.into();
    m.observe(&Output::Counters {
        container: Arc::new(l),
        kernel: Default::default(),
        probe_throttled_ns: 0,
    });
    let text = m.encode();
    assert!(!text.lines().any(|l| l.starts_with("forged")), "{text}");
    assert!(text.contains(r#"pod="x\"} 1\nforged{a=\"b\\""#), "{text}");
    let families = prometheus_client::encoding::prometheus_protobuf::encode(&m.registry).unwrap();
    let pods: Vec<&str> = families
        .iter()
        .flat_map(|f| &f.metric)
        .flat_map(|s| &s.label)
        .filter(|l| l.name == "pod")
        .map(|l| l.value.as_str())
        .collect();
    assert!(
        !pods.is_empty() && pods.iter().all(|p| *p == forged),
        "{pods:?}"
    );
}

/// The advice's two series follow the advice: replaced when it changes,
/// gone with none, never made for a container whose series are gone.
#[test]
fn advice_series_follow_the_advice() {
    let m = Metrics::new();
    let l = labels("adv");
    m.set_advice(&l, Some(&advice("0.7")));
    assert!(
        lines_of(&m.encode(), "adv").is_empty(),
        "unknown container: nothing"
    );
    m.observe(&Output::Counters {
        container: l.clone(),
        kernel: Default::default(),
        probe_throttled_ns: 0,
    });
    m.set_advice(&l, Some(&advice("0.7")));
    m.set_advice(&l, Some(&advice("1.5")));
    let body = m.encode();
    let rec: Vec<&str> = lines_of(&body, "adv")
        .into_iter()
        .filter(|l| l.starts_with("throttlewatch_recommended"))
        .collect();
    assert_eq!(rec.len(), 2, "{body}");
    assert!(
        rec.iter()
            .any(|r| r.starts_with("throttlewatch_recommended{")
                && r.contains("key=\"resources.limits.cpu\"")
                && r.contains("value=\"1.5\"")
                && r.ends_with(" 1.5")),
        "{rec:?}"
    );
    assert!(rec.iter().any(
        |r| r.starts_with("throttlewatch_recommended_throttled_ratio{") && r.ends_with(" 0.05")
    ));
    m.set_advice(&l, None);
    assert!(!m.encode().contains("throttlewatch_recommended{"));
}

/// A registered container's first scrape sees its counters and histograms
/// at 0; what came before it is applied after, for the next scrape.
#[test]
fn the_first_scrape_of_a_container_sees_zero() {
    let m = Metrics::new();
    let l = labels("new");
    m.keep(&l);
    m.observe(&Output::Counters {
        container: l.clone(),
        kernel: throttlewatch_cgroup::CpuStat {
            throttled_ns: 700_000_000,
            nr_periods: 10,
            ..Default::default()
        },
        probe_throttled_ns: 0,
    });
    let value = |body: &str| {
        lines_of(body, "new")
            .into_iter()
            .find(|l| l.starts_with("throttlewatch_kernel_throttled_seconds_total{"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{body}"))
    };
    let first = m.encode();
    assert_eq!(value(&first), 0.0, "{first}");
    assert_eq!(value(&m.encode()), 0.7);
    // Seen once, then fed at once.
    m.observe(&Output::Counters {
        container: l.clone(),
        kernel: throttlewatch_cgroup::CpuStat {
            throttled_ns: 300_000_000,
            ..Default::default()
        },
        probe_throttled_ns: 0,
    });
    assert_eq!(value(&m.encode()), 1.0);
    // Nobody scrapes: past HELD_AT_MOST they are applied anyway.
    let q = labels("unscraped");
    m.keep(&q);
    let one = Output::Counters {
        container: q.clone(),
        kernel: throttlewatch_cgroup::CpuStat {
            nr_periods: 1,
            ..Default::default()
        },
        probe_throttled_ns: 0,
    };
    m.observe(&one);
    assert_eq!(m.periods.get(&q).map(|c| c.get()), Some(0.0), "held");
    if let Ok(mut u) = m.unscraped.lock() {
        u.get_mut(q.as_ref()).unwrap().since -= HELD_AT_MOST;
    }
    m.observe(&one);
    assert_eq!(
        m.periods.get(&q).map(|c| c.get()),
        Some(2.0),
        "both, once held too long"
    );
    // Freezes are never held: a histogram appears with its first one.
    let f = labels("frozen");
    m.keep(&f);
    m.observe(&Output::Freeze {
        container: f.clone(),
        frozen_ns: 1_000_000,
        record: None,
    });
    assert!(m.freeze_seconds.get(&f).is_some());
}
