//! `[control]` of throttlewatch.toml: the node's switch and bounds for the
//! dynamic CPU controller (docs/control.md). Off by default; a container
//! opts in with `throttlewatch.io/cpu-control=auto` (or a class preset).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ControlConfig {
    /// Whether the agent controls the containers that ask for it.
    pub enabled: bool,
    /// Highest burst, percent of the container's original quota (1..=100:
    /// the kernel refuses a burst above the quota).
    pub burst_ceiling_percent: u32,
    /// Highest quota, percent of the original (100..=1000; Koordinator's 300).
    pub quota_ceiling_percent: u32,
    /// Smallest step, percent of the original quota; a step is at least the
    /// throttled time seen per period.
    pub step_percent: u32,
    /// Milliseconds between two raises (and between two steps down under node pressure).
    pub cooldown_ms: u64,
    /// Milliseconds without throttling before each step back down.
    pub calm_ms: u64,
    /// Node CPU pressure: the share of the last guard window (0.5 s) in
    /// which some task waited for CPU (PSI `some`, from the file's `total=`
    /// stall counter, percent), at or above which nothing is raised and
    /// raised values step down (while idle CPU is low too); 100: never.
    /// (`pressure_psi_some_avg10`, its first name, is still read.)
    #[serde(alias = "pressure_psi_some_avg10")]
    pub pressure_psi_some_percent: f64,
    /// Idle CPU of the node over the same window (percent) at or below
    /// which the node counts as under pressure: with PSI, both must hold
    /// (a throttled task counts as waiting in PSI, so a controlled
    /// container's own throttling must not trip the guard while CPUs
    /// idle); without PSI, this alone; 0: PSI alone (never without it).
    pub pressure_idle_percent: f64,
    /// The PSI file the guard reads: the node's (`/proc/pressure/cpu`), or a
    /// cgroup2 group's `cpu.pressure` (e.g. the one holding the workloads,
    /// so that the system's own daemons do not count). Absolute path.
    pub pressure_psi_file: String,
}

impl Default for ControlConfig {
    fn default() -> Self {
        ControlConfig {
            enabled: false,
            burst_ceiling_percent: 100,
            quota_ceiling_percent: 300,
            step_percent: 20,
            cooldown_ms: 100,
            calm_ms: 2000,
            pressure_psi_some_percent: 60.0,
            pressure_idle_percent: 10.0,
            pressure_psi_file: "/proc/pressure/cpu".into(),
        }
    }
}

impl ControlConfig {
    /// Every value in range, or the field, its value and what is accepted.
    pub fn check(&self) -> Result<(), crate::bad_value::BadValue> {
        let bad = |k: &str, v: String, want: &str| {
            Err(crate::bad_value::BadValue::new(
                &format!("[control] {k}"),
                v,
                want,
            ))
        };
        if !(1..=100).contains(&self.burst_ceiling_percent) {
            return bad(
                "burst_ceiling_percent",
                self.burst_ceiling_percent.to_string(),
                "1 to 100 (the kernel caps a burst at the quota)",
            );
        }
        if !(100..=1000).contains(&self.quota_ceiling_percent) {
            return bad(
                "quota_ceiling_percent",
                self.quota_ceiling_percent.to_string(),
                "100 to 1000 (percent of the original quota)",
            );
        }
        if !(1..=100).contains(&self.step_percent) {
            return bad(
                "step_percent",
                self.step_percent.to_string(),
                "1 to 100 (percent of the original quota)",
            );
        }
        if !(10..=60_000).contains(&self.cooldown_ms) {
            return bad(
                "cooldown_ms",
                self.cooldown_ms.to_string(),
                "10 to 60000 milliseconds",
            );
        }
        if !(100..=600_000).contains(&self.calm_ms) {
            return bad(
                "calm_ms",
                self.calm_ms.to_string(),
                "100 to 600000 milliseconds",
            );
        }
        if !(0.0..=100.0).contains(&self.pressure_psi_some_percent) {
            return bad(
                "pressure_psi_some_percent",
                self.pressure_psi_some_percent.to_string(),
                "0 to 100 (percent; 100: never)",
            );
        }
        if !(0.0..=100.0).contains(&self.pressure_idle_percent) {
            return bad(
                "pressure_idle_percent",
                self.pressure_idle_percent.to_string(),
                "0 to 100 (percent; 0: PSI alone)",
            );
        }
        if !self.pressure_psi_file.starts_with('/') {
            return bad(
                "pressure_psi_file",
                format!("{:?}", self.pressure_psi_file),
                "an absolute path to a PSI file (/proc/pressure/cpu or a cgroup2 cpu.pressure)",
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_pass_and_out_of_range_is_named() {
        assert!(ControlConfig::default().check().is_ok());
        let c = ControlConfig {
            quota_ceiling_percent: 50,
            ..Default::default()
        };
        let e = c.check().unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.value.as_str()),
            ("[control] quota_ceiling_percent", "50")
        );
        let e = e.to_string();
        assert!(
            e.contains("quota_ceiling_percent = 50") && e.contains("100 to 1000"),
            "{e}"
        );
        let c = ControlConfig {
            burst_ceiling_percent: 150,
            ..Default::default()
        };
        assert!(c
            .check()
            .unwrap_err()
            .to_string()
            .contains("burst_ceiling_percent = 150"));
        let c = ControlConfig {
            pressure_psi_file: "pressure/cpu".into(),
            ..Default::default()
        };
        let e = c.check().unwrap_err().to_string();
        assert!(
            e.contains("pressure_psi_file = \"pressure/cpu\"") && e.contains("absolute"),
            "{e}"
        );
    }

    #[test]
    fn the_first_name_of_the_psi_threshold_is_still_read() {
        let c: ControlConfig = toml::from_str("pressure_psi_some_avg10 = 80.0\n").unwrap();
        assert_eq!(c.pressure_psi_some_percent, 80.0);
    }
}
