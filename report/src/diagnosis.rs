//! Where a container's runnable time went, and its dominant cause in one
//! sentence: frozen by its own limit (the container's, its pod's, an
//! ancestor's quota), or waiting for a CPU held by other containers, by the
//! host, or by its own threads (more runnable threads than CPUs). The
//! advice (recommend.rs) follows the cause: a limit does not help a
//! container that waits for CPUs others hold.
//!
//! Frozen time is the `throttle` records' (`end.frozen_ns`) split by the
//! level that froze it; run-queue wait is `end.runq.total_ns` (both summed
//! over threads), split between those who held the CPU in proportion to
//! the preemptions of watched threads by each (`preempted_by_*`): the
//! probe counts who switched a runnable thread out, not how long each held
//! the CPU afterwards (docs/report.md).

use serde::Serialize;

use crate::levels::LevelShare;
use crate::model::Container;

/// One cause and its share of the runnable-but-not-running time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CauseShare {
    /// `own_limit`, `pod_limit`, `ancestor_limit`, `other_containers`,
    /// `host`, `own_threads`.
    pub cause: &'static str,
    pub ns: u64,
    pub share: f64,
}

/// The shape of the throttling over time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Shape {
    /// No throttled period.
    None,
    /// Throttled in most of the periods it was active: a steady overload.
    Steady,
    /// Throttled periods mostly after periods without throttling: spikes.
    Bursts,
}

#[derive(Debug, Clone, Serialize)]
pub struct Diagnosis {
    /// The largest share's cause; `none` when the threads never waited.
    pub cause: &'static str,
    pub sentence: String,
    /// Most first.
    pub shares: Vec<CauseShare>,
    pub shape: Shape,
    /// Throttled periods over the periods the group was active (kernel).
    pub throttled_period_share: Option<f64>,
    /// Throttled periods that followed one without throttling.
    pub isolated_share: Option<f64>,
}

impl Diagnosis {
    pub fn share_of(&self, causes: &[&str]) -> f64 {
        self.shares
            .iter()
            .filter(|s| causes.contains(&s.cause))
            .map(|s| s.share)
            .sum()
    }

    /// Thread time spent waiting for CPUs others hold (containers, the host).
    pub fn contention_ns(&self) -> u64 {
        self.shares
            .iter()
            .filter(|s| CONTENTION.contains(&s.cause))
            .map(|s| s.ns)
            .sum()
    }

    /// Waiting for CPUs others hold (containers, the host) is the larger part.
    pub fn contended(&self) -> bool {
        self.share_of(CONTENTION) > self.share_of(LIMITS)
    }
}

pub const LIMITS: &[&str] = &["own_limit", "pod_limit", "ancestor_limit"];
pub const CONTENTION: &[&str] = &["other_containers", "host"];

