//! The kernel's cgroup file names, named once.

/// v1 `cpu` controller.
pub const V1_CFS_QUOTA_US: &str = "cpu.cfs_quota_us";
pub const V1_CFS_PERIOD_US: &str = "cpu.cfs_period_us";
pub const V1_CFS_BURST_US: &str = "cpu.cfs_burst_us";
/// v2 `cpu` controller: "$MAX $PERIOD" with MAX "max" for unlimited.
pub const V2_CPU_MAX: &str = "cpu.max";
pub const V2_CPU_MAX_BURST: &str = "cpu.max.burst";
/// Both versions: flat keyed; v1 in nanoseconds, v2 in microseconds.
pub const CPU_STAT: &str = "cpu.stat";
/// Both versions (5.x+ kernels): the time this group itself was throttled,
/// whichever ancestor held the quota.
pub const CPU_STAT_LOCAL: &str = "cpu.stat.local";

pub const CPUSET_CPUS: &str = "cpuset.cpus";
pub const CPUSET_MEMS: &str = "cpuset.mems";
pub const CPUSET_CPUS_EFFECTIVE: &str = "cpuset.cpus.effective";
pub const CPUSET_MEMS_EFFECTIVE: &str = "cpuset.mems.effective";

pub const CGROUP_PROCS: &str = "cgroup.procs";
pub const CGROUP_CONTROLLERS: &str = "cgroup.controllers";
pub const CGROUP_SUBTREE_CONTROL: &str = "cgroup.subtree_control";

/// `cpu.stat` keys.
pub mod stat_keys {
    pub const NR_PERIODS: &str = "nr_periods";
    pub const NR_THROTTLED: &str = "nr_throttled";
    pub const V1_THROTTLED_TIME: &str = "throttled_time";
    pub const V2_THROTTLED_USEC: &str = "throttled_usec";
    pub const NR_BURSTS: &str = "nr_bursts";
    pub const V1_BURST_TIME: &str = "burst_time";
    pub const V2_BURST_USEC: &str = "burst_usec";
}

/// statfs magic numbers (linux/magic.h).
pub const CGROUP_SUPER_MAGIC: i64 = 0x0027_e0eb;
pub const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
