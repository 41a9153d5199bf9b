//! Pods as kubelet makes them, through the real containerd CRI (2.3.4 and
//! 1.6): handler `throttlewatch` (our shim) and the runc shim with our
//! wrapper as `BinaryName`, each pod's `linux.cgroup_parent` a pod cgroup
//! that the test made and sized before RunPodSandbox, as kubelet does,
//! below a private `kubepods` (cgroupfs driver). The container's burst must
//! be shared with the pod's quota (the pod cgroup's burst raised while it
//! runs, taken back when it is gone), the throttling of pod and container
//! together at most half of what it is without the burst, the start record
//! must name the pod's limit, and an in-place resize through
//! UpdateContainerResources must succeed with the bursts in place.
//!
//! kubelet's behaviour followed (v1.35, cgroupfs driver, cgroup v1 node):
//! - `pkg/kubelet/cm/qos_container_manager_linux.go`: `kubepods` with the
//!   node's allocatable CPU as `cpu.shares` (2 CPUs: 2048), `burstable`
//!   below it with the sum of its pods' requests as shares (MilliCPUToShares,
//!   at least 2), `besteffort` with 2; no quota at those levels.
//! - `pkg/kubelet/cm/pod_container_manager_linux.go`: the pod cgroup
//!   `pod<uid>` in `kubepods` (Guaranteed) or in its QoS class's cgroup,
//!   made before the sandbox; its literal path is the sandbox's
//!   `cgroup_parent` (the CRI puts pause and containers below it).
//! - `pkg/kubelet/cm/helpers_linux.go`, `ResourceConfigForPod`: every
//!   container with a CPU limit, so the pod's `cpu.cfs_quota_us` is the sum
//!   of MilliCPUToQuota(limit) over a 100 ms `cpu.cfs_period_us`, its
//!   `cpu.shares` the sum of the requests.
//! - `pkg/kubelet/kuberuntime/kuberuntime_container_linux.go`: the
//!   container's `LinuxContainerResources` carry the quota, the period and
//!   the request's shares.
//! - `pkg/kubelet/kuberuntime/kuberuntime_manager.go`, `doPodResizeAction`:
//!   a CPU limit that shrinks is sent with UpdateContainerResources first,
//!   then written on the pod cgroup; one that grows the other way round.
//!
//! Run `cargo build --workspace --bins` first.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use k8s_cri::v1 as api;
use throttlewatch_cgroup::{CgroupMode, CpuCgroup, CpuStat, Hierarchies};
use throttlewatch_integration::containerd::{build_busybox_image_as, IMAGE_NAME};
use throttlewatch_integration::cri::{ContainerdRelease, CriNode, Pod};
use throttlewatch_integration::daemons::{Agent, PrivateConfig};
use throttlewatch_integration::kubelet::{IDLE, SPIKY};
use throttlewatch_integration::shim::wait_until;
use throttlewatch_integration::{bin, cpu_lock, of_type, read_log, Scratch};

use ContainerdRelease::{V1_6, V2_3};

const HANDLER_SHIM: &str = "throttlewatch";
const HANDLER_WRAPPER: &str = "throttlewatch-runc";
const BURST_ANNOTATION: &str = "throttlewatch.io/cpu-burst";
const PERIOD_US: i64 = 100_000;
/// The node's allocatable CPU (this box: 2 CPUs), as `kubepods`' shares.
const NODE_SHARES: u64 = 2048;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Qos {
    Guaranteed,
    Burstable,
}

/// A container's CPU as the pod spec gives it, in millicores.
#[derive(Clone, Copy, Debug)]
struct Cpu {
    request_m: i64,
    limit_m: i64,
}

impl Cpu {
    /// kubelet's MilliCPUToQuota (100 ms period, at least 1 ms).
    fn quota_us(self) -> i64 {
        (self.limit_m * PERIOD_US / 1000).max(1000)
    }
    /// kubelet's MilliCPUToShares (at least 2).
    fn shares(self) -> i64 {
        (self.request_m * 1024 / 1000).max(2)
    }
    /// The container's `(quota, period)` for CreateContainer (whose shares
    /// follow the limit: a Burstable container's are above kubelet's).
    fn quota(self) -> Option<(i64, i64)> {
        Some((self.quota_us(), PERIOD_US))
    }
    fn resources(self) -> api::LinuxContainerResources {
        api::LinuxContainerResources {
            cpu_period: PERIOD_US,
            cpu_quota: self.quota_us(),
            cpu_shares: self.shares(),
            ..Default::default()
        }
    }
}

