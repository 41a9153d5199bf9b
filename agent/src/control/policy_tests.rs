use super::*;

const MS: u64 = 1_000_000;

fn orig() -> Bandwidth {
    Bandwidth {
        quota_us: 50_000,
        period_us: 100_000,
        burst_us: 0,
    }
}

fn iv(now_ms: u64, throttled_ms: u64) -> Interval {
    Interval {
        now_ns: now_ms * MS,
        length_ns: 50 * MS,
        throttled_ns: throttled_ms * MS,
        episodes: u64::from(throttled_ms > 0),
        ..Default::default()
    }
}

fn calm() -> Pressure {
    Pressure {
        psi_some_percent: Some(1.0),
        idle_percent: None,
    }
}

/// Throttled every 50 ms interval until nothing moves.
fn saturate(p: &mut ControlPolicy, from_ms: u64) -> (Vec<Change>, u64) {
    let mut changes = vec![];
    let mut t = from_ms;
    for _ in 0..400 {
        t += 50;
        if let Some(c) = p.step(&iv(t, 20), &calm()) {
            changes.push(c);
        }
    }
    (changes, t)
}

#[test]
fn burst_first_then_quota_within_ceilings() {
    let mut p = ControlPolicy::new(Settings::default(), orig(), 0);
    let first = p.step(&iv(50, 20), &calm()).unwrap();
    assert_eq!(first.cause, Cause::Throttled);
    assert_eq!(first.action(), "raise");
    assert_eq!(first.after.quota_us, 50_000, "burst first");
    // 20 ms throttled in 50 ms = 40 ms per 100 ms period: the step.
    assert_eq!(first.after.burst_us, 40_000);
    let (changes, _) = saturate(&mut p, 50);
    let (quota_max, burst_max) = p.ceilings();
    assert_eq!((quota_max, burst_max), (150_000, 50_000));
    assert_eq!(p.current().burst_us, burst_max);
    assert_eq!(p.current().quota_us, quota_max);
    for c in &changes {
        assert!(c.after.quota_us <= quota_max && c.after.burst_us <= burst_max);
        assert!(c.after.burst_us <= c.after.quota_us, "the kernel's cap");
    }
    // Quota moved only once burst was at its ceiling.
    let first_quota = changes
        .iter()
        .position(|c| c.after.quota_us > 50_000)
        .unwrap();
    assert!(changes[..first_quota]
        .iter()
        .all(|c| c.after.burst_us <= burst_max));
    assert_eq!(changes[first_quota].before.burst_us, burst_max);
}

/// An agent kept off the CPU polls late: the throttled time of the one
/// period it hit, seen over a 400 ms interval, is still that period's, not
/// a quarter of it (the kernel's `nr_throttled` says how many periods it
/// covers); spread over four periods it is a quarter per period.
#[test]
fn a_late_poll_steps_by_the_throttled_periods_not_the_interval() {
    let late = |periods| Interval {
        length_ns: 400 * MS,
        throttled_ns: 60 * MS,
        episodes: 2,
        throttled_periods: periods,
        ..iv(400, 0)
    };
    let step = |i: &Interval| {
        let mut p = ControlPolicy::new(Settings::default(), orig(), 0);
        p.step(i, &calm()).unwrap().after.burst_us
    };
    assert_eq!(
        step(&late(1)),
        50_000,
        "60 ms in one period: the burst ceiling"
    );
    assert_eq!(
        step(&late(4)),
        15_000,
        "60 ms over four periods: 15 ms each"
    );
    assert_eq!(step(&late(0)), 15_000, "periods unknown: over the interval");
    // On time (50 ms, one period): as before, per 100 ms of interval.
    let on_time = Interval {
        throttled_periods: 1,
        ..iv(50, 20)
    };
    assert_eq!(step(&on_time), 40_000);
}

/// The same for the peak use a calm step down keeps: 120 ms of CPU in the
/// two periods the group ran in, polled 400 ms late, is 60 ms per period.
#[test]
fn a_late_poll_keeps_the_peak_of_the_periods_the_group_ran_in() {
    let mut p = ControlPolicy::new(Settings::default(), orig(), 0);
    p.step(
        &Interval {
            length_ns: 400 * MS,
            used_ns: 120 * MS,
            active_periods: 2,
            ..iv(400, 0)
        },
        &calm(),
    );
    assert_eq!(p.peak_us(400 * MS), 60_000);
}

#[test]
fn cooldown_spaces_raises() {
    let mut p = ControlPolicy::new(Settings::default(), orig(), 0);
    assert!(p.step(&iv(50, 5), &calm()).is_some());
    assert!(
        p.step(&iv(100, 5), &calm()).is_none(),
        "50 ms < cooldown 100 ms"
    );
    assert!(p.step(&iv(150, 5), &calm()).is_some());
}

