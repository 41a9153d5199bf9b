//! Writing a plan into a container's cgroup. Kernel errors become refusals;
//! nothing here panics.

use throttlewatch_cgroup::{CgroupMode, CpuCgroup};

use crate::keys::Key;
use crate::plan::Plan;
use crate::refusal::Refusal;

/// Write the burst (v1 `cpu.cfs_burst_us`, v2 `cpu.max.burst`), then
/// `cpuset.cpus`, then `cpuset.mems`. Each write is independent: one failing
/// does not stop the others.
pub fn apply_plan(plan: &Plan, cg: &CpuCgroup) -> Vec<Refusal> {
    let mut refused = Vec::new();
    if let Some(us) = plan.burst_us {
        if let Err(e) = cg.set_burst(us) {
            let file = match cg.mode {
                CgroupMode::V1 => "cpu.cfs_burst_us",
                CgroupMode::V2 => "cpu.max.burst",
            };
            let why = format!("the kernel refused {file} = {us}: {e}");
            refused.push(
                Refusal::new(Key::CpuBurst.annotation(), &format!("{us}us"), why)
                    .about(Key::CpuBurst),
            );
        }
    }
    let cpuset_fail = |what: &str, value: &str, e: &dyn std::fmt::Display| {
        Refusal::new(
            Key::Cpuset.annotation(),
            value,
            format!("the kernel refused {what} = {value}: {e}"),
        )
        .about(Key::Cpuset)
    };
    if let Some(cpus) = &plan.cpus {
        let v = cpus.to_string();
        if let Err(e) = cg.set_cpuset(Some(&v), None) {
            refused.push(cpuset_fail("cpuset.cpus", &v, &e));
        }
    }
    if let Some(mems) = &plan.mems {
        let v = mems.to_string();
        if let Err(e) = cg.set_cpuset(None, Some(&v)) {
            refused.push(cpuset_fail("cpuset.mems", &v, &e));
        }
    }
    refused
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use throttlewatch_cgroup::Hierarchies;
    use throttlewatch_core::CpuList;

    use super::*;

    fn group(root: &Path, mode: CgroupMode, cpuset: bool) -> CpuCgroup {
        let h = Hierarchies {
            mode,
            cpu: root.join("cpu"),
            cpuset: cpuset.then(|| root.join("cpuset")),
            extra_v1: vec![],
        };
        let g = CpuCgroup::at(&h, "/c1");
        std::fs::create_dir_all(&g.cpu_dir).unwrap();
        if let Some(d) = &g.cpuset_dir {
            std::fs::create_dir_all(d).unwrap();
        }
        g
    }

    fn plan() -> Plan {
        Plan {
            burst_us: Some(20_000),
            cpus: Some(CpuList::parse("", "0-3").unwrap()),
            mems: Some(CpuList::parse("", "0").unwrap()),
            ..Default::default()
        }
    }

    #[test]
    fn writes_v1_and_v2_files() {
        let d = tempfile::tempdir().unwrap();
        let g = group(&d.path().join("v1"), CgroupMode::V1, true);
        assert_eq!(apply_plan(&plan(), &g), vec![]);
        assert_eq!(
            std::fs::read_to_string(g.cpu_dir.join("cpu.cfs_burst_us")).unwrap(),
            "20000"
        );
        let cs = g.cpuset_dir.as_ref().unwrap();
        assert_eq!(
            std::fs::read_to_string(cs.join("cpuset.cpus")).unwrap(),
            "0-3"
        );
        assert_eq!(
            std::fs::read_to_string(cs.join("cpuset.mems")).unwrap(),
            "0"
        );
        let g = group(&d.path().join("v2"), CgroupMode::V2, true);
        assert_eq!(apply_plan(&plan(), &g), vec![]);
        assert_eq!(
            std::fs::read_to_string(g.cpu_dir.join("cpu.max.burst")).unwrap(),
            "20000"
        );
    }

    #[test]
    fn failures_become_refusals_with_errno_text() {
        let d = tempfile::tempdir().unwrap();
        let mut g = group(d.path(), CgroupMode::V2, false);
        g.cpu_dir = d.path().join("gone");
        let r = apply_plan(&plan(), &g);
        assert_eq!(r.len(), 3, "{r:?}");
        assert!(
            r[0].to_string().contains("cpu.max.burst = 20000")
                && r[0].reason.contains("No such file"),
            "{}",
            r[0]
        );
        assert!(r[1].reason.contains("cpuset"), "{}", r[1]);
        assert!(apply_plan(&Plan::default(), &g).is_empty());
    }
}
