//! Advice from one container's log, each with the setting to change and the
//! throttled time the replay (replay.rs) predicts with it.

use crate::diagnosis::{diagnose, Diagnosis, Shape};
use crate::format::trim_float;
use crate::heatmap::short;
use crate::model::{Container, PeriodThrottle};
use crate::replay::{demand, replay, Bucket, Competition, PeriodDemand};

pub use crate::recommendation::{Effect, Recommendation};

/// The demand rebuilt from the log, and what the replay needs.
pub struct Model {
    /// Under this run's competition for the CPUs: what the same conditions
    /// would see (the burst, `--what-if`).
    pub demand: Vec<PeriodDemand>,
    /// As if the group had the CPUs it was frozen on to itself: what a
    /// limit is sized for, the same on a quiet and a busy host.
    pub demand_alone: Vec<PeriodDemand>,
    pub bw: Bucket,
    pub cpus: f64,
    pub observed_ns: u64,
    /// Which part of the log the demand came from, when not all of it (the
    /// controller changed the limit): said with each recommendation.
    pub span: Option<String>,
}

/// The fewest throttled periods under the controller's last limit that the
/// model is built from instead of the whole log.
const MIN_SPAN_PERIODS: usize = 10;

/// The periods the demand is rebuilt from and the bandwidth they ran under
/// (quota, burst in µs): the start's over the whole log; when the
/// controller changed the limit, the periods since its last change under
/// the limit it set, when at least [`MIN_SPAN_PERIODS`] of them were
/// throttled; else those before its first change, under the start's. A
/// replay over periods that ran under another quota would take their
/// throttling for that quota's.
struct Span {
    from: u64,
    to: u64,
    quota_us: u64,
    burst_us: u64,
    note: Option<String>,
}

fn span(
    c: &Container,
    start: &throttlewatch_core::logfmt::Start,
    periods: &[(u64, PeriodThrottle)],
) -> Option<Span> {
    let whole = Span {
        from: 0,
        to: u64::MAX,
        quota_us: start.quota_us?,
        burst_us: start.burst_us.unwrap_or(0),
        note: None,
    };
    let (Some((first_ts, first)), Some((last_ts, last))) = (c.controls.first(), c.controls.last())
    else {
        return Some(whole);
    };
    let same_period = c
        .controls
        .iter()
        .all(|(_, x)| x.after.period_us == start.period_us);
    // The period a change came in ran under both limits: left out.
    let at = |ts: &u64| c.period_containing(*ts);
    let throttled = |from: u64, to: u64| {
        periods
            .iter()
            .filter(|(k, _)| *k >= from && *k < to)
            .count()
    };
    let cpus = |q: u64| q as f64 / start.period_us.max(1) as f64;
    if let (true, Some(from)) = (same_period, at(last_ts)) {
        let n = throttled(from + 1, u64::MAX);
        if n >= MIN_SPAN_PERIODS && last.after.quota_us > 0 {
            return Some(Span {
                from: from + 1,
                to: u64::MAX,
                quota_us: last.after.quota_us,
                burst_us: last.after.burst_us,
                note: Some(format!(
                    "computed over the {n} throttled periods after the controller's last change, under the limit it set ({:.2} CPUs)",
                    cpus(last.after.quota_us)
                )),
            });
        }
    }
    if let Some(to) = at(first_ts).filter(|_| first.before.quota_us > 0) {
        let n = throttled(0, to);
        if n > 0 {
            return Some(Span {
                from: 0,
                to,
                quota_us: first.before.quota_us,
                burst_us: first.before.burst_us,
                note: Some(format!(
                    "computed over the {n} throttled periods before the controller first changed the limit ({:.2} CPUs then)",
                    cpus(first.before.quota_us)
                )),
            });
        }
    }
    Some(Span {
        note: Some("the controller changed the limit during the log: computed over the whole log under the limit at the start".into()),
        ..whole
    })
}

