//! The node guard's input: CPU pressure from `/proc/pressure/cpu` (PSI
//! `some avg10`) where the kernel has it, idle CPU from `/proc/stat`
//! otherwise. Read at most once a second (avg10 moves every 2 s).

use std::time::{Duration, Instant};

use super::policy::Pressure;

const PSI_CPU: &str = "/proc/pressure/cpu";
const PROC_STAT: &str = "/proc/stat";
const EVERY: Duration = Duration::from_secs(1);

/// `some avg10=…` of a PSI file.
pub fn parse_psi_some_avg10(text: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace()
        .find_map(|f| f.strip_prefix("avg10="))?
        .parse()
        .ok()
}

/// (idle + iowait, total) jiffies of the `cpu ` line of /proc/stat.
pub fn parse_stat_idle(text: &str) -> Option<(u64, u64)> {
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

pub struct NodeSignal {
    last: Option<Instant>,
    pressure: Pressure,
    idle_prev: Option<(u64, u64)>,
}

impl NodeSignal {
    pub fn new() -> NodeSignal {
        NodeSignal {
            last: None,
            pressure: Pressure::default(),
            idle_prev: None,
        }
    }

    pub fn read(&mut self) -> Pressure {
        if self.last.is_some_and(|t| t.elapsed() < EVERY) {
            return self.pressure;
        }
        self.last = Some(Instant::now());
        let psi = std::fs::read_to_string(PSI_CPU)
            .ok()
            .and_then(|t| parse_psi_some_avg10(&t));
        let idle = match psi {
            Some(_) => None,
            None => std::fs::read_to_string(PROC_STAT)
                .ok()
                .and_then(|t| parse_stat_idle(&t))
                .and_then(|now| {
                    let prev = self.idle_prev.replace(now)?;
                    let total = now.1.saturating_sub(prev.1);
                    (total > 0).then(|| now.0.saturating_sub(prev.0) as f64 * 100.0 / total as f64)
                }),
        };
        self.pressure = Pressure {
            psi_some_avg10: psi,
            idle_percent: idle,
        };
        self.pressure
    }
}

impl Default for NodeSignal {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psi_and_stat_parse() {
        let psi = "some avg10=12.50 avg60=3.00 avg300=0.50 total=123\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
        assert_eq!(parse_psi_some_avg10(psi), Some(12.5));
        assert_eq!(parse_psi_some_avg10("full avg10=1.00\n"), None);
        let stat = "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4\n";
        assert_eq!(parse_stat_idle(stat), Some((850, 1000)));
    }

    #[test]
    fn this_machine_has_a_reading() {
        let mut n = NodeSignal::new();
        let p = n.read();
        // This kernel has PSI; without it the first idle reading needs a second sample.
        if std::path::Path::new(PSI_CPU).exists() {
            let v = p.psi_some_avg10.expect("PSI readable");
            assert!((0.0..=100.0).contains(&v));
        } else {
            assert_eq!(p.psi_some_avg10, None);
        }
    }
}
