//! A Pod spec (as `kubectl kustomize` renders it, parsed into JSON values)
//! turned into the CRI calls kubelet makes for it, for the tests that run
//! packaging/kubernetes' DaemonSets through a real CRI (no kubelet runs
//! here). What is reproduced, from kubelet 1.32's sources:
//!
//! - `pkg/kubelet/kuberuntime/kuberuntime_sandbox.go`,
//!   `generatePodSandboxConfig` / `generatePodSandboxLinuxConfig`: the
//!   sandbox's metadata (name, namespace, uid, attempt), kubelet's labels,
//!   the pod's annotations, the cgroup parent, and the namespace options
//!   (`hostNetwork`, `hostPID` → `NODE`; else `POD` network and
//!   `CONTAINER` pid, as `namespacesForPod` in `helpers_linux.go` /
//!   `util.go`), `privileged` when any container is;
//! - `kuberuntime_container.go`, `generateContainerConfig`: the command
//!   (`command` + `args`), the working dir, kubelet's labels and
//!   annotations (among them `io.kubernetes.pod.terminationGracePeriod`),
//!   the environment (`env` values and `valueFrom.configMapKeyRef`,
//!   `envFrom.configMapRef`), the mounts (`makeMounts` in
//!   `kubelet_pods.go`: a hostPath volume's path, `readOnly`, and
//!   `mountPropagation` → `PROPAGATION_PRIVATE`, `_HOST_TO_CONTAINER`,
//!   `_BIDIRECTIONAL`; a configMap volume is a directory kubelet writes the
//!   keys to and bind-mounts read-only);
//! - `kuberuntime_container_linux.go`, `generateLinuxContainerResources` /
//!   `calculateLinuxResources`: CPU requests into shares
//!   (`milliCPUToShares`: milli × 1024 / 1000, at least 2), CPU limits into
//!   a CFS quota over a 100 ms period (`milliCPUToQuota`, at least 1 ms),
//!   the memory limit in bytes; the security context's `privileged`;
//! - `killContainer`: StopContainer's timeout is the pod's
//!   `terminationGracePeriodSeconds` (default 30).
//!
//! Host paths go through [`HostPaths`], so a test's DaemonSet writes to
//! private directories where the manifests name the node's.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use k8s_cri::v1 as api;
use serde_json::Value;

use super::pods::{CONTAINER_NAME_LABEL, POD_NAMESPACE_LABEL, POD_NAME_LABEL, POD_UID_LABEL};

/// kubelet's annotation with the pod's grace period (`kuberuntime_labels.go`).
pub const GRACE_ANNOTATION: &str = "io.kubernetes.pod.terminationGracePeriod";
/// kubelet's default `terminationGracePeriodSeconds`.
pub const DEFAULT_GRACE_S: i64 = 30;

/// Where each host path of the manifests is on this machine: the longest
/// prefix listed wins; a path under none is used as it is.
#[derive(Debug, Clone, Default)]
pub struct HostPaths(pub Vec<(PathBuf, PathBuf)>);

impl HostPaths {
    pub fn resolve(&self, p: &str) -> PathBuf {
        let p = Path::new(p);
        self.0
            .iter()
            .filter(|(from, _)| p.starts_with(from))
            .max_by_key(|(from, _)| from.as_os_str().len())
            .map(|(from, to)| to.join(p.strip_prefix(from).unwrap()))
            .unwrap_or_else(|| p.to_path_buf())
    }
}

/// A pod spec ready for the CRI: the sandbox and each container's config,
/// the init containers apart (run to completion first, in order).
pub struct KubeletPod {
    pub sandbox: api::PodSandboxConfig,
    pub init_containers: Vec<api::ContainerConfig>,
    pub containers: Vec<api::ContainerConfig>,
    /// StopContainer's timeout (s).
    pub grace_s: i64,
}

