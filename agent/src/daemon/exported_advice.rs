//! The advice a fleet can act on, as the agent exports it: the node
//! report's first recommendation that a fleet can apply.

/// The advice a fleet can act on, as exported.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Advice {
    /// The setting: `resources.limits.cpu`, `throttlewatch.io/cpu-burst`,
    /// `throttlewatch.io/cpuset-exclusive`, `throttlewatch.io/cpuset`.
    pub key: String,
    /// As the node report prints it (`0.7`, `20ms`, `true`, `gpu-local`).
    pub value: String,
    /// The value as a number where it is one (CPUs, seconds of burst), else 1.
    pub number: f64,
    /// Predicted throttled time with it over the observed; None where the
    /// report predicts no throttled time (contention, placement).
    pub throttled_ratio: Option<f64>,
}

impl Advice {
    /// The node report's first recommendation that a fleet can apply (a
    /// log threshold is the log's advice, not the workload's).
    pub(crate) fn first_of(
        recs: &[throttlewatch_report::recommend::Recommendation],
    ) -> Option<Advice> {
        let r = recs
            .iter()
            .find(|r| matches!(r.kind, "quota" | "cpu-burst" | "contention" | "cpuset"))?;
        let number = match r.kind {
            "quota" => r.value.parse().ok()?,
            "cpu-burst" => throttlewatch_core::units::parse_duration(&r.key, &r.value)
                .ok()?
                .as_secs_f64(),
            _ => 1.0,
        };
        let throttled_ratio = r
            .predicted_throttled_ns
            .filter(|_| r.observed_throttled_ns > 0)
            .map(|p| (p as f64 / r.observed_throttled_ns as f64).min(1.0));
        Some(Advice {
            key: r.key.clone(),
            value: r.value.clone(),
            number,
            throttled_ratio,
        })
    }
}
