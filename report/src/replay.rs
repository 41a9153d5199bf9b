//! Replaying the recorded per-period demand through the kernel's CFS
//! bandwidth rules, to predict the throttled time under another quota or
//! burst. The model and its assumptions are in docs/report.md.
//!
//! The kernel (kernel/sched/fair.c, `__refill_cfs_bandwidth_runtime`): each
//! period the group's runtime grows by the quota and is capped at
//! quota + burst; the group runs while runtime is left and is throttled
//! until the next refill once it is spent.

use serde::Serialize;

use crate::model::PeriodThrottle;

/// The demand of one period, rebuilt from the log.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PeriodDemand {
    /// CPU time asked for in this period.
    pub fresh_ns: f64,
    /// The part of it the period could not have (observed): left over.
    pub unmet_ns: f64,
    /// The part of it that is the period before's leftover: all of it after
    /// a period without throttling, the backlog after a spike's throttled
    /// period, else 0.
    pub carried_ns: f64,
    /// Throttled time per unit of unmet work (>= 1: a thread frozen to the
    /// period's end may have needed less than the whole span).
    pub span_per_unmet: f64,
}

/// The group's CFS bandwidth as the replay runs it: a bucket refilled by the
/// quota each period and capped at quota + burst.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Bucket {
    pub quota_ns: u64,
    pub period_ns: u64,
    pub burst_ns: u64,
}

/// Whose CPU time the demand is rebuilt under.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Competition {
    /// As the log saw it: a group busy all period got the share of its CPUs
    /// it was given (the others ran the rest), and would have done that
    /// share of the work in its throttled time. The prediction for this
    /// run's conditions.
    AsObserved,
    /// As if the group had CPUs to itself: a group busy all period would
    /// have run all period on as many CPUs as it had threads frozen (they
    /// were runnable; beside other work they may all have been frozen on
    /// one CPU), at most `cpus`: the CPUs it was seen frozen on (at once, or
    /// over the run).
    /// What it needs on a quiet host, the same whatever else ran beside
    /// this run.
    Alone { cpus: f64 },
}

/// The longest run of throttled periods taken for one spike (docs/report.md).
const SPIKE_RUN: usize = 3;

/// Rebuild per-period demand from each period's throttling (`None`: a
/// period without throttling), observed under `quota_ns`, counting the
/// CPUs others held as `competition` says.
///
/// A throttled period used its quota. Its CPUs ran the group until the quota
/// was spent and were throttled for the rest: `cpus x period - throttled` of
/// CPU time ran the quota, so a group busy the whole period (throttled in the
/// period before too) got `share = quota / that` of each CPU it ran on (1 when
/// nothing else competed); after a period without throttling the group may
/// have idled before it ran out, so its share is taken as 1. The work left
/// over is `share x throttled`. It is at most one quota when the next period was not
/// throttled (it was then done within that period's runtime). A period
/// without throttling is taken to ask only for the work left over from the
/// period before (none after a period without throttling).
///
/// Work left over is not carried into the replayed next period: the next
/// period's observed demand already holds it (and the replay takes it out
/// again where it served that work in the period it was asked in).
pub fn demand(
    periods: &[Option<PeriodThrottle>],
    quota_ns: u64,
    period_ns: u64,
    competition: Competition,
) -> Vec<PeriodDemand> {
    let q = quota_ns as f64;
    let mut unmet = unmet_estimates(periods, q, period_ns, competition);
    let backlog = bound_spike_backlogs(periods, q, &mut unmet);
    build(periods, q, &unmet, &backlog)
}

/// Each throttled period's work left over, before the spikes' bound: the
/// share of the throttled time the group would have run, at most one quota
/// when the next period was not throttled.
fn unmet_estimates(
    periods: &[Option<PeriodThrottle>],
    q: f64,
    period_ns: u64,
    competition: Competition,
) -> Vec<f64> {
    (0..periods.len())
        .map(|k| {
            let Some(p) = periods[k] else { return 0.0 };
            let t = p.throttled_ns as f64;
            let ran = (p.cpus.max(1) as f64 * period_ns as f64 - t).max(1.0);
            // The log's last period: what came next is not known.
            let next_throttled = periods.get(k + 1).is_none_or(|n| n.is_some());
            // The share is only known for a group that was runnable all the
            // period: one with work left from a throttled period before (or,
            // at the log's start, throttled again after). After a period
            // without throttling the group may have idled before its spike:
            // `ran` then counts idle time, not competition.
            let busy = if k == 0 {
                next_throttled
            } else {
                periods[k - 1].is_some()
            };
            let u = match competition {
                Competition::AsObserved if busy => (q / ran).min(1.0) * t,
                Competition::Alone { cpus } if busy => {
                    let could = (p.threads as f64).min(cpus).max(p.cpus as f64);
                    (could * period_ns as f64 - q).max(t)
                }
                _ => t,
            };
            if next_throttled {
                u
            } else {
                u.min(q)
            }
        })
        .collect()
}

