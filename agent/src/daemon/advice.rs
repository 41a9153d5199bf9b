//! Each container's current advice in `/metrics`, for the fleet answer
//! (docs/fleet.md): the node report's own first recommendation
//! (`throttlewatch report` on the container's log, the same replay and the
//! same rules, significance bound included), as two series at most:
//! `throttlewatch_recommended{key, value}` and
//! `throttlewatch_recommended_throttled_ratio{key}` (the replay's predicted
//! throttled time over the observed).
//!
//! Only a container with news is read again: one that was throttled or
//! waited behind others since its last reading, at most once a minute, and
//! once more at its end. Reading a log is the report's work, so it runs on
//! a thread of its own, off the agent's loop; a full queue drops the job
//! (the next minute asks again; counted in agent.log).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub(crate) use super::exported_advice::Advice;
use super::metrics::Metrics;
use crate::labels::ContainerLabels;

/// The least time between two readings of one container's log.
pub(crate) const ADVICE_EVERY: Duration = Duration::from_secs(60);
/// Readings waiting for the thread at most.
const QUEUE: usize = 256;

struct Job {
    labels: Arc<ContainerLabels>,
    log: PathBuf,
}

/// The thread that reads logs, and which containers are due.
pub(crate) struct Advisor {
    tx: SyncSender<Job>,
    /// Containers with news since their last reading, and when that was.
    news: HashMap<Arc<ContainerLabels>, bool>,
    last: HashMap<Arc<ContainerLabels>, Instant>,
    dropped: u64,
}

impl Advisor {
    pub(crate) fn start(metrics: Arc<Mutex<Metrics>>) -> Advisor {
        let (tx, rx) = sync_channel::<Job>(QUEUE);
        let _ = std::thread::Builder::new()
            .name("advice".into())
            .spawn(move || {
                for job in rx {
                    let src = throttlewatch_report::reader::with_rotated_parts(&job.log);
                    let advice = match throttlewatch_report::report_one(&src, |_, _| {}) {
                        Ok(r) => Advice::first_of(&r.recommendations),
                        Err(e) => {
                            tracing::debug!("advice: {}: {e}", job.log.display());
                            continue;
                        }
                    };
                    if let Ok(m) = metrics.lock() {
                        m.set_advice(&job.labels, advice.as_ref());
                    }
                }
            });
        Advisor {
            tx,
            news: HashMap::new(),
            last: HashMap::new(),
            dropped: 0,
        }
    }

    /// Something worth reading again happened to the container.
    pub(crate) fn news(&mut self, l: &Arc<ContainerLabels>) {
        self.news.insert(l.clone(), true);
    }

    /// Read the log of each container with news whose last reading is
    /// [`ADVICE_EVERY`] old (`ended`: now, whatever the time: its last).
    pub(crate) fn due(&mut self, l: &Arc<ContainerLabels>, log: &std::path::Path, ended: bool) {
        let news = self.news.get(l).copied().unwrap_or(false);
        if !news {
            if ended {
                self.last.remove(l);
                self.news.remove(l);
            }
            return;
        }
        if ended {
            self.last.remove(l);
            self.news.remove(l);
        } else if self.last.get(l).is_some_and(|t| t.elapsed() < ADVICE_EVERY) {
            return;
        } else {
            self.news.insert(l.clone(), false);
            self.last.insert(l.clone(), Instant::now());
        }
        let job = Job {
            labels: l.clone(),
            log: log.to_path_buf(),
        };
        if let Err(TrySendError::Full(_)) = self.tx.try_send(job) {
            self.dropped += 1;
            if self.dropped.is_power_of_two() {
                eprintln!(
                    "throttlewatch agent: advice: {} readings dropped (the advice thread is behind)",
                    self.dropped
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use throttlewatch_report::recommend::Recommendation;

    fn rec(kind: &'static str, key: &str, value: &str, predicted: Option<u64>) -> Recommendation {
        Recommendation {
            kind,
            key: key.into(),
            value: value.into(),
            run_flag: String::new(),
            reason: String::new(),
            observed_throttled_ns: 2_000_000_000,
            predicted_throttled_ns: predicted,
            covers: "",
            predicted_effect: None,
        }
    }

    #[test]
    fn the_first_applicable_recommendation_is_the_advice() {
        let recs = [
            rec("threshold", "throttlewatch.io/threshold", "500us", None),
            rec(
                "cpu-burst",
                "throttlewatch.io/cpu-burst",
                "20ms",
                Some(100_000_000),
            ),
            rec("quota", "resources.limits.cpu", "0.7", Some(50_000_000)),
        ];
        let a = Advice::first_of(&recs).unwrap();
        assert_eq!(
            (a.key.as_str(), a.value.as_str()),
            ("throttlewatch.io/cpu-burst", "20ms")
        );
        assert!((a.number - 0.02).abs() < 1e-12);
        assert_eq!(a.throttled_ratio, Some(0.05));
        let a = Advice::first_of(&recs[2..]).unwrap();
        assert_eq!((a.number, a.throttled_ratio), (0.7, Some(0.025)));
        let c = Advice::first_of(&[rec(
            "contention",
            "throttlewatch.io/cpuset-exclusive",
            "true",
            None,
        )])
        .unwrap();
        assert_eq!((c.number, c.throttled_ratio), (1.0, None));
        assert_eq!(
            Advice::first_of(&recs[..1]),
            None,
            "a log threshold is no workload advice"
        );
    }
}
