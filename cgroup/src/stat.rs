//! `cpu.stat` / `cpu.stat.local`, normalised to nanoseconds.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::files::stat_keys as k;
use crate::hierarchy::CgroupMode;
use crate::parse;
use crate::Result;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuStat {
    pub nr_periods: u64,
    pub nr_throttled: u64,
    pub throttled_ns: u64,
    pub nr_bursts: u64,
    pub burst_ns: u64,
}

impl CpuStat {
    /// Parse the content of `cpu.stat` (or `cpu.stat.local`) of a cgroup of `mode`.
    pub fn parse(content: &str, mode: CgroupMode) -> CpuStat {
        let m = parse::flat_keyed_str(content);
        let g = |key: &str| m.get(key).copied().unwrap_or(0);
        match mode {
            CgroupMode::V1 => CpuStat {
                nr_periods: g(k::NR_PERIODS),
                nr_throttled: g(k::NR_THROTTLED),
                throttled_ns: g(k::V1_THROTTLED_TIME),
                nr_bursts: g(k::NR_BURSTS),
                burst_ns: g(k::V1_BURST_TIME),
            },
            CgroupMode::V2 => CpuStat {
                nr_periods: g(k::NR_PERIODS),
                nr_throttled: g(k::NR_THROTTLED),
                throttled_ns: g(k::V2_THROTTLED_USEC) * 1000,
                nr_bursts: g(k::NR_BURSTS),
                burst_ns: g(k::V2_BURST_USEC) * 1000,
            },
        }
    }

    pub fn read(path: &Path, mode: CgroupMode) -> Result<CpuStat> {
        Ok(Self::parse(&parse::read_string(path)?, mode))
    }

    /// Counter deltas since `earlier` (saturating: counters never go back,
    /// but a re-created cgroup must not produce huge numbers).
    pub fn since(&self, earlier: &CpuStat) -> CpuStat {
        CpuStat {
            nr_periods: self.nr_periods.saturating_sub(earlier.nr_periods),
            nr_throttled: self.nr_throttled.saturating_sub(earlier.nr_throttled),
            throttled_ns: self.throttled_ns.saturating_sub(earlier.throttled_ns),
            nr_bursts: self.nr_bursts.saturating_sub(earlier.nr_bursts),
            burst_ns: self.burst_ns.saturating_sub(earlier.burst_ns),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_is_nanoseconds() {
        let s = CpuStat::parse(
            "nr_periods 10\nnr_throttled 4\nthrottled_time 123456789\nnr_bursts 2\nburst_time 5000\n",
            CgroupMode::V1,
        );
        assert_eq!(
            s,
            CpuStat {
                nr_periods: 10,
                nr_throttled: 4,
                throttled_ns: 123_456_789,
                nr_bursts: 2,
                burst_ns: 5000
            }
        );
    }

    #[test]
    fn v2_is_microseconds() {
        let s = CpuStat::parse(
            "usage_usec 100\nuser_usec 50\nsystem_usec 50\nnr_periods 7\nnr_throttled 3\nthrottled_usec 2500\nnr_bursts 1\nburst_usec 40\n",
            CgroupMode::V2,
        );
        assert_eq!(s.throttled_ns, 2_500_000);
        assert_eq!(s.burst_ns, 40_000);
        assert_eq!(s.nr_periods, 7);
    }

    #[test]
    fn local_file_has_only_throttled_time() {
        let s = CpuStat::parse("throttled_time 999\n", CgroupMode::V1);
        assert_eq!(s.throttled_ns, 999);
        assert_eq!(s.nr_periods, 0);
    }

    #[test]
    fn delta_saturates() {
        let a = CpuStat {
            nr_periods: 5,
            throttled_ns: 100,
            ..Default::default()
        };
        let b = CpuStat {
            nr_periods: 8,
            throttled_ns: 50,
            ..Default::default()
        };
        let d = b.since(&a);
        assert_eq!(d.nr_periods, 3);
        assert_eq!(d.throttled_ns, 0);
    }
}