pub fn diagnose(c: &Container, levels: &[LevelShare]) -> Diagnosis {
    let frozen = c.frozen_ns();
    let mut parts: Vec<(&'static str, f64)> = Vec::new();
    if levels.is_empty() {
        parts.push(("own_limit", frozen as f64));
    } else {
        for l in levels {
            let cause = match l.level {
                "pod" => "pod_limit",
                "ancestor" => "ancestor_limit",
                _ => "own_limit",
            };
            parts.push((cause, frozen as f64 * l.share));
        }
    }
    if let Some(q) = c.runq() {
        let by = [
            ("own_threads", q.preempted_by_same),
            ("other_containers", q.preempted_by_other),
            ("host", q.preempted_by_host),
        ];
        let n: u64 = by.iter().map(|(_, k)| k).sum();
        for (cause, k) in by {
            let w = if n == 0 {
                // No preemption seen: the threads woke to a busy CPU; who
                // held it is not known, the host's share stands for it.
                if cause == "host" {
                    q.total_ns as f64
                } else {
                    0.0
                }
            } else {
                q.total_ns as f64 * k as f64 / n as f64
            };
            parts.push((cause, w));
        }
    }
    reattribute_own_threads(c, frozen, &mut parts);
    let mut merged: Vec<(&'static str, f64)> = Vec::new();
    for (cause, ns) in parts {
        match merged.iter_mut().find(|(c, _)| *c == cause) {
            Some(m) => m.1 += ns,
            None => merged.push((cause, ns)),
        }
    }
    let total: f64 = merged.iter().map(|(_, ns)| ns).sum();
    let mut shares: Vec<CauseShare> = merged
        .into_iter()
        .filter(|(_, ns)| *ns > 0.0)
        .map(|(cause, ns)| CauseShare {
            cause,
            ns: ns as u64,
            share: ns / total,
        })
        .collect();
    shares.sort_by(|a, b| b.ns.cmp(&a.ns).then(a.cause.cmp(b.cause)));
    let (shape, throttled_period_share, isolated_share) = shape(c);
    let cause = shares.first().map_or("none", |s| s.cause);
    let sentence = sentence(c, &shares, shape, levels);
    Diagnosis {
        cause,
        sentence,
        shares,
        shape,
        throttled_period_share,
        isolated_share,
    }
}

/// Threads cannot wait behind their own threads while those do not fill
/// the CPUs: a group that was hardly frozen and ran well below what its
/// limit and its CPUs allow waited for CPUs others held, whoever switched
/// it out (a worker woken behind its sibling that was itself about to be
/// preempted). Its own-thread waits then count as the others' (the host's
/// where no other container preempted it).
fn reattribute_own_threads(c: &Container, frozen: u64, parts: &mut [(&'static str, f64)]) {
    let (Some(start), Some(end)) = (c.start.as_ref(), c.end.as_ref()) else {
        return;
    };
    let Some(running) = end.thread_cpu.as_ref().map(|t| t.running_ns as f64) else {
        return;
    };
    let wall = c.wall_ns() as f64;
    let cpus = start
        .cpus
        .as_deref()
        .and_then(|s| throttlewatch_core::cpulist::CpuList::parse("cpus", s).ok())
        .map_or(1.0, |l| l.len().max(1) as f64);
    let limit = start.quota_us.map_or(cpus, |q| {
        (q as f64 / start.period_us.max(1) as f64).min(cpus)
    });
    let own: f64 = parts
        .iter()
        .filter(|p| p.0 == "own_threads")
        .map(|p| p.1)
        .sum();
    let total: f64 = parts.iter().map(|p| p.1).sum();
    if wall <= 0.0 || own <= 0.0 || (frozen as f64) > 0.1 * total || running > 0.8 * limit * wall {
        return;
    }
    let other: f64 = parts
        .iter()
        .filter(|p| p.0 == "other_containers")
        .map(|p| p.1)
        .sum();
    let host: f64 = parts.iter().filter(|p| p.0 == "host").map(|p| p.1).sum();
    let to_other = if other + host > 0.0 {
        own * other / (other + host)
    } else {
        0.0
    };
    for p in parts.iter_mut() {
        match p.0 {
            "own_threads" => p.1 = 0.0,
            "other_containers" => p.1 += to_other,
            "host" => p.1 += own - to_other,
            _ => {}
        }
    }
}

/// The throttling's shape from the periods: the kernel's throttled share of
/// the active periods, and how many throttled periods followed one without.
fn shape(c: &Container) -> (Shape, Option<f64>, Option<f64>) {
    let periods = c.throttled_periods();
    if periods.is_empty() {
        return (Shape::None, None, None);
    }
    let isolated = periods
        .iter()
        .enumerate()
        .filter(|(i, (k, _))| *i == 0 || periods[i - 1].0 + 1 != *k)
        .count() as f64
        / periods.len() as f64;
    let throttled = c
        .periods_throttled()
        .filter(|(p, _)| *p > 0)
        .map(|(p, t)| t as f64 / p as f64);
    // Spikes: most throttled periods start after one without throttling
    // and the group is not throttled in most periods it is active.
    let s = if isolated >= 0.5 && throttled.is_none_or(|t| t < 0.5) {
        Shape::Bursts
    } else {
        Shape::Steady
    };
    (s, throttled, Some(isolated))
}

fn words(cause: &str) -> &'static str {
    match cause {
        "own_limit" => "frozen by its own CPU limit",
        "pod_limit" => "frozen by its pod's CPU limit",
        "ancestor_limit" => "frozen by a parent cgroup's CPU limit",
        "other_containers" => "waiting for CPUs held by other containers",
        "host" => "waiting for CPUs held by the host's other processes",
        "own_threads" => "waiting behind its own threads (more runnable threads than CPUs)",
        _ => "",
    }
}

fn sentence(c: &Container, shares: &[CauseShare], shape: Shape, levels: &[LevelShare]) -> String {
    let Some(first) = shares.first() else {
        return "its threads never waited to run: nothing to fix".into();
    };
    let total: u64 = shares.iter().map(|s| s.ns).sum();
    let rest: Vec<String> = shares
        .iter()
        .skip(1)
        .filter(|s| s.share >= 0.05)
        .map(|s| format!("{} {:.0} %", words(s.cause), s.share * 100.0))
        .collect();
    let limit = match first.cause {
        "own_limit" => c
            .start
            .as_ref()
            .and_then(|s| Some(s.quota_us? as f64 / s.period_us.max(1) as f64))
            .map(|cpus| format!(" ({} CPUs)", crate::format::trim_float(cpus)))
            .unwrap_or_default(),
        "pod_limit" | "ancestor_limit" => levels
            .iter()
            .find(|l| l.level != "container")
            .and_then(|l| Some(l.quota_us? as f64 / l.period_us.max(1) as f64))
            .map(|cpus| format!(" ({} CPUs)", crate::format::trim_float(cpus)))
            .unwrap_or_default(),
        _ => String::new(),
    };
    let how = match (first.cause, shape) {
        ("own_limit" | "pod_limit" | "ancestor_limit", Shape::Steady) => {
            ", in most periods: a steady overload"
        }
        ("own_limit" | "pod_limit" | "ancestor_limit", Shape::Bursts) => {
            ", in spikes after idle periods"
        }
        _ => "",
    };
    format!(
        "{:.0} % of the time its threads were runnable without running ({} summed over threads) they were {}{limit}{how}{}",
        first.share * 100.0,
        crate::heatmap::short(total),
        words(first.cause),
        if rest.is_empty() {
            String::new()
        } else {
            format!("; {}", rest.join(", "))
        }
    )
}

#[cfg(test)]
mod tests {
    use throttlewatch_core::logfmt::{End, Record, Runq, Start, Throttle};

    use super::*;

    fn container(periods: &[u64], frozen: u64, runq: Runq) -> Container {
        let mut c = Container::default();
        c.add(
            0,
            Record::Start(Start {
                cgroup_id: 7,
                quota_us: Some(50_000),
                period_us: 100_000,
                ..Default::default()
            }),
        );
        let p = 100_000_000u64;
        for k in periods {
            c.add(
                0,
                Record::Throttle(Throttle {
                    tid: 1,
                    cgroup_id: 7,
                    throttled_cgroup_id: 7,
                    start_ns: k * p + 60_000_000,
                    frozen_ns: 40_000_000,
                    ..Default::default()
                }),
            );
        }
        c.add(
            0,
            Record::End(End {
                frozen_ns: frozen,
                nr_periods: 100,
                nr_throttled: periods.len() as u64,
                runq: Some(runq),
                ..Default::default()
            }),
        );
        c
    }

    #[test]
    fn a_steady_overload_is_its_own_limit() {
        let c = container(
            &(0..90).collect::<Vec<_>>(),
            3_600_000_000,
            Runq {
                total_ns: 100_000_000,
                preempted_by_same: 10,
                ..Default::default()
            },
        );
        let d = diagnose(&c, &crate::levels::levels(&c));
        assert_eq!(d.cause, "own_limit");
        assert_eq!(d.shape, Shape::Steady);
        assert!(!d.contended());
        assert!(
            d.sentence.contains("own CPU limit (0.5 CPUs)"),
            "{}",
            d.sentence
        );
        assert!(d.sentence.contains("steady overload"), "{}", d.sentence);
    }

    #[test]
    fn spikes_after_idle_periods_are_bursts() {
        let c = container(&[3, 10, 17, 24, 31], 200_000_000, Runq::default());
        let d = diagnose(&c, &crate::levels::levels(&c));
        assert_eq!((d.cause, d.shape), ("own_limit", Shape::Bursts));
    }

    #[test]
    fn waiting_for_cpus_others_hold_is_contention() {
        let c = container(
            &(0..20).collect::<Vec<_>>(),
            400_000_000,
            Runq {
                total_ns: 3_000_000_000,
                preempted_by_host: 30,
                preempted_by_other: 10,
                preempted_by_same: 0,
                ..Default::default()
            },
        );
        let d = diagnose(&c, &crate::levels::levels(&c));
        assert_eq!(d.cause, "host");
        assert!(d.contended());
        assert!((d.share_of(&["other_containers"]) - 750.0 / 3400.0).abs() < 1e-3);
        assert!(d.sentence.starts_with("66 %"), "{}", d.sentence);
    }

    #[test]
    fn own_thread_waits_of_a_group_that_did_not_fill_its_cpus_are_the_others() {
        use throttlewatch_core::logfmt::ThreadCpu;
        let mut c = Container::default();
        c.add(
            0,
            Record::Start(Start {
                cgroup_id: 7,
                quota_us: Some(150_000),
                period_us: 100_000,
                cpus: Some("0-1".into()),
                ..Default::default()
            }),
        );
        // 4 s, 0.5 CPU of running against a 1.5 CPU limit, never frozen.
        c.add(
            4_000_000_000,
            Record::End(End {
                duration_ns: 4_000_000_000,
                runq: Some(Runq {
                    total_ns: 10_000_000_000,
                    preempted_by_same: 30,
                    preempted_by_host: 10,
                    ..Default::default()
                }),
                thread_cpu: Some(ThreadCpu {
                    running_ns: 2_000_000_000,
                    ..Default::default()
                }),
                ..Default::default()
            }),
        );
        let d = diagnose(&c, &crate::levels::levels(&c));
        assert_eq!(d.cause, "host", "{d:?}");
        assert!(d.contended());
        assert_eq!(d.share_of(&["own_threads"]), 0.0);
    }
}
