//! The typed reading of a bundle's `config.json`: the parts throttlewatch
//! reads (annotations, the process environment, the CPU resources). Taken
//! from the document [`SpecFile`] read, never from a second read of the file.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;
use throttlewatch_core::units::UnitError;
use throttlewatch_core::CpuList;

use crate::spec_file::{SpecError, SpecFile};

/// Annotations by which CRI runtimes mark a pod's sandbox (pause)
/// container: (key, value). containerd's CRI plugin and CRI-O.
pub const POD_SANDBOX_MARKERS: [(&str, &str); 2] = [
    ("io.kubernetes.cri.container-type", "sandbox"),
    ("io.kubernetes.cri-o.ContainerType", "sandbox"),
];

/// Whether annotations (looked up by `get`) mark a pod sandbox container.
/// It runs no workload (`pause` sleeps), so throttlewatch leaves it alone:
/// no hooks, no QoS, no log. The pod's containers carry the sandbox's id
/// and names in their own annotations.
pub fn is_pod_sandbox<'a>(get: impl Fn(&str) -> Option<&'a str>) -> bool {
    POD_SANDBOX_MARKERS
        .iter()
        .any(|(k, v)| get(k).is_some_and(|x| x == *v))
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct BundleSpec {
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub process: Option<SpecProcess>,
    #[serde(default)]
    pub linux: Option<Linux>,
    #[serde(default)]
    pub hostname: Option<String>,
}

#[cfg(test)]
impl BundleSpec {
    /// A spec with these annotations and environment (unit tests).
    pub(crate) fn with(annotations: &[(&str, &str)], env: &[&str]) -> BundleSpec {
        BundleSpec {
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            process: Some(SpecProcess {
                env: env.iter().map(|s| s.to_string()).collect(),
            }),
            ..Default::default()
        }
    }
}

/// The spec's `process` section: the container's environment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct SpecProcess {
    #[serde(default)]
    pub env: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Linux {
    #[serde(default)]
    pub cgroups_path: Option<String>,
    #[serde(default)]
    pub resources: Option<Resources>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Resources {
    #[serde(default)]
    pub cpu: Option<Cpu>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Cpu {
    #[serde(default)]
    pub quota: Option<i64>,
    #[serde(default)]
    pub period: Option<u64>,
    /// The cpuset the orchestrator set (kubelet's CPU manager, `docker
    /// --cpuset-cpus`), in the kernel's list format.
    #[serde(default)]
    pub cpus: Option<String>,
}

impl SpecFile {
    /// The typed reading (annotations, environment, CPU resources).
    pub fn typed(&self) -> Result<BundleSpec, SpecError> {
        BundleSpec::from_value(&self.value).map_err(|source| SpecError::Shape {
            path: self.path.clone(),
            source,
        })
    }
}

impl BundleSpec {
    /// Read `<bundle>/config.json` (see [`SpecFile::read`]) and type it.
    pub fn load(bundle: &Path) -> Result<BundleSpec, SpecError> {
        SpecFile::read(bundle)?.typed()
    }

    /// The typed view of a spec document (deserialized from a borrow: no
    /// copy of the whole spec). Fields it does not name are ignored.
    pub fn from_value(v: &Value) -> Result<BundleSpec, serde_json::Error> {
        BundleSpec::deserialize(v)
    }

    pub fn env(&self) -> &[String] {
        self.process
            .as_ref()
            .map(|p| p.env.as_slice())
            .unwrap_or_default()
    }

    /// The spec's CPU quota and period in µs (None: no quota).
    pub fn cpu_quota(&self) -> (Option<u64>, Option<u64>) {
        let cpu = self
            .linux
            .as_ref()
            .and_then(|l| l.resources.as_ref())
            .and_then(|r| r.cpu.as_ref());
        let quota = cpu
            .and_then(|c| c.quota)
            .filter(|q| *q > 0)
            .map(|q| q as u64);
        (quota, cpu.and_then(|c| c.period))
    }

    /// `linux.resources.cpu.cpus` when set and not empty: the orchestrator's
    /// cpuset, which QoS may narrow but never widen or replace. A value that
    /// is not a CPU list is an error naming it.
    pub fn orchestrator_cpus(&self) -> Result<Option<CpuList>, UnitError> {
        let cpus = self
            .linux
            .as_ref()
            .and_then(|l| l.resources.as_ref())
            .and_then(|r| r.cpu.as_ref())
            .and_then(|c| c.cpus.as_deref())
            .map(str::trim)
            .filter(|c| !c.is_empty());
        cpus.map(|c| CpuList::parse("linux.resources.cpu.cpus", c))
            .transpose()
    }

    /// See [`is_pod_sandbox`].
    pub fn is_pod_sandbox(&self) -> bool {
        is_pod_sandbox(|k| self.annotations.get(k).map(String::as_str))
    }

    /// A display name from well-known annotations (Kubernetes, nerdctl).
    pub fn container_name(&self) -> String {
        const KEYS: [&str; 3] = [
            "io.kubernetes.cri.container-name",
            "io.kubernetes.container.name",
            "nerdctl/name",
        ];
        KEYS.iter()
            .find_map(|k| self.annotations.get(*k))
            .cloned()
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_the_fields_it_needs() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join(crate::spec_file::CONFIG_JSON),
            r#"{"ociVersion":"1.0.2","process":{"env":["A=1"],"args":["sh"]},"annotations":{"throttlewatch.io/cpu-burst":"20ms"},
               "linux":{"cgroupsPath":"/tw/c1","resources":{"cpu":{"quota":30000,"period":100000}}},"unknown":{"x":1}}"#,
        )
        .unwrap();
        let s = BundleSpec::load(d.path()).unwrap();
        assert_eq!(s.env(), ["A=1".to_string()]);
        assert_eq!(s.cpu_quota(), (Some(30_000), Some(100_000)));
        assert_eq!(s.annotations["throttlewatch.io/cpu-burst"], "20ms");
    }

    #[test]
    fn pod_sandboxes_are_recognised() {
        let spec = |ann: &str| -> BundleSpec {
            serde_json::from_str(&format!(r#"{{"annotations":{{{ann}}}}}"#)).unwrap()
        };
        assert!(spec(r#""io.kubernetes.cri.container-type":"sandbox""#).is_pod_sandbox());
        assert!(spec(r#""io.kubernetes.cri-o.ContainerType":"sandbox""#).is_pod_sandbox());
        assert!(!spec(r#""io.kubernetes.cri.container-type":"container""#).is_pod_sandbox());
        assert!(!spec("").is_pod_sandbox());
    }
}
