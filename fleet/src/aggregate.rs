//! Replicas into workloads (namespace + owner + container name), and the
//! workload's answer.
//!
//! **The recommendation** is the agent's own per-replica advice (the node
//! report's first applicable recommendation on that replica's log: the
//! same replay, the same rules and significance bound; agent/src/daemon/advice.rs),
//! aggregated by one rule: the key carried by the replicas that hold most
//! of the advised throttled time, and for that key **the largest value any
//! replica was advised** (a limit or a burst; KRR takes the max of per-pod
//! percentiles for the same reason). A pod template serves every replica,
//! and the replay's throttled time falls as the quota or burst rises, so
//! the largest keeps each replica at or under its own prediction; a
//! smaller one would leave the worst replica throttled. One replica: its
//! advice, exactly as its node report gives it. The predicted throttled
//! time is the sum of each advised replica's observed time × its own
//! predicted ratio (an upper bound at the larger value) and the others'
//! observed time unchanged. No replica with advice: no advice.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

use crate::collect::Replica;
use crate::hist::Hist;
use crate::owner::{from_pod_name, KsmOwners, Owner, OwnerSource};
use crate::patch;

/// Causes that are the limit's, and the CPUs others hold (the agent's
/// `runnable_waiting_seconds` causes).
const LIMIT_CAUSES: [&str; 2] = ["own_limit", "ancestor_limit"];
const CONTENTION_CAUSES: [&str; 2] = ["other_containers", "host"];

