//! The kernel's side of the comparison: which `cpu.stat` counter a
//! session's probe total is compared with, and its baseline; the kernel's
//! final counters of a removed group; its OOM kills.

use throttlewatch_cgroup::{CpuCgroup, CpuStat};

use crate::spec::Baseline;

/// Which kernel counter the episode total is compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KernelSource {
    /// The group holds the quota itself: `cpu.stat` throttled time.
    CpuStat,
    /// The throttling comes from an ancestor: `cpu.stat.local`.
    CpuStatLocal,
    /// Kernels before `cpu.stat.local` (Linux 6.8): the throttling
    /// ancestor's own `cpu.stat` (exact when the group is its only busy child).
    Ancestor,
}

impl KernelSource {
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            KernelSource::CpuStat => "cpu.stat",
            KernelSource::CpuStatLocal => "cpu.stat.local",
            KernelSource::Ancestor => "ancestor cpu.stat",
        }
    }
}

/// One read of a cgroup's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct CgroupReading {
    /// None when `cpu.stat` could not be read (the cgroup is going away).
    pub stat: Option<CpuStat>,
    pub local: Option<CpuStat>,
}

impl CgroupReading {
    pub(crate) fn read(g: &CpuCgroup) -> CgroupReading {
        CgroupReading {
            stat: g.cpu_stat().ok(),
            local: g.cpu_stat_local().ok().flatten(),
        }
    }

    /// The group's `cpu.stat` as the kernel's own struct held it when its
    /// last task exited (the probe keeps it): for a cgroup already removed.
    pub(crate) fn at_exit(b: throttlewatch_bpf::ExitBandwidth) -> CgroupReading {
        CgroupReading {
            stat: Some(CpuStat {
                nr_periods: b.nr_periods,
                nr_throttled: b.nr_throttled,
                throttled_ns: b.throttled_ns,
                nr_bursts: b.nr_bursts,
                burst_ns: b.burst_ns,
            }),
            local: None,
        }
    }
}

/// The counters a session's totals are compared with, from its start.
#[derive(Debug, Clone)]
pub(crate) struct KernelCounters {
    source: KernelSource,
    base: CpuStat,
    base_local: Option<CpuStat>,
    /// With KernelSource::Ancestor: the ancestor holding the quota and its
    /// counters when watching began.
    ancestor: Option<(CpuCgroup, CpuStat)>,
}

impl KernelCounters {
    /// `own_quota`: the group has a quota of its own. `now`: read just
    /// before; `resume`: the baseline of a log that continues.
    pub(crate) fn open(
        g: &CpuCgroup,
        own_quota: bool,
        now: &CgroupReading,
        resume: Option<&Baseline>,
    ) -> KernelCounters {
        let ancestor = if !own_quota && now.local.is_none() {
            quota_ancestor(g).map(|a| {
                let s = a.cpu_stat().unwrap_or_default();
                (a, s)
            })
        } else {
            None
        };
        let source = match (own_quota, &ancestor) {
            (true, _) => KernelSource::CpuStat,
            (false, Some(_)) => KernelSource::Ancestor,
            (false, None) => KernelSource::CpuStatLocal,
        };
        let (base, base_local) = match resume {
            Some(b) => (b.stat, b.local),
            None => (now.stat.unwrap_or_default(), now.local),
        };
        KernelCounters {
            source,
            base,
            base_local,
            ancestor,
        }
    }

    /// The kernel's throttled time since the start.
    pub(crate) fn throttled_ns(&self, now: &CgroupReading) -> u64 {
        match (self.source, now.local, self.base_local) {
            (KernelSource::CpuStatLocal, Some(l), Some(b)) => l.since(&b).throttled_ns,
            (KernelSource::Ancestor, _, _) => {
                let (a, base) = self.ancestor.as_ref().expect("Ancestor has one");
                a.cpu_stat().unwrap_or(*base).since(base).throttled_ns
            }
            _ => now.stat.unwrap_or(self.base).since(&self.base).throttled_ns,
        }
    }

    /// The group's own throttled time since the start (an ancestor's quota
    /// aside): what passed unwatched when a log resumes.
    pub(crate) fn own_throttled_ns(&self, now: &CgroupReading) -> u64 {
        match (self.source, now.local, self.base_local) {
            (KernelSource::CpuStatLocal, Some(l), Some(b)) => l.since(&b).throttled_ns,
            _ => now.stat.unwrap_or_default().since(&self.base).throttled_ns,
        }
    }

    /// The `cpu.stat` deltas since the start (periods, bursts).
    pub(crate) fn delta(&self, now: &CgroupReading) -> CpuStat {
        now.stat.unwrap_or(self.base).since(&self.base)
    }

    /// The source as reported: `cpu.stat.local` only where it was there at the start.
    pub(crate) fn source(&self) -> KernelSource {
        if self.source == KernelSource::CpuStatLocal && self.base_local.is_none() {
            KernelSource::CpuStat
        } else {
            self.source
        }
    }

    /// Whether the group holds its own quota (the fentry view sees it).
    pub(crate) fn own_quota(&self) -> bool {
        self.source == KernelSource::CpuStat
    }

    pub(crate) fn base(&self) -> (CpuStat, Option<CpuStat>) {
        (self.base, self.base_local)
    }
}

/// The nearest ancestor that holds a quota (walking up the cpu hierarchy).
fn quota_ancestor(g: &CpuCgroup) -> Option<CpuCgroup> {
    let mut dir = g.cpu_dir.clone();
    let mut rel = g.rel.clone();
    while dir.pop() {
        rel = rel.rsplit_once('/').map(|(p, _)| p.to_string())?;
        let a = CpuCgroup {
            mode: g.mode,
            rel: rel.clone(),
            cpu_dir: dir.clone(),
            cpuset_dir: None,
            extra_dirs: vec![],
        };
        match a.bandwidth() {
            Ok(l) if l.quota_us.is_some() => return Some(a),
            Ok(_) => continue,
            Err(_) => return None,
        }
    }
    None
}

/// OOM kills in a container's memory cgroup, from the kernel's own count.
#[derive(Debug, Clone)]
pub(crate) struct OomKills {
    dir: std::path::PathBuf,
    mode: throttlewatch_cgroup::CgroupMode,
    at_start: u64,
    latest: u64,
}

impl OomKills {
    /// The memory cgroup of the container's init process, where it has one.
    pub(crate) fn of(pid: Option<u32>) -> Option<OomKills> {
        let (dir, mode) = throttlewatch_cgroup::memory_dir_of(pid?)?;
        let n = throttlewatch_cgroup::oom_kills(&dir, mode)?;
        Some(OomKills {
            dir,
            mode,
            at_start: n,
            latest: n,
        })
    }

    /// Re-read the count while the cgroup is there.
    pub(crate) fn refresh(&mut self) {
        if let Some(n) = throttlewatch_cgroup::oom_kills(&self.dir, self.mode) {
            self.latest = n;
        }
    }

    /// Kills since watching began: now, else as last read.
    pub(crate) fn since_start(&self) -> u64 {
        throttlewatch_cgroup::oom_kills(&self.dir, self.mode)
            .unwrap_or(self.latest)
            .saturating_sub(self.at_start)
    }
}
