//! Cpuset advice from the `start` record's `topology` (NUMA nodes, GPUs and
//! the container's GPUs): keep a container on the node of its GPUs, or on
//! one node when its quota fits there. The effect predicted is the share of
//! its CPUs that would be local, not throttled time (the quota is the same).

use throttlewatch_core::logfmt::StartTopology;
use throttlewatch_core::CpuList;

use crate::model::Container;
use crate::recommendation::{Effect, Recommendation};

const KEY: &str = "throttlewatch.io/cpuset";

pub fn placement(c: &Container) -> Option<Recommendation> {
    let start = c.start.as_ref()?;
    let topo = start.topology.as_ref()?;
    let nodes = nodes(topo);
    if nodes.len() < 2 {
        return None;
    }
    let all = nodes
        .iter()
        .fold(CpuList::default(), |acc, (_, l)| acc.union(l));
    let cpus = start
        .cpus
        .as_deref()
        .and_then(|s| CpuList::parse("cpus", s).ok())
        .filter(|l| !l.is_empty())
        .unwrap_or(all);
    // Without a quota the container may use every CPU it has: narrowing its
    // cpuset would take CPU time away.
    let quota = start.quota_us? as f64 / start.period_us.max(1) as f64;
    let on = |l: &CpuList| cpus.intersect(l).len() as f64 / cpus.len() as f64;
    let observed = c.kernel_throttled_ns().unwrap_or(0);
    let rec = |value, node: &CpuList, reason, metric, now| {
        advice(observed, value, node, reason, metric, now)
    };
    if !topo.container_gpus.is_empty() {
        // None: GPUs on several nodes, or on an unknown one.
        let n = gpus_node(topo)?;
        let (_, node) = nodes.iter().find(|(id, _)| *id == n)?;
        let local = on(node);
        if local >= 1.0 || quota > node.len() as f64 {
            return None;
        }
        let gpus: Vec<String> = topo.container_gpus.iter().map(|g| g.to_string()).collect();
        return Some(rec(
            "gpu-local".into(),
            node,
            format!(
                "its GPUs {} are on NUMA node {n}, but {:.0} % of its CPUs are on other nodes: their transfers and memory cross the socket link; node {n}'s {} CPUs hold its quota of {quota:.1}",
                gpus.join(","),
                (1.0 - local) * 100.0,
                node.len()
            ),
            "cpus_local_to_gpus",
            local,
        ));
    }
    let (best, share) = nodes
        .iter()
        .map(|(id, l)| (*id, on(l)))
        .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)))?;
    let node = &nodes.iter().find(|(id, _)| *id == best)?.1;
    if share >= 1.0 || quota > node.len() as f64 {
        return None;
    }
    Some(rec(
        format!("numa:{best}"),
        node,
        format!(
            "its cpuset spans {} NUMA nodes while its quota of {quota:.1} CPUs fits in node {best} ({} CPUs): its threads would stop moving across sockets, away from their memory",
            nodes.iter().filter(|(_, l)| on(l) > 0.0).count(),
            node.len()
        ),
        "cpus_on_one_node",
        share,
    ))
}

/// The advice to move the cpuset: `run --cpuset` takes the CPU list the
/// annotation's value resolves to.
fn advice(
    observed: u64,
    value: String,
    node: &CpuList,
    reason: String,
    metric: &'static str,
    now: f64,
) -> Recommendation {
    Recommendation {
        kind: "cpuset",
        key: KEY.into(),
        run_flag: format!("--cpuset {node}"),
        value,
        reason,
        observed_throttled_ns: observed,
        predicted_throttled_ns: None,
        covers: "where its CPUs are (the share near its GPUs or on one node), from the start record's topology",
        predicted_effect: Some(Effect {
            metric,
            observed: now,
            predicted: 1.0,
        }),
    }
}

/// The one NUMA node of the container's GPUs; None when they are on
/// several or on an unknown one.
fn gpus_node(topo: &StartTopology) -> Option<u32> {
    let mut gpu_nodes: Vec<Option<u32>> = topo
        .container_gpus
        .iter()
        .map(|i| {
            topo.gpus
                .iter()
                .find(|g| g.index == *i)
                .and_then(|g| g.numa_node)
        })
        .collect();
    gpu_nodes.sort();
    gpu_nodes.dedup();
    match gpu_nodes[..] {
        [Some(n)] => Some(n),
        _ => None,
    }
}

