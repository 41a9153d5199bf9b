//! Unit tests of gpu.rs on recorded sample series.
use throttlewatch_core::logfmt::{CpuStatSnapshot, GpuSample, Record, Start, Throttle};

use super::*;

const S: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;
const T0: u64 = 1_700_000_000 * S;

/// One sample a second for `secs` seconds: `util(second)`.
fn series(gpu: usize, secs: u64, util: impl Fn(u64) -> u32) -> Vec<GpuSample> {
    (0..secs)
        .map(|i| GpuSample {
            gpu,
            start_ns: T0 + i * S,
            interval_ns: S,
            util_pct: util(i),
            mem_used_bytes: 4 << 30,
            mem_total_bytes: 80 << 30,
            ..Default::default()
        })
        .collect()
}

/// 80 ms frozen in each 100 ms period of the given seconds.
fn frozen(seconds: &[u64]) -> Vec<(u64, u64)> {
    seconds
        .iter()
        .flat_map(|s| (0..10).map(move |p| T0 + s * S + p * 100 * MS + 20 * MS))
        .map(|a| (a, a + 80 * MS))
        .collect()
}

#[test]
fn frozen_time_in_an_interval() {
    let spans = [(10, 20), (30, 40), (50, 60)];
    assert_eq!(frozen_in(&spans, 0, 100), 30);
    assert_eq!(frozen_in(&spans, 15, 35), 10);
    assert_eq!(frozen_in(&spans, 20, 30), 0);
    assert_eq!(frozen_in(&spans, 55, 56), 1);
    assert_eq!(frozen_in(&[], 0, 100), 0);
}

#[test]
fn a_gpu_busy_except_while_its_container_is_frozen() {
    let frozen_secs = [10, 11, 30];
    let samples = series(0, 60, |i| if frozen_secs.contains(&i) { 5 } else { 90 });
    let a = &align(&samples, &frozen(&frozen_secs))[0];
    assert_eq!((a.gpu, a.samples, a.sampled_ns), (0, 60, 60 * S));
    assert_eq!(a.frozen_ns, 3 * 800 * MS);
    // All the frozen time falls in the 5 % seconds.
    assert!((a.util_frozen_pct.unwrap() - 5.0).abs() < 1e-9, "{a:?}");
    // Unfrozen: 57 s at 90 %, and 3 x 0.2 s at 5 %.
    let want = (57.0 * 90.0 + 0.6 * 5.0) / 57.6;
    assert!((a.util_unfrozen_pct.unwrap() - want).abs() < 1e-9, "{a:?}");
    assert_eq!(a.idle_while_frozen_ns, 2_280 * MS);
    assert_eq!(a.mem_used_max_bytes, 4 << 30);
}

#[test]
fn a_gpu_that_does_not_care_shows_no_difference() {
    let samples = series(1, 20, |_| 70);
    let a = &align(&samples, &frozen(&[3, 4]))[0];
    assert_eq!(a.util_frozen_pct, Some(70.0));
    assert_eq!(a.util_unfrozen_pct, Some(70.0));
    assert_eq!(a.idle_while_frozen_ns, 480 * MS);
    // Never frozen: no frozen figure at all.
    let b = &align(&samples, &[])[0];
    assert_eq!((b.frozen_ns, b.util_frozen_pct), (0, None));
}

#[test]
fn two_gpus_are_aligned_apart() {
    let mut samples = series(0, 10, |_| 100);
    samples.extend(series(3, 10, |_| 0));
    let v = align(&samples, &frozen(&[2]));
    assert_eq!(v.iter().map(|a| a.gpu).collect::<Vec<_>>(), vec![0, 3]);
    assert_eq!(v[0].idle_while_frozen_ns, 0);
    assert_eq!(v[1].idle_while_frozen_ns, 800 * MS);
}

#[test]
fn the_timeline_has_frozen_share_and_utilisation_per_bucket() {
    let samples = series(0, 240, |i| if i == 100 { 0 } else { 80 });
    let t = timeline(&samples, &frozen(&[100]), Some(T0));
    assert_eq!((t.from_ns, t.bucket_ns), (T0, S));
    assert_eq!(t.frozen_share.len(), 240);
    assert!((t.frozen_share[100] - 0.8).abs() < 1e-9);
    assert_eq!(t.frozen_share[99], 0.0);
    assert_eq!(t.gpus[0].1[100], Some(0.0));
    assert_eq!(t.gpus[0].1[5], Some(80.0));
}

/// A log as the agent writes it: a start, freezes in seconds 10 and 11 (80
/// ms of each 100 ms period on one CPU), `cpu_stat` records every 10 s
/// with the samples of a GPU busy except while frozen.
fn synthetic() -> Container {
    let mut c = Container::default();
    c.add(
        T0,
        Record::Start(Start {
            container_id: "gpu".into(),
            period_us: 100_000,
            quota_us: Some(20_000),
            ..Default::default()
        }),
    );
    let frozen_secs = [10, 11];
    let samples = series(2, 30, |i| if frozen_secs.contains(&i) { 10 } else { 95 });
    for (a, b) in frozen(&frozen_secs) {
        let t = Throttle {
            tid: 7,
            pid: 7,
            start_ns: a,
            frozen_ns: b - a,
            ..Default::default()
        };
        c.add(b, Record::Throttle(t));
    }
    for chunk in samples.chunks(10) {
        let at = chunk[chunk.len() - 1].end_ns();
        let rec = CpuStatSnapshot {
            gpu: chunk.to_vec(),
            ..Default::default()
        };
        c.add(at, Record::CpuStat(rec));
    }
    c
}

