//! A [`CriNode`] driven by `crictl` (cri-tools 1.36, `../shared/bin`), as
//! an operator or a benchmark drives a node: each call one `crictl`
//! process on the node's socket, pods and containers from JSON config
//! files shaped as kubelet sends them (host network, a PID namespace per
//! container, kubelet's labels, the pod's cgroup parent under the node's
//! `cgroup_root`).

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use super::node::CriNode;
use super::pods::{CONTAINER_NAME_LABEL, POD_NAMESPACE_LABEL, POD_NAME_LABEL, POD_UID_LABEL};
use crate::containerd::IMAGE_NAME;

/// A pod made by `crictl runp`: its id, uid and the config file crictl
/// `create` needs again.
#[derive(Debug, Clone)]
pub struct CrictlPod {
    pub id: String,
    pub name: String,
    pub uid: String,
    pub config: PathBuf,
}

/// Host network (2 = NODE), a PID namespace per container (1 =
/// CONTAINER), the pod's IPC (0 = POD).
fn namespaces() -> Value {
    json!({"network": 2, "pid": 1, "ipc": 0})
}

fn to_map(kv: &[(&str, &str)]) -> Value {
    Value::Object(
        kv.iter()
            .map(|(k, v)| (k.to_string(), Value::from(*v)))
            .collect::<Map<_, _>>(),
    )
}

impl CriNode {
    /// `crictl ARGS` on this node's socket (30 s per call).
    pub fn crictl(&self, args: &[&str]) -> Output {
        let ep = format!("unix://{}", self.socket.display());
        Command::new(crate::shared_bin("crictl"))
            .args(["--runtime-endpoint", &ep, "--image-endpoint", &ep])
            .args(["--timeout", "30s"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("crictl")
    }

    /// `crictl ARGS`, which must succeed; its stdout, trimmed, and how long
    /// the call took (the crictl process included).
    pub fn crictl_timed(&self, args: &[&str]) -> (String, Duration) {
        let t0 = Instant::now();
        let o = self.crictl(args);
        let took = t0.elapsed();
        let log = self.log();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        assert!(
            o.status.success(),
            "crictl {args:?}: {}{}\ncontainerd's log (last lines):\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
        (String::from_utf8_lossy(&o.stdout).trim().to_string(), took)
    }

    /// [`CriNode::crictl_timed`] without the time.
    pub fn crictl_ok(&self, args: &[&str]) -> String {
        self.crictl_timed(args).0
    }

    /// `crictl runp` of a pod named `name` with `annotations` (default
    /// runtime handler).
    pub fn crictl_run_pod(&self, name: &str, annotations: &[(&str, &str)]) -> CrictlPod {
        let uid = format!("{:08x}-{}", std::process::id(), crate::unique());
        let config = json!({
            "metadata": {"name": name, "uid": uid, "namespace": "default", "attempt": 0},
            "hostname": "",
            "labels": {
                POD_NAME_LABEL: name,
                POD_NAMESPACE_LABEL: "default",
                POD_UID_LABEL: uid,
            },
            "annotations": to_map(annotations),
            "linux": {
                "cgroup_parent": format!("{}/pod{uid}", self.cgroup_root),
                "security_context": {"namespace_options": namespaces()},
            },
        });
        let dir = self.dir.0.join("crictl");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("pod-{uid}.json"));
        std::fs::write(&path, config.to_string()).unwrap();
        let id = self.crictl_ok(&["runp", path.to_str().unwrap()]);
        self.ids.lock().unwrap().push(id.clone());
        CrictlPod {
            id,
            name: name.into(),
            uid,
            config: path,
        }
    }

    /// `crictl create` of a container `name` in `pod` running `cmd` from the
    /// busybox image, a CFS quota of 50 ms per 100 ms; its id and the time
    /// the call took.
    pub fn crictl_create(&self, pod: &CrictlPod, name: &str, cmd: &[&str]) -> (String, Duration) {
        let config = json!({
            "metadata": {"name": name, "attempt": 0},
            "image": {"image": IMAGE_NAME},
            "command": cmd,
            "labels": {
                POD_NAME_LABEL: pod.name,
                POD_NAMESPACE_LABEL: "default",
                POD_UID_LABEL: pod.uid,
                CONTAINER_NAME_LABEL: name,
            },
            "linux": {
                "resources": {"cpu_period": 100_000, "cpu_quota": 50_000, "cpu_shares": 512},
                "security_context": {"namespace_options": namespaces()},
            },
        });
        let path = self
            .dir
            .0
            .join("crictl")
            .join(format!("ctr-{}-{name}.json", pod.uid));
        std::fs::write(&path, config.to_string()).unwrap();
        let (id, took) = self.crictl_timed(&[
            "create",
            "--no-pull",
            &pod.id,
            path.to_str().unwrap(),
            pod.config.to_str().unwrap(),
        ]);
        self.ids.lock().unwrap().push(id.clone());
        (id, took)
    }

    /// The cpu-controller cgroup directory the CRI gives container `id` of
    /// `pod` (cgroupfs: `<cgroup_root>/pod<uid>/<id>`), in the hierarchy
    /// mounted at `hierarchy` (`/sys/fs/cgroup/cpu` on v1).
    pub fn crictl_cgroup_dir(
        &self,
        hierarchy: &std::path::Path,
        pod: &CrictlPod,
        id: &str,
    ) -> PathBuf {
        hierarchy
            .join(self.cgroup_root.trim_start_matches('/'))
            .join(format!("pod{}", pod.uid))
            .join(id)
    }
}
