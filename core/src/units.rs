//! Durations and CPU amounts as users write them.

use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: invalid value {value:?}: {accepted}")]
pub struct UnitError {
    pub field: String,
    pub value: String,
    pub accepted: &'static str,
}

pub const DURATION_ACCEPTED: &str =
    "expected a non-negative duration such as 500us, 20ms, 1.5s, 2m (units: ns, us, ms, s, m, h; a bare number is microseconds)";

/// Parse "20ms", "1.5s", "500us", "250000ns", "2m", "1h"; a bare integer is
/// microseconds (the unit of the kernel's cgroup files).
pub fn parse_duration(field: &str, s: &str) -> Result<Duration, UnitError> {
    let err = || UnitError {
        field: field.into(),
        value: s.into(),
        accepted: DURATION_ACCEPTED,
    };
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() || num.starts_with('.') && num.len() == 1 {
        return Err(err());
    }
    let mult: f64 = match unit.trim() {
        "" | "us" | "µs" => 1e3,
        "ns" => 1.0,
        "ms" => 1e6,
        "s" => 1e9,
        "m" => 60e9,
        "h" => 3600e9,
        _ => return Err(err()),
    };
    let v: f64 = num.parse().map_err(|_| err())?;
    let ns = v * mult;
    if !ns.is_finite() || !(0.0..=1e18).contains(&ns) {
        return Err(err());
    }
    Ok(Duration::from_nanos(ns.round() as u64))
}

pub fn format_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns >= 1_000_000_000 {
        format!("{:.3}s", d.as_secs_f64())
    } else if ns >= 1_000_000 {
        format!("{:.3}ms", ns as f64 / 1e6)
    } else if ns >= 1_000 {
        format!("{:.1}us", ns as f64 / 1e3)
    } else {
        format!("{ns}ns")
    }
}

pub const CPUS_ACCEPTED: &str =
    "expected a positive number of CPUs such as 0.5, 2 or 16 (at most 1024)";

/// `--cpus 0.5`: CPUs worth of quota.
pub fn parse_cpus(field: &str, s: &str) -> Result<f64, UnitError> {
    let err = || UnitError {
        field: field.into(),
        value: s.into(),
        accepted: CPUS_ACCEPTED,
    };
    let v: f64 = s.trim().parse().map_err(|_| err())?;
    if !v.is_finite() || v <= 0.0 || v > 1024.0 {
        return Err(err());
    }
    Ok(v)
}

/// Quota in microseconds for `cpus` CPUs over `period_us`; the kernel's
/// minimum quota is 1 ms.
pub fn quota_for_cpus(cpus: f64, period_us: u64) -> u64 {
    ((cpus * period_us as f64).round() as u64).max(1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration("x", "20ms").unwrap(),
            Duration::from_millis(20)
        );
        assert_eq!(
            parse_duration("x", "1.5s").unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(
            parse_duration("x", "500us").unwrap(),
            Duration::from_micros(500)
        );
        assert_eq!(
            parse_duration("x", "250ns").unwrap(),
            Duration::from_nanos(250)
        );
        assert_eq!(
            parse_duration("x", "100000").unwrap(),
            Duration::from_millis(100)
        );
        assert_eq!(
            parse_duration("x", " 2m ").unwrap(),
            Duration::from_secs(120)
        );
        assert_eq!(parse_duration("x", "0").unwrap(), Duration::ZERO);
    }

    #[test]
    fn bad_durations_name_field_and_value() {
        for bad in [
            "",
            "ms",
            "-5ms",
            "5 parsecs",
            "1e400s",
            "abc",
            ".",
            "1.2.3s",
        ] {
            let e = parse_duration("--burst", bad).unwrap_err();
            assert_eq!(e.field, "--burst");
            assert!(
                e.to_string().contains("--burst") && e.to_string().contains("expected"),
                "{e}"
            );
        }
    }

    #[test]
    fn cpus() {
        assert_eq!(parse_cpus("--cpus", "0.5").unwrap(), 0.5);
        for bad in ["0", "-1", "nan", "inf", "2000", "two"] {
            assert!(parse_cpus("--cpus", bad).is_err(), "{bad}");
        }
        assert_eq!(quota_for_cpus(0.5, 100_000), 50_000);
        assert_eq!(quota_for_cpus(0.001, 100_000), 1000);
    }

    #[test]
    fn formatting() {
        assert_eq!(format_duration(Duration::from_micros(1500)), "1.500ms");
        assert_eq!(format_duration(Duration::from_nanos(999)), "999ns");
    }
}