/// Bounds `unmet` from the end back: the work left when a throttled period
/// ended is at most what the next one served (one quota: it was throttled
/// too) and what was left after it. Where that bound is below the frozen time's
/// worth, the leftover was a backlog the next period drained (the tail of
/// a spike, not a group busy all along), and the next period's demand is
/// that backlog, not new work (counted once, `carried_ns`).
///
/// Only in a short run of throttled periods between periods without
/// (a spike): in a long run the group is busy all along, its demand a
/// rate (a time-bound worker does more work under more quota), and the
/// bound would take noise in the frozen time for a backlog.
///
/// Returns which periods' leftover was such a backlog.
fn bound_spike_backlogs(
    periods: &[Option<PeriodThrottle>],
    q: f64,
    unmet: &mut [f64],
) -> Vec<bool> {
    let mut backlog = vec![false; periods.len()];
    let mut end = periods.len();
    while end > 0 {
        // The run of throttled periods ending just before `end`.
        let Some(last) = (0..end).rev().find(|k| periods[*k].is_some()) else {
            break;
        };
        let start = (0..=last)
            .rev()
            .take_while(|k| periods[*k].is_some())
            .last()
            .unwrap_or(last);
        let bracketed = last + 1 < periods.len() && start > 0;
        if bracketed && last - start < SPIKE_RUN {
            for k in (start..last).rev() {
                if unmet[k] > q + unmet[k + 1] {
                    unmet[k] = q + unmet[k + 1];
                    backlog[k] = true;
                }
            }
        }
        end = start;
    }
    backlog
}

/// Each period's demand from its work left over and whether the period
/// before left a backlog.
fn build(
    periods: &[Option<PeriodThrottle>],
    q: f64,
    unmet: &[f64],
    backlog: &[bool],
) -> Vec<PeriodDemand> {
    (0..periods.len())
        .map(|k| {
            let carried = |fresh: f64| {
                if k > 0 && backlog[k - 1] {
                    unmet[k - 1].min(fresh)
                } else {
                    0.0
                }
            };
            match periods[k] {
                Some(p) if unmet[k] > 0.0 => PeriodDemand {
                    fresh_ns: q + unmet[k],
                    unmet_ns: unmet[k],
                    carried_ns: carried(q + unmet[k]),
                    span_per_unmet: p.throttled_ns as f64 / unmet[k],
                },
                Some(_) => PeriodDemand {
                    fresh_ns: q,
                    unmet_ns: 0.0,
                    carried_ns: carried(q),
                    span_per_unmet: 1.0,
                },
                None => {
                    let left = if k > 0 { unmet[k - 1] } else { 0.0 };
                    PeriodDemand {
                        fresh_ns: left,
                        unmet_ns: 0.0,
                        carried_ns: left,
                        span_per_unmet: 1.0,
                    }
                }
            }
        })
        .collect()
}

