//! The node users run now (issue 31), and the VM lane's own: containerd
//! 2.3.4 with its CRI plugin, configured from its own `config default`
//! through `throttlewatch install containerd`, pods on a bridge CNI network,
//! handler `runc` (containerd-shim-runc-v2 2.3.4 and runc) and handler
//! `throttlewatch` (our shim). In the VM lane this is pure cgroup v2 on
//! Linux 6.1 (dequeue-based throttling); on the dev machine the hybrid
//! layout. A throttled pod's container must be logged start..end with the
//! probe's throttled total within 0.5 % of the kernel's `cpu.stat`. Run
//! `cargo build --workspace --bins` first.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_cri::v1 as api;
use throttlewatch_integration::cri::{CriNode, Pod};
use throttlewatch_integration::daemons::{Agent, PrivateConfig};
use throttlewatch_integration::modern_node::{containerd_2_node, logs_in, HANDLER};
use throttlewatch_integration::{cpu_lock, of_type, read_log};

/// Pod operations are slow under the VM lane's emulation (a runc create
/// alone takes over a second there).
const SLOW: Duration = Duration::from_secs(60);

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A pod through `handler` on the bridge network (kubelet's default: not
/// the host's network).
fn run_pod(node: &CriNode, handler: &str, name: &str) -> Pod {
    let mut config = node.pod_config(name, "default", &[]);
    let ns = config
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut())
        .unwrap();
    ns.network = api::NamespaceMode::Pod as i32;
    let t0 = Instant::now();
    let pod = node
        .run_pod(handler, config)
        .unwrap_or_else(|e| panic!("{handler}: {e}\n{}", node.log()));
    eprintln!(
        "{handler}: RunPodSandbox took {} ms",
        t0.elapsed().as_millis()
    );
    pod
}

/// The pod's IP from the CNI network.
fn pod_ip(node: &CriNode, pod: &Pod) -> String {
    let req = api::PodSandboxStatusRequest {
        pod_sandbox_id: pod.id.clone(),
        verbose: false,
    };
    let st = node
        .call("PodSandboxStatus", node.runtime().pod_sandbox_status(req))
        .unwrap();
    st.status
        .and_then(|s| s.network)
        .map(|n| n.ip)
        .unwrap_or_default()
}

fn container(node: &CriNode, pod: &Pod, name: &str, cmd: &[&str], cpu: (i64, i64)) -> String {
    let id = node
        .create_container(pod, name, cmd, Some(cpu))
        .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
    node.start_container(&id)
        .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
    id
}

