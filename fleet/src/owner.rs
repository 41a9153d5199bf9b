//! Which workload a pod belongs to: from kube-state-metrics' owner series
//! where Prometheus has them (`kube_pod_owner`, `kube_replicaset_owner`,
//! `kube_job_owner`), else from the pod name's pattern, which the
//! controllers write: a Deployment's pods are `<name>-<pod-template-hash>-<5>`,
//! a CronJob's `<name>-<minutes since epoch>-<5>`, a StatefulSet's
//! `<name>-<ordinal>`, a DaemonSet's and a Job's `<name>-<5>` (the two
//! cannot be told apart by name). The random parts use Kubernetes'
//! `rand.String` alphabet (`k8s.io/apimachinery/pkg/util/rand`:
//! "bcdfghjklmnpqrstvwxz2456789").

use std::collections::HashMap;

use serde::Serialize;

const ALPHABET: &str = "bcdfghjklmnpqrstvwxz2456789";

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Owner {
    pub kind: String,
    pub name: String,
}

/// Where the owners came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OwnerSource {
    KubeStateMetrics,
    PodName,
}

fn random(s: &str, min: usize, max: usize) -> bool {
    (min..=max).contains(&s.len()) && s.chars().all(|c| ALPHABET.contains(c))
}

/// The owner a pod's name implies.
pub fn from_pod_name(pod: &str) -> Owner {
    let parts: Vec<&str> = pod.rsplitn(3, '-').collect();
    let o = |kind: &str, name: &str| Owner {
        kind: kind.into(),
        name: name.into(),
    };
    match parts.as_slice() {
        [suffix, minutes, name]
            if random(suffix, 5, 5)
                && minutes.len() >= 8
                && minutes.chars().all(|c| c.is_ascii_digit()) =>
        {
            o("CronJob", name)
        }
        [suffix, hash, name] if random(suffix, 5, 5) && random(hash, 6, 10) && !name.is_empty() => {
            o("Deployment", name)
        }
        [ordinal, ..] if !ordinal.is_empty() && ordinal.chars().all(|c| c.is_ascii_digit()) => {
            o("StatefulSet", &pod[..pod.len() - ordinal.len() - 1])
        }
        [suffix, ..] if random(suffix, 5, 5) && pod.len() > 6 => {
            o("DaemonSet/Job", &pod[..pod.len() - 6])
        }
        _ => o("Pod", pod),
    }
}

/// Owners read from kube-state-metrics: pod → (kind, name) and
/// ReplicaSet/Job → (kind, name), resolved to the top owner.
#[derive(Debug, Default)]
pub struct KsmOwners {
    pub pods: HashMap<(String, String), Owner>,
    pub sets: HashMap<(String, String, String), Owner>,
}

impl KsmOwners {
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// The pod's workload: its owner, and the ReplicaSet's or Job's owner
    /// above it (a Deployment, a CronJob) where there is one.
    pub fn owner_of(&self, namespace: &str, pod: &str) -> Option<Owner> {
        let o = self.pods.get(&(namespace.to_string(), pod.to_string()))?;
        if o.kind == "ReplicaSet" || o.kind == "Job" {
            if let Some(up) = self
                .sets
                .get(&(namespace.to_string(), o.kind.clone(), o.name.clone()))
                .filter(|u| !u.kind.is_empty() && u.kind != "<none>")
            {
                return Some(up.clone());
            }
        }
        Some(o.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_names_as_the_controllers_write_them() {
        let k = |p: &str| {
            let o = from_pod_name(p);
            (o.kind, o.name)
        };
        assert_eq!(
            k("web-7d9f8b6c5d-x2k4p"),
            ("Deployment".into(), "web".into())
        );
        assert_eq!(
            k("my-api-v2-5c8d7f9b4-qwxzt"),
            ("Deployment".into(), "my-api-v2".into())
        );
        assert_eq!(
            k("backup-28950720-tq5rs"),
            ("CronJob".into(), "backup".into())
        );
        assert_eq!(k("db-0"), ("StatefulSet".into(), "db".into()));
        assert_eq!(
            k("kafka-broker-12"),
            ("StatefulSet".into(), "kafka-broker".into())
        );
        assert_eq!(
            k("fluentd-x7k2p"),
            ("DaemonSet/Job".into(), "fluentd".into())
        );
        assert_eq!(k("standalone"), ("Pod".into(), "standalone".into()));
        // Vowels are not in the alphabet: "a-train" is no hash.
        assert_eq!(k("hello-world"), ("Pod".into(), "hello-world".into()));
    }

    #[test]
    fn kube_state_metrics_owners_resolve_to_the_top() {
        let mut k = KsmOwners::default();
        let o = |kind: &str, name: &str| Owner {
            kind: kind.into(),
            name: name.into(),
        };
        let key = |p: &str| ("shop".to_string(), p.to_string());
        k.pods.insert(key("web-abc-x"), o("ReplicaSet", "web-abc"));
        k.pods.insert(key("job-1-y"), o("Job", "nightly-28950720"));
        k.pods.insert(key("bare-rs-z"), o("ReplicaSet", "bare-rs"));
        k.pods.insert(key("db-0"), o("StatefulSet", "db"));
        k.sets.insert(
            ("shop".into(), "ReplicaSet".into(), "web-abc".into()),
            o("Deployment", "web"),
        );
        k.sets.insert(
            ("shop".into(), "Job".into(), "nightly-28950720".into()),
            o("CronJob", "nightly"),
        );
        k.sets.insert(
            ("shop".into(), "ReplicaSet".into(), "bare-rs".into()),
            o("<none>", "<none>"),
        );
        assert_eq!(
            k.owner_of("shop", "web-abc-x"),
            Some(o("Deployment", "web"))
        );
        assert_eq!(k.owner_of("shop", "job-1-y"), Some(o("CronJob", "nightly")));
        assert_eq!(
            k.owner_of("shop", "bare-rs-z"),
            Some(o("ReplicaSet", "bare-rs"))
        );
        assert_eq!(k.owner_of("shop", "db-0"), Some(o("StatefulSet", "db")));
        assert_eq!(
            k.owner_of("other", "db-0"),
            None,
            "not known: the pod name decides"
        );
    }
}