#[test]
fn the_report_aligns_a_synthetic_logs_samples_with_its_freezes() {
    let c = synthetic();
    assert_eq!(c.gpu.samples.len(), 30);
    let spans = frozen_spans(&c);
    assert_eq!(spans.len(), 20, "{spans:?}");
    let total: u64 = spans.iter().map(|s| s.1 - s.0).sum();
    assert_eq!(total, 20 * 80 * MS);
    let r = report(&c).expect("GPU samples give a GPU report");
    let a = &r.gpus[0];
    assert_eq!(a.gpu, 2);
    assert_eq!(a.frozen_ns, 1_600 * MS);
    let frozen = a.util_frozen_pct.unwrap();
    let unfrozen = a.util_unfrozen_pct.unwrap();
    assert!(frozen < 15.0 && unfrozen > 90.0, "{a:?}");
    assert!(a.idle_while_frozen_ns >= 1_400 * MS, "{a:?}");
    let line = describe(a);
    assert!(line.starts_with("GPU 2: 10% busy while frozen"), "{line}");
    let summary = crate::summary::container("x".into(), &c, Default::default());
    let json = serde_json::to_value(&summary).unwrap();
    assert_eq!(json["gpu"]["gpus"][0]["frozen_ns"], 1_600 * MS);
}

#[test]
fn no_samples_no_gpu_report() {
    let mut c = Container::default();
    let start = Start {
        period_us: 100_000,
        ..Default::default()
    };
    c.add(T0, Record::Start(start));
    c.add(T0 + S, Record::CpuStat(CpuStatSnapshot::default()));
    assert!(report(&c).is_none());
    let summary = crate::summary::container("x".into(), &c, Default::default());
    let json = serde_json::to_value(&summary).unwrap();
    assert!(json.get("gpu").is_none());
}

#[test]
fn samples_past_the_cap_are_counted() {
    let mut g = GpuSamples::default();
    let mut rec = CpuStatSnapshot {
        gpu: series(0, 10, |_| 1),
        gpu_samples_dropped: 4,
        ..Default::default()
    };
    g.add(&mut rec);
    assert_eq!((g.samples.len(), g.dropped()), (10, 4));
    // Cumulative in the log: the next record's 6 include these 4.
    rec.gpu_samples_dropped = 6;
    g.add(&mut rec);
    assert_eq!(g.dropped(), 6);
    assert!(
        rec.gpu.is_empty(),
        "the record's samples are moved, not kept twice"
    );
}

#[test]
fn sm_activity_is_split_by_frozen_time_where_the_gpu_has_it() {
    // SM activity from second 5 on (GPM: the first readings have none):
    // 60 % while running, 2 % in the frozen seconds 10 and 11.
    let frozen_secs = [10, 11];
    let mut samples = series(0, 30, |i| if frozen_secs.contains(&i) { 20 } else { 95 });
    for (i, s) in samples.iter_mut().enumerate().skip(5) {
        s.sm_active_pct = Some(if frozen_secs.contains(&(i as u64)) {
            2
        } else {
            60
        });
    }
    let spans = frozen(&frozen_secs);
    let a = &align(&samples, &spans)[0];
    assert_eq!(a.sm_sampled_ns, 25 * S);
    assert!(
        (a.sm_active_frozen_pct.unwrap() - 2.0).abs() < 1e-9,
        "{a:?}"
    );
    // Unfrozen with SM: 23 s at 60 %, 2 x 0.2 s at 2 %.
    let want = (23.0 * 60.0 + 0.4 * 2.0) / 23.4;
    assert!(
        (a.sm_active_unfrozen_pct.unwrap() - want).abs() < 1e-9,
        "{a:?}"
    );
    // Utilisation still over every sample.
    assert_eq!((a.sampled_ns, a.frozen_ns), (30 * S, 1_600 * MS));
    let line = describe(a);
    assert!(
        line.contains("; SM active 2% while frozen, 59% while not; idle while frozen"),
        "{line}"
    );
    let t = timeline(&samples, &spans, Some(T0));
    assert_eq!(t.sm.len(), 1);
    // 30 s in 240 buckets: 8 a second.
    let at = |sec: usize| t.sm[0].1[sec * 8];
    assert_eq!((at(4), at(5), at(10)), (None, Some(60.0), Some(2.0)));
    let json = serde_json::to_value(align(&samples, &spans)).unwrap();
    assert_eq!(json[0]["sm_sampled_ns"], 25 * S);
    assert!(json[0]["sm_active_frozen_pct"].as_f64().is_some());
}

#[test]
fn without_sm_activity_nothing_about_it() {
    let samples = series(0, 10, |_| 50);
    let spans = frozen(&[3]);
    let a = &align(&samples, &spans)[0];
    assert_eq!(
        (
            a.sm_sampled_ns,
            a.sm_active_frozen_pct,
            a.sm_active_unfrozen_pct
        ),
        (0, None, None)
    );
    assert!(!describe(a).contains("SM"), "{}", describe(a));
    let t = timeline(&samples, &spans, None);
    assert!(t.sm.is_empty());
    let json = serde_json::to_value(&t).unwrap();
    assert!(json.get("sm").is_none(), "{json}");
}