/// A 300m limit; Guaranteed requests it, Burstable 100m.
fn cpu_300m(qos: Qos) -> Cpu {
    Cpu {
        request_m: if qos == Qos::Guaranteed { 300 } else { 100 },
        limit_m: 300,
    }
}

fn write(dir: &Path, file: &str, value: &str) {
    std::fs::write(dir.join(file), value)
        .unwrap_or_else(|e| panic!("{}/{file} = {value}: {e}", dir.display()));
}

/// The QoS levels and the pod cgroup for a pod of `qos` whose containers
/// are `cpus`, made and sized as kubelet does before RunPodSandbox, below
/// the node's private cgroup root (removed with the node); returns the pod
/// cgroup's path (the sandbox's `cgroup_parent`).
fn kubelet_pod_cgroup(
    node: &CriNode,
    h: &Hierarchies,
    uid: &str,
    qos: Qos,
    cpus: &[Cpu],
) -> String {
    assert_eq!(h.mode, CgroupMode::V1, "these shapes are cgroup v1's");
    let root = &node.cgroup_root;
    let sum = |f: fn(Cpu) -> i64| cpus.iter().map(|c| f(*c)).sum::<i64>();
    let level = |rel: &str, shares: u64| {
        let g = CpuCgroup::at(h, rel);
        std::fs::create_dir_all(&g.cpu_dir).unwrap();
        write(&g.cpu_dir, "cpu.shares", &shares.to_string());
        g
    };
    level(root, NODE_SHARES);
    let burstable = match qos {
        Qos::Burstable => sum(Cpu::shares) as u64,
        Qos::Guaranteed => 2,
    };
    level(&format!("{root}/burstable"), burstable);
    level(&format!("{root}/besteffort"), 2);
    let pod = match qos {
        Qos::Guaranteed => format!("{root}/pod{uid}"),
        Qos::Burstable => format!("{root}/burstable/pod{uid}"),
    };
    let g = level(&pod, sum(Cpu::shares) as u64);
    // ResourceConfigForPod: every container has a limit, so the pod a quota.
    write(&g.cpu_dir, "cpu.cfs_period_us", &PERIOD_US.to_string());
    write(
        &g.cpu_dir,
        "cpu.cfs_quota_us",
        &sum(Cpu::quota_us).to_string(),
    );
    pod
}

/// A sandbox in a kubelet pod cgroup, through `handler`, with our burst
/// annotation (when given) on the pod.
fn run_kubelet_pod(
    node: &CriNode,
    h: &Hierarchies,
    handler: &str,
    name: &str,
    qos: Qos,
    cpus: &[Cpu],
    burst: Option<&str>,
) -> (Pod, CpuCgroup) {
    let annotations: Vec<(&str, &str)> = burst.map(|b| (BURST_ANNOTATION, b)).into_iter().collect();
    let mut config = node.pod_config(name, "ml", &annotations);
    let uid = config.metadata.as_ref().unwrap().uid.clone();
    let parent = kubelet_pod_cgroup(node, h, &uid, qos, cpus);
    config.linux.as_mut().unwrap().cgroup_parent = parent.clone();
    let pod = node
        .run_pod(handler, config)
        .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
    (pod, CpuCgroup::at(h, &parent))
}

/// CreateContainer through the CRI as kubelet sends it (its labels, host
/// network, the limit's quota and period), running tw-burn `args`.
fn create_burner(node: &CriNode, pod: &Pod, name: &str, args: &[&str], cpu: Cpu) -> String {
    let cmd: Vec<&str> = std::iter::once("/tw-burn")
        .chain(args.iter().copied())
        .collect();
    node.create_container(pod, name, &cmd, cpu.quota())
        .unwrap_or_else(|e| panic!("{e}\n{}", node.log()))
}

fn remove_container(node: &CriNode, id: &str) {
    let stop = api::StopContainerRequest {
        container_id: id.into(),
        timeout: 0,
    };
    node.call("StopContainer", node.runtime().stop_container(stop))
        .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
    let rm = api::RemoveContainerRequest {
        container_id: id.into(),
    };
    node.call("RemoveContainer", node.runtime().remove_container(rm))
        .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
}