#[derive(Debug, Clone, Serialize)]
pub struct ReplicaRow {
    pub pod: String,
    pub node: String,
    pub throttled_seconds: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advice: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Spread {
    /// `alike`, or `uneven` (a replica more than twice the median or under half of it).
    pub verdict: &'static str,
    pub detail: String,
    pub per_replica: Vec<ReplicaRow>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FleetRecommendation {
    pub key: String,
    pub value: String,
    /// How many replicas were advised this key, and this value.
    pub advised_replicas: usize,
    pub observed_throttled_seconds: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_throttled_seconds: Option<f64>,
    pub rule: String,
    pub kubectl_patch: String,
    pub kustomize_patch: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Workload {
    pub namespace: String,
    pub workload: String,
    pub kind: String,
    pub container: String,
    pub owner_source: OwnerSource,
    pub replicas: usize,
    pub nodes: usize,
    pub node_names: Vec<String>,
    pub throttled_seconds: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throttled_period_share: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub freeze_p50_seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub freeze_p99_seconds: Option<f64>,
    /// Where the runnable time went: seconds by cause (summed over threads and replicas).
    pub runnable_waiting_seconds: BTreeMap<String, f64>,
    pub spread: Spread,
    /// Nodes where the CPUs others hold, not the limit, cost this workload time.
    pub contention_nodes: Vec<String>,
    pub recommendations: Vec<FleetRecommendation>,
}

/// Group replicas into workloads, ranked by throttled time (most first).
pub fn workloads(replicas: Vec<Replica>, ksm: &KsmOwners, window_s: f64) -> Vec<Workload> {
    let mut groups: BTreeMap<(String, Owner, String), (OwnerSource, Vec<Replica>)> =
        BTreeMap::new();
    for r in replicas {
        let (owner, src) = match ksm.owner_of(&r.namespace, &r.pod) {
            Some(o) => (o, OwnerSource::KubeStateMetrics),
            None => (from_pod_name(&r.pod), OwnerSource::PodName),
        };
        let g = groups
            .entry((r.namespace.clone(), owner, r.container.clone()))
            .or_insert((src, vec![]));
        g.1.push(r);
    }
    let mut out: Vec<Workload> = groups
        .into_iter()
        .map(|((ns, owner, container), (src, rs))| {
            workload(ns, owner, container, src, rs, window_s)
        })
        .collect();
    out.sort_by(|a, b| {
        b.throttled_seconds
            .total_cmp(&a.throttled_seconds)
            .then_with(|| (&a.namespace, &a.workload).cmp(&(&b.namespace, &b.workload)))
    });
    out
}

fn workload(
    ns: String,
    owner: Owner,
    container: String,
    src: OwnerSource,
    rs: Vec<Replica>,
    window_s: f64,
) -> Workload {
    let pods: BTreeSet<&str> = rs.iter().map(|r| r.pod.as_str()).collect();
    let nodes: BTreeSet<String> = rs.iter().map(|r| r.node.clone()).collect();
    let throttled: f64 = rs.iter().map(|r| r.throttled_s).sum();
    let periods: f64 = rs.iter().map(|r| r.periods).sum();
    let tp: f64 = rs.iter().map(|r| r.throttled_periods).sum();
    let mut freezes = Hist::default();
    let mut waiting: BTreeMap<String, f64> = BTreeMap::new();
    for r in &rs {
        freezes.merge(&r.freezes);
        for (c, s) in &r.waiting {
            *waiting.entry(c.clone()).or_default() += s;
        }
    }
    let recommendations = recommend(&ns, &owner, &container, &rs)
        .into_iter()
        .collect();
    Workload {
        replicas: pods.len(),
        nodes: nodes.len(),
        node_names: nodes.iter().cloned().collect(),
        throttled_seconds: throttled,
        throttled_period_share: (periods > 0.0).then(|| tp / periods),
        freeze_p50_seconds: freezes.quantile(0.5),
        freeze_p99_seconds: freezes.quantile(0.99),
        runnable_waiting_seconds: waiting,
        spread: spread(&rs),
        contention_nodes: contention_nodes(&rs, window_s),
        recommendations,
        namespace: ns,
        workload: owner.name,
        kind: owner.kind,
        container,
        owner_source: src,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn spread(rs: &[Replica]) -> Spread {
    let per_replica: Vec<ReplicaRow> = rs
        .iter()
        .map(|r| ReplicaRow {
            pod: r.pod.clone(),
            node: r.node.clone(),
            throttled_seconds: r.throttled_s,
            advice: r.advice.as_ref().map(|a| format!("{}={}", a.key, a.value)),
        })
        .collect();
    let m = median(rs.iter().map(|r| r.throttled_s).collect());
    let odd: Vec<String> = rs
        .iter()
        .filter(|r| {
            rs.len() > 1 && (r.throttled_s > 2.0 * m + 0.1 || r.throttled_s + 0.1 < m / 2.0)
        })
        .map(|r| {
            format!(
                "{} on {} throttled {:.1} s (median {:.1} s)",
                r.pod, r.node, r.throttled_s, m
            )
        })
        .collect();
    Spread {
        verdict: if odd.is_empty() { "alike" } else { "uneven" },
        detail: if odd.is_empty() {
            format!(
                "{} replica(s) within a factor of 2 of the median {m:.1} s",
                rs.len()
            )
        } else {
            odd.join("; ")
        },
        per_replica,
    }
}

/// Nodes whose replicas waited longer for CPUs others held than their
/// limits froze them, by the report's significance bound (100 ms and 1 %
/// of the window per replica there).
fn contention_nodes(rs: &[Replica], window_s: f64) -> Vec<String> {
    let mut by: BTreeMap<&str, (f64, f64, usize)> = BTreeMap::new();
    for r in rs {
        let e = by.entry(&r.node).or_default();
        e.0 += CONTENTION_CAUSES
            .iter()
            .filter_map(|c| r.waiting.get(*c))
            .sum::<f64>();
        e.1 += LIMIT_CAUSES
            .iter()
            .filter_map(|c| r.waiting.get(*c))
            .sum::<f64>();
        e.2 += 1;
    }
    by.into_iter()
        .filter(|(_, (wait, lim, n))| {
            let wall_ns = (window_s * *n as f64 * 1e9) as u64;
            wait > lim && throttlewatch_report::recommend::significant((wait * 1e9) as u64, wall_ns)
        })
        .map(|(n, _)| n.to_string())
        .collect()
}

fn recommend(
    ns: &str,
    owner: &Owner,
    container: &str,
    rs: &[Replica],
) -> Option<FleetRecommendation> {
    // The key carried by the replicas holding most of the advised throttled time.
    let mut weight: HashMap<&str, f64> = HashMap::new();
    for r in rs {
        if let Some(a) = &r.advice {
            *weight.entry(a.key.as_str()).or_default() += r.throttled_s.max(1e-9);
        }
    }
    let key = weight
        .into_iter()
        .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(a.0)))?
        .0
        .to_string();
    let advised: Vec<&Replica> = rs
        .iter()
        .filter(|r| r.advice.as_ref().is_some_and(|a| a.key == key))
        .collect();
    let top = advised
        .iter()
        .filter_map(|r| r.advice.as_ref())
        .max_by(|a, b| a.number.total_cmp(&b.number))?
        .clone();
    let observed: f64 = rs.iter().map(|r| r.throttled_s).sum();
    let predicted = advised
        .iter()
        .all(|r| r.advice.as_ref().and_then(|a| a.throttled_ratio).is_some())
        .then(|| {
            rs.iter()
                .map(|r| match &r.advice {
                    Some(a) if a.key == key => r.throttled_s * a.throttled_ratio.unwrap_or(1.0),
                    _ => r.throttled_s,
                })
                .sum()
        });
    let same = advised
        .iter()
        .filter(|r| r.advice.as_ref().is_some_and(|a| a.value == top.value))
        .count();
    Some(FleetRecommendation {
        rule: if rs.len() == 1 {
            "the replica's own advice (its node report's)".into()
        } else {
            format!(
                "the largest of the {} advised replicas' {key} ({same} advised {}); a pod template serves every replica",
                advised.len(),
                top.value
            )
        },
        kubectl_patch: patch::kubectl(ns, owner, container, &key, &top.value),
        kustomize_patch: patch::kustomize(ns, owner, container, &key, &top.value),
        key,
        value: top.value,
        advised_replicas: advised.len(),
        observed_throttled_seconds: observed,
        predicted_throttled_seconds: predicted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::ReplicaAdvice;

    fn replica(
        pod: &str,
        node: &str,
        throttled: f64,
        advice: Option<(&str, &str, f64, f64)>,
    ) -> Replica {
        Replica {
            namespace: "shop".into(),
            pod: pod.into(),
            container: "app".into(),
            node: node.into(),
            throttled_s: throttled,
            periods: 100.0,
            throttled_periods: 50.0,
            advice: advice.map(|(k, v, n, r)| ReplicaAdvice {
                key: k.into(),
                value: v.into(),
                number: n,
                throttled_ratio: Some(r),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_largest_advised_value_serves_every_replica() {
        let lim = "resources.limits.cpu";
        let rs = vec![
            replica(
                "web-7d9f8b6c5d-x2k4p",
                "n1",
                10.0,
                Some((lim, "0.7", 0.7, 0.05)),
            ),
            replica(
                "web-7d9f8b6c5d-q2w4z",
                "n2",
                12.0,
                Some((lim, "1", 1.0, 0.02)),
            ),
            replica("web-7d9f8b6c5d-b5c6d", "n3", 1.0, None),
            replica("db-0", "n1", 0.0, None),
        ];
        let w = workloads(rs, &KsmOwners::default(), 60.0);
        assert_eq!(w.len(), 2);
        let web = &w[0];
        assert_eq!(
            (web.workload.as_str(), web.kind.as_str()),
            ("web", "Deployment")
        );
        assert_eq!((web.replicas, web.nodes), (3, 3));
        assert_eq!(web.throttled_seconds, 23.0);
        let r = &web.recommendations[0];
        assert_eq!(
            (r.key.as_str(), r.value.as_str(), r.advised_replicas),
            (lim, "1", 2)
        );
        let p = r.predicted_throttled_seconds.unwrap();
        assert!((p - (10.0 * 0.05 + 12.0 * 0.02 + 1.0)).abs() < 1e-9, "{p}");
        assert!(
            r.kubectl_patch.contains("\"cpu\":\"1\"")
                && r.kubectl_patch.contains("patch deployment web")
        );
        assert_eq!(web.spread.verdict, "uneven", "{:?}", web.spread);
        let db = &w[1];
        assert_eq!(db.kind, "StatefulSet");
        assert!(
            db.recommendations.is_empty(),
            "no advised replica: no advice"
        );
    }

    #[test]
    fn one_replica_gets_its_own_advice_and_contention_names_the_node() {
        let mut r = replica(
            "api-5c8d7f9b4-qwxzt",
            "busy-node",
            0.2,
            Some(("throttlewatch.io/cpuset-exclusive", "true", 1.0, 1.0)),
        );
        r.advice.as_mut().unwrap().throttled_ratio = None;
        r.waiting.insert("host".into(), 5.0);
        r.waiting.insert("own_limit".into(), 0.2);
        let w = workloads(vec![r], &KsmOwners::default(), 60.0);
        let rec = &w[0].recommendations[0];
        assert_eq!(rec.value, "true");
        assert_eq!(rec.predicted_throttled_seconds, None);
        assert!(rec.rule.contains("its node report"));
        assert_eq!(w[0].contention_nodes, vec!["busy-node".to_string()]);
        assert!(rec
            .kubectl_patch
            .contains("throttlewatch.io/cpuset-exclusive"));
    }
}
