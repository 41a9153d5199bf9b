use std::collections::BTreeMap;

use super::*;
use crate::exclusive::ExclusiveAllocator;
use crate::fixtures;
use crate::keys::PREFIX;
use crate::policy::Policy;
use crate::request::parse_request;
use crate::topology::Topology;
use throttlewatch_core::CpuList;

const PERIOD: u64 = 100_000;

fn list(s: &str) -> CpuList {
    CpuList::parse("", s).unwrap()
}

fn req(pairs: &[(&str, &str)]) -> QosRequest {
    let a: BTreeMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (format!("{PREFIX}{k}"), v.to_string()))
        .collect();
    let (r, refused) = parse_request(&a, &[], &Policy::default());
    assert_eq!(refused, vec![], "{pairs:?}");
    r
}

fn gpus_env(v: &str) -> Vec<String> {
    vec![format!("NVIDIA_VISIBLE_DEVICES={v}")]
}

/// Plan on `topo` with no parent restriction.
fn simple(
    r: &QosRequest,
    topo: &Topology,
    alloc: Option<&ExclusiveAllocator>,
    id: &str,
    cpus: Option<u64>,
    env: &[String],
) -> Plan {
    plan(&PlanInput {
        req: r,
        topo,
        alloc,
        container_id: id,
        parent_cpus: &CpuList::default(),
        quota_us: cpus.map(|c| c * PERIOD),
        period_us: PERIOD,
        env,
    })
}

fn has_note(p: &Plan, s: &str) -> bool {
    p.notes.iter().any(|n| n.contains(s))
}

#[test]
fn bursts() {
    let t = fixtures::single_node_vm().topology();
    let p = plan(&PlanInput {
        req: &req(&[("cpu-burst", "50%")]),
        topo: &t,
        alloc: None,
        container_id: "c",
        parent_cpus: &CpuList::default(),
        quota_us: Some(200_000),
        period_us: PERIOD,
        env: &[],
    });
    assert_eq!(p.burst_us, Some(100_000));
    let p = plan(&PlanInput {
        req: &req(&[("cpu-burst", "5s")]),
        topo: &t,
        alloc: None,
        container_id: "c",
        parent_cpus: &CpuList::default(),
        quota_us: Some(200_000),
        period_us: PERIOD,
        env: &[],
    });
    assert_eq!(
        p.burst_us,
        Some(200_000),
        "the kernel refuses a burst above the quota"
    );
    assert!(has_note(&p, "clamped to 200000us"), "{:?}", p.notes);
    let p = plan(&PlanInput {
        req: &req(&[("cpu-burst", "20ms")]),
        topo: &t,
        alloc: None,
        container_id: "c",
        parent_cpus: &CpuList::default(),
        quota_us: None,
        period_us: PERIOD,
        env: &[],
    });
    assert_eq!(p.burst_us, None);
    assert_eq!(p.refused[0].key, "throttlewatch.io/cpu-burst");
    assert!(
        p.refused[0].reason.contains("needs a CPU quota"),
        "{}",
        p.refused[0]
    );
    let p = plan(&PlanInput {
        req: &req(&[("qos-class", "burstable")]),
        topo: &t,
        alloc: None,
        container_id: "c",
        parent_cpus: &CpuList::default(),
        quota_us: None,
        period_us: PERIOD,
        env: &[],
    });
    assert!(
        p.refused.is_empty() && has_note(&p, "needs a CPU quota"),
        "a preset only notes it"
    );

    let policy = Policy {
        max_burst_percent: 25,
        ..Default::default()
    };
    let a = BTreeMap::from([(format!("{PREFIX}cpu-burst"), "80ms".to_string())]);
    let (r, _) = parse_request(&a, &[], &policy);
    let p = plan(&PlanInput {
        req: &r,
        topo: &t,
        alloc: None,
        container_id: "c",
        parent_cpus: &CpuList::default(),
        quota_us: Some(200_000),
        period_us: PERIOD,
        env: &[],
    });
    assert_eq!(p.burst_us, Some(50_000));
    assert!(has_note(&p, "policy maximum 25%"), "{:?}", p.notes);
}

#[test]
fn numa_node_and_explicit_lists() {
    let t = fixtures::training_node().topology();
    let p = simple(&req(&[("cpuset", "numa:1")]), &t, None, "c", None, &[]);
    assert_eq!(
        (p.cpus, p.mems),
        (Some(list("24-47,72-95")), Some(list("1")))
    );
    let p = simple(&req(&[("cpuset", "numa:2")]), &t, None, "c", None, &[]);
    assert!(
        p.cpus.is_none()
            && p.refused[0]
                .reason
                .contains("NUMA node 2 does not exist; this machine has nodes 0-1")
    );
    let p = simple(&req(&[("cpuset", "0-3,8")]), &t, None, "c", None, &[]);
    assert_eq!(
        (p.cpus, p.mems),
        (Some(list("0-3,8")), None),
        "explicit lists leave mems alone"
    );
    let p = simple(&req(&[("cpuset", "90-100")]), &t, None, "c", None, &[]);
    assert!(p.cpus.is_none());
    assert!(
        p.refused[0]
            .to_string()
            .contains("\"90-100\": CPUs 96-100 do not exist"),
        "{}",
        p.refused[0]
    );
    let p = simple(
        &req(&[("cpuset", "numa:0"), ("cpuset-cpus", "200")]),
        &t,
        None,
        "c",
        None,
        &[],
    );
    assert!(
        p.cpus.is_none() && p.refused[0].reason.contains("this machine has 96 online"),
        "{:?}",
        p.refused
    );
    let p = simple(
        &req(&[("cpuset", "numa:0"), ("cpuset-cpus", "4")]),
        &t,
        None,
        "c",
        None,
        &[],
    );
    assert_eq!(
        p.cpus,
        Some(list("0-1,48-49")),
        "shared with a count: whole cores"
    );
}