/// The throttled time the demand would have met under `bw`, with at most
/// `cpus` CPUs' worth of throttled time per period.
pub fn replay(demand: &[PeriodDemand], bw: Bucket, cpus: f64) -> f64 {
    let q = bw.quota_ns as f64;
    let cap = q + bw.burst_ns.min(bw.quota_ns) as f64;
    let per_period_max = cpus * bw.period_ns as f64;
    // The bucket starts full: every write of a bandwidth setting refills it
    // (tg_set_cfs_bandwidth() calls __refill_cfs_bandwidth_runtime()), and a
    // burst is written after the quota (its own file in v1 and v2), so a
    // group starts with quota + burst.
    let mut runtime = cap;
    let mut throttled = 0.0;
    // Of the last period's leftover, what the replay served in that period.
    let mut absorbed = 0.0;
    for d in demand {
        let need = d.fresh_ns - d.carried_ns.min(absorbed);
        let served = need.min(runtime).min(per_period_max);
        let unmet = need - served;
        if unmet > 0.0 {
            throttled += (unmet * d.span_per_unmet).min(per_period_max);
        }
        absorbed = (served - (need - d.unmet_ns)).clamp(0.0, d.unmet_ns);
        runtime = (runtime - served + q).min(cap);
    }
    throttled
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 100_000_000;

    fn bw(quota_ms: u64, burst_ms: u64) -> Bucket {
        Bucket {
            quota_ns: quota_ms * 1_000_000,
            period_ns: P,
            burst_ns: burst_ms * 1_000_000,
        }
    }

    fn thr(ms: u64, cpus: u32) -> Option<PeriodThrottle> {
        Some(PeriodThrottle {
            throttled_ns: ms * 1_000_000,
            threads: cpus,
            cpus,
        })
    }

    #[test]
    fn a_busy_group_sharing_its_cpus_needs_less_than_its_frozen_time() {
        // 10ms quota on 2 CPUs shared half with others: the quota lasts 10ms of
        // wall time, 180ms throttled; with 30ms it lasts 30ms: 140ms.
        let t = vec![thr(180, 2); 10];
        let d = demand(&t, 10_000_000, P, Competition::AsObserved);
        assert!((replay(&d, bw(10, 0), 2.0) - 1.8e9).abs() < 1e3);
        let more = replay(&d, bw(30, 0), 2.0);
        assert!((more - 1.4e9).abs() < 1e3, "{more}");
    }

    #[test]
    fn replaying_the_observed_settings_gives_the_observed_time() {
        // Busy on 2 CPUs under 50ms: 150ms throttled every period.
        let t = vec![thr(150, 2); 10];
        let d = demand(&t, 50_000_000, P, Competition::AsObserved);
        assert!((replay(&d, bw(50, 0), 2.0) - 1.5e9).abs() < 1e3);
        // 1.5 CPUs: 50ms each period; 2 CPUs: none. Burst cannot help a busy group.
        assert!((replay(&d, bw(150, 0), 2.0) - 0.5e9).abs() < 1e3);
        assert!(replay(&d, bw(200, 0), 2.0) < 1e3);
        assert!(replay(&d, bw(50, 50), 2.0) > 1.4e9);
    }

    #[test]
    fn burst_absorbs_a_spike_after_idle_periods() {
        // A spike every 4th period that overran a 20ms quota by 10ms (80ms frozen).
        let mut t = vec![None; 42];
        for k in (3..40).step_by(4) {
            t[k] = thr(80, 1);
        }
        let d = demand(&t, 20_000_000, P, Competition::AsObserved);
        let observed = replay(&d, bw(20, 0), 2.0);
        assert!((observed - 10.0 * 80e6).abs() < 1e3, "{observed}");
        // The leftover is at most one quota (the next period was not throttled):
        // a 20ms burst, refilled by the idle periods, absorbs it.
        assert!(replay(&d, bw(20, 20), 2.0) < 1e3);
        // Half of it absorbs half.
        let half = replay(&d, bw(20, 10), 2.0);
        assert!((half - observed / 2.0).abs() < 1e3, "{half}");
    }

    #[test]
    fn a_burst_set_with_the_quota_starts_full() {
        // The log starts with a spike: the group had only its quota, and
        // overran it by 10ms (80ms frozen). With a burst written after the
        // quota the kernel's bucket starts at quota + burst: no throttling.
        let mut t = vec![None; 8];
        t[0] = thr(80, 1);
        let d = demand(&t, 20_000_000, P, Competition::AsObserved);
        assert!((replay(&d, bw(20, 0), 2.0) - 80e6).abs() < 1e3);
        assert!(replay(&d, bw(20, 20), 2.0) < 1e3);
    }

    #[test]
    fn a_spike_over_two_throttled_periods_is_counted_once() {
        // After idle periods a spike of 45ms under a 20ms quota on one CPU:
        // 20ms, frozen 80ms; 20ms, frozen 80ms; the last 5ms. The work left
        // after the first period is at most the second's quota and what was
        // left after it (at most one quota: the third was not throttled), so
        // a 20ms burst leaves at most one period's worth, not two.
        let mut t = vec![None; 12];
        t[4] = thr(80, 1);
        t[5] = thr(80, 1);
        let d = demand(&t, 20_000_000, P, Competition::AsObserved);
        assert!((replay(&d, bw(20, 0), 1.0) - 160e6).abs() < 1e3);
        let burst = replay(&d, bw(20, 20), 1.0);
        assert!(burst <= 40e6 + 1e3, "{burst}");
        // A group busy all along stays busy: no backlog is taken for it,
        // however its frozen time varies, and a higher quota helps it by the
        // quota's raise.
        let mut busy: Vec<_> = (0..24)
            .map(|k| thr(if k % 2 == 0 { 95 } else { 85 }, 1))
            .collect();
        busy.insert(0, None);
        busy.push(None);
        let d = demand(&busy, 5_000_000, P, Competition::AsObserved);
        assert!(d[1..25].iter().all(|p| p.carried_ns == 0.0), "{d:?}");
    }

    #[test]
    fn a_spike_after_idle_periods_is_not_taken_for_a_shared_cpu() {
        // Idle, then a spike that ran its 20ms quota, froze 10ms to the
        // refill and went on: the 80ms it did not run were idle, not other
        // tasks' turn, so the leftover is the whole 10ms (not 20/90 of it)
        // and a 10ms burst is what absorbs it.
        let mut t = vec![None; 12];
        for k in (2..12).step_by(4) {
            t[k] = thr(10, 1);
        }
        let d = demand(&t, 20_000_000, P, Competition::AsObserved);
        assert!((replay(&d, bw(20, 0), 2.0) - 30e6).abs() < 1e3);
        let small = replay(&d, bw(20, 5), 2.0);
        assert!((small - 15e6).abs() < 1e3, "{small}");
        assert!(replay(&d, bw(20, 10), 2.0) < 1e3);
    }
}
