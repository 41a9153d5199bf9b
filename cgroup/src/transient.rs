//! Transient cgroups for `throttlewatch run` and for tests: created with the
//! limits asked for, removed (after killing what is left) when dropped.

use std::time::{Duration, Instant};

use crate::error::{io_err, Result};
use crate::files::{CGROUP_SUBTREE_CONTROL, CPUSET_CPUS};
use crate::group::{inherit_v1_cpuset, CpuCgroup};
use crate::hierarchy::{CgroupMode, Hierarchies};
use crate::parse;

#[derive(Debug)]
pub struct TransientCgroup {
    pub group: CpuCgroup,
    created: Vec<std::path::PathBuf>,
}

impl TransientCgroup {
    /// Create `rel` (and missing parents) in the cpu, cpuset and accounting
    /// hierarchies. Parents created here are removed on drop as well.
    pub fn create(h: &Hierarchies, rel: &str) -> Result<TransientCgroup> {
        let group = CpuCgroup::at(h, rel);
        let mut created = Vec::new();
        let mut roots: Vec<(std::path::PathBuf, bool)> = vec![(h.cpu.clone(), false)];
        if let Some(cs) = &h.cpuset {
            if *cs != h.cpu {
                roots.push((cs.clone(), true));
            }
        }
        for r in &h.extra_v1 {
            roots.push((r.clone(), false));
        }
        let mut t = TransientCgroup {
            group,
            created: Vec::new(),
        };
        for (root, is_cpuset) in roots {
            let mut dir = root.clone();
            for comp in t.group.rel.split('/').filter(|c| !c.is_empty()) {
                if h.mode == CgroupMode::V2 {
                    // Delegate cpu (and cpuset) to the children of `dir`.
                    enable_v2_controllers(&dir);
                }
                dir.push(comp);
                if !dir.exists() {
                    std::fs::create_dir(&dir).map_err(io_err(&dir))?;
                    created.push(dir.clone());
                    t.created = created.clone();
                    if is_cpuset && h.mode == CgroupMode::V1 {
                        inherit_v1_cpuset(&dir)?;
                    }
                }
            }
        }
        t.created = created;
        Ok(t)
    }

    /// Remove the group: kill what is left, then rmdir deepest first.
    pub fn remove(&mut self) {
        for dir in self.created.iter().rev() {
            let procs = dir.join("cgroup.procs");
            let deadline = Instant::now() + Duration::from_secs(2);
            loop {
                let pids: Vec<i32> = std::fs::read_to_string(&procs)
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|l| l.trim().parse().ok())
                    .collect();
                for p in &pids {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(*p),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                if std::fs::remove_dir(dir).is_ok() || !dir.exists() || Instant::now() > deadline {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        self.created.clear();
    }
}

fn enable_v2_controllers(dir: &std::path::Path) {
    let p = dir.join(CGROUP_SUBTREE_CONTROL);
    let _ = parse::write(&p, "+cpu");
    let _ = parse::write(&p, "+cpuset");
    let _ = CPUSET_CPUS;
}

impl Drop for TransientCgroup {
    fn drop(&mut self) {
        self.remove();
    }
}
