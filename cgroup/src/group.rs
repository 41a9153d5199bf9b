//! One cgroup, seen through the controllers throttlewatch reads and writes.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{io_err, CgroupError, Result};
use crate::file_error::FileError;
use crate::files::*;
use crate::hierarchy::{join_rel, statfs_magic, CgroupMode, Hierarchies};
use crate::parse;
use crate::stat::CpuStat;

/// CPU limits as the kernel holds them, in microseconds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuLimits {
    /// None: no quota ("max" / -1).
    pub quota_us: Option<u64>,
    pub period_us: u64,
    /// None: the kernel has no burst file (older kernels).
    pub burst_us: Option<u64>,
    pub cpus: Option<String>,
    pub mems: Option<String>,
}

#[derive(Debug, Clone)]
pub struct CpuCgroup {
    pub mode: CgroupMode,
    /// Path relative to the hierarchy root, e.g. `/docker/abc`.
    pub rel: String,
    pub cpu_dir: PathBuf,
    pub cpuset_dir: Option<PathBuf>,
    /// Further v1 hierarchies the group exists in (cpuacct).
    pub extra_dirs: Vec<PathBuf>,
}

impl CpuCgroup {
    /// Open an existing cgroup. The cpu directory must exist and lie on cgroupfs.
    pub fn open(h: &Hierarchies, rel: &str) -> Result<CpuCgroup> {
        let g = Self::at(h, rel);
        if !g.cpu_dir.is_dir() {
            return Err(CgroupError::Missing(g.cpu_dir));
        }
        let magic = statfs_magic(&g.cpu_dir)?;
        if magic != CGROUP_SUPER_MAGIC && magic != CGROUP2_SUPER_MAGIC {
            return Err(CgroupError::Invalid(format!(
                "{} is not on cgroupfs",
                g.cpu_dir.display()
            )));
        }
        Ok(g)
    }

    /// The handle for `rel` without checking that it exists.
    pub fn at(h: &Hierarchies, rel: &str) -> CpuCgroup {
        let rel = normalise(rel);
        CpuCgroup {
            mode: h.mode,
            cpu_dir: h.cpu_dir(&rel),
            cpuset_dir: h.cpuset_dir(&rel),
            extra_dirs: h.extra_v1.iter().map(|r| join_rel(r, &rel)).collect(),
            rel,
        }
    }

    /// The cgroup id as the kernel's BPF helpers and `kn->id` see it: the
    /// inode number of the cpu-controller directory.
    pub fn id(&self) -> Result<u64> {
        Ok(std::fs::metadata(&self.cpu_dir)
            .map_err(io_err(&self.cpu_dir))?
            .ino())
    }

    pub fn parent(&self, h: &Hierarchies) -> Option<CpuCgroup> {
        let rel = self.rel.rsplit_once('/').map(|(p, _)| p)?;
        Some(CpuCgroup::at(h, if rel.is_empty() { "/" } else { rel }))
    }

    /// The ancestors below the hierarchy's root that have a CFS quota,
    /// nearest first, with their limits (cpu controller only).
    pub fn limited_ancestors(&self) -> Vec<(CpuCgroup, CpuLimits)> {
        let mut out = Vec::new();
        let mut rel = self.rel.as_str();
        let mut dir = self.cpu_dir.as_path();
        while let (Some((up, _)), Some(d)) = (rel.rsplit_once('/'), dir.parent()) {
            if up.is_empty() {
                break;
            }
            (rel, dir) = (up, d);
            let g = CpuCgroup {
                mode: self.mode,
                rel: rel.to_string(),
                cpu_dir: dir.to_path_buf(),
                cpuset_dir: None,
                extra_dirs: Vec::new(),
            };
            if let Ok(l) = g.bandwidth() {
                if l.quota_us.is_some() {
                    out.push((g, l));
                }
            }
        }
        out
    }

    fn cpu_file(&self, name: &str) -> PathBuf {
        self.cpu_dir.join(name)
    }

    fn cpuset_file(&self, name: &str) -> Option<PathBuf> {
        self.cpuset_dir.as_ref().map(|d| d.join(name))
    }

    pub fn cpu_stat(&self) -> Result<CpuStat> {
        CpuStat::read(&self.cpu_file(CPU_STAT), self.mode)
    }

