//! The `control` record: one change the dynamic CPU controller made to a
//! container's bandwidth, with the signal that caused it (docs/log-format.md).

use serde::{Deserialize, Serialize};

/// CFS bandwidth as written to the cgroup, microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bandwidth {
    pub quota_us: u64,
    pub period_us: u64,
    pub burst_us: u64,
}

/// What the controller saw when it acted.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ControlSignal {
    /// Throttled time the probe counted ((cgroup, CPU) episodes) over `interval_ns`.
    pub throttled_ns: u64,
    pub episodes: u64,
    pub interval_ns: u64,
    /// Time without throttling before a step down.
    pub quiet_ns: u64,
    /// Node CPU pressure: the share of the guard's last window (0.5 s) in
    /// which some task waited (PSI `some`, percent), where present. Logs
    /// written before it carried `psi_some_avg10`, read into it.
    #[serde(
        default,
        alias = "psi_some_avg10",
        skip_serializing_if = "Option::is_none"
    )]
    pub psi_some_percent: Option<f64>,
    /// Idle CPU of the node over the same window, percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_percent: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Control {
    /// `raise`, `lower`, `restore` (the originals written back) or `adopt`
    /// (an operator's update became the new original).
    pub action: String,
    /// `throttled`, `calm`, `node_pressure`, `operator_update`,
    /// `container_end`, `control_off`, `agent_stop`, `agent_restart`.
    pub cause: String,
    pub before: Bandwidth,
    pub after: Bandwidth,
    /// The values the controller returns to and never goes below.
    pub original: Bandwidth,
    pub signal: ControlSignal,
}

#[cfg(test)]
mod tests {
    use crate::logfmt::{Line, Record};

    #[test]
    fn the_documented_example_is_a_control_line() {
        let doc = include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/log-format.md"
        ));
        let line = doc
            .lines()
            .find(|l| l.starts_with('{') && l.contains("\"type\":\"control\""))
            .expect("docs/log-format.md has a control example");
        let l: Line = serde_json::from_str(line).unwrap();
        let Record::Control(c) = &l.record else {
            panic!("{line}")
        };
        assert_eq!((c.action.as_str(), c.after.quota_us), ("raise", 70_000));
        let back = serde_json::to_value(&l).unwrap();
        assert_eq!(
            back,
            serde_json::from_str::<serde_json::Value>(line).unwrap()
        );
    }
}
