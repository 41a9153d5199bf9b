//! Where the cpu and cpuset controllers live, and in which cgroup version.
//!
//! The version is decided by filesystem magic (statfs), never from path names;
//! mount points come from `/proc/self/mountinfo`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{io_err, CgroupError, Result};
use crate::file_error::FileError;
use crate::files::{CGROUP2_SUPER_MAGIC, CGROUP_CONTROLLERS, CGROUP_SUPER_MAGIC};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupMode {
    V1,
    V2,
}

impl std::fmt::Display for CgroupMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CgroupMode::V1 => "v1",
            CgroupMode::V2 => "v2",
        })
    }
}

/// The mount points that throttlewatch uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchies {
    /// The version of the hierarchy that holds the cpu controller.
    pub mode: CgroupMode,
    /// Mount point of the hierarchy holding `cpu`.
    pub cpu: PathBuf,
    /// Mount point of the hierarchy holding `cpuset` (same as `cpu` on v2).
    pub cpuset: Option<PathBuf>,
    /// Other v1 hierarchies a transient group joins as well (cpuacct when
    /// separate), so a command is accounted like a container would be.
    pub extra_v1: Vec<PathBuf>,
}

#[derive(Debug, Clone)]
struct Mount {
    point: PathBuf,
    fstype: String,
    super_opts: Vec<String>,
}

fn parse_mountinfo(content: &str) -> Vec<Mount> {
    content
        .lines()
        .filter_map(|line| {
            // id parent maj:min root point opts [optional...] - fstype source superopts
            let (left, right) = line.split_once(" - ")?;
            let point = left.split(' ').nth(4)?;
            let mut r = right.split(' ');
            let fstype = r.next()?.to_string();
            let _source = r.next();
            let super_opts = r
                .next()
                .unwrap_or("")
                .split(',')
                .map(str::to_string)
                .collect();
            Some(Mount {
                point: PathBuf::from(unescape(point)),
                fstype,
                super_opts,
            })
        })
        .collect()
}

fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

pub fn statfs_magic(path: &Path) -> Result<i64> {
    let st = nix::sys::statfs::statfs(path).map_err(|e| FileError::io(path)(e.into()))?;
    Ok(st.filesystem_type().0 as i64)
}

/// Where a process's memory cgroup is: the v1 `memory` hierarchy's
/// directory, or its cgroup2 directory when the memory controller is there.
/// From the `/proc/<pid>/cgroup` and mountinfo texts.
pub fn memory_dir_from(proc_cgroup: &str, mountinfo: &str) -> Option<(PathBuf, CgroupMode)> {
    controller_dir_from(proc_cgroup, mountinfo, "memory")
}

/// Where a process's cgroup for `controller` (`memory`, `cpuacct`, `pids`…)
/// is: its v1 hierarchy's directory, or its cgroup2 directory when the
/// controller is there.
pub fn controller_dir_from(
    proc_cgroup: &str,
    mountinfo: &str,
    controller: &str,
) -> Option<(PathBuf, CgroupMode)> {
    let mounts = parse_mountinfo(mountinfo);
    for line in proc_cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (_, ctrls, rel) = (f.next()?, f.next()?, f.next()?);
        if ctrls.split(',').any(|c| c == controller) {
            let m = mounts
                .iter()
                .find(|m| m.fstype == "cgroup" && m.super_opts.iter().any(|o| o == controller))?;
            return Some((join_rel(&m.point, rel), CgroupMode::V1));
        }
    }
    // cgroup2: `0::/rel`, where the root lists the controller (cpuacct's
    // figures are in v2's always-present cpu.stat).
    let rel = proc_cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
    let m = mounts.iter().find(|m| m.fstype == "cgroup2")?;
    let ctrls = std::fs::read_to_string(m.point.join(CGROUP_CONTROLLERS)).unwrap_or_default();
    (controller == "cpuacct" || ctrls.split_whitespace().any(|c| c == controller))
        .then(|| (join_rel(&m.point, rel), CgroupMode::V2))
}

/// The memory cgroup of a running process (see [`memory_dir_from`]).
pub fn memory_dir_of(pid: u32) -> Option<(PathBuf, CgroupMode)> {
    let pc = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let mi = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    memory_dir_from(&pc, &mi)
}

/// The kernel's count of OOM kills in a memory cgroup: `oom_kill` in v1's
/// `memory.oom_control` or v2's `memory.events`. None when neither says.
pub fn oom_kills(dir: &Path, mode: CgroupMode) -> Option<u64> {
    let file = match mode {
        CgroupMode::V1 => "memory.oom_control",
        CgroupMode::V2 => "memory.events",
    };
    let text = std::fs::read_to_string(dir.join(file)).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|v| v.trim().parse().ok())
}

impl Hierarchies {
    /// Discover from the running system.
    pub fn discover() -> Result<Hierarchies> {
        let mi = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(io_err("/proc/self/mountinfo"))?;
        Self::from_mountinfo(&mi, |p| statfs_magic(p).ok())
    }

