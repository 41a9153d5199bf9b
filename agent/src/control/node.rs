//! The node guard's input, read at most every [`EVERY`] and measured over
//! the time since the previous reading (not a 10-second average):
//! - PSI `some`: the share of the window in which some task waited for CPU,
//!   from the `total=` stall counter (µs) of `/proc/pressure/cpu` or of the
//!   configured file (a cgroup2 group's `cpu.pressure`). `avg10` lags: a
//!   neighbour that starts spinning takes ~9 s to lift it from 0 to 60 %,
//!   while the counter's delta shows it in the next window.
//! - Idle CPU of the node (idle + iowait jiffies of `/proc/stat`) over the
//!   same window. A throttled task counts as waiting in PSI, so a container
//!   held at its quota makes the node's `some` high by itself while CPUs
//!   idle; the guard wants both (see `Pressure::is_high`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::policy::Pressure;

const PROC_STAT: &str = "/proc/stat";
pub(crate) const EVERY: Duration = Duration::from_millis(500);

/// `some … total=…` of a PSI file: the cumulative stall, µs.
pub(crate) fn parse_psi_some_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace()
        .find_map(|f| f.strip_prefix("total="))?
        .parse()
        .ok()
}

/// (idle + iowait, total) jiffies of the `cpu ` line of /proc/stat.
pub(crate) fn parse_stat_idle(text: &str) -> Option<(u64, u64)> {
    let v: Vec<u64> = text
        .lines()
        .next()?
        .strip_prefix("cpu ")?
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // user nice system idle iowait irq softirq steal (guest is in user).
    let total = v.iter().take(8).sum();
    Some((v.get(3)? + v.get(4).copied().unwrap_or(0), total))
}

/// The share of `wall` that `stall` covers, percent, at most 100.
pub(crate) fn share_percent(stall_us: u64, wall: Duration) -> Option<f64> {
    let wall_us = wall.as_micros() as f64;
    (wall_us > 0.0).then(|| (stall_us as f64 * 100.0 / wall_us).min(100.0))
}

pub(crate) struct NodeSignal {
    psi_file: PathBuf,
    last: Option<Instant>,
    pressure: Pressure,
    psi_prev: Option<(Instant, u64)>,
    idle_prev: Option<(u64, u64)>,
}

impl NodeSignal {
    pub(crate) fn new(psi_file: impl Into<PathBuf>) -> NodeSignal {
        NodeSignal {
            psi_file: psi_file.into(),
            last: None,
            pressure: Pressure::default(),
            psi_prev: None,
            idle_prev: None,
        }
    }

    pub(crate) fn read(&mut self) -> Pressure {
        if self.last.is_some_and(|t| t.elapsed() < EVERY) {
            return self.pressure;
        }
        let at = Instant::now();
        self.last = Some(at);
        let psi = std::fs::read_to_string(&self.psi_file)
            .ok()
            .and_then(|t| parse_psi_some_total(&t))
            .and_then(|total| {
                let (t0, prev) = self.psi_prev.replace((at, total))?;
                share_percent(total.saturating_sub(prev), at - t0)
            });
        let idle = std::fs::read_to_string(PROC_STAT)
            .ok()
            .and_then(|t| parse_stat_idle(&t))
            .and_then(|now| {
                let prev = self.idle_prev.replace(now)?;
                let total = now.1.saturating_sub(prev.1);
                (total > 0).then(|| now.0.saturating_sub(prev.0) as f64 * 100.0 / total as f64)
            });
        self.pressure = Pressure {
            psi_some_percent: psi,
            idle_percent: idle,
        };
        self.pressure
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psi_and_stat_parse() {
        let psi = "some avg10=12.50 avg60=3.00 avg300=0.50 total=123\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
        assert_eq!(parse_psi_some_total(psi), Some(123));
        assert_eq!(parse_psi_some_total("full avg10=1.00 total=5\n"), None);
        let stat = "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4\n";
        assert_eq!(parse_stat_idle(stat), Some((850, 1000)));
        assert_eq!(
            share_percent(250_000, Duration::from_millis(500)),
            Some(50.0)
        );
        // Counter and clock read a moment apart: never past 100 %.
        assert_eq!(
            share_percent(600_000, Duration::from_millis(500)),
            Some(100.0)
        );
        assert_eq!(share_percent(1, Duration::ZERO), None);
    }

    #[test]
    fn this_machine_has_a_reading_over_one_window() {
        let mut n = NodeSignal::new("/proc/pressure/cpu");
        let p0 = n.read();
        assert_eq!(p0.psi_some_percent, None, "the first reading is the base");
        std::thread::sleep(EVERY);
        let p = n.read();
        let i = p.idle_percent.expect("/proc/stat readable");
        assert!((0.0..=100.0).contains(&i), "{i}");
        if std::path::Path::new("/proc/pressure/cpu").exists() {
            let v = p.psi_some_percent.expect("PSI readable");
            assert!((0.0..=100.0).contains(&v), "{v}");
        } else {
            assert_eq!(p.psi_some_percent, None);
        }
        // Cached within a window.
        assert_eq!(n.read(), p);
    }
}
