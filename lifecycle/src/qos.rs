//! The QoS steps at `createRuntime`: what the container asks for (parsed
//! once), the plan for its cgroup, the writes, the burst record, and a JSON
//! summary for the log's `start` record. Nothing here fails the container:
//! what cannot be done is a refusal naming the key and value.

use std::path::Path;

use serde_json::json;
use throttlewatch_cgroup::{CpuCgroup, Hierarchies};
use throttlewatch_core::config::Config;
use throttlewatch_core::{ContainerKey, CpuList, StateDir};
use throttlewatch_qos::{
    apply_plan, parse_request, plan, CpusetTarget, ExclusiveAllocator, Key, Plan, PlanInput,
    Policy, QosRequest, Refusal, Topology,
};

use crate::bundle_spec::BundleSpec;
use crate::burst_record::{BurstRecord, RECORD_VERSION};

/// CFS period assumed when neither the cgroup nor the spec tells one.
pub const DEFAULT_PERIOD_US: u64 = 100_000;

/// What a container asks for, parsed once from its spec.
#[derive(Debug, Clone)]
pub struct Requested {
    pub req: QosRequest,
    /// Keys and values refused while parsing.
    pub refused: Vec<Refusal>,
}

impl Requested {
    /// Parse what the container asks for (annotations win over the environment).
    pub fn parse(cfg: &Config, spec: &BundleSpec) -> Requested {
        let (req, refused) = parse_request(&spec.annotations, spec.env(), &Policy::for_config(cfg));
        Requested { req, refused }
    }
}

/// The container whose cgroup gets the QoS.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    /// The container (its exclusive cores are held under this key).
    pub key: &'a ContainerKey,
    /// Its init process (the holder of exclusive cores).
    pub pid: u32,
    pub hierarchies: &'a Hierarchies,
    pub cgroup: &'a CpuCgroup,
}

#[derive(Debug, Clone)]
pub struct QosOutcome {
    /// Goes into `Register.qos` (the log's `start` record).
    pub summary: serde_json::Value,
    pub refused: Vec<Refusal>,
    pub watch: Option<bool>,
    pub threshold_ns: Option<u64>,
    /// The burst written, for the burst record.
    pub burst: Option<BurstRecord>,
}

/// Which writes the kernel refused.
#[derive(Debug, Default)]
struct WriteFailures {
    refused: Vec<Refusal>,
    cpuset_failed: bool,
    burst_failed: bool,
}

/// Plan and apply the container's QoS. Never fails: what cannot be done is
/// a refusal naming the key and value.
pub fn apply(cfg: &Config, spec: &BundleSpec, asked: Requested, t: Target) -> QosOutcome {
    let Requested {
        mut req,
        mut refused,
    } = asked;
    let bound = orchestrator_bound(&mut req, &mut refused, spec);
    let (quota_us, period_us) = bandwidth(spec, t.cgroup);
    let (topo, alloc) = cpuset_context(cfg, &req, t.pid, &mut refused);
    let parent_cpus = parent_cpus(&req, t, bound.as_ref());
    let holder = t.key.qualified();
    let p = plan(&PlanInput {
        req: &req,
        topo: &topo,
        alloc: alloc.as_ref(),
        container_id: &holder,
        parent_cpus: &parent_cpus,
        quota_us,
        period_us,
        env: spec.env(),
    });
    refused.extend(p.refused.iter().cloned());
    let w = write(&p, t, alloc.as_ref());
    refused.extend(w.refused.iter().cloned());
    let burst = match (p.burst_us, req.burst) {
        (Some(us), Some(spec)) if !w.burst_failed => Some(BurstRecord {
            v: RECORD_VERSION,
            container_id: t.key.id.clone(),
            scope: t.key.scope.clone(),
            cgroup_path: t.cgroup.rel.clone(),
            request: spec.into(),
            cap_percent: req.burst_cap_percent,
            applied_us: us,
        }),
        _ => None,
    };
    QosOutcome {
        summary: summary(&req, &p, &w, &refused),
        watch: req.watch,
        threshold_ns: req.threshold_us.map(|us| us * 1000),
        refused,
        burst,
    }
}

/// The group's quota and period (the spec's where the cgroup cannot be read).
fn bandwidth(spec: &BundleSpec, cg: &CpuCgroup) -> (Option<u64>, u64) {
    match cg.bandwidth() {
        Ok(l) => (l.quota_us, l.period_us),
        Err(_) => {
            let (quota, period) = spec.cpu_quota();
            (quota, period.unwrap_or(DEFAULT_PERIOD_US))
        }
    }
}

