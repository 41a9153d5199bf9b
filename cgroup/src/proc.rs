//! `/proc/PID/cgroup`: which cgroup a process is in.

use std::path::Path;

use crate::error::{io_err, Result};
use crate::file_error::FileError;
use crate::hierarchy::CgroupMode;

/// The cpu-controller cgroup (relative path) of a process, from the content of
/// `/proc/PID/cgroup`.
pub fn cpu_cgroup_of(content: &str, mode: CgroupMode) -> Option<String> {
    content.lines().find_map(|line| {
        let mut it = line.splitn(3, ':');
        let id = it.next()?;
        let ctrls = it.next()?;
        let path = it.next()?;
        let hit = match mode {
            CgroupMode::V1 => ctrls.split(',').any(|c| c == "cpu"),
            CgroupMode::V2 => id == "0" && ctrls.is_empty(),
        };
        hit.then(|| path.to_string())
    })
}

pub fn cpu_cgroup_of_pid(proc_root: &Path, pid: u32, mode: CgroupMode) -> Result<String> {
    let p = proc_root.join(pid.to_string()).join("cgroup");
    let s = std::fs::read_to_string(&p).map_err(io_err(&p))?;
    cpu_cgroup_of(&s, mode)
        .ok_or_else(|| FileError::parse(p, "a cpu cgroup line", s.as_str()).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "12:cpuset:/docker/abc\n4:cpu:/docker/abc\n3:cpuacct:/docker/abc\n1:name=systemd:/x\n0::/\n";

    #[test]
    fn v1_cpu_line() {
        assert_eq!(
            cpu_cgroup_of(HYBRID, CgroupMode::V1).as_deref(),
            Some("/docker/abc")
        );
        assert_eq!(
            cpu_cgroup_of("5:cpu,cpuacct:/kubepods/pod1/c\n", CgroupMode::V1).as_deref(),
            Some("/kubepods/pod1/c")
        );
    }

    #[test]
    fn v2_line() {
        assert_eq!(cpu_cgroup_of(HYBRID, CgroupMode::V2).as_deref(), Some("/"));
        assert_eq!(
            cpu_cgroup_of("0::/system.slice/a.scope\n", CgroupMode::V2).as_deref(),
            Some("/system.slice/a.scope")
        );
    }

    #[test]
    fn missing_controller() {
        assert_eq!(cpu_cgroup_of("3:cpuacct:/x\n", CgroupMode::V1), None);
    }
}