/// What the translation needs besides the spec.
pub struct PodContext<'a> {
    pub name: &'a str,
    pub namespace: &'a str,
    pub uid: &'a str,
    /// The parent of the pod's cgroup (`<root>/pod<uid>` is the pod's).
    pub cgroup_root: &'a str,
    /// The ConfigMaps by name: key → text.
    pub config_maps: &'a HashMap<String, BTreeMap<String, String>>,
    pub host_paths: &'a HostPaths,
    /// Where kubelet's volume directories go (configMap volumes).
    pub volumes_dir: &'a Path,
}

fn str_of<'v>(v: &'v Value, key: &str) -> &'v str {
    v[key].as_str().unwrap_or("")
}

fn list(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or(&[])
}

/// kubelet's Linux namespaces for a pod (`namespacesForPod`).
pub fn namespaces(spec: &Value) -> api::NamespaceOption {
    let node_if = |key: &str, other: api::NamespaceMode| {
        if spec[key].as_bool() == Some(true) {
            api::NamespaceMode::Node as i32
        } else {
            other as i32
        }
    };
    api::NamespaceOption {
        network: node_if("hostNetwork", api::NamespaceMode::Pod),
        pid: node_if("hostPID", api::NamespaceMode::Container),
        ipc: node_if("hostIPC", api::NamespaceMode::Pod),
        ..Default::default()
    }
}

/// A Kubernetes CPU quantity in millicores ("250m", "2", "0.5").
pub fn milli_cpu(q: &Value) -> Option<i64> {
    let s = match q {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => return None,
    };
    match s.strip_suffix('m') {
        Some(m) => m.parse().ok(),
        None => s.parse::<f64>().ok().map(|c| (c * 1000.0).round() as i64),
    }
}

/// A Kubernetes memory quantity in bytes ("128Mi", "1G", "512").
pub fn bytes(q: &Value) -> Option<i64> {
    let s = q
        .as_str()
        .map(str::to_string)
        .or_else(|| q.as_i64().map(|n| n.to_string()))?;
    let units: [(&str, i64); 8] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    for (u, f) in units {
        if let Some(n) = s.strip_suffix(u) {
            return n.parse::<i64>().ok().map(|n| n * f);
        }
    }
    s.parse().ok()
}

/// `calculateLinuxResources`: shares from the request, quota from the limit.
pub fn resources(c: &Value) -> api::LinuxContainerResources {
    let r = &c["resources"];
    let (req, lim) = (
        milli_cpu(&r["requests"]["cpu"]),
        milli_cpu(&r["limits"]["cpu"]),
    );
    // kubelet: a limit without a request requests the limit.
    let shares = req.or(lim).map_or(2, |m| (m * 1024 / 1000).max(2));
    let period = 100_000;
    let quota = lim.map_or(0, |m| (m * period / 1000).max(1000));
    api::LinuxContainerResources {
        cpu_shares: shares,
        cpu_period: if lim.is_some() { period } else { 0 },
        cpu_quota: quota,
        memory_limit_in_bytes: bytes(&r["limits"]["memory"]).unwrap_or(0),
        ..Default::default()
    }
}

fn propagation(m: &Value) -> i32 {
    match str_of(m, "mountPropagation") {
        "HostToContainer" => api::MountPropagation::PropagationHostToContainer as i32,
        "Bidirectional" => api::MountPropagation::PropagationBidirectional as i32,
        _ => api::MountPropagation::PropagationPrivate as i32,
    }
}