/// UpdateContainerResources with the container's whole CPU, as kubelet's
/// resize sends it.
fn update_cpu(node: &CriNode, id: &str, cpu: Cpu) -> Result<(), String> {
    let req = api::UpdateContainerResourcesRequest {
        container_id: id.into(),
        linux: Some(cpu.resources()),
        ..Default::default()
    };
    node.call(
        "UpdateContainerResources",
        node.runtime().update_container_resources(req),
    )
    .map(drop)
}

/// The node's container image (`IMAGE_NAME`, busybox) made again with
/// the host-built tw-burn as `/tw-burn` and the libraries `ldd` names at
/// their host paths; returns once the CRI gives the new image for the name.
fn import_burn_image(node: &CriNode) {
    let d = Scratch::new("twburnimg");
    let root = d.0.join("rootfs");
    let tw_burn = bin("tw-burn");
    let ldd = Command::new("ldd").arg(&tw_burn).output().expect("ldd");
    for lib in String::from_utf8_lossy(&ldd.stdout)
        .split_whitespace()
        .filter(|w| w.starts_with('/'))
    {
        let to = root.join(lib.trim_start_matches('/'));
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(lib, &to).unwrap_or_else(|e| panic!("{lib}: {e}"));
    }
    std::fs::create_dir_all(&root).unwrap();
    std::fs::copy(&tw_burn, root.join("tw-burn")).unwrap();
    let before = image_id(node);
    let tar = build_busybox_image_as(&d.0, IMAGE_NAME, &["sh"]);
    let out = node.ctr(&["images", "import", tar.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "ctr images import: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_until(
        "the CRI to give the tw-burn image",
        Duration::from_secs(20),
        || image_id(node) != before,
    );
}

fn image_id(node: &CriNode) -> Option<String> {
    let req = api::ImageStatusRequest {
        image: Some(api::ImageSpec {
            image: IMAGE_NAME.into(),
            ..Default::default()
        }),
        verbose: false,
    };
    node.call("ImageStatus", node.images().image_status(req))
        .ok()
        .and_then(|r| r.image)
        .map(|i| i.id)
}

/// A running containerd on `release` with both handler styles (annotation
/// allowlists as `throttlewatch install` writes them), our shim first in
/// its PATH, our configuration passed on; the tw-burn image imported.
fn node(release: ContainerdRelease, tw: &PrivateConfig) -> CriNode {
    let wrapper = bin("throttlewatch-runtime");
    let handlers = release.handler_toml(HANDLER_SHIM, "io.containerd.throttlewatch.v2", &[])
        + &release.handler_toml(
            HANDLER_WRAPPER,
            "io.containerd.runc.v2",
            &[("BinaryName", wrapper.to_str().unwrap())],
        );
    let shim_dir = bin("containerd-shim-throttlewatch-v2")
        .parent()
        .unwrap()
        .to_path_buf();
    let mut node = CriNode::new_on(
        release,
        &handlers,
        &[shim_dir],
        &[("THROTTLEWATCH_CONFIG", tw.path.to_str().unwrap())],
    );
    node.start();
    import_burn_image(&node);
    node
}

/// One spiky container's run in a fresh kubelet pod.
struct Ran {
    pod_ms: f64,
    container_ms: f64,
    pod_burst_running: u64,
    container_burst_running: u64,
    pod_burst_after: u64,
    pod_rel: String,
    start: serde_json::Value,
}

fn burst_us(g: &CpuCgroup) -> u64 {
    g.bandwidth().unwrap().burst_us.unwrap_or(0)
}

/// A one-container pod of `qos` (300m limit) through `handler` running
/// SPIKY to its end; the container removed, then the pod.
fn spiky_pod(
    node: &CriNode,
    tw: &PrivateConfig,
    h: &Hierarchies,
    handler: &str,
    qos: Qos,
    burst: Option<&str>,
) -> Ran {
    let cpu = cpu_300m(qos);
    let (pod, pod_cg) = run_kubelet_pod(node, h, handler, "spiky", qos, &[cpu], burst);
    let p0 = pod_cg.cpu_stat().unwrap();
    let id = create_burner(node, &pod, "burner", SPIKY, cpu);
    node.start_container(&id)
        .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
    let c_cg = CpuCgroup::at(h, &format!("{}/{id}", pod_cg.rel));
    let container_burst_running = burst_us(&c_cg);
    let pod_burst_running = burst_us(&pod_cg);
    // The container's cgroup goes with its task: its last reading kept.
    let mut last = CpuStat::default();
    wait_until("the burner to exit", Duration::from_secs(30), || {
        if let Ok(s) = c_cg.cpu_stat() {
            last = s;
        }
        node.container_state(&id).unwrap().0 == api::ContainerState::ContainerExited
    });
    let log_path = tw.log_of(&id);
    wait_until("the end record", Duration::from_secs(10), || {
        log_path.exists() && !of_type(&read_log(&log_path), "end").is_empty()
    });
    remove_container(node, &id);
    let pod_burst_after = burst_us(&pod_cg);
    let p1 = pod_cg.cpu_stat().unwrap();
    node.stop_pod(&pod).unwrap();
    node.remove_pod(&pod).unwrap();
    let log = read_log(&log_path);
    let end = of_type(&log, "end")[0];
    let kernel = end["kernel_throttled_ns"].as_u64().unwrap_or(0);
    Ran {
        pod_ms: (p1.throttled_ns - p0.throttled_ns) as f64 / 1e6,
        container_ms: kernel.max(last.throttled_ns) as f64 / 1e6,
        pod_burst_running,
        container_burst_running,
        pod_burst_after,
        pod_rel: pod_cg.rel.clone(),
        start: of_type(&log, "start")[0].clone(),
    }
}

/// Per QoS class: the spiky container without a burst (through one
/// handler), then with `cpu-burst: 30ms` through each handler.
fn a_burst_works_in_kubelet_pods(release: ContainerdRelease, classes: &[Qos]) {
    let tw = PrivateConfig::new("");
    let _agent = Agent::start(&tw);
    let node = node(release, &tw);
    let h = Hierarchies::discover().unwrap();
    let _cpu = cpu_lock();
    for (i, &qos) in classes.iter().enumerate() {
        let base_handler = [HANDLER_WRAPPER, HANDLER_SHIM][i % 2];
        let plain = spiky_pod(&node, &tw, &h, base_handler, qos, None);
        let without = plain.pod_ms + plain.container_ms;
        eprintln!(
            "{} {qos:?} ({base_handler}) without a burst: pod {:.1} ms + container {:.1} ms throttled",
            release.name(),
            plain.pod_ms,
            plain.container_ms
        );
        assert_eq!(plain.pod_burst_running, 0, "{qos:?}: no burst asked");
        assert!(
            without > 100.0,
            "{} {qos:?}: the workload was hardly throttled without a burst: {without:.1} ms",
            release.name()
        );
        // The log names the pod's limit above the container.
        let above = &plain.start["limits_above"][0];
        assert_eq!(above["cgroup_path"], plain.pod_rel, "{}", plain.start);
        assert_eq!(above["quota_us"], 30_000, "{}", plain.start);
        for handler in [HANDLER_SHIM, HANDLER_WRAPPER] {
            let what = format!("{} {qos:?} {handler}", release.name());
            let r = spiky_pod(&node, &tw, &h, handler, qos, Some("30ms"));
            let with = r.pod_ms + r.container_ms;
            eprintln!(
                "{what} with cpu-burst 30ms: pod {:.1} ms + container {:.1} ms throttled \
                 (pod burst {} us while it ran, {} us after)",
                r.pod_ms, r.container_ms, r.pod_burst_running, r.pod_burst_after
            );
            assert_eq!(r.container_burst_running, 30_000, "{what}");
            assert_eq!(
                r.pod_burst_running, 30_000,
                "{what}: the pod cgroup carries the container's burst"
            );
            assert_eq!(r.pod_burst_after, 0, "{what}: taken back at removal");
            assert_eq!(r.start["burst_us"], 30_000, "{what}: {}", r.start);
            assert_eq!(
                r.start["limits_above"][0]["cgroup_path"], r.pod_rel,
                "{what}: {}",
                r.start
            );
            assert!(
                with <= 0.5 * without,
                "{what}: with a burst {with:.1} ms, without {without:.1} ms"
            );
        }
    }
}

#[test]
fn a_burst_works_in_kubelet_pods_on_containerd_2_3() {
    a_burst_works_in_kubelet_pods(V2_3, &[Qos::Burstable, Qos::Guaranteed]);
}

#[test]
fn a_burst_works_in_a_burstable_kubelet_pod_on_containerd_1_6() {
    a_burst_works_in_kubelet_pods(V1_6, &[Qos::Burstable]);
}

/// A Guaranteed pod of two 300m containers (the pod's quota 60 ms), the
/// burst annotation on the pod (both containers 30 ms): the pod's burst is
/// their sum within its quota. Then kubelet's in-place resize of the first:
/// shrink to 100m (UpdateContainerResources, then the pod's quota written
/// alone: the kernel refuses it below the pod's burst), grow to 500m (the
/// pod first). Both handlers side by side.
fn a_resize_succeeds_with_bursts_in_place(release: ContainerdRelease) {
    let tw = PrivateConfig::new("");
    let _agent = Agent::start(&tw);
    let node = node(release, &tw);
    let h = Hierarchies::discover().unwrap();
    let cpu = cpu_300m(Qos::Guaranteed);
    for handler in [HANDLER_SHIM, HANDLER_WRAPPER] {
        let what = format!("{} {handler}", release.name());
        let (pod, pod_cg) = run_kubelet_pod(
            &node,
            &h,
            handler,
            "resize",
            Qos::Guaranteed,
            &[cpu, cpu],
            Some("30ms"),
        );
        let ids: Vec<String> = ["a", "b"]
            .iter()
            .map(|n| {
                let id = create_burner(&node, &pod, n, IDLE, cpu);
                node.start_container(&id)
                    .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
                id
            })
            .collect();
        let a = CpuCgroup::at(&h, &format!("{}/{}", pod_cg.rel, ids[0]));
        let quota = |g: &CpuCgroup| g.bandwidth().unwrap().quota_us;
        assert_eq!(quota(&pod_cg), Some(60_000), "{what}");
        assert_eq!(
            burst_us(&pod_cg),
            60_000,
            "{what}: both containers' bursts, within the pod's 60 ms"
        );

        // Shrink a to 100m: the container first, then the pod (60 -> 40 ms).
        let small = Cpu {
            request_m: 100,
            limit_m: 100,
        };
        update_cpu(&node, &ids[0], small).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(quota(&a), Some(10_000), "{what}");
        assert_eq!(burst_us(&a), 10_000, "{what}: a's burst follows its quota");
        assert_eq!(
            burst_us(&pod_cg),
            40_000,
            "{what}: the pod's burst fits 40 ms"
        );
        let shrink = pod_cg.set_quota_only(40_000, PERIOD_US as u64);
        eprintln!("{what}: shrink, kubelet's pod quota 40 ms: {shrink:?}");
        shrink.unwrap_or_else(|e| panic!("{what}: kubelet's write of the pod quota refused: {e}"));

        // Grow a to 500m: the pod first (40 -> 80 ms), then the container.
        pod_cg
            .set_quota_only(80_000, PERIOD_US as u64)
            .unwrap_or_else(|e| panic!("{what}: grow, pod quota: {e}"));
        let big = Cpu {
            request_m: 500,
            limit_m: 500,
        };
        let grow = update_cpu(&node, &ids[0], big);
        eprintln!("{what}: grow to 500m: {grow:?}");
        grow.unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(quota(&a), Some(50_000), "{what}");
        assert_eq!(burst_us(&a), 30_000, "{what}: 30ms asked, within 50 ms");
        assert_eq!(burst_us(&pod_cg), 60_000, "{what}: 30 + 30 ms within 80 ms");
        eprintln!(
            "{what}: after the resize pod quota {:?} burst {} us, a quota {:?} burst {} us",
            quota(&pod_cg),
            burst_us(&pod_cg),
            quota(&a),
            burst_us(&a)
        );

        for id in &ids {
            remove_container(&node, id);
        }
        assert_eq!(
            burst_us(&pod_cg),
            0,
            "{what}: taken back with the containers"
        );
        node.stop_pod(&pod).unwrap();
        node.remove_pod(&pod).unwrap();
    }
}

#[test]
fn a_resize_succeeds_with_bursts_in_place_on_containerd_2_3() {
    a_resize_succeeds_with_bursts_in_place(V2_3);
}

#[test]
fn a_resize_succeeds_with_bursts_in_place_on_containerd_1_6() {
    a_resize_succeeds_with_bursts_in_place(V1_6);
}
