//! Pods and containers as kubelet asks the CRI for them.

use std::collections::HashMap;

use k8s_cri::v1 as api;

use super::node::CriNode;
use crate::containerd::IMAGE_NAME;

/// kubelet's pod and container labels (the CRI plugin copies metadata, not these).
pub const POD_NAME_LABEL: &str = "io.kubernetes.pod.name";
pub const POD_NAMESPACE_LABEL: &str = "io.kubernetes.pod.namespace";
pub const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";
pub const CONTAINER_NAME_LABEL: &str = "io.kubernetes.container.name";

/// A running pod sandbox and the configuration kubelet keeps for it (every
/// CreateContainer sends it again).
pub struct Pod {
    pub id: String,
    pub handler: String,
    pub config: api::PodSandboxConfig,
}

impl CriNode {
    /// A pod as kubelet asks for one with host networking: metadata and
    /// kubelet's labels, an empty hostname, the cgroup parent
    /// `<cgroup_root>/pod<uid>`, and `annotations`.
    pub fn pod_config(
        &self,
        name: &str,
        namespace: &str,
        annotations: &[(&str, &str)],
    ) -> api::PodSandboxConfig {
        let uid = format!("{:08x}-{}", std::process::id(), crate::unique());
        let labels = HashMap::from([
            (POD_NAME_LABEL.to_string(), name.to_string()),
            (POD_NAMESPACE_LABEL.to_string(), namespace.to_string()),
            (POD_UID_LABEL.to_string(), uid.clone()),
        ]);
        api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: name.into(),
                uid: uid.clone(),
                namespace: namespace.into(),
                attempt: 0,
            }),
            hostname: String::new(),
            labels,
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            linux: Some(api::LinuxPodSandboxConfig {
                cgroup_parent: format!("{}/pod{uid}", self.cgroup_root),
                security_context: Some(api::LinuxSandboxSecurityContext {
                    namespace_options: Some(host_network()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// RunPodSandbox through `handler` ("" = the default runtime).
    pub fn run_pod(&self, handler: &str, config: api::PodSandboxConfig) -> Result<Pod, String> {
        let req = api::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: handler.into(),
        };
        let r = self.call("RunPodSandbox", self.runtime().run_pod_sandbox(req))?;
        self.ids.lock().unwrap().push(r.pod_sandbox_id.clone());
        Ok(Pod {
            id: r.pod_sandbox_id,
            handler: handler.into(),
            config,
        })
    }

    /// CreateContainer in `pod` from the busybox image, running `cmd`, with
    /// kubelet's labels and, when given, a CFS quota and period in µs
    /// (`linux.resources`, as kubelet sets a CPU limit).
    pub fn create_container(
        &self,
        pod: &Pod,
        name: &str,
        cmd: &[&str],
        cpu: Option<(i64, i64)>,
    ) -> Result<String, String> {
        let meta = pod.config.metadata.clone().unwrap_or_default();
        let labels = HashMap::from([
            (POD_NAME_LABEL.to_string(), meta.name),
            (POD_NAMESPACE_LABEL.to_string(), meta.namespace),
            (POD_UID_LABEL.to_string(), meta.uid),
            (CONTAINER_NAME_LABEL.to_string(), name.to_string()),
        ]);
        let resources = cpu.map(|(quota, period)| api::LinuxContainerResources {
            cpu_quota: quota,
            cpu_period: period,
            cpu_shares: quota * 1024 / period,
            ..Default::default()
        });
        let config = api::ContainerConfig {
            metadata: Some(api::ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            image: Some(api::ImageSpec {
                image: IMAGE_NAME.into(),
                ..Default::default()
            }),
            command: cmd.iter().map(|s| s.to_string()).collect(),
            labels,
            linux: Some(api::LinuxContainerConfig {
                resources,
                security_context: Some(api::LinuxContainerSecurityContext {
                    namespace_options: Some(host_network()),
                    ..Default::default()
                }),
            }),
            ..Default::default()
        };
        let req = api::CreateContainerRequest {
            pod_sandbox_id: pod.id.clone(),
            config: Some(config),
            sandbox_config: Some(pod.config.clone()),
        };
        let r = self.call("CreateContainer", self.runtime().create_container(req))?;
        self.ids.lock().unwrap().push(r.container_id.clone());
        Ok(r.container_id)
    }

    /// CreateContainer in `pod` with a whole `config` (a pod spec kubelet
    /// would run: `kubelet_spec`).
    pub fn create_with(&self, pod: &Pod, config: api::ContainerConfig) -> Result<String, String> {
        let req = api::CreateContainerRequest {
            pod_sandbox_id: pod.id.clone(),
            config: Some(config),
            sandbox_config: Some(pod.config.clone()),
        };
        let r = self.call("CreateContainer", self.runtime().create_container(req))?;
        self.ids.lock().unwrap().push(r.container_id.clone());
        Ok(r.container_id)
    }

    /// StopContainer with kubelet's grace period (`timeout` s: SIGTERM,
    /// then SIGKILL after it).
    pub fn stop_container(&self, id: &str, timeout: i64) -> Result<(), String> {
        let req = api::StopContainerRequest {
            container_id: id.into(),
            timeout,
        };
        self.call("StopContainer", self.runtime().stop_container(req))
            .map(drop)
    }

    pub fn remove_container(&self, id: &str) -> Result<(), String> {
        let req = api::RemoveContainerRequest {
            container_id: id.into(),
        };
        self.call("RemoveContainer", self.runtime().remove_container(req))
            .map(drop)
    }

    pub fn start_container(&self, id: &str) -> Result<(), String> {
        let req = api::StartContainerRequest {
            container_id: id.into(),
        };
        self.call("StartContainer", self.runtime().start_container(req))
            .map(drop)
    }

    /// ContainerStatus (verbose: `info` holds the pid and the OCI spec).
    pub fn container_status(&self, id: &str) -> Result<api::ContainerStatusResponse, String> {
        let req = api::ContainerStatusRequest {
            container_id: id.into(),
            verbose: true,
        };
        self.call("ContainerStatus", self.runtime().container_status(req))
    }

    /// The container's state (`ContainerState` as i32) and exit code.
    pub fn container_state(&self, id: &str) -> Result<(api::ContainerState, i32), String> {
        let st = self
            .container_status(id)?
            .status
            .ok_or_else(|| format!("ContainerStatus {id}: no status"))?;
        Ok((st.state(), st.exit_code))
    }

    /// The init pid of a running container (from the verbose `info`).
    pub fn container_pid(&self, id: &str) -> Result<u32, String> {
        let r = self.container_status(id)?;
        let info = r
            .info
            .get("info")
            .ok_or_else(|| format!("ContainerStatus {id}: no verbose info"))?;
        let v: serde_json::Value = serde_json::from_str(info).map_err(|e| e.to_string())?;
        v["pid"]
            .as_u64()
            .filter(|p| *p > 0)
            .map(|p| p as u32)
            .ok_or_else(|| format!("ContainerStatus {id}: no pid in {info}"))
    }

    /// ContainerStats (CPU, memory: what kubelet reads for a container).
    pub fn container_stats(&self, id: &str) -> Result<api::ContainerStats, String> {
        let req = api::ContainerStatsRequest {
            container_id: id.into(),
        };
        self.call("ContainerStats", self.runtime().container_stats(req))?
            .stats
            .ok_or_else(|| format!("ContainerStats {id}: no stats"))
    }

    /// The names of the metrics ListPodSandboxMetrics gives for container
    /// `id` (sorted; containerd 2.x, 1.6 does not implement it).
    pub fn container_metric_names(&self, id: &str) -> Result<Vec<String>, String> {
        let req = api::ListPodSandboxMetricsRequest {};
        let r = self.call(
            "ListPodSandboxMetrics",
            self.runtime().list_pod_sandbox_metrics(req),
        )?;
        let mut names: Vec<String> = r
            .pod_metrics
            .iter()
            .flat_map(|p| &p.container_metrics)
            .filter(|c| c.container_id == id)
            .flat_map(|c| c.metrics.iter().map(|m| m.name.clone()))
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    pub fn stop_pod(&self, pod: &Pod) -> Result<(), String> {
        let req = api::StopPodSandboxRequest {
            pod_sandbox_id: pod.id.clone(),
        };
        self.call("StopPodSandbox", self.runtime().stop_pod_sandbox(req))
            .map(drop)
    }

    pub fn remove_pod(&self, pod: &Pod) -> Result<(), String> {
        let req = api::RemovePodSandboxRequest {
            pod_sandbox_id: pod.id.clone(),
        };
        self.call("RemovePodSandbox", self.runtime().remove_pod_sandbox(req))
            .map(drop)
    }

    /// Stop and remove `pod`; a test fails with the runtime's log.
    pub fn stop_and_remove(&self, pod: &Pod) {
        self.stop_pod(pod)
            .unwrap_or_else(|e| panic!("{e}\n{}", self.log()));
        self.remove_pod(pod)
            .unwrap_or_else(|e| panic!("{e}\n{}", self.log()));
    }

    /// A running container's cpu cgroup; a test fails with the runtime's log.
    pub fn cpu_cgroup_of(&self, id: &str) -> throttlewatch_cgroup::CpuCgroup {
        use throttlewatch_cgroup::{proc::cpu_cgroup_of_pid, CpuCgroup, Hierarchies};
        let pid = self
            .container_pid(id)
            .unwrap_or_else(|e| panic!("{e}\n{}", self.log()));
        let h = Hierarchies::discover().unwrap();
        let rel = cpu_cgroup_of_pid(std::path::Path::new("/proc"), pid, h.mode).unwrap();
        CpuCgroup::open(&h, &rel).unwrap()
    }
}

/// Host network, a pid namespace per container, the pod's IPC: kubelet's
/// choice for a `hostNetwork: true` pod.
fn host_network() -> api::NamespaceOption {
    api::NamespaceOption {
        network: api::NamespaceMode::Node as i32,
        pid: api::NamespaceMode::Container as i32,
        ipc: api::NamespaceMode::Pod as i32,
        ..Default::default()
    }
}