    /// Decide from a mountinfo text and a statfs oracle (tests pass a fake).
    pub fn from_mountinfo(
        mountinfo: &str,
        magic: impl Fn(&Path) -> Option<i64>,
    ) -> Result<Hierarchies> {
        let mounts = parse_mountinfo(mountinfo);
        let v1 = |ctrl: &str| {
            mounts
                .iter()
                .find(|m| m.fstype == "cgroup" && m.super_opts.iter().any(|o| o == ctrl))
                .filter(|m| magic(&m.point) == Some(CGROUP_SUPER_MAGIC))
                .map(|m| m.point.clone())
        };
        if let Some(cpu) = v1("cpu") {
            let cpuacct = v1("cpuacct").filter(|p| *p != cpu);
            return Ok(Hierarchies {
                mode: CgroupMode::V1,
                cpu,
                cpuset: v1("cpuset"),
                extra_v1: cpuacct.into_iter().collect(),
            });
        }
        for m in mounts.iter().filter(|m| m.fstype == "cgroup2") {
            if magic(&m.point) != Some(CGROUP2_SUPER_MAGIC) {
                continue;
            }
            let ctrls =
                std::fs::read_to_string(m.point.join(CGROUP_CONTROLLERS)).unwrap_or_default();
            if ctrls.split_whitespace().any(|c| c == "cpu") {
                let cpuset = ctrls
                    .split_whitespace()
                    .any(|c| c == "cpuset")
                    .then(|| m.point.clone());
                return Ok(Hierarchies {
                    mode: CgroupMode::V2,
                    cpu: m.point.clone(),
                    cpuset,
                    extra_v1: vec![],
                });
            }
        }
        Err(CgroupError::NoController("cpu"))
    }

    /// The cpu-controller directory of a cgroup path relative to the hierarchy root
    /// (as in `/proc/PID/cgroup` or an OCI `cgroupsPath`).
    pub fn cpu_dir(&self, rel: &str) -> PathBuf {
        join_rel(&self.cpu, rel)
    }

    pub fn cpuset_dir(&self, rel: &str) -> Option<PathBuf> {
        self.cpuset.as_ref().map(|r| join_rel(r, rel))
    }
}

/// Join a cgroup-relative path below a mount point without ever leaving it:
/// `..` and empty components are dropped.
pub fn join_rel(root: &Path, rel: &str) -> PathBuf {
    let mut p = root.to_path_buf();
    for c in rel
        .split('/')
        .filter(|c| !c.is_empty() && *c != "." && *c != "..")
    {
        p.push(c);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
25 1 0:23 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
26 25 0:24 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
27 25 0:25 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
28 25 0:26 / /sys/fs/cgroup/cpuacct rw - cgroup cgroup rw,cpuacct
29 25 0:27 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset
";

    #[test]
    fn the_memory_cgroup_of_a_process_and_its_oom_kills() {
        let mi =
            format!("{HYBRID}30 25 0:28 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n");
        let pc = "12:memory:/docker/abc\n4:cpu:/docker/abc\n0::/\n";
        assert_eq!(
            memory_dir_from(pc, &mi),
            Some((
                PathBuf::from("/sys/fs/cgroup/memory/docker/abc"),
                CgroupMode::V1
            ))
        );
        assert_eq!(
            memory_dir_from("4:cpu:/x\n", HYBRID),
            None,
            "no memory hierarchy"
        );
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
        )
        .unwrap();
        assert_eq!(oom_kills(d.path(), CgroupMode::V1), Some(3));
        std::fs::write(
            d.path().join("memory.events"),
            "low 0\nhigh 0\nmax 7\noom 2\noom_kill 1\noom_group_kill 0\n",
        )
        .unwrap();
        assert_eq!(oom_kills(d.path(), CgroupMode::V2), Some(1));
        assert_eq!(oom_kills(&d.path().join("gone"), CgroupMode::V2), None);
    }

    #[test]
    fn hybrid_host_uses_v1_cpu() {
        let h = Hierarchies::from_mountinfo(HYBRID, |p| {
            Some(if p.ends_with("unified") {
                CGROUP2_SUPER_MAGIC
            } else {
                CGROUP_SUPER_MAGIC
            })
        })
        .unwrap();
        assert_eq!(h.mode, CgroupMode::V1);
        assert_eq!(h.cpu, PathBuf::from("/sys/fs/cgroup/cpu"));
        assert_eq!(h.cpuset, Some(PathBuf::from("/sys/fs/cgroup/cpuset")));
        assert_eq!(h.extra_v1, vec![PathBuf::from("/sys/fs/cgroup/cpuacct")]);
    }

    #[test]
    fn combined_cpu_cpuacct_mount() {
        let mi = "27 25 0:25 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n";
        let h = Hierarchies::from_mountinfo(mi, |_| Some(CGROUP_SUPER_MAGIC)).unwrap();
        assert_eq!(h.cpu, PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"));
        assert!(h.extra_v1.is_empty());
        assert_eq!(h.cpuset, None);
    }

    #[test]
    fn names_do_not_decide_the_mode() {
        // A mount that says cgroup but whose statfs magic is not cgroupfs is ignored.
        let e = Hierarchies::from_mountinfo(HYBRID, |_| Some(0x1234)).unwrap_err();
        assert!(e.to_string().contains("cpu controller"), "{e}");
    }

    #[test]
    fn pure_v2_from_controllers_file() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join(CGROUP_CONTROLLERS),
            "cpuset cpu io memory pids\n",
        )
        .unwrap();
        let mi = format!(
            "30 1 0:26 / {} rw - cgroup2 cgroup2 rw\n",
            d.path().display()
        );
        let h = Hierarchies::from_mountinfo(&mi, |_| Some(CGROUP2_SUPER_MAGIC)).unwrap();
        assert_eq!(h.mode, CgroupMode::V2);
        assert_eq!(h.cpuset.as_deref(), Some(d.path()));
    }

    #[test]
    fn join_rel_never_escapes() {
        let r = Path::new("/sys/fs/cgroup/cpu");
        assert_eq!(
            join_rel(r, "/a/../../b/./c"),
            PathBuf::from("/sys/fs/cgroup/cpu/a/b/c")
        );
        assert_eq!(join_rel(r, "/"), r.to_path_buf());
    }
}