/// Nodes with CPUs.
fn nodes(t: &StartTopology) -> Vec<(u32, CpuList)> {
    t.nodes
        .iter()
        .filter_map(|n| {
            CpuList::parse("cpus", &n.cpus)
                .ok()
                .filter(|l| !l.is_empty())
                .map(|l| (n.id, l))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use throttlewatch_core::logfmt::Line;

    /// A `start` record of a 2-socket, 96-CPU machine with 8 GPUs (0-3 on
    /// node 0, 4-7 on node 1), as the agent writes it.
    fn container(cpus: &str, quota_us: Option<u64>, gpus: &str) -> Container {
        let line = format!(
            r#"{{"v":1,"ts":1,"type":"start","container_id":"c","container_name":"train","pid":1,"cgroup_path":"/c","cgroup_id":2,"cgroup_mode":"v2","quota_us":{},"period_us":100000,"burst_us":0,"cpus":"{cpus}","mems":"0-1","kernel_release":"6.1.0","throttle_model":"runqueue","probe":"tp_btf","threshold_ns":0,
            "topology":{{"nodes":[{{"id":0,"cpus":"0-23,48-71"}},{{"id":1,"cpus":"24-47,72-95"}}],
            "gpus":[{{"index":0,"numa_node":0}},{{"index":1,"numa_node":0}},{{"index":2,"numa_node":0}},{{"index":3,"numa_node":0}},{{"index":4,"numa_node":1}},{{"index":5,"numa_node":1}},{{"index":6,"numa_node":1}},{{"index":7,"numa_node":1}}],
            "container_gpus":[{gpus}]}}}}"#,
            quota_us.map_or("null".into(), |q| q.to_string())
        )
        .replace('\n', "");
        let l: Line = serde_json::from_str(&line).unwrap();
        let mut c = Container::default();
        c.add(l.ts, l.record);
        assert!(c.start.as_ref().is_some_and(|s| s.topology.is_some()));
        c
    }

    #[test]
    fn gpus_on_node_1_and_every_cpu_advise_gpu_local() {
        // 8 CPUs of quota, all 96 CPUs, GPUs 4 and 5.
        let r = placement(&container("0-95", Some(800_000), "4,5")).expect("advice");
        assert_eq!((r.key.as_str(), r.value.as_str()), (KEY, "gpu-local"));
        assert_eq!(r.run_flag, "--cpuset 24-47,72-95");
        assert!(r.reason.contains("node 1"), "{}", r.reason);
        let e = r.predicted_effect.unwrap();
        assert_eq!(e.metric, "cpus_local_to_gpus");
        assert!(
            (e.observed - 0.5).abs() < 1e-9 && e.predicted == 1.0,
            "{e:?}"
        );
        // Already on node 1: nothing to say.
        assert!(placement(&container("24-47,72-95", Some(800_000), "4,5")).is_none());
        // A quota larger than node 1 (48 CPUs): narrowing would cost CPU.
        assert!(placement(&container("0-95", Some(6_000_000), "4,5")).is_none());
        // GPUs on both nodes, or no quota: no advice.
        assert!(placement(&container("0-95", Some(800_000), "3,4")).is_none());
        assert!(placement(&container("0-95", None, "4,5")).is_none());
    }

    #[test]
    fn no_gpu_spanning_two_nodes_advises_one_node() {
        // CPUs 20-29: 4 on node 0, 6 on node 1; 2 CPUs of quota.
        let r = placement(&container("20-29", Some(200_000), "")).expect("advice");
        assert_eq!(r.value, "numa:1");
        let e = r.predicted_effect.unwrap();
        assert_eq!(e.metric, "cpus_on_one_node");
        assert!((e.observed - 0.6).abs() < 1e-9, "{e:?}");
        assert!(
            placement(&container("0-7", Some(200_000), "")).is_none(),
            "one node already"
        );
    }
}
