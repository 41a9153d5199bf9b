//! packaging/kubernetes' NRI DaemonSet run through a real CRI: the
//! manifests rendered offline (`kubectl kustomize overlays/nri`), the
//! DaemonSet's pod turned into RunPodSandbox / CreateContainer /
//! StartContainer as kubelet does it (`throttlewatch_integration::cri::kubelet_spec`,
//! after kubelet's `kuberuntime_sandbox.go` and `kuberuntime_container.go`)
//! on containerd 2.3.4's CRI (private instance, NRI on a private socket),
//! from the image `packaging/build-image.sh` makes (imported into
//! `k8s.io`; debug binaries with their host libraries, `--with-host-libs`).
//! Then workload pods with no runtime class through the same CRI: watched
//! by the DaemonSet's plugin (a log, the burst in the cgroup, the metrics
//! on the agent's port). The DaemonSet's pod restarted mid-workload (a new
//! pod, as a rollout makes): the running workload keeps its one log, with
//! one `start`, ended at its stop. Deleted: workloads go on; the cleanup
//! overlay's pod then leaves the host paths as they were (the logs kept).
//!
//! The node's host paths are a scratch root (`/` of the manifests), but
//! `/sys` (the real cgroups, BTF, bpffs) and `/var/run/nri` (containerd's
//! private NRI socket). Run `cargo build --workspace --bins` first.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_cri::v1 as api;
use serde_json::Value;
use throttlewatch_integration::bundle::text;
use throttlewatch_integration::cri::kubelet_spec::{HostPaths, KubeletPod, PodContext};
use throttlewatch_integration::cri::{CriNode, Pod};
use throttlewatch_integration::daemons::PrivateConfig;
use throttlewatch_integration::modern_node::{containerd_2_node, logs_in};
use throttlewatch_integration::trees::snapshot;
use throttlewatch_integration::{bin, cpu_lock, of_type, read_log, unique, Scratch};