/// Rebuild the demand: per-period throttled spans from the records, scaled so
/// they sum to the kernel's throttled time (records under the threshold and
/// lost events are in the kernel's figure, not in the records).
pub fn model(c: &Container) -> Option<Model> {
    let start = c.start.as_ref()?;
    let period_ns = c.period_ns();
    let all = c.throttled_periods();
    let recorded: u64 = all.iter().map(|(_, p)| p.throttled_ns).sum();
    let kernel = c.kernel_throttled_ns().unwrap_or(recorded);
    let scale = if recorded > 0 && kernel > 0 {
        kernel as f64 / recorded as f64
    } else {
        1.0
    };
    let span = span(c, start, &all)?;
    let quota_ns = span.quota_us * 1000;
    let periods: Vec<(u64, PeriodThrottle)> = all
        .into_iter()
        .filter(|(k, _)| *k >= span.from && *k < span.to)
        .collect();
    let (first, last) = (periods.first()?.0, periods.last()?.0);
    let observed = if span.note.is_some() && (span.from > 0 || span.to < u64::MAX) {
        (periods.iter().map(|(_, p)| p.throttled_ns).sum::<u64>() as f64 * scale) as u64
    } else {
        kernel
    };
    // Through the span's end (the log's, or the controller's first
    // change): whether the last throttled period was followed by one
    // without throttling matters (replay.rs).
    let end = c
        .period_index(c.last_ts)
        .unwrap_or(last)
        .min(span.to.saturating_sub(1));
    let last = last.max(end);
    let mut t = vec![None; (last - first + 1) as usize];
    for (k, p) in &periods {
        t[(k - first) as usize] = Some(PeriodThrottle {
            throttled_ns: (p.throttled_ns as f64 * scale) as u64,
            ..*p
        });
    }
    let cpus = start
        .cpus
        .as_deref()
        .and_then(|s| throttlewatch_core::cpulist::CpuList::parse("cpus", s).ok())
        .map(|v| v.len() as f64)
        .filter(|n| *n > 0.0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64));
    // The CPUs it can run on side by side: the most it was frozen on at
    // once in a period, or all it was ever frozen on (beside a neighbour
    // its threads may share one CPU in every period, but not the same one
    // all run long); threads pinned to one CPU never show two.
    let seen = c.frozen_on_cpus.len() as u32;
    let spread = periods
        .iter()
        .map(|(_, p)| p.cpus)
        .max()
        .map_or(cpus, |n| (n.max(seen).max(1) as f64).min(cpus));
    Some(Model {
        demand: demand(&t, quota_ns, period_ns, Competition::AsObserved),
        demand_alone: demand(&t, quota_ns, period_ns, Competition::Alone { cpus: spread }),
        bw: Bucket {
            quota_ns,
            period_ns,
            burst_ns: span.burst_us * 1000,
        },
        cpus,
        observed_ns: observed,
        span: span.note,
    })
}

/// The least a cause must cost before advice names it: 100 ms of thread
/// time in all, and 1 % of the wall time the log covers (docs/report.md,
/// "When there is no advice"). A container that lost less to its limit and
/// to contention gets no limit, burst or cpuset advice.
pub const SIGNIFICANT_MIN_NS: u64 = 100_000_000;
pub const SIGNIFICANT_WALL_SHARE: f64 = 0.01;

/// Whether `ns` of lost time over `wall_ns` is worth advice.
pub fn significant(ns: u64, wall_ns: u64) -> bool {
    ns >= SIGNIFICANT_MIN_NS && ns as f64 >= SIGNIFICANT_WALL_SHARE * wall_ns as f64
}

/// Advice that follows the diagnosis (diagnosis.rs): a container that
/// mostly waits for CPUs others hold gets placement and priority advice and
/// no limit (more quota is more CPU time it cannot get); a burst only for
/// throttling in spikes; a limit (or fewer workers) for a steady overload.
pub fn recommend(c: &Container) -> Vec<Recommendation> {
    let levels = crate::levels::levels(c);
    let d = diagnose(c, &levels);
    let mut out = Vec::new();
    let wall = c.wall_ns();
    let contended = d.contended() && significant(d.contention_ns(), wall);
    if contended {
        out.extend(contention(c, &d));
    }
    if let Some(m) = model(c) {
        let said = |mut r: Recommendation| {
            if let Some(n) = &m.span {
                r.reason = format!("{}; {n}", r.reason);
            }
            r
        };
        // Under contention a limit still removes the freezes where they are
        // a large part (the advice says it leaves the wait); a burst never
        // helps there: the quota left unused was CPU the group could not get.
        let limits = d.share_of(crate::diagnosis::LIMITS);
        if significant(m.observed_ns, wall) && (!contended || limits >= 0.25) {
            if d.shape == Shape::Bursts && !contended {
                out.extend(burst(&m).map(said));
            }
            out.extend(quota(c, &m).map(|mut q| {
                if contended {
                    q.reason = format!(
                        "{} (this removes the freezes, {:.0} % of the runnable time, not the wait for CPUs others hold)",
                        q.reason,
                        limits * 100.0
                    );
                }
                said(q)
            }));
        }
    }
    out.extend(threshold(c));
    out.extend(crate::placement::placement(c));
    out
}

