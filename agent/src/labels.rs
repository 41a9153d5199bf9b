//! Who a watched container is, as the metrics label it and the log's
//! `start` record names it (Kubernetes names from the OCI annotations).

use std::collections::BTreeMap;

use prometheus_client::encoding::EncodeLabelSet;

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContainerLabels {
    pub container_id: String,
    pub container_name: String,
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

/// Annotation keys that name the Kubernetes objects (kubelet/dockershim and CRI containerd).
const NAMESPACE_KEYS: [&str; 2] = [
    "io.kubernetes.pod.namespace",
    "io.kubernetes.cri.sandbox-namespace",
];
const POD_KEYS: [&str; 2] = ["io.kubernetes.pod.name", "io.kubernetes.cri.sandbox-name"];
const CONTAINER_KEYS: [&str; 2] = [
    "io.kubernetes.container.name",
    "io.kubernetes.cri.container-name",
];

impl ContainerLabels {
    pub fn new(id: &str, name: &str, annotations: &BTreeMap<String, String>) -> ContainerLabels {
        let pick = |keys: &[&str]| {
            keys.iter()
                .find_map(|k| annotations.get(*k))
                .cloned()
                .unwrap_or_default()
        };
        ContainerLabels {
            container_id: id.into(),
            container_name: name.into(),
            namespace: pick(&NAMESPACE_KEYS),
            pod: pick(&POD_KEYS),
            container: pick(&CONTAINER_KEYS),
        }
    }

    /// A container outside Kubernetes (`run`, `watch`): an id and a name only.
    pub fn plain(id: &str, name: &str) -> ContainerLabels {
        ContainerLabels::new(id, name, &BTreeMap::new())
    }

    /// The label subset written into the log's `start` record.
    pub fn as_map(&self) -> BTreeMap<String, String> {
        [
            ("k8s_namespace", &self.namespace),
            ("k8s_pod", &self.pod),
            ("k8s_container", &self.container),
        ]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_names_from_either_runtime() {
        let a: BTreeMap<String, String> = [
            ("io.kubernetes.cri.sandbox-namespace", "ns"),
            ("io.kubernetes.pod.name", "pod"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let l = ContainerLabels::new("id", "name", &a);
        assert_eq!((l.namespace.as_str(), l.pod.as_str()), ("ns", "pod"));
        let m = l.as_map();
        assert_eq!(m.len(), 2, "{m:?}");
        assert!(!m.contains_key("k8s_container"));
        assert!(ContainerLabels::plain("x", "y").as_map().is_empty());
    }
}