const WAIT: Duration = Duration::from_secs(40);
/// The name the DaemonSet's plugin registers under (`--idx 90`).
const PLUGIN: &str = "90-throttlewatch";
const IMAGE: &str = "throttlewatch-node:0.1.0";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool, seen: impl Fn() -> String) {
    let t0 = Instant::now();
    while !f() {
        assert!(
            t0.elapsed() < WAIT,
            "timed out after {WAIT:?} waiting for {what}; seen:\n{}",
            seen()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `kubectl kustomize packaging/kubernetes/DIR`, one JSON value per document.
fn render(dir: &str) -> Vec<Value> {
    let o = Command::new("kubectl")
        .arg("kustomize")
        .arg(repo().join("packaging/kubernetes").join(dir))
        .output()
        .expect("kubectl");
    assert!(o.status.success(), "kubectl kustomize {dir}: {}", text(&o));
    String::from_utf8(o.stdout)
        .unwrap()
        .split("\n---\n")
        .map(|d| serde_yaml::from_str(d).unwrap())
        .collect()
}

fn config_maps(docs: &[Value]) -> HashMap<String, BTreeMap<String, String>> {
    docs.iter()
        .filter(|d| d["kind"] == "ConfigMap")
        .map(|d| {
            let data = d["data"].as_object().unwrap();
            let kv = data
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                .collect();
            (d["metadata"]["name"].as_str().unwrap().to_string(), kv)
        })
        .collect()
}

/// The rendered DaemonSet's pod spec, its image names made the imported one.
fn daemonset_pod(docs: &[Value]) -> Value {
    let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").unwrap();
    let mut spec = ds["spec"]["template"]["spec"].clone();
    for key in ["initContainers", "containers"] {
        for c in spec[key].as_array_mut().into_iter().flatten() {
            assert_eq!(c["image"], IMAGE, "the kustomization's image");
            c["image"] = Value::String(format!("docker.io/library/{IMAGE}"));
        }
    }
    spec
}

/// The node: containerd 2.3.4 with the node image in `k8s.io`, and the
/// host paths of the manifests.
struct Node {
    cri: CriNode,
    root: PathBuf,
    host: HostPaths,
    volumes: PathBuf,
    _scratch: Scratch,
}

fn node_up(tw: &PrivateConfig) -> Node {
    let mut cri = containerd_2_node(tw);
    cri.start();
    let nri = cri.dir.0.join("nri");
    wait_until(
        "the NRI socket",
        || nri.join("nri.sock").exists(),
        || cri.log(),
    );
    let scratch = Scratch::new("ds-cri");
    let tar = scratch.0.join("node.tar");
    let o = Command::new("bash")
        .arg(repo().join("packaging/build-image.sh"))
        .arg("--bin-dir")
        .arg(bin("throttlewatch").parent().unwrap())
        .args(["--allow-dynamic", "--with-host-libs", "--out"])
        .arg(&tar)
        .output()
        .unwrap();
    assert!(o.status.success(), "build-image.sh: {}", text(&o));
    let o = cri.ctr(&["images", "import", tar.to_str().unwrap()]);
    assert!(o.status.success(), "ctr import: {}", text(&o));
    let root = scratch.0.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let host = HostPaths(vec![
        ("/".into(), root.clone()),
        ("/sys".into(), "/sys".into()),
        ("/var/run/nri".into(), nri),
    ]);
    let volumes = scratch.0.join("kubelet");
    Node {
        cri,
        root,
        host,
        volumes,
        _scratch: scratch,
    }
}

/// A pod of `spec` as kubelet runs it: the sandbox, each init container to
/// its exit 0, the containers started. Returns the pod, its containers' ids
/// by name, and the translation.
fn run_kubelet_pod(
    node: &Node,
    name: &str,
    spec: &Value,
    cms: &HashMap<String, BTreeMap<String, String>>,
) -> (Pod, BTreeMap<String, String>, KubeletPod) {
    let uid = format!("{:08x}-{}", std::process::id(), unique());
    let ctx = PodContext {
        name,
        namespace: "throttlewatch",
        uid: &uid,
        cgroup_root: &node.cri.cgroup_root,
        config_maps: cms,
        host_paths: &node.host,
        volumes_dir: &node.volumes,
    };
    let k = ctx.pod(spec, &HashMap::new());
    let pod = node
        .cri
        .run_pod("", k.sandbox.clone())
        .unwrap_or_else(|e| panic!("{e}\n{}", node.cri.log()));
    for c in &k.init_containers {
        let id = node.cri.create_with(&pod, c.clone()).unwrap();
        node.cri.start_container(&id).unwrap();
        wait_until(
            "the init container's exit",
            || node.cri.container_state(&id).unwrap().0 == api::ContainerState::ContainerExited,
            || node.cri.log(),
        );
        let (_, code) = node.cri.container_state(&id).unwrap();
        assert_eq!(code, 0, "init container {:?}", c.metadata);
    }
    let mut ids = BTreeMap::new();
    for c in &k.containers {
        let id = node
            .cri
            .create_with(&pod, c.clone())
            .unwrap_or_else(|e| panic!("{e}\n{}", node.cri.log()));
        node.cri
            .start_container(&id)
            .unwrap_or_else(|e| panic!("{e}\n{}", node.cri.log()));
        ids.insert(c.metadata.as_ref().unwrap().name.clone(), id);
    }
    (pod, ids, k)
}

/// kubelet deleting a pod: each container stopped with the grace period,
/// then the sandbox stopped and removed.
fn delete_kubelet_pod(node: &Node, pod: &Pod, ids: &BTreeMap<String, String>, grace_s: i64) {
    for id in ids.values() {
        node.cri.stop_container(id, grace_s).unwrap();
    }
    node.cri.stop_and_remove(pod);
}

/// The DaemonSet's containers' output (the CRI's container logs).
fn pod_logs(node: &Node) -> String {
    snapshot(&node.volumes.join("logs"))
        .into_iter()
        .map(|(p, b)| format!("== {}\n{}", p.display(), String::from_utf8_lossy(&b)))
        .collect()
}

fn synchronized(node: &Node) -> usize {
    node.cri
        .log()
        .lines()
        .filter(|l| l.contains(PLUGIN) && l.contains("connected and synchronized"))
        .count()
}

/// The agent's metrics from inside containerd's network namespace (the
/// pod network), at the sandbox's IP on the configured port.
fn metrics(node: &Node, pod: &Pod) -> String {
    let st = node
        .cri
        .call(
            "PodSandboxStatus",
            node.cri
                .runtime()
                .pod_sandbox_status(api::PodSandboxStatusRequest {
                    pod_sandbox_id: pod.id.clone(),
                    verbose: false,
                }),
        )
        .unwrap();
    let ip = st.status.unwrap().network.unwrap().ip;
    let o = node
        .cri
        .nsenter_cmd(throttlewatch_integration::python3())
        .args([
            "-c",
            "import sys, urllib.request as u; sys.stdout.write(u.urlopen(sys.argv[1], timeout=3).read().decode())",
        ])
        .arg(format!("http://{ip}:9477/metrics"))
        .output()
        .unwrap();
    match o.status.success() {
        true => String::from_utf8_lossy(&o.stdout).into_owned(),
        false => format!(
            "GET http://{ip}:9477/metrics in containerd's netns: {}",
            text(&o)
        ),
    }
}

/// A workload pod with no runtime class: annotated, a 20 ms burst asked
/// for, a 50 ms / 100 ms quota.
fn workload(node: &Node, name: &str) -> (Pod, String) {
    let ann = [
        ("throttlewatch.io/watch", "true"),
        ("throttlewatch.io/cpu-burst", "20ms"),
    ];
    let pod = node
        .cri
        .run_pod("", node.cri.pod_config(name, "default", &ann))
        .unwrap();
    let id = node
        .cri
        .create_container(&pod, "work", &["sleep", "600"], Some((50_000, 100_000)))
        .unwrap();
    node.cri.start_container(&id).unwrap();
    (pod, id)
}

fn burst_us(node: &Node, id: &str) -> Option<u64> {
    node.cri.cpu_cgroup_of(id).limits().unwrap().burst_us
}

#[test]
fn nri_daemonset_through_containerd_2_cri() {
    let _cpu = cpu_lock();
    let t0 = Instant::now();
    let tw = PrivateConfig::new("");
    let node = node_up(&tw);
    let docs = render("overlays/nri");
    let cms = config_maps(&docs);
    let spec = daemonset_pod(&docs);
    let logs = node.root.join("var/log/throttlewatch");
    let before = snapshot(&node.root);

    let (ds, ds_ids, k) = run_kubelet_pod(&node, "throttlewatch-a", &spec, &cms);
    assert_eq!(
        k.grace_s, 15,
        "the DaemonSet's terminationGracePeriodSeconds"
    );
    wait_until(
        "the DaemonSet's plugin synchronized",
        || synchronized(&node) >= 1,
        || node.cri.log(),
    );
    let (w1, id1) = workload(&node, "work-1");
    let log1 = logs.join(format!("{id1}@ns-k8s.io.jsonl"));
    wait_until(
        "the workload's start record",
        || log1.exists() && !of_type(&read_log(&log1), "start").is_empty(),
        || format!("{:?}\n{}", logs_in(&logs), pod_logs(&node)),
    );
    assert_eq!(
        burst_us(&node, &id1),
        Some(20_000),
        "the burst in the cgroup"
    );
    wait_until(
        "the workload on the agent's metrics port",
        || metrics(&node, &ds).contains(&id1),
        || metrics(&node, &ds),
    );

    // A rollout: the old pod deleted, a new one of the same spec.
    delete_kubelet_pod(&node, &ds, &ds_ids, k.grace_s);
    let (ds2, ds2_ids, _) = run_kubelet_pod(&node, "throttlewatch-b", &spec, &cms);
    wait_until(
        "the new pod's plugin synchronized",
        || synchronized(&node) >= 2,
        || node.cri.log(),
    );
    let (w2, id2) = workload(&node, "work-2");
    let log2 = logs.join(format!("{id2}@ns-k8s.io.jsonl"));
    wait_until(
        "the second workload's start record",
        || log2.exists() && !of_type(&read_log(&log2), "start").is_empty(),
        || node.cri.log(),
    );
    node.cri.stop_and_remove(&w1);
    wait_until(
        "the first workload's end",
        || !of_type(&read_log(&log1), "end").is_empty(),
        || format!("{:?}", read_log(&log1)),
    );
    let v1 = throttlewatch_integration::assert_whole_log(&log1);
    assert_eq!(
        of_type(&v1, "start").len(),
        1,
        "one start across the rollout: {v1:?}"
    );
    assert_eq!(of_type(&v1, "end").len(), 1);

    // The DaemonSet deleted: workloads go on, unwatched.
    delete_kubelet_pod(&node, &ds2, &ds2_ids, 15);
    let (w3, id3) = workload(&node, "work-3");
    for id in [&id2, &id3] {
        let (state, _) = node.cri.container_state(id).unwrap();
        assert_eq!(state, api::ContainerState::ContainerRunning, "{id}");
    }
    assert!(!logs.join(format!("{id3}@ns-k8s.io.jsonl")).exists());
    node.cri.stop_and_remove(&w2);
    node.cri.stop_and_remove(&w3);

    // The cleanup overlay's pod: the host paths as they were, logs aside.
    let cdocs = render("overlays/cleanup");
    let mut cspec = daemonset_pod(&cdocs);
    // The script counts the throttlewatch shims among the host's processes
    // (hostPID); on this machine other tests run ours, the private node
    // none: its HOST_PROC knob points at no process.
    cspec["initContainers"][0]["env"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": "HOST_PROC", "value": "/no-processes"}));
    let (cp, cids, ck) = run_kubelet_pod(&node, "cleanup", &cspec, &config_maps(&cdocs));
    // Its `done` container is a `sleep` that ignores SIGTERM: kubelet
    // would wait the whole grace period; 2 s here.
    delete_kubelet_pod(&node, &cp, &cids, ck.grace_s.min(2));
    let kept_logs = |s: Vec<(PathBuf, Vec<u8>)>| {
        s.into_iter()
            .filter(|(p, _)| !p.starts_with(&logs))
            .collect::<Vec<_>>()
    };
    let after = kept_logs(snapshot(&node.root));
    let names = |s: &[(PathBuf, Vec<u8>)]| s.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>();
    assert_eq!(
        names(&after),
        names(&before),
        "host files left by the DaemonSet"
    );
    eprintln!(
        "the NRI DaemonSet through containerd 2.3.4's CRI: {:?}",
        t0.elapsed()
    );
}