fn burst(m: &Model) -> Option<Recommendation> {
    let q = m.bw.quota_ns;
    let observed = m.observed_ns as f64;
    let at = |b: u64| {
        replay(
            &m.demand,
            Bucket {
                burst_ns: b,
                ..m.bw
            },
            m.cpus,
        )
    };
    // The smallest burst of a quarter, a half, three quarters or all of the
    // quota (on a 5 ms grid, 1 ms under 20 ms: values a person writes, and
    // the same for runs that differ by noise) that absorbs 90 % of the
    // throttling; else the largest the kernel takes (the quota) if it helps.
    let grid: u64 = if q >= 20_000_000 {
        5_000_000
    } else {
        1_000_000
    };
    let mut steps: Vec<u64> = (1..=4)
        .map(|i| (q * i / 4).div_ceil(grid) * grid)
        .map(|b| b.min(q))
        .filter(|b| *b > m.bw.burst_ns)
        .collect();
    steps.dedup();
    let pick = steps
        .iter()
        .copied()
        .find(|b| at(*b) <= 0.1 * observed)
        .or_else(|| steps.last().copied().filter(|b| at(*b) <= 0.95 * observed))?;
    let predicted = at(pick);
    let b = round_us(pick);
    Some(Recommendation {
        kind: "cpu-burst",
        key: "throttlewatch.io/cpu-burst".into(),
        value: short_exact(b),
        run_flag: format!("--burst {}", short_exact(b)),
        reason: format!(
            "the throttling comes in spikes after periods that left quota unused while the group had nothing to run; a burst of {} (at most the quota, {}) lets them spend it",
            short(b),
            short(q)
        ),
        observed_throttled_ns: m.observed_ns,
        predicted_throttled_ns: Some(predicted as u64),
        covers: COVERS_THROTTLED,
        predicted_effect: None,
    })
}

fn quota(c: &Container, m: &Model) -> Option<Recommendation> {
    let periods = c.throttled_periods();
    let runnable = periods.iter().map(|(_, p)| p.threads).max()? as f64;
    let cpus_now = m.bw.quota_ns as f64 / m.bw.period_ns as f64;
    let limit_max = runnable.min(m.cpus).max(cpus_now);
    // Sized for the demand with the CPUs to itself: the same advice on a
    // quiet host and beside other work (beside it, the group got less of
    // its CPUs and so seemed to need less).
    let l = smallest_limit(m, &m.demand_alone, cpus_now, limit_max);
    if l <= cpus_now + 1e-9 {
        return None;
    }
    let at = |cpus: f64| replay(&m.demand_alone, limit_bw(m, cpus), m.cpus);
    let under_load = smallest_limit(m, &m.demand, cpus_now, limit_max);
    let predicted = at(l);
    let frozen_per_period = periods.iter().map(|(_, p)| p.throttled_ns).sum::<u64>() as f64
        / periods.len().max(1) as f64;
    let workers = cpus_now.floor().max(1.0);
    // Frozen mostly by the pod's quota: that is the limit to name (kubelet
    // makes it the sum of the pod's containers' limits).
    let above = crate::levels::levels(c)
        .into_iter()
        .find(|x| x.level != "container" && x.share > 0.5)
        .map(|x| {
            format!(
                "the {} cgroup's quota ({}{}) froze {:.0} % of it, not the container's own{}; ",
                if x.level == "pod" { "pod" } else { "ancestor" },
                x.cgroup_path,
                x.quota_us
                    .filter(|_| x.period_us > 0)
                    .map(|q| format!(", {} CPUs", trim_float(q as f64 / x.period_us as f64)))
                    .unwrap_or_default(),
                x.share * 100.0,
                if x.level == "pod" {
                    ": under kubelet it is the sum of the pod's containers' limits, so raising this container's limit raises it"
                } else {
                    ": raise that cgroup's quota too"
                }
            )
        })
        .unwrap_or_default();
    Some(Recommendation {
        kind: "quota",
        key: "resources.limits.cpu".into(),
        value: trim_float(l),
        run_flag: format!("--cpus {}", trim_float(l)),
        reason: format!(
            "{above}{} runnable threads under a quota of {} CPUs freeze for {} of each throttled period (summed over CPUs): run {} worker{}, or raise the limit to {}",
            runnable,
            trim_float(cpus_now),
            short(frozen_per_period as u64),
            workers,
            if workers > 1.0 { "s" } else { "" },
            trim_float(l)
        ) + &if under_load + 1e-9 < l {
            format!(
                "; sized as if it had CPUs to itself (as many as it had runnable threads, at most those it may use): beside this run's other work it got less of them, and {} CPU{} would do while that work runs",
                trim_float(under_load),
                if under_load > 1.0 + 1e-9 { "s" } else { "" }
            )
        } else {
            String::new()
        },
        observed_throttled_ns: m.observed_ns,
        predicted_throttled_ns: Some(predicted as u64),
        covers: COVERS_LIMIT,
        predicted_effect: None,
    })
}

