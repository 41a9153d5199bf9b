//! Unit tests of recommend.rs (the threshold, the model under the controller).
use super::*;
use throttlewatch_core::logfmt::{Record, Start, Throttle};

/// A steady overload under 0.5 CPUs: four threads frozen 50 ms in every
/// period; the controller raises the quota to 1 CPU before period
/// `change` (0: never), and `after` periods follow under it.
fn controlled(change: u64, after: u64) -> Container {
    use throttlewatch_core::logfmt::control::{Bandwidth as Bw, Control};
    let ms = 1_000_000u64;
    let mut c = Container::default();
    c.add(
        0,
        Record::Start(Start {
            period_us: 100_000,
            quota_us: Some(50_000),
            ..Default::default()
        }),
    );
    let n = if change == 0 { 40 } else { change + after };
    for k in 0..n {
        let frozen = if change > 0 && k >= change {
            20 * ms
        } else {
            50 * ms
        };
        for cpu in 0..2 {
            c.add(
                k * 100 * ms,
                Record::Throttle(Throttle {
                    tid: cpu + 1,
                    cpu,
                    start_ns: k * 100 * ms + (100 * ms - frozen),
                    frozen_ns: frozen,
                    ..Default::default()
                }),
            );
        }
        if change > 0 && k + 1 == change {
            let bw = |q| Bw {
                quota_us: q,
                period_us: 100_000,
                burst_us: 0,
            };
            c.add(
                k * 100 * ms + 10 * ms,
                Record::Control(Control {
                    action: "raise".into(),
                    cause: "throttled".into(),
                    before: bw(50_000),
                    after: bw(100_000),
                    original: bw(50_000),
                    ..Default::default()
                }),
            );
        }
    }
    c
}

#[test]
fn under_the_controller_the_model_uses_the_limit_it_set() {
    let m = model(&controlled(0, 0)).unwrap();
    assert_eq!((m.bw.quota_ns, m.span.as_deref()), (50_000_000, None));
    // 20 periods under the raised quota: those, under 1 CPU.
    let m = model(&controlled(20, 20)).unwrap();
    assert_eq!(m.bw.quota_ns, 100_000_000);
    let note = m.span.clone().unwrap();
    assert!(
        note.contains("after the controller's last change") && note.contains("1.00 CPUs"),
        "{note}"
    );
    // Their throttling only: 19-20 periods of 2 x 20 ms, not the 50 ms
    // ones before.
    assert!(
        (700_000_000..=800_000_000).contains(&m.observed_ns),
        "{}",
        m.observed_ns
    );
    // Too few periods after the change: those before it, under 0.5 CPUs.
    let m = model(&controlled(20, 3)).unwrap();
    assert_eq!(m.bw.quota_ns, 50_000_000);
    assert!(m
        .span
        .unwrap()
        .contains("before the controller first changed the limit"));
    // The recommendations say which part of the log they stand on.
    let r = recommend(&controlled(20, 20));
    assert!(
        r.iter()
            .any(|x| x.reason.contains("after the controller's last change")),
        "{r:?}"
    );
}

#[test]
fn a_noisy_log_gets_a_threshold_and_a_quiet_one_none() {
    let mut c = Container::default();
    c.add(
        0,
        Record::Start(Start {
            period_us: 100_000,
            ..Default::default()
        }),
    );
    // 100 001 freezes: 95 % of 50 µs, 5 % of 5 ms.
    for i in 0..100_001u64 {
        let frozen_ns = if i % 20 == 0 { 5_000_000 } else { 50_000 };
        c.add(
            0,
            Record::Throttle(Throttle {
                tid: 1,
                start_ns: i * 1_000_000,
                frozen_ns,
                ..Default::default()
            }),
        );
    }
    let r = threshold(&c).expect("a threshold for 100 001 records");
    assert_eq!(r.key, "throttlewatch.io/threshold");
    // The p90 is the short freezes' (clamped to at least 100 µs).
    assert_eq!(r.value, "100us", "{r:?}");
    c.start.as_mut().unwrap().threshold_ns = 1_000_000;
    assert!(
        threshold(&c).is_none(),
        "a threshold of 1 ms is already set"
    );
    assert!(threshold(&Container::default()).is_none());
}

/// Four CPU-bound threads under 0.5 CPUs on two CPUs, 30 periods: alone
/// they spend the quota in 25 ms on both CPUs and are frozen the other
/// 75 ms on each; beside a heavier neighbour they all sit on one CPU and
/// spend it over 50 ms there, frozen 50 ms on that one CPU (in nine
/// periods of ten).
fn overloaded(contended: bool) -> Container {
    let ms = 1_000_000u64;
    let mut c = Container::default();
    c.add(
        0,
        Record::Start(Start {
            period_us: 100_000,
            quota_us: Some(50_000),
            cpus: Some("0-1".into()),
            ..Default::default()
        }),
    );
    for k in 0..30u64 {
        // Beside the neighbour, one period in ten it got both CPUs.
        let one_cpu = contended && k % 10 != 0;
        let frozen = if one_cpu { 50 * ms } else { 75 * ms };
        for tid in 1..=4u32 {
            let cpu = if one_cpu { 0 } else { tid % 2 };
            c.add(
                k * 100 * ms,
                Record::Throttle(Throttle {
                    tid,
                    cpu,
                    start_ns: k * 100 * ms + (100 * ms - frozen),
                    frozen_ns: frozen,
                    ..Default::default()
                }),
            );
        }
    }
    c
}