#[test]
fn small_throttling_steps_by_the_minimum() {
    let mut p = ControlPolicy::new(Settings::default(), orig(), 0);
    let c = p.step(&iv(50, 0), &calm());
    assert!(c.is_none(), "nothing throttled, nothing raised");
    let c = p
        .step(
            &Interval {
                throttled_ns: 100_000,
                ..iv(100, 0)
            },
            &calm(),
        )
        .unwrap();
    assert_eq!(c.after.burst_us, 10_000, "20 % of the original quota");
}

#[test]
fn calm_steps_back_to_the_originals_never_below() {
    let mut p = ControlPolicy::new(Settings::default(), orig(), 0);
    let (_, mut t) = saturate(&mut p, 0);
    let mut downs = vec![];
    for _ in 0..2000 {
        t += 50;
        if let Some(c) = p.step(&iv(t, 0), &calm()) {
            downs.push((t, c));
        }
    }
    assert!(downs
        .iter()
        .all(|(_, c)| c.cause == Cause::Calm && c.action() == "lower"));
    // The first step waits for calm (2 s), and they are 2 s apart.
    let first_t = downs[0].0;
    assert!(first_t - 20_000 >= 2000, "{first_t}");
    assert!(downs.windows(2).all(|w| w[1].0 - w[0].0 >= 2000));
    // Quota comes down before burst.
    let q_done = downs
        .iter()
        .position(|(_, c)| c.after.quota_us == 50_000)
        .unwrap();
    assert!(downs[..=q_done]
        .iter()
        .all(|(_, c)| c.after.burst_us == 50_000));
    assert_eq!(p.current(), orig());
    for (_, c) in &downs {
        assert!(c.after.quota_us >= 50_000 && c.after.burst_us <= c.after.quota_us);
    }
}

#[test]
fn node_pressure_stops_raises_and_steps_down_fast() {
    let mut p = ControlPolicy::new(Settings::default(), orig(), 0);
    let (_, mut t) = saturate(&mut p, 0);
    let high = Pressure {
        psi_some_percent: Some(75.0),
        idle_percent: Some(2.0),
    };
    let mut downs = 0;
    for _ in 0..40 {
        t += 50;
        // Still throttled: pressure wins.
        if let Some(c) = p.step(&iv(t, 20), &high) {
            assert_eq!(c.cause, Cause::NodePressure);
            assert_eq!(c.action(), "lower");
            assert_eq!(c.signal.psi_some_percent, Some(75.0));
            downs += 1;
        }
    }
    assert_eq!(p.current(), orig(), "back to the originals within 2 s");
    assert!(downs >= 3);
    // PSI high while CPUs idle: the container's own throttling (a
    // throttled task counts as waiting in PSI), not the node's.
    assert!(!Pressure {
        idle_percent: Some(40.0),
        ..high
    }
    .is_high(&Settings::default()));
    // Idle 0 turns the idle condition off: PSI alone.
    let psi_only = Settings {
        pressure_idle: 0.0,
        ..Settings::default()
    };
    assert!(Pressure {
        idle_percent: Some(40.0),
        ..high
    }
    .is_high(&psi_only));
    // Without PSI, idle CPU is the guard.
    let idle = Pressure {
        psi_some_percent: None,
        idle_percent: Some(5.0),
    };
    assert!(idle.is_high(&Settings::default()));
    assert!(!Pressure {
        idle_percent: Some(50.0),
        ..idle
    }
    .is_high(&Settings::default()));
    // 100 turns the PSI guard off.
    let off = Settings {
        pressure_psi: 100.0,
        ..Settings::default()
    };
    assert!(!Pressure {
        psi_some_percent: Some(100.0),
        idle_percent: None
    }
    .is_high(&off));
    // Both off: never.
    let never = Settings {
        pressure_idle: 0.0,
        ..off
    };
    assert!(!Pressure {
        psi_some_percent: Some(100.0),
        idle_percent: Some(0.0)
    }
    .is_high(&never));
}

#[test]
fn an_original_burst_above_the_ceiling_is_kept_and_adopt_restarts() {
    let s = Settings {
        burst_ceiling_percent: 10,
        ..Settings::default()
    };
    let o = Bandwidth {
        burst_us: 20_000,
        ..orig()
    };
    let mut p = ControlPolicy::new(s, o, 0);
    assert_eq!(p.ceilings().1, 20_000);
    let c = p.step(&iv(50, 20), &calm()).unwrap();
    assert_eq!(c.after.burst_us, 20_000);
    assert!(c.after.quota_us > 50_000, "burst at its ceiling: quota");
    let upd = Bandwidth {
        quota_us: 80_000,
        period_us: 100_000,
        burst_us: 0,
    };
    p.adopt(upd, 100 * MS);
    assert_eq!((p.original(), p.current()), (upd, upd));
    assert_eq!(p.ceilings().0, 240_000);
}