fn limit_bw(m: &Model, cpus: f64) -> Bucket {
    Bucket {
        quota_ns: (cpus * m.bw.period_ns as f64) as u64,
        ..m.bw
    }
}

/// The smallest limit whose replay of `demand` removes 90 % of the observed
/// throttling, in steps a person writes: tenths of a CPU below 1, halves to
/// 4, whole CPUs above; at most `limit_max`.
fn smallest_limit(m: &Model, demand: &[PeriodDemand], cpus_now: f64, limit_max: f64) -> f64 {
    let observed = m.observed_ns as f64;
    let step = |l: f64| {
        if l < 1.0 - 1e-9 {
            0.1
        } else if l < 4.0 - 1e-9 {
            0.5
        } else {
            1.0
        }
    };
    let up = |l: f64| {
        let s = step(l);
        (((l + 1e-9) / s).floor() * s + s).max(l + 1e-9)
    };
    let round = |l: f64| (l * 10.0).round() / 10.0;
    let mut l = round(up(cpus_now));
    while l < limit_max && replay(demand, limit_bw(m, l), m.cpus) > 0.1 * observed {
        l = round(up(l));
    }
    l.min(limit_max)
}

pub const COVERS_THROTTLED: &str = "the kernel's throttled time only, replayed from this log's periods (docs/report.md: it errs high for spikes after idle periods); not run-queue wait, not step time";

pub const COVERS_LIMIT: &str = "the kernel's throttled time only, replayed from this log's periods as if the group had CPUs to itself (the same advice on a quiet and a busy host; docs/report.md); not run-queue wait, not step time";

/// Waiting for CPUs others hold: more quota will not help.
fn contention(c: &Container, d: &Diagnosis) -> Option<Recommendation> {
    let wait = d.contention_ns();
    let frozen = c.frozen_ns();
    let who = if d.share_of(&["host"]) >= d.share_of(&["other_containers"]) {
        "the host's other processes"
    } else {
        "other containers"
    };
    Some(Recommendation {
        kind: "contention",
        key: "throttlewatch.io/cpuset-exclusive".into(),
        value: "true".into(),
        run_flag: "--cpuset <CPUs of its own>".into(),
        reason: format!(
            "its threads waited {} for CPUs held by {who} against {} frozen by its limit: raising the limit will not help (it allows CPU time the threads cannot get). Give it CPUs of its own (this annotation, or a Guaranteed pod with whole CPUs under kubelet's static CPU manager), move neighbours off its CPUs, or raise its priority (QoS class, cpu.weight)",
            short(wait),
            short(frozen)
        ),
        observed_throttled_ns: c.kernel_throttled_ns().unwrap_or(0),
        predicted_throttled_ns: None,
        covers: "run-queue wait, which this report measures and does not predict",
        predicted_effect: None,
    })
}

/// A noisy log (many short freezes): a threshold that keeps the long ones.
fn threshold(c: &Container) -> Option<Recommendation> {
    let h = &c.freezes;
    let thr = c.start.as_ref().map_or(0, |s| s.threshold_ns);
    if h.count < 100_000 || thr >= 1_000_000 {
        return None;
    }
    let p90 = h.quantile(0.9)?;
    let t = round_us(p90.clamp(100_000, 1_000_000));
    Some(Recommendation {
        kind: "threshold",
        key: "throttlewatch.io/threshold".into(),
        value: short_exact(t),
        run_flag: format!("--threshold {}", short_exact(t)),
        reason: format!(
            "{} freeze records, half of them under {}: a threshold keeps the log to the freezes that matter (the totals still count all)",
            h.count,
            short(h.quantile(0.5).unwrap_or(0))
        ),
        observed_throttled_ns: c.kernel_throttled_ns().unwrap_or(0),
        predicted_throttled_ns: None,
        covers: "the log's size, not the container",
        predicted_effect: None,
    })
}

pub(crate) fn round_us(ns: u64) -> u64 {
    ns.div_ceil(1000) * 1000
}

/// A duration the annotation and flag parsers take back exactly (whole µs or ms).
fn short_exact(ns: u64) -> String {
    if ns / 1_000_000 * 1_000_000 == ns {
        format!("{}ms", ns / 1_000_000)
    } else {
        format!("{}us", ns / 1000)
    }
}

#[cfg(test)]
#[path = "recommend_tests.rs"]
mod tests;
