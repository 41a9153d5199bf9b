//! Who a watched container is, as the metrics label it and the log's
//! `start` record names it (Kubernetes names from the OCI annotations).

use std::collections::BTreeMap;

use prometheus_client::encoding::EncodeLabelSet;
use throttlewatch_qos::{Key, QosClass};

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ContainerLabels {
    pub container_id: LabelValue,
    /// The id space (`ns-<containerd namespace>`, `root-<name>-<hash>`;
    /// empty for runc's default root): the same id in two scopes is two
    /// containers (core::container_key).
    pub scope: LabelValue,
    pub container_name: LabelValue,
    pub namespace: LabelValue,
    pub pod: LabelValue,
    pub container: LabelValue,
    /// `latency-critical`, `burstable`, `best-effort` (the
    /// `throttlewatch.io/qos-class` request) or empty: three values at most.
    pub qos_class: LabelValue,
}

/// A label value that a container chose (its id, names, annotations). The
/// text formats escape it (prometheus-client 0.25.2 and later escape `\\`,
/// `"` and line feed in every label value they write, so a pod named
/// `x"} 1\nforged{a="b` cannot add a series); the protobuf exposition
/// carries it as a length-delimited string, where nothing needs escaping.
/// Written here as it is: escaping it again would double the escapes.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub(crate) struct LabelValue(pub String);

impl LabelValue {
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for LabelValue {
    fn from(s: &str) -> Self {
        LabelValue(s.into())
    }
}

impl prometheus_client::encoding::EncodeLabelValue for LabelValue {
    fn encode(
        &self,
        encoder: &mut prometheus_client::encoding::LabelValueEncoder,
    ) -> Result<(), std::fmt::Error> {
        use std::fmt::Write;
        encoder.write_str(&self.0)
    }
}

/// Only the classes `QosClass` accepts become label values.
fn qos_class_name(v: &str) -> Option<&'static str> {
    Some(match QosClass::parse(v)? {
        QosClass::LatencyCritical => "latency-critical",
        QosClass::Burstable => "burstable",
        QosClass::BestEffort => "best-effort",
    })
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
    pub(crate) fn new(
        id: &str,
        name: &str,
        annotations: &BTreeMap<String, String>,
    ) -> ContainerLabels {
        let pick = |keys: &[&str]| {
            LabelValue(
                keys.iter()
                    .find_map(|k| annotations.get(*k))
                    .cloned()
                    .unwrap_or_default(),
            )
        };
        ContainerLabels {
            container_id: id.into(),
            scope: LabelValue::default(),
            container_name: name.into(),
            namespace: pick(&NAMESPACE_KEYS),
            pod: pick(&POD_KEYS),
            container: pick(&CONTAINER_KEYS),
            qos_class: annotations
                .get(&Key::QosClass.annotation())
                .and_then(|v| qos_class_name(v))
                .unwrap_or_default()
                .into(),
        }
    }

    /// The class the hook resolved (its `qos` summary: `request.qos_class`,
    /// from either the annotation or the environment channel) wins over
    /// the annotation read here.
    pub(crate) fn with_qos_summary(mut self, qos: Option<&serde_json::Value>) -> ContainerLabels {
        if let Some(c) = qos
            .and_then(|q| q["request"]["qos_class"].as_str())
            .and_then(qos_class_name)
        {
            self.qos_class = c.into();
        }
        self
    }

    /// The registration's id space, as the `scope` label.
    pub(crate) fn with_scope(
        mut self,
        scope: Option<&throttlewatch_core::Scope>,
    ) -> ContainerLabels {
        if let Some(s) = scope {
            self.scope = s.as_str().into();
        }
        self
    }

    /// A container outside Kubernetes (`run`, `watch`): an id and a name only.
    pub(crate) fn plain(id: &str, name: &str) -> ContainerLabels {
        ContainerLabels::new(id, name, &BTreeMap::new())
    }

    /// The label subset written into the log's `start` record.
    pub(crate) fn as_map(&self) -> BTreeMap<String, String> {
        [
            ("k8s_namespace", &self.namespace),
            ("k8s_pod", &self.pod),
            ("k8s_container", &self.container),
        ]
        .into_iter()
        .filter(|(_, v)| !v.0.is_empty())
        .map(|(k, v)| (k.to_string(), v.0.clone()))
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

    #[test]
    fn qos_class_only_from_the_known_classes() {
        let ann = |v: &str| -> BTreeMap<String, String> {
            [(Key::QosClass.annotation(), v.to_string())]
                .into_iter()
                .collect()
        };
        let l = ContainerLabels::new("id", "n", &ann(" latency-critical "));
        assert_eq!(l.qos_class.as_str(), "latency-critical");
        let l = ContainerLabels::new("id", "n", &ann("gold\"} 1"));
        assert_eq!(
            l.qos_class.as_str(),
            "",
            "an unknown class is no label value"
        );
        let summary = serde_json::json!({"request": {"qos_class": "best-effort"}});
        let l = l.with_qos_summary(Some(&summary));
        assert_eq!(l.qos_class.as_str(), "best-effort");
        let l = l.with_qos_summary(Some(&serde_json::json!({"request": {}})));
        assert_eq!(l.qos_class.as_str(), "best-effort", "kept without a class");
    }
}