#[test]
fn gpu_local() {
    let t = fixtures::training_node().topology();
    let r = req(&[("cpuset", "gpu-local")]);
    let p = simple(&r, &t, None, "c", None, &gpus_env("0,1"));
    assert_eq!(
        (p.cpus.clone(), p.mems.clone()),
        (Some(list("0-23,48-71")), Some(list("0")))
    );
    assert!(
        has_note(&p, "gpu-local: GPUs 0-1 on NUMA node 0"),
        "{:?}",
        p.notes
    );
    assert_eq!(p.gpus, vec![0, 1]);
    let p = simple(&r, &t, None, "c", None, &gpus_env("3,4"));
    assert_eq!(
        (p.cpus.clone(), p.mems.clone()),
        (Some(list("0-95")), Some(list("0-1")))
    );
    let p = simple(
        &req(&[("cpuset", "gpu-local"), ("gpus", &fixtures::uuid(5))]),
        &t,
        None,
        "c",
        None,
        &gpus_env("0"),
    );
    assert_eq!(
        p.mems,
        Some(list("1")),
        "the gpus key overrides NVIDIA_VISIBLE_DEVICES"
    );
    let p = simple(&r, &t, None, "c", None, &[]);
    assert!(
        p.cpus.is_none() && p.refused[0].reason.contains("container has none"),
        "{:?}",
        p.refused
    );
    let p = simple(&r, &t, None, "c", None, &gpus_env("9"));
    assert!(
        p.cpus.is_none() && p.refused[0].key == "NVIDIA_VISIBLE_DEVICES",
        "{:?}",
        p.refused
    );

    let u = fixtures::unknown_numa_gpus().topology();
    let p = simple(&r, &u, None, "c", None, &gpus_env("all"));
    assert_eq!(
        (p.cpus.clone(), p.mems.clone()),
        (Some(list("0-15")), Some(list("0-1")))
    );
    assert!(
        has_note(&p, "unknown (numa_node -1): all nodes"),
        "{:?}",
        p.notes
    );
}

#[test]
fn parent_cpuset_bounds_the_choice() {
    let t = fixtures::training_node().topology();
    let r = req(&[("cpuset", "numa:0")]);
    let p = plan(&PlanInput {
        req: &r,
        topo: &t,
        alloc: None,
        container_id: "c",
        parent_cpus: &list("0-11"),
        quota_us: None,
        period_us: PERIOD,
        env: &[],
    });
    assert_eq!(
        (p.cpus.clone(), p.mems.clone()),
        (Some(list("0-11")), Some(list("0")))
    );
    assert!(
        has_note(&p, "parent cgroup allows only 0-11"),
        "{:?}",
        p.notes
    );
    let p = plan(&PlanInput {
        req: &r,
        topo: &t,
        alloc: None,
        container_id: "c",
        parent_cpus: &list("24-47"),
        quota_us: None,
        period_us: PERIOD,
        env: &[],
    });
    assert!(
        p.cpus.is_none() && p.refused[0].reason.contains("parent cgroup's cpuset 24-47"),
        "{:?}",
        p.refused
    );
}