#[test]
fn a_quota_only_update_leaves_the_raised_burst_to_hand_back() {
    let mut p = ControlPolicy::new(Settings::default(), orig(), 0);
    // The first raise is the burst's.
    let c = p.step(&iv(50, 20), &calm()).unwrap();
    assert!(c.after.burst_us > 0 && c.after.quota_us == 50_000);
    let raised_burst = c.after.burst_us;
    // `docker update --cpus 0.7`: the quota moves, the wrapper holds the burst.
    let read = Bandwidth {
        quota_us: 70_000,
        burst_us: raised_burst,
        ..orig()
    };
    p.adopt(read, 100 * MS);
    assert_eq!(
        p.original(),
        Bandwidth {
            quota_us: 70_000,
            ..orig()
        },
        "the quota is the operator's, the burst is still the controller's raise"
    );
    assert_eq!(p.current(), read);
    assert_eq!(p.ceilings().0, 210_000);
    // A burst written by hand is the operator's too.
    let hand = Bandwidth {
        burst_us: 10_000,
        ..read
    };
    p.adopt(hand, 200 * MS);
    assert_eq!(p.original(), hand);
}

/// A burst every second that needs 1.2x the original: a step down below
/// that is premature; the controller goes straight back to the level that
/// held and waits twice as long before the next one, so the bursts it
/// throttles become rarer (2 s calm alone: one every ~4 s, for ever).
#[test]
fn a_premature_calm_step_down_backs_off() {
    let mut p = ControlPolicy::new(Settings::default(), orig(), 0);
    let need = 60_000u64; // quota + burst the burst needs per period
    let mut throttled_bursts = vec![];
    let mut t = 0;
    while t < 120_000 {
        t += 50;
        let c = p.current();
        let bursting = t % 1000 == 500;
        let throttled = if bursting && c.quota_us + c.burst_us < need {
            20
        } else {
            0
        };
        if throttled > 0 {
            throttled_bursts.push(t);
        }
        if let Some(ch) = p.step(&iv(t, throttled), &calm()) {
            if ch.cause == Cause::Throttled {
                let held = ch.after.quota_us + ch.after.burst_us;
                assert!(held <= 300_000 + 50_000, "{ch:?}");
            }
        }
    }
    let late = throttled_bursts.iter().filter(|&&t| t > 60_000).count();
    assert!(
        late <= 2,
        "throttled bursts in the second minute: {late} (all: {throttled_bursts:?})"
    );
    assert!(p.calm_now_ns() > Settings::default().calm_ns, "backed off");
    // Quiet for good: back to the originals, and the calm wait with them.
    for _ in 0..4000 {
        t += 50;
        p.step(&iv(t, 0), &calm());
    }
    assert_eq!(p.current(), orig());
    assert_eq!(p.calm_now_ns(), Settings::default().calm_ns);
}

/// Calm step downs stop at the recent peak use per period: a group that
/// used 1.3x its original quota in a burst a second ago keeps quota +
/// burst at least that; once the bursts stop it all goes back.
#[test]
fn calm_step_downs_stop_at_the_recent_peak_use() {
    let mut p = ControlPolicy::new(Settings::default(), orig(), 0);
    let need_us = 65_000u64; // per 100 ms period, in the burst
    let mut t = 0;
    let mut throttled_bursts = vec![];
    while t < 30_000 {
        t += 50;
        let c = p.current();
        let bursting = t % 1000 == 500;
        let limit = c.quota_us + c.burst_us;
        let (throttled, used_us) = match bursting {
            true if limit < need_us => (20, limit / 2),
            true => (0, need_us / 2),
            false => (0, 5_000),
        };
        if throttled > 0 {
            throttled_bursts.push(t);
        }
        let mut i = iv(t, throttled);
        i.used_ns = used_us * 1000;
        p.step(&i, &calm());
        if t > 3_000 {
            let c = p.current();
            assert!(c.quota_us + c.burst_us >= need_us, "at {t}: {c:?}");
        }
    }
    assert!(throttled_bursts.len() <= 2, "{throttled_bursts:?}");
    assert!(p.peak_us(t) >= need_us);
    // The bursts stop: the peak ages out, the values go back.
    for _ in 0..6000 {
        t += 50;
        let mut i = iv(t, 0);
        i.used_ns = 5_000_000;
        p.step(&i, &calm());
    }
    assert_eq!(p.current(), orig());
}
