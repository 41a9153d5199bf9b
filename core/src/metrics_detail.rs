//! How many series a watched container gets in `/metrics` (docs/metrics.md,
//! "Series budget"): the node's `metrics_detail`, and a pod's
//! `throttlewatch.io/metrics-detail` annotation over it.

use serde::{Deserialize, Serialize};

/// `basic` (the default): at most 16 series per container where Prometheus
/// scrapes native histograms. `full`: also the splits by who preempted and
/// who woke, the probe's own throttled time, the burst count and the GPUs'
/// memory and SM activity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MetricsDetail {
    #[default]
    Basic,
    Full,
}

impl MetricsDetail {
    /// What the annotation and the configuration accept.
    pub const ACCEPTED: &'static str = "expected basic or full";

    /// An annotation's value: exactly `basic` or `full` (surrounding blanks
    /// ignored, as for every key), else None.
    pub fn parse(v: &str) -> Option<MetricsDetail> {
        match v.trim() {
            "basic" => Some(MetricsDetail::Basic),
            "full" => Some(MetricsDetail::Full),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            MetricsDetail::Basic => "basic",
            MetricsDetail::Full => "full",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_two_levels_parse() {
        assert_eq!(MetricsDetail::parse("full"), Some(MetricsDetail::Full));
        assert_eq!(MetricsDetail::parse(" basic "), Some(MetricsDetail::Basic));
        for bad in ["", "Full", "all", "full,basic", "1"] {
            assert_eq!(MetricsDetail::parse(bad), None, "{bad:?}");
        }
        for d in [MetricsDetail::Basic, MetricsDetail::Full] {
            assert_eq!(MetricsDetail::parse(d.name()), Some(d));
        }
    }
}
