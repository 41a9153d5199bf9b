//! Annotation QoS for one container: parse, plan and write into its cgroup,
//! and a JSON summary for the `start` record.

use std::path::Path;

use serde_json::json;
use throttlewatch_cgroup::{CpuCgroup, Hierarchies};
use throttlewatch_core::config::Config;
use throttlewatch_core::CpuList;
use throttlewatch_qos::{
    apply_plan, parse_request, plan, CpusetTarget, ExclusiveAllocator, Policy, QosRequest, Refusal,
    Topology,
};

use crate::burst_record::{BurstRecord, RECORD_VERSION};
use crate::spec::BundleSpec;

/// The exclusive-cpuset state lives here, below the configured state dir.
pub const CPUSETS_DIR: &str = "cpusets";

#[derive(Debug, Clone)]
pub struct QosOutcome {
    /// Goes into `Register.qos` (the log's `start` record).
    pub summary: serde_json::Value,
    pub refused: Vec<Refusal>,
    pub watch: Option<bool>,
    pub threshold_ns: Option<u64>,
    /// The burst written, for `throttlewatch-runtime update`.
    pub burst: Option<BurstRecord>,
}

/// Parse what the container asks for (annotations win over the environment).
pub fn request(cfg: &Config, spec: &BundleSpec) -> (QosRequest, Vec<Refusal>) {
    parse_request(&spec.annotations, spec.env(), &Policy::for_config(cfg))
}

/// The orchestrator's cpuset (`linux.resources.cpu.cpus`), which a request
/// may narrow, never widen or replace: an explicit CPU list outside it is
/// refused with the reason; other targets are chosen inside it.
fn orchestrator_bound(
    req: &mut QosRequest,
    refused: &mut Vec<Refusal>,
    spec: &BundleSpec,
) -> Option<CpuList> {
    req.cpuset.as_ref()?;
    let bound = match spec.orchestrator_cpus() {
        Ok(b) => b?,
        Err(e) => {
            refused.push(req.refusal(
                throttlewatch_qos::Key::Cpuset,
                format!("cannot read the cpuset the orchestrator set: {e}"),
            ));
            req.cpuset = None;
            req.exclusive = false;
            return None;
        }
    };
    if let Some(CpusetTarget::List(l)) = &req.cpuset {
        if !l.is_subset(&bound) {
            refused.push(req.refusal(
                throttlewatch_qos::Key::Cpuset,
                format!(
                    "not inside the cpuset the orchestrator set (linux.resources.cpu.cpus = {bound}): a request may narrow it, never widen or replace it"
                ),
            ));
            req.cpuset = None;
            req.exclusive = false;
            return None;
        }
    }
    Some(bound)
}

fn no_topology() -> Topology {
    Topology {
        online: CpuList::default(),
        nodes: vec![],
        cores: vec![],
        gpus: vec![],
        numa_from_sysfs: false,
    }
}

/// Plan and apply the container's QoS. Never fails: what cannot be done is
/// a refusal naming the key and value.
pub fn apply(
    cfg: &Config,
    id: &str,
    pid: u32,
    spec: &BundleSpec,
    h: &Hierarchies,
    cg: &CpuCgroup,
) -> QosOutcome {
    let (mut req, mut refused) = request(cfg, spec);
    let bound = orchestrator_bound(&mut req, &mut refused, spec);
    let (spec_quota, spec_period) = spec.cpu_quota();
    let (quota, period) = match cg.limits() {
        Ok(l) => (l.quota_us, l.period_us),
        Err(_) => (spec_quota, spec_period.unwrap_or(100_000)),
    };
    let mut topo = no_topology();
    let mut alloc = None;
    if req.cpuset.is_some() {
        match Topology::discover(Path::new("/sys"), Path::new("/proc")) {
            Ok(t) => topo = t,
            Err(e) => refused.push(Refusal::new(
                throttlewatch_qos::Key::Cpuset.annotation(),
                &req.cpuset
                    .as_ref()
                    .map(|c| c.to_string())
                    .unwrap_or_default(),
                format!("cannot read the machine's topology: {e}"),
            )),
        }
        match ExclusiveAllocator::open(&cfg.state_dir.join(CPUSETS_DIR))
            .map(|a| a.with_lock_timeout(cfg.cpuset_lock_timeout()))
        {
            Ok(a) => alloc = Some(a.for_holder(Some(pid))),
            Err(e) => refused.push(Refusal::new(
                throttlewatch_qos::Key::Cpuset.annotation(),
                &req.cpuset
                    .as_ref()
                    .map(|c| c.to_string())
                    .unwrap_or_default(),
                format!(
                    "cannot open the exclusive cpuset state in {}: {e}",
                    cfg.state_dir.display()
                ),
            )),
        }
    }
    // Only a cpuset request looks at the parent's CPUs (two cgroupfs reads saved otherwise).
    let parent_cpus = match req.cpuset {
        Some(_) => cg
            .parent(h)
            .and_then(|p| p.effective_cpus())
            .and_then(|s| CpuList::parse("cpuset.cpus.effective", &s).ok())
            .unwrap_or_default(),
        None => CpuList::default(),
    };
    // Inside the orchestrator's cpuset (the plan treats an empty list as
    // "no bound", so the bound itself stands in for an unknown parent).
    let parent_cpus = match &bound {
        Some(b) if parent_cpus.is_empty() => b.clone(),
        Some(b) => parent_cpus.intersect(b),
        None => parent_cpus,
    };
    let env = spec.env();
    let p = plan(
        &req,
        &topo,
        alloc.as_ref(),
        id,
        &parent_cpus,
        quota,
        period,
        env,
    );
    refused.extend(p.refused.iter().cloned());
    let write_refused = apply_plan(&p, cg);
    let cpuset_failed = write_refused.iter().any(|r| r.key.ends_with("cpuset"));
    if p.exclusive && cpuset_failed {
        if let Some(a) = &alloc {
            let _ = a.release(id);
        }
    }
    let burst_failed = write_refused.iter().any(|r| r.key.ends_with("cpu-burst"));
    refused.extend(write_refused);
    let burst = match (p.burst_us, req.burst) {
        (Some(us), Some(spec)) if !burst_failed => Some(BurstRecord {
            v: RECORD_VERSION,
            container_id: id.to_string(),
            cgroup_path: cg.rel.clone(),
            request: spec.into(),
            cap_percent: req.burst_cap_percent,
            applied_us: us,
        }),
        _ => None,
    };
    let summary = json!({
        "request": &req,
        "applied": {
            "burst_us": if burst_failed { None } else { p.burst_us },
            "cpus": if cpuset_failed { None } else { p.cpus.as_ref().map(|c| c.to_string()) },
            "mems": if cpuset_failed { None } else { p.mems.as_ref().map(|c| c.to_string()) },
            "exclusive": p.exclusive && !cpuset_failed,
        },
        "notes": &p.notes,
        "refused": &refused,
        "refused_text": refused.iter().map(|r| r.to_string()).collect::<Vec<_>>(),
    });
    QosOutcome {
        summary,
        refused,
        watch: req.watch,
        threshold_ns: req.threshold_us.map(|us| us * 1000),
        burst,
    }
}