    /// CPU time the kernel charged the group, ns, and where it was read:
    /// `cpuacct.usage` where a v1 cpuacct hierarchy holds the group (hybrid
    /// hosts), else cgroup v2's `cpu.stat` `usage_usec`.
    pub fn usage_ns(&self) -> Result<(u64, &'static str)> {
        let v1 = self
            .extra_dirs
            .iter()
            .chain(std::iter::once(&self.cpu_dir))
            .map(|d| d.join("cpuacct.usage"))
            .find(|p| p.exists());
        if let Some(p) = v1 {
            let v = std::fs::read_to_string(&p).map_err(io_err(&p))?;
            let ns = v
                .trim()
                .parse()
                .map_err(|_| FileError::parse(p, "cpuacct.usage", v.as_str()))?;
            return Ok((ns, "cpuacct.usage"));
        }
        let p = self.cpu_file(CPU_STAT);
        let stat = std::fs::read_to_string(&p).map_err(io_err(&p))?;
        let us: u64 = stat
            .lines()
            .find_map(|l| l.strip_prefix("usage_usec ")?.trim().parse().ok())
            .ok_or_else(|| FileError::parse(p, "usage_usec", stat.as_str()))?;
        Ok((us * 1000, "cpu.stat usage_usec"))
    }

    /// `cpu.stat.local`: None where the kernel does not have it.
    pub fn cpu_stat_local(&self) -> Result<Option<CpuStat>> {
        let p = self.cpu_file(CPU_STAT_LOCAL);
        if !p.exists() {
            return Ok(None);
        }
        CpuStat::read(&p, self.mode).map(Some)
    }

    /// [`CpuCgroup::bandwidth`], and `cpus` and `mems` from the cpuset.
    pub fn limits(&self) -> Result<CpuLimits> {
        let mut l = self.bandwidth()?;
        self.read_cpuset(&mut l);
        Ok(l)
    }

    /// Quota, period and burst: the cpu controller's files only, `cpus` and
    /// `mems` left None (unread). What the start path needs before the
    /// container runs; the cpuset is for the log's `start` record, later
    /// ([`CpuCgroup::read_cpuset`]).
    pub fn bandwidth(&self) -> Result<CpuLimits> {
        let (quota_us, period_us, burst_us) = match self.mode {
            CgroupMode::V1 => {
                let q = parse::single_i64(&self.cpu_file(V1_CFS_QUOTA_US))?;
                let p = parse::single_i64(&self.cpu_file(V1_CFS_PERIOD_US))?;
                let b = parse::single_i64(&self.cpu_file(V1_CFS_BURST_US)).ok();
                (
                    (q >= 0).then_some(q as u64),
                    p.max(0) as u64,
                    b.map(|b| b.max(0) as u64),
                )
            }
            CgroupMode::V2 => {
                let path = self.cpu_file(V2_CPU_MAX);
                let s = parse::read_string(&path)?;
                let (q, p) = parse::cpu_max_str(&s)
                    .ok_or_else(|| FileError::parse(path, "\"$MAX $PERIOD\"", s.trim()))?;
                let b = parse::single_i64(&self.cpu_file(V2_CPU_MAX_BURST)).ok();
                (q, p, b.map(|b| b.max(0) as u64))
            }
        };
        Ok(CpuLimits {
            quota_us,
            period_us,
            burst_us,
            cpus: None,
            mems: None,
        })
    }

    /// `l.cpus` and `l.mems` from the cpuset's files (None where unreadable).
    pub fn read_cpuset(&self, l: &mut CpuLimits) {
        let read_opt = |name| {
            self.cpuset_file(name)
                .and_then(|p| std::fs::read_to_string(p).ok())
                .map(|s| s.trim().to_string())
        };
        l.cpus = read_opt(CPUSET_CPUS);
        l.mems = read_opt(CPUSET_MEMS);
    }