#[test]
fn exclusive_cores_for_several_containers() {
    let t = fixtures::training_node().topology();
    let d = tempfile::tempdir().unwrap();
    let a = ExclusiveAllocator::open(d.path()).unwrap();
    let lc = req(&[("qos-class", "latency-critical")]);
    let env = gpus_env("4,5,6,7");
    let p1 = simple(&lc, &t, Some(&a), "c1", Some(3), &env);
    assert_eq!(
        p1.cpus,
        Some(list("24-25,72-73")),
        "3 CPUs → 2 whole cores on the GPUs' node"
    );
    assert_eq!(
        (p1.mems.clone(), p1.exclusive, p1.burst_us),
        (Some(list("1")), true, Some(300_000))
    );
    let p2 = simple(&lc, &t, Some(&a), "c2", Some(4), &env);
    assert_eq!(p2.cpus, Some(list("26-27,74-75")));
    // Node 1 has 20 free cores left: 44 CPUs spill to node 0, with a note.
    let p3 = simple(&lc, &t, Some(&a), "c3", Some(44), &env);
    let c3 = p3.cpus.clone().unwrap();
    assert_eq!(c3.len(), 44);
    assert!(has_note(&p3, "also took 0-1,48-49"), "{:?}", p3.notes);
    assert_eq!(p3.mems, Some(list("0-1")));
    for (x, y) in [(&p1, &p2), (&p1, &p3), (&p2, &p3)] {
        assert!(x
            .cpus
            .as_ref()
            .unwrap()
            .intersect(y.cpus.as_ref().unwrap())
            .is_empty());
    }
    // numa:1 is strict: nothing left there.
    let p = simple(
        &req(&[("cpuset", "numa:1,exclusive")]),
        &t,
        Some(&a),
        "c4",
        Some(2),
        &[],
    );
    assert!(p.cpus.is_none());
    assert_eq!(p.refused[0].key, "throttlewatch.io/cpuset");
    assert!(
        p.refused[0].reason.contains("only 0 free") && p.refused[0].reason.contains("c1, c2, c3"),
        "{}",
        p.refused[0]
    );
    // auto without GPUs: node 0 has the most free CPUs.
    let p = simple(
        &req(&[("cpuset-exclusive", "true"), ("cpuset-cpus", "2")]),
        &t,
        Some(&a),
        "c5",
        None,
        &[],
    );
    assert_eq!(p.cpus, Some(list("2,50")));
    // A shared cpuset leaves out exclusively held CPUs.
    let p = simple(&req(&[("cpuset", "numa:1")]), &t, Some(&a), "c6", None, &[]);
    assert_eq!(p.cpus, Some(list("24-47,72-95")));
    assert!(has_note(&p, "sharing it anyway"), "{:?}", p.notes);
    let p = simple(&req(&[("cpuset", "numa:0")]), &t, Some(&a), "c6", None, &[]);
    assert_eq!(p.cpus, Some(list("3-23,51-71")), "{:?}", p.notes);
    // Releasing frees the cores for the next container.
    a.release("c3").unwrap();
    let p = simple(
        &req(&[("cpuset", "numa:1,exclusive")]),
        &t,
        Some(&a),
        "c4",
        Some(2),
        &[],
    );
    assert_eq!(p.cpus, Some(list("28,76")));
    assert!(
        p.explain().contains("cpuset.cpus: 28,76 (exclusive)"),
        "{}",
        p.explain()
    );
}

#[test]
fn exclusive_edge_cases() {
    let t = fixtures::training_node().topology();
    let r = req(&[("cpuset", "0-3,48,exclusive")]);
    let p = simple(&r, &t, None, "c", Some(1), &[]);
    assert!(
        p.refused[0]
            .reason
            .contains("need the allocator's state directory"),
        "{:?}",
        p.refused
    );
    let d = tempfile::tempdir().unwrap();
    let a = ExclusiveAllocator::open(d.path()).unwrap();
    let p = simple(&r, &t, Some(&a), "c", None, &[]);
    assert_eq!(
        p.cpus,
        Some(list("0,48")),
        "no quota: every free whole core of the list"
    );
    assert!(
        has_note(&p, "CPUs 1-3 are not whole cores"),
        "{:?}",
        p.notes
    );

    let vm = fixtures::single_node_vm().topology();
    let d2 = tempfile::tempdir().unwrap();
    let a2 = ExclusiveAllocator::open(d2.path()).unwrap();
    let p = simple(
        &req(&[("qos-class", "latency-critical")]),
        &vm,
        Some(&a2),
        "vm",
        Some(1),
        &[],
    );
    assert_eq!(
        (p.cpus.clone(), p.mems.clone()),
        (Some(list("0-1")), Some(list("0")))
    );

    let m = fixtures::memory_only_node().topology();
    let p = simple(&req(&[("cpuset", "numa:2")]), &m, None, "c", None, &[]);
    assert!(
        p.refused[0].reason.contains("no CPUs (a memory-only node)"),
        "{:?}",
        p.refused
    );
    let p = simple(&req(&[("cpuset", "numa:3")]), &m, None, "c", None, &[]);
    assert_eq!(
        (p.cpus.clone(), p.mems.clone()),
        (Some(list("8-11,20-23")), None)
    );
    assert!(has_note(&p, "cpuset.mems left as it is"), "{:?}", p.notes);
}

#[test]
fn nothing_requested_plans_nothing_and_serialises() {
    let t = fixtures::training_node().topology();
    let p = simple(&req(&[("watch", "true")]), &t, None, "c", Some(2), &[]);
    assert!(p.is_empty() && p.refused.is_empty());
    let p = simple(&req(&[("cpuset", "numa:0")]), &t, None, "c", None, &[]);
    let json = serde_json::to_value(&p).unwrap();
    assert_eq!(json["cpus"], "0-23,48-71");
    assert_eq!(json["mems"], "0");
    assert_eq!(json["burst_us"], serde_json::Value::Null);
    assert_eq!(cpus_for_quota(Some(150_000), 100_000), Some(2));
    assert_eq!(cpus_for_quota(Some(1_000), 100_000), Some(1));
    assert_eq!(cpus_for_quota(None, 100_000), None);
}