#[test]
fn a_limit_is_sized_the_same_beside_other_work() {
    let limit = |c: &Container| {
        let m = model(c).unwrap();
        quota(c, &m).map(|r| (r.value, r.reason))
    };
    let (quiet, why) = limit(&overloaded(false)).unwrap();
    let (busy, busy_why) = limit(&overloaded(true)).unwrap();
    assert_eq!(quiet, "2", "{why}");
    assert_eq!(busy, "2", "{busy_why}");
    // The busy log says what would do under its load (mostly one CPU's
    // worth was all it got), the quiet one has nothing to add.
    let c = overloaded(true);
    let m = model(&c).unwrap();
    let under_load = smallest_limit(&m, &m.demand, 0.5, 2.0);
    assert!(under_load < 2.0, "{under_load}");
    assert!(
        busy_why.contains(&format!("{} CPU", trim_float(under_load)))
            && busy_why.contains("would do while that work runs"),
        "{busy_why}"
    );
    assert!(!why.contains("would do while"), "{why}");
}

/// `threads` busy threads under 0.5 CPUs of the two the container may
/// use, 30 periods, each frozen the second half of every period on the CPU
/// `cpu_of(period)` gives: the quota advice (value, reason).
fn advice_frozen_on(threads: u32, cpu_of: impl Fn(u64) -> u32) -> (String, String) {
    let ms = 1_000_000u64;
    let mut c = Container::default();
    c.add(
        0,
        Record::Start(Start {
            period_us: 100_000,
            quota_us: Some(50_000),
            cpus: Some("0-1".into()),
            ..Default::default()
        }),
    );
    for k in 0..30u64 {
        for tid in 1..=threads {
            c.add(
                k * 100 * ms,
                Record::Throttle(Throttle {
                    tid,
                    cpu: cpu_of(k),
                    start_ns: k * 100 * ms + 50 * ms,
                    frozen_ns: 50 * ms,
                    ..Default::default()
                }),
            );
        }
    }
    let m = model(&c).unwrap();
    let r = quota(&c, &m).unwrap();
    (r.value, r.reason)
}

#[test]
fn threads_moved_between_cpus_are_sized_for_both() {
    // Beside a neighbour the four threads share one CPU in every period
    // (never frozen on two at once), but the CPU changes over the run:
    // with CPUs to itself the group runs on both, as the quiet run does.
    let (value, reason) = advice_frozen_on(4, |k| ((k / 5) % 2) as u32);
    assert_eq!(value, "2", "{reason}");
}

#[test]
fn threads_pinned_to_one_cpu_are_not_sized_for_two() {
    // Two busy threads pinned to CPU 0 of the two the container may use:
    // never frozen on two CPUs at once, nor on another CPU, so one is what
    // they can use.
    let (value, reason) = advice_frozen_on(2, |_| 0);
    assert_eq!(value, "1", "{reason}");
}

/// A container that slept 24 s with 2.8 ms of run-queue wait behind other
/// containers and no throttling: nothing worth naming, so no advice (it
/// once got `cpuset-exclusive`, "raising the limit will not help").
#[test]
fn a_container_that_lost_nothing_worth_naming_gets_no_advice() {
    use throttlewatch_core::logfmt::{End, Runq};
    let ms = 1_000_000u64;
    let mut c = Container::default();
    c.add(
        0,
        Record::Start(Start {
            period_us: 100_000,
            quota_us: Some(50_000),
            ..Default::default()
        }),
    );
    c.add(
        24_000 * ms,
        Record::Runq(Runq {
            interval_ns: 24_000 * ms,
            count: 40,
            total_ns: 2_800_000,
            preempted_by_other: 30,
            preempted_by_host: 2,
            ..Default::default()
        }),
    );
    c.add(
        24_000 * ms,
        Record::End(End {
            reason: "exit".into(),
            duration_ns: 24_000 * ms,
            ..Default::default()
        }),
    );
    let advice = recommend(&c);
    assert!(advice.is_empty(), "{advice:?}");
    assert!(!significant(2_800_000, 24_000 * ms));
    assert!(
        !significant(200 * ms, 24_000 * ms),
        "under 1 % of the wall time"
    );
    assert!(significant(300 * ms, 24_000 * ms));
    assert!(!significant(90 * ms, 1_000 * ms), "under 100 ms");
    // The overload of the tests above is well past the bound.
    assert!(recommend(&overloaded(false))
        .iter()
        .any(|r| r.kind == "quota"));
}