    /// Set quota and period (microseconds). `None` removes the quota.
    pub fn set_quota(&self, quota_us: Option<u64>, period_us: u64) -> Result<()> {
        match self.mode {
            CgroupMode::V1 => {
                // The period is written first so that a quota valid only for
                // the new period is accepted; a burst above the new quota
                // makes the kernel refuse it, so burst is cleared first.
                let _ = parse::write(&self.cpu_file(V1_CFS_BURST_US), "0");
                parse::write(&self.cpu_file(V1_CFS_PERIOD_US), &period_us.to_string())?;
                let q = quota_us.map(|q| q as i64).unwrap_or(-1);
                parse::write(&self.cpu_file(V1_CFS_QUOTA_US), &q.to_string())
            }
            CgroupMode::V2 => {
                let _ = parse::write(&self.cpu_file(V2_CPU_MAX_BURST), "0");
                let q = quota_us
                    .map(|q| q.to_string())
                    .unwrap_or_else(|| "max".into());
                parse::write(&self.cpu_file(V2_CPU_MAX), &format!("{q} {period_us}"))
            }
        }
    }

    /// Set the quota alone, the period and the burst left as they are (the
    /// kernel refuses a quota below the burst), as kubelet writes a pod's.
    pub fn set_quota_only(&self, quota_us: u64, period_us: u64) -> Result<()> {
        match self.mode {
            CgroupMode::V1 => parse::write(&self.cpu_file(V1_CFS_QUOTA_US), &quota_us.to_string()),
            CgroupMode::V2 => parse::write(
                &self.cpu_file(V2_CPU_MAX),
                &format!("{quota_us} {period_us}"),
            ),
        }
    }

    /// Set the CFS burst (microseconds). The kernel refuses a burst above the quota.
    pub fn set_burst(&self, burst_us: u64) -> Result<()> {
        let name = match self.mode {
            CgroupMode::V1 => V1_CFS_BURST_US,
            CgroupMode::V2 => V2_CPU_MAX_BURST,
        };
        parse::write(&self.cpu_file(name), &burst_us.to_string())
    }

    pub fn burst_file(&self) -> PathBuf {
        self.cpu_file(match self.mode {
            CgroupMode::V1 => V1_CFS_BURST_US,
            CgroupMode::V2 => V2_CPU_MAX_BURST,
        })
    }

    /// Write cpuset.cpus and/or cpuset.mems (mems first is not required; cpus first is).
    pub fn set_cpuset(&self, cpus: Option<&str>, mems: Option<&str>) -> Result<()> {
        let dir = self
            .cpuset_dir
            .as_ref()
            .ok_or(CgroupError::NoController("cpuset"))?;
        if let Some(c) = cpus {
            parse::write(&dir.join(CPUSET_CPUS), c)?;
        }
        if let Some(m) = mems {
            parse::write(&dir.join(CPUSET_MEMS), m)?;
        }
        Ok(())
    }

    /// The CPUs the group may use: `cpuset.cpus.effective` where it exists
    /// (v2, and v1 on recent kernels), otherwise `cpuset.cpus`.
    pub fn effective_cpus(&self) -> Option<String> {
        let dir = self.cpuset_dir.as_ref()?;
        [CPUSET_CPUS_EFFECTIVE, CPUSET_CPUS]
            .iter()
            .find_map(|f| {
                std::fs::read_to_string(dir.join(f))
                    .ok()
                    .map(|s| s.trim().to_string())
            })
            .filter(|s| !s.is_empty())
    }

    pub fn effective_mems(&self) -> Option<String> {
        let dir = self.cpuset_dir.as_ref()?;
        [CPUSET_MEMS_EFFECTIVE, CPUSET_MEMS]
            .iter()
            .find_map(|f| {
                std::fs::read_to_string(dir.join(f))
                    .ok()
                    .map(|s| s.trim().to_string())
            })
            .filter(|s| !s.is_empty())
    }

    /// Move a process into the group in every hierarchy it exists in.
    pub fn add_pid(&self, pid: u32) -> Result<()> {
        let mut dirs = vec![self.cpu_dir.clone()];
        dirs.extend(
            self.cpuset_dir
                .iter()
                .filter(|d| **d != self.cpu_dir)
                .cloned(),
        );
        dirs.extend(self.extra_dirs.iter().cloned());
        for d in dirs {
            parse::write(&d.join(CGROUP_PROCS), &pid.to_string())?;
        }
        Ok(())
    }

