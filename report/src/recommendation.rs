//! One piece of advice as the report gives it, and an effect it predicts
//! other than throttled time.

use serde::Serialize;

/// One piece of advice.
#[derive(Debug, Clone, Serialize)]
pub struct Recommendation {
    /// `cpu-burst`, `quota`, `threshold`, `cpuset`.
    pub kind: &'static str,
    /// The setting: an annotation key, or the orchestrator's field.
    pub key: String,
    pub value: String,
    /// The same for `throttlewatch run`.
    pub run_flag: String,
    pub reason: String,
    /// Throttled time observed and predicted with the change (kernel's measure).
    pub observed_throttled_ns: u64,
    pub predicted_throttled_ns: Option<u64>,
    /// What the prediction is about, and how far to trust it.
    pub covers: &'static str,
    /// For advice whose effect is not throttled time (`cpuset`): the figure it
    /// changes, now and with the change.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_effect: Option<Effect>,
}

/// A predicted effect other than throttled time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Effect {
    /// What is measured, e.g. `cpus_local_to_gpus`.
    pub metric: &'static str,
    pub observed: f64,
    pub predicted: f64,
}

impl Effect {
    /// ` -> metric 50 % (was 100 %)`, for the terminal and the page.
    pub fn describe(&self) -> String {
        format!(
            " -> predicted {} {:.0} % (was {:.0} %)",
            self.metric.replace('_', " "),
            self.predicted * 100.0,
            self.observed * 100.0
        )
    }
}