#[test]
fn pods_on_a_containerd_2_node_with_the_installed_config() {
    let _cpu = cpu_lock();
    let t_test = Instant::now();
    let tw = PrivateConfig::new("");
    let _agent = Agent::start(&tw);
    let mut node = containerd_2_node(&tw);
    let t0 = Instant::now();
    node.start();
    eprintln!(
        "containerd 2.3.4 with the CRI plugin ready, images imported in {} ms",
        t0.elapsed().as_millis()
    );

    // Both handlers are the CRI's, with the same features (our shim's
    // `-info` answers as the runc shim's).
    let st = node
        .call(
            "Status",
            node.runtime().status(api::StatusRequest { verbose: false }),
        )
        .unwrap();
    let features = |h: &str| {
        st.runtime_handlers
            .iter()
            .find(|r| r.name == h)
            .unwrap_or_else(|| panic!("no handler {h:?}: {:?}", st.runtime_handlers))
            .features
    };
    eprintln!("runtime handlers: {:?}", st.runtime_handlers);
    assert_eq!(features(HANDLER), features("runc"), "handler features");

    // Handler runc: its pod on the bridge network, its container under its
    // CPU limit, nothing of ours involved.
    let runc_pod = run_pod(&node, "runc", "plain");
    let ip = pod_ip(&node, &runc_pod);
    assert!(
        ip.starts_with("10.98."),
        "runc pod IP {ip:?} not from the CNI"
    );
    let plain = container(
        &node,
        &runc_pod,
        "sleeper",
        &["sleep", "600"],
        (50_000, 100_000),
    );
    let cg = node.cpu_cgroup_of(&plain);
    let limits = cg.limits().unwrap();
    assert_eq!(limits.quota_us, Some(50_000), "runc container's quota");
    let shims = node.shim_pids();
    let runc_shims = shims
        .iter()
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| c.contains("containerd-shim-runc-v2"))
        })
        .count();
    assert_eq!(
        runc_shims,
        shims.len(),
        "only runc shims serve the runc pod"
    );
    node.stop_and_remove(&runc_pod);
    assert_eq!(
        logs_in(&tw.log_dir),
        Vec::<std::path::PathBuf>::new(),
        "a runc pod got a log of ours"
    );

    // Handler throttlewatch: two spinners for 4 s under a 0.3-CPU limit.
    let pod = run_pod(&node, HANDLER, "trainer");
    let ip = pod_ip(&node, &pod);
    assert!(ip.starts_with("10.98."), "pod IP {ip:?} not from the CNI");
    let burn = "(timeout 4 sh -c 'while :; do :; done') & timeout 4 sh -c 'while :; do :; done'; wait; true";
    let id = container(
        &node,
        &pod,
        "burner",
        &["sh", "-c", burn],
        (30_000, 100_000),
    );
    let cg = node.cpu_cgroup_of(&id);
    assert_eq!(cg.limits().unwrap().quota_us, Some(30_000), "quota");
    // cpu.stat while it runs (the CRI deletes the task at its exit, and
    // its cgroup with it).
    let mut seen = 0;
    wait_until("the burner to exit", SLOW, || {
        if let Ok(st) = cg.cpu_stat() {
            seen = seen.max(st.throttled_ns);
        }
        node.container_state(&id)
            .is_ok_and(|(s, _)| s == api::ContainerState::ContainerExited)
    });
    let (_, code) = node.container_state(&id).unwrap();
    assert_eq!(code, 0, "the burner's exit code");
    node.stop_pod(&pod)
        .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
    let path = tw.log_of(&id);
    wait_until("the end record", SLOW, || {
        path.exists() && !of_type(&read_log(&path), "end").is_empty()
    });
    node.remove_pod(&pod)
        .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));

    // The VM lane keeps the log with its artifacts (`run.sh --keep`).
    if let Some(dir) = std::env::var_os("THROTTLEWATCH_VM_ARTIFACTS") {
        let _ = std::fs::copy(&path, Path::new(&dir).join("modern_node-burner.jsonl"));
    }
    let log = throttlewatch_integration::assert_whole_log(&path);
    let start = &log[0];
    assert_eq!(start["container_name"], "burner", "{start}");
    assert_eq!(start["labels"]["k8s_pod"], "trainer", "{start}");
    assert!(!of_type(&log, "throttle").is_empty(), "no throttle records");
    let end = of_type(&log, "end")[0];
    assert_eq!(end["exit_code"], 0, "{end}");
    let probe = end["probe_throttled_ns"].as_u64().unwrap();
    let kernel = end["kernel_throttled_ns"].as_u64().unwrap();
    // Both totals count from the watch's start (the agent's first
    // cpu.stat reading); under emulation the container can run and be
    // throttled a little before that.
    assert_eq!(end["kernel_source"], "cpu.stat", "{end}");
    assert!(seen > 0, "cpu.stat showed no throttling while it ran");
    eprintln!(
        "cpu.stat while it ran: {seen} ns at most; the log's (since the watch began): {kernel} ns"
    );
    assert!(kernel > 500_000_000, "too little throttling: {end}");
    let err = (probe as f64 - kernel as f64).abs() / kernel as f64;
    eprintln!(
        "containerd 2.3.4 CRI pod, handler {HANDLER}: probe {probe} ns, cpu.stat {kernel} ns, error {:.3} %",
        err * 100.0
    );
    assert!(
        err <= 0.005,
        "probe {probe} vs cpu.stat {kernel}: {:.3} % > 0.5 %",
        err * 100.0
    );
    assert_eq!(logs_in(&tw.log_dir), vec![path], "one log: the burner's");

    wait_until("the shims to exit", SLOW, || node.shim_pids().is_empty());
    assert_eq!(tw.hook_log(), "", "the hook reported problems");
    eprintln!("test took {} ms", t_test.elapsed().as_millis());
}