    pub fn pids(&self) -> Result<Vec<u32>> {
        let p = self.cpu_file(CGROUP_PROCS);
        Ok(parse::read_string(&p)?
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect())
    }

    pub fn exists(&self) -> bool {
        self.cpu_dir.is_dir()
    }
}

fn normalise(rel: &str) -> String {
    let parts: Vec<&str> = rel
        .split('/')
        .filter(|c| !c.is_empty() && *c != "." && *c != "..")
        .collect();
    format!("/{}", parts.join("/"))
}

/// Read the cpuset files of `dir`'s parent into `dir` (v1 creates children with
/// empty cpuset.cpus/mems, which refuses tasks).
pub fn inherit_v1_cpuset(dir: &Path) -> Result<()> {
    let parent = dir
        .parent()
        .ok_or_else(|| CgroupError::Invalid(format!("{} has no parent", dir.display())))?;
    for f in [CPUSET_CPUS, CPUSET_MEMS] {
        let cur = parse::read_string(&dir.join(f))?;
        if cur.trim().is_empty() {
            let v = parse::read_string(&parent.join(f))?;
            parse::write(&dir.join(f), v.trim())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(mode: CgroupMode) -> (tempfile::TempDir, Hierarchies) {
        let d = tempfile::tempdir().unwrap();
        let h = Hierarchies {
            mode,
            cpu: d.path().join("cpu"),
            cpuset: Some(d.path().join("cpuset")),
            extra_v1: vec![],
        };
        (d, h)
    }

    #[test]
    fn v1_limits_from_files() {
        let (_d, h) = fake(CgroupMode::V1);
        let g = CpuCgroup::at(&h, "/../pod/./c1/");
        assert_eq!(g.rel, "/pod/c1");
        std::fs::create_dir_all(&g.cpu_dir).unwrap();
        std::fs::create_dir_all(g.cpuset_dir.as_ref().unwrap()).unwrap();
        std::fs::write(g.cpu_dir.join(V1_CFS_QUOTA_US), "50000\n").unwrap();
        std::fs::write(g.cpu_dir.join(V1_CFS_PERIOD_US), "100000\n").unwrap();
        std::fs::write(g.cpu_dir.join(V1_CFS_BURST_US), "20000\n").unwrap();
        std::fs::write(g.cpuset_dir.as_ref().unwrap().join(CPUSET_CPUS), "0-1\n").unwrap();
        let l = g.limits().unwrap();
        assert_eq!(l.quota_us, Some(50_000));
        assert_eq!(l.period_us, 100_000);
        assert_eq!(l.burst_us, Some(20_000));
        assert_eq!(l.cpus.as_deref(), Some("0-1"));
        assert_eq!(l.mems, None);
        // The bandwidth alone: the same numbers, the cpuset unread until asked.
        let mut b = g.bandwidth().unwrap();
        assert_eq!(
            (b.quota_us, b.period_us, b.burst_us, b.cpus.as_deref()),
            (Some(50_000), 100_000, Some(20_000), None)
        );
        g.read_cpuset(&mut b);
        assert_eq!(b, l);
    }

    #[test]
    fn v2_unlimited_and_write() {
        let (_d, h) = fake(CgroupMode::V2);
        let g = CpuCgroup::at(&h, "x");
        std::fs::create_dir_all(&g.cpu_dir).unwrap();
        std::fs::write(g.cpu_dir.join(V2_CPU_MAX), "max 100000\n").unwrap();
        assert_eq!(g.limits().unwrap().quota_us, None);
        g.set_quota(Some(20_000), 50_000).unwrap();
        assert_eq!(
            std::fs::read_to_string(g.cpu_dir.join(V2_CPU_MAX)).unwrap(),
            "20000 50000"
        );
        let l = g.limits().unwrap();
        assert_eq!(
            (l.quota_us, l.period_us, l.burst_us),
            (Some(20_000), 50_000, Some(0))
        );
    }

    #[test]
    fn parent_of_nested() {
        let (_d, h) = fake(CgroupMode::V1);
        let g = CpuCgroup::at(&h, "/a/b");
        assert_eq!(g.parent(&h).unwrap().rel, "/a");
        assert_eq!(g.parent(&h).unwrap().parent(&h).unwrap().rel, "/");
    }
}