/// The machine's topology and the exclusive-core allocator, read only for
/// a cpuset request; what cannot be read is a refusal of the cpuset.
fn cpuset_context(
    cfg: &Config,
    req: &QosRequest,
    pid: u32,
    refused: &mut Vec<Refusal>,
) -> (Topology, Option<ExclusiveAllocator>) {
    let mut topo = no_topology();
    let Some(cpuset) = &req.cpuset else {
        return (topo, None);
    };
    let refuse = |why: String| {
        Refusal::new(Key::Cpuset.annotation(), &cpuset.to_string(), why).about(Key::Cpuset)
    };
    match Topology::discover(Path::new("/sys"), Path::new("/proc")) {
        Ok(t) => topo = t,
        Err(e) => refused.push(refuse(format!("cannot read the machine's topology: {e}"))),
    }
    let dir = StateDir::new(&cfg.state_dir).cpusets_dir();
    let opened =
        ExclusiveAllocator::open(&dir).map(|a| a.with_lock_timeout(cfg.cpuset_lock_timeout()));
    let alloc = match opened {
        Ok(a) => Some(a.for_holder(Some(pid))),
        Err(e) => {
            refused.push(refuse(format!(
                "cannot open the exclusive cpuset state in {}: {e}",
                cfg.state_dir.display()
            )));
            None
        }
    };
    (topo, alloc)
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

/// The parent's CPUs, read only for a cpuset request (two cgroupfs reads
/// saved otherwise), inside the orchestrator's cpuset (the plan treats an
/// empty list as "no bound", so the bound itself stands in for an unknown
/// parent).
fn parent_cpus(req: &QosRequest, t: Target, bound: Option<&CpuList>) -> CpuList {
    if req.cpuset.is_none() {
        return CpuList::default();
    }
    let parent = t
        .cgroup
        .parent(t.hierarchies)
        .and_then(|p| p.effective_cpus())
        .and_then(|s| CpuList::parse("cpuset.cpus.effective", &s).ok())
        .unwrap_or_default();
    match bound {
        Some(b) if parent.is_empty() => b.clone(),
        Some(b) => parent.intersect(b),
        None => parent,
    }
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
    let why = match spec.orchestrator_cpus() {
        Ok(None) => return None,
        Ok(Some(bound)) => match &req.cpuset {
            Some(CpusetTarget::List(l)) if !l.is_subset(&bound) => format!(
                "not inside the cpuset the orchestrator set (linux.resources.cpu.cpus = {bound}): a request may narrow it, never widen or replace it"
            ),
            _ => return Some(bound),
        },
        Err(e) => format!("cannot read the cpuset the orchestrator set: {e}"),
    };
    refused.push(req.refusal(Key::Cpuset, why));
    req.cpuset = None;
    req.exclusive = false;
    None
}

/// Write the plan; exclusive cores whose cpuset the kernel refused are released.
fn write(p: &Plan, t: Target, alloc: Option<&ExclusiveAllocator>) -> WriteFailures {
    let refused = apply_plan(p, t.cgroup);
    let cpuset_failed = refused.iter().any(|r| r.is_about(Key::Cpuset));
    if p.exclusive && cpuset_failed {
        if let Some(a) = alloc {
            let _ = a.release(&t.key.qualified());
        }
    }
    WriteFailures {
        burst_failed: refused.iter().any(|r| r.is_about(Key::CpuBurst)),
        cpuset_failed,
        refused,
    }
}

/// The `qos` object of the `start` record.
fn summary(
    req: &QosRequest,
    p: &Plan,
    w: &WriteFailures,
    refused: &[Refusal],
) -> serde_json::Value {
    let cpuset = |c: &Option<CpuList>| match w.cpuset_failed {
        true => None,
        false => c.as_ref().map(|c| c.to_string()),
    };
    json!({
        "request": req,
        "applied": {
            "burst_us": if w.burst_failed { None } else { p.burst_us },
            "cpus": cpuset(&p.cpus),
            "mems": cpuset(&p.mems),
            "exclusive": p.exclusive && !w.cpuset_failed,
        },
        "notes": &p.notes,
        "refused": refused,
        "refused_text": refused.iter().map(|r| r.to_string()).collect::<Vec<_>>(),
    })
}

/// The request alone (the runtime wrapper's cpuset modifier, the burst
/// derived again at `update`).
pub fn request(cfg: &Config, spec: &BundleSpec) -> (QosRequest, Vec<Refusal>) {
    let r = Requested::parse(cfg, spec);
    (r.req, r.refused)
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

    fn run(cfg: &Config, s: &BundleSpec, h: &Hierarchies, g: &CpuCgroup) -> QosOutcome {
        let t = Target {
            key: &ContainerKey::new("c1", None),
            pid: 1,
            hierarchies: h,
            cgroup: g,
        };
        apply(cfg, s, Requested::parse(cfg, s), t)
    }

    fn spec(annotations: &[(&str, &str)], env: &[&str]) -> BundleSpec {
        BundleSpec::with(annotations, env)
    }

    #[test]
    fn burst_from_annotation_is_written_and_recorded() {
        let d = tempfile::tempdir().unwrap();
        let (h, g) = fake_group(d.path(), "30000");
        let cfg = Config {
            state_dir: d.path().join("state"),
            ..Config::default()
        };
        let o = run(
            &cfg,
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
        let o = run(&cfg, &s, &h, &g);
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
        let o = run(
            &cfg,
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