impl PodContext<'_> {
    /// The host directory behind a volume: a hostPath (created when its
    /// type says `DirectoryOrCreate`), or a configMap's keys written out.
    fn volume_dir(&self, spec: &Value, name: &str) -> PathBuf {
        let v = list(&spec["volumes"])
            .iter()
            .find(|v| str_of(v, "name") == name)
            .unwrap_or_else(|| panic!("volume {name:?} is not in the pod's volumes"));
        if v["hostPath"].is_object() {
            let p = self.host_paths.resolve(str_of(&v["hostPath"], "path"));
            if str_of(&v["hostPath"], "type") == "DirectoryOrCreate" {
                std::fs::create_dir_all(&p).unwrap();
            }
            return p;
        }
        let cm = str_of(&v["configMap"], "name");
        let data = self
            .config_maps
            .get(cm)
            .unwrap_or_else(|| panic!("configMap {cm:?} of volume {name:?} not rendered"));
        let dir = self
            .volumes_dir
            .join(format!("{}/kubernetes.io~configmap/{name}", self.uid));
        std::fs::create_dir_all(&dir).unwrap();
        let mode = v["configMap"]["defaultMode"].as_u64().unwrap_or(0o644) as u32;
        for (k, text) in data {
            let f = dir.join(k);
            std::fs::write(&f, text).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        dir
    }

    fn mounts(&self, spec: &Value, c: &Value) -> Vec<api::Mount> {
        list(&c["volumeMounts"])
            .iter()
            .map(|m| {
                let name = str_of(m, "name");
                let is_cm = list(&spec["volumes"])
                    .iter()
                    .any(|v| str_of(v, "name") == name && v["configMap"].is_object());
                api::Mount {
                    container_path: str_of(m, "mountPath").into(),
                    host_path: self.volume_dir(spec, name).display().to_string(),
                    readonly: m["readOnly"].as_bool() == Some(true) || is_cm,
                    propagation: propagation(m),
                    ..Default::default()
                }
            })
            .collect()
    }

    fn envs(&self, c: &Value) -> Vec<api::KeyValue> {
        let kv = |k: &str, v: &str| api::KeyValue {
            key: k.into(),
            value: v.into(),
        };
        let mut out = Vec::new();
        for from in list(&c["envFrom"]) {
            let cm = str_of(&from["configMapRef"], "name");
            for (k, v) in self.config_maps.get(cm).into_iter().flatten() {
                out.push(kv(k, v));
            }
        }
        for e in list(&c["env"]) {
            let r = &e["valueFrom"]["configMapKeyRef"];
            let value = if r.is_object() {
                let cm = self.config_maps.get(str_of(r, "name"));
                cm.and_then(|m| m.get(str_of(r, "key")))
                    .cloned()
                    .unwrap_or_default()
            } else {
                str_of(e, "value").to_string()
            };
            out.push(kv(str_of(e, "name"), &value));
        }
        out
    }

    /// `generateContainerConfig` for container `c` of `spec`.
    pub fn container(&self, spec: &Value, c: &Value, grace_s: i64) -> api::ContainerConfig {
        let name = str_of(c, "name");
        let labels = HashMap::from([
            (POD_NAME_LABEL.to_string(), self.name.to_string()),
            (POD_NAMESPACE_LABEL.to_string(), self.namespace.to_string()),
            (POD_UID_LABEL.to_string(), self.uid.to_string()),
            (CONTAINER_NAME_LABEL.to_string(), name.to_string()),
        ]);
        let annotations = HashMap::from([
            (GRACE_ANNOTATION.to_string(), grace_s.to_string()),
            (
                "io.kubernetes.container.restartCount".to_string(),
                "0".to_string(),
            ),
        ]);
        let strings = |v: &Value| {
            list(v)
                .iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect::<Vec<_>>()
        };
        let mut ns = namespaces(spec);
        // A container's own view: the pod's network and IPC, its pid
        // namespace unless hostPID.
        ns.target_id = String::new();
        api::ContainerConfig {
            metadata: Some(api::ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            image: Some(api::ImageSpec {
                image: str_of(c, "image").into(),
                ..Default::default()
            }),
            command: strings(&c["command"]),
            args: strings(&c["args"]),
            working_dir: str_of(c, "workingDir").into(),
            envs: self.envs(c),
            mounts: self.mounts(spec, c),
            labels,
            annotations,
            log_path: format!("{name}/0.log"),
            linux: Some(api::LinuxContainerConfig {
                resources: Some(resources(c)),
                security_context: Some(api::LinuxContainerSecurityContext {
                    privileged: c["securityContext"]["privileged"].as_bool() == Some(true),
                    namespace_options: Some(ns),
                    ..Default::default()
                }),
            }),
            ..Default::default()
        }
    }

    /// The whole pod: `generatePodSandboxConfig` and each container's config.
    pub fn pod(&self, spec: &Value, annotations: &HashMap<String, String>) -> KubeletPod {
        let grace_s = spec["terminationGracePeriodSeconds"]
            .as_i64()
            .unwrap_or(DEFAULT_GRACE_S);
        let all: Vec<&Value> = list(&spec["initContainers"])
            .iter()
            .chain(list(&spec["containers"]))
            .collect();
        let privileged = all
            .iter()
            .any(|c| c["securityContext"]["privileged"].as_bool() == Some(true));
        let sandbox = api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: self.name.into(),
                uid: self.uid.into(),
                namespace: self.namespace.into(),
                attempt: 0,
            }),
            // This sandbox's runc cannot set a hostname in a host UTS.
            hostname: String::new(),
            log_directory: self
                .volumes_dir
                .join(format!(
                    "logs/{}_{}_{}",
                    self.namespace, self.name, self.uid
                ))
                .display()
                .to_string(),
            labels: HashMap::from([
                (POD_NAME_LABEL.to_string(), self.name.to_string()),
                (POD_NAMESPACE_LABEL.to_string(), self.namespace.to_string()),
                (POD_UID_LABEL.to_string(), self.uid.to_string()),
            ]),
            annotations: annotations.clone(),
            linux: Some(api::LinuxPodSandboxConfig {
                cgroup_parent: format!("{}/pod{}", self.cgroup_root, self.uid),
                security_context: Some(api::LinuxSandboxSecurityContext {
                    namespace_options: Some(namespaces(spec)),
                    privileged,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let logs = PathBuf::from(&sandbox.log_directory);
        for c in &all {
            std::fs::create_dir_all(logs.join(str_of(c, "name"))).unwrap();
        }
        let configs = |key: &str| {
            list(&spec[key])
                .iter()
                .map(|c| self.container(spec, c, grace_s))
                .collect()
        };
        KubeletPod {
            sandbox,
            init_containers: configs("initContainers"),
            containers: configs("containers"),
            grace_s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn quantities_and_resources_as_kubelet_computes_them() {
        assert_eq!(milli_cpu(&json!("250m")), Some(250));
        assert_eq!(milli_cpu(&json!("2")), Some(2000));
        assert_eq!(milli_cpu(&json!(0.5)), Some(500));
        assert_eq!(bytes(&json!("128Mi")), Some(128 << 20));
        assert_eq!(bytes(&json!("1G")), Some(1_000_000_000));
        let r = resources(
            &json!({"resources": {"requests": {"cpu": "10m"}, "limits": {"memory": "32Mi"}}}),
        );
        assert_eq!((r.cpu_shares, r.cpu_quota, r.cpu_period), (10, 0, 0));
        assert_eq!(r.memory_limit_in_bytes, 32 << 20);
        let r = resources(&json!({"resources": {"limits": {"cpu": "500m"}}}));
        assert_eq!(
            (r.cpu_shares, r.cpu_quota, r.cpu_period),
            (512, 50_000, 100_000)
        );
        let r = resources(&json!({}));
        assert_eq!(r.cpu_shares, 2, "kubelet's minimum");
    }

    #[test]
    fn namespaces_and_host_paths() {
        let ns = namespaces(&json!({"hostPID": true}));
        assert_eq!(ns.pid, api::NamespaceMode::Node as i32);
        assert_eq!(ns.network, api::NamespaceMode::Pod as i32);
        let hp = HostPaths(vec![
            ("/run".into(), "/tmp/a".into()),
            ("/run/throttlewatch".into(), "/tmp/b".into()),
        ]);
        assert_eq!(hp.resolve("/run/throttlewatch/x"), Path::new("/tmp/b/x"));
        assert_eq!(hp.resolve("/run/other"), Path::new("/tmp/a/other"));
        assert_eq!(hp.resolve("/sys/fs/cgroup"), Path::new("/sys/fs/cgroup"));
    }
}