#[cfg(test)]
mod tests {
    use throttlewatch_cgroup::CgroupMode;

    use super::*;

    fn fake_group(root: &Path, quota: &str) -> (Hierarchies, CpuCgroup) {
        let h = Hierarchies {
            mode: CgroupMode::V1,
            cpu: root.join("cpu"),
            cpuset: None,
            extra_v1: vec![],
        };
        let g = CpuCgroup::at(&h, "/tw/c1");
        std::fs::create_dir_all(&g.cpu_dir).unwrap();
        std::fs::write(g.cpu_dir.join("cpu.cfs_quota_us"), quota).unwrap();
        std::fs::write(g.cpu_dir.join("cpu.cfs_period_us"), "100000").unwrap();
        std::fs::write(g.cpu_dir.join("cpu.cfs_burst_us"), "0").unwrap();
        (h, g)
    }

    fn spec(annotations: &[(&str, &str)], env: &[&str]) -> BundleSpec {
        BundleSpec {
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            process: Some(crate::spec::Process {
                env: env.iter().map(|s| s.to_string()).collect(),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn burst_from_annotation_is_written_and_recorded() {
        let d = tempfile::tempdir().unwrap();
        let (h, g) = fake_group(d.path(), "30000");
        let cfg = Config {
            state_dir: d.path().join("state"),
            ..Config::default()
        };
        let o = apply(
            &cfg,
            "c1",
            1,
            &spec(&[("throttlewatch.io/cpu-burst", "20ms")], &[]),
            &h,
            &g,
        );
        assert!(o.refused.is_empty(), "{:?}", o.refused);
        assert_eq!(
            std::fs::read_to_string(g.cpu_dir.join("cpu.cfs_burst_us")).unwrap(),
            "20000"
        );
        assert_eq!(o.burst.unwrap().applied_us, 20_000);
        assert_eq!(o.summary["applied"]["burst_us"], 20_000);
    }

    #[test]
    fn bad_values_are_refusals_naming_the_value() {
        let d = tempfile::tempdir().unwrap();
        let (h, g) = fake_group(d.path(), "30000");
        let cfg = Config {
            state_dir: d.path().join("state"),
            ..Config::default()
        };
        let s = spec(
            &[
                ("throttlewatch.io/cpu-burst", "abc"),
                ("throttlewatch.io/cpu-brust", "1ms"),
            ],
            &["THROTTLEWATCH_THRESHOLD=99s"],
        );
        let o = apply(&cfg, "c1", 1, &s, &h, &g);
        let text = o.summary["refused_text"].to_string();
        assert!(
            text.contains("throttlewatch.io/cpu-burst=\\\"abc\\\""),
            "{text}"
        );
        assert!(
            text.contains("cpu-brust") && text.contains("THROTTLEWATCH_THRESHOLD"),
            "{text}"
        );
        assert_eq!(o.refused.len(), 3);
        assert!(o.burst.is_none());
        assert_eq!(
            std::fs::read_to_string(g.cpu_dir.join("cpu.cfs_burst_us")).unwrap(),
            "0"
        );
    }

    #[test]
    fn environment_channel_for_docker() {
        let d = tempfile::tempdir().unwrap();
        let (h, g) = fake_group(d.path(), "20000");
        let cfg = Config {
            state_dir: d.path().join("state"),
            ..Config::default()
        };
        let o = apply(
            &cfg,
            "c1",
            1,
            &spec(&[], &["PATH=/bin", "THROTTLEWATCH_CPU_BURST=10ms"]),
            &h,
            &g,
        );
        assert_eq!(
            std::fs::read_to_string(g.cpu_dir.join("cpu.cfs_burst_us")).unwrap(),
            "10000"
        );
        assert!(o.refused.is_empty());
    }
}
