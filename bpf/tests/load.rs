//! The probe loads into the real kernel in both flavours, and the model is
//! the one the kernel's BTF says.

use throttlewatch_bpf::{ProbeKind, ProbeOptions, ThrottleModel, ThrottleProbe};

#[test]
fn tp_btf_loads_and_watch_map_works() {
    let p = ThrottleProbe::load(&ProbeOptions::default()).expect("load");
    assert_eq!(
        p.kind(),
        ProbeKind::TpBtf,
        "tp_btf must load on this kernel"
    );
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let (maj, min) = {
        let mut it = release
            .trim()
            .split(['.', '-'])
            .map(|x| x.parse::<u32>().unwrap_or(0));
        (it.next().unwrap(), it.next().unwrap())
    };
    let expect = if (maj, min) >= (6, 18) {
        ThrottleModel::Task
    } else {
        ThrottleModel::RunQueue
    };
    assert_eq!(p.model(), expect, "kernel {release}");
    p.watch(12345).unwrap();
    p.watch(67890).unwrap();
    assert_eq!(p.watched_count(), 2);
    p.unwatch(12345).unwrap();
    assert_eq!(p.watched_count(), 1);
    assert_eq!(p.episode_totals(67890).count, 0);
}

#[test]
fn raw_tp_variant_loads() {
    let p = ThrottleProbe::load(&ProbeOptions {
        force_raw_tp: true,
        ..Default::default()
    })
    .expect("load raw_tp");
    assert_eq!(p.kind(), ProbeKind::RawTp);
    assert_eq!(p.lost_events(), 0);
}

#[test]
fn runq_and_cold_start_load_with_tp_btf() {
    let p = ThrottleProbe::load(&ProbeOptions::default()).expect("load");
    assert!(
        p.runq_available(),
        "run-queue programs: {:?}",
        p.runq_error()
    );
    p.watch(4242).unwrap();
    let t = p.runq_totals(4242).expect("histogram created at watch");
    assert_eq!(t.count, 0);
    assert!(p.arm_cold_start(4242, 10_000_000).unwrap());
    p.cold_start_finished(4242);
    p.unwatch(4242).unwrap();
    assert!(p.runq_totals(4242).is_none());
}

/// The probe tells the CFS bandwidth timers from other hrtimers
/// by their callbacks, read from a task group at the first switches: they
/// must be the kernel's sched_cfs_period_timer / sched_cfs_slack_timer.
#[test]
fn bandwidth_timer_callbacks_are_the_kernels() {
    let p = ThrottleProbe::load(&ProbeOptions::default()).expect("load");
    // A few switches of our own.
    for _ in 0..20 {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    // Both models learn them: a group throttled before it was watched is
    // found by its timer's runs (dequeue.bpf.h).
    let got = p.bandwidth_timer_callbacks();
    let syms = std::fs::read_to_string("/proc/kallsyms").unwrap();
    let addr = |name: &str| {
        syms.lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() >= 3 && f[2] == name).then(|| u64::from_str_radix(f[0], 16).unwrap())
            })
            .unwrap_or_else(|| panic!("{name} not in /proc/kallsyms"))
    };
    assert_eq!(
        got,
        (
            addr("sched_cfs_period_timer"),
            addr("sched_cfs_slack_timer")
        ),
        "learnt callbacks (period, slack)"
    );
}
