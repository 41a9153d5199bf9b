//! The kubelet path: pods through the CRI plugin of containerd 1.6 and of
//! containerd 2.3.4 (../shared/bin), driven by a CRI v1 client as kubelet
//! drives it, on a node configuration (each release's own config shape)
//! before and after `throttlewatch install containerd`. The default handler
//! (runc) must be unaffected; handler `throttlewatch` (our shim) and a
//! hand-copied style-B handler (the runc shim with our wrapper as
//! `BinaryName`) must give the pod's container a log with its Kubernetes
//! names, its burst, and leave nothing behind. The pod's sandbox (pause)
//! container is unlogged. Every test runs on both releases.
//! Run `cargo build --workspace --bins` first.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_cri::v1::ContainerState;
use throttlewatch_cgroup::proc::cpu_cgroup_of_pid;
use throttlewatch_cgroup::{CpuCgroup, Hierarchies};
use throttlewatch_core::protocol::{call, Request, Response};
use throttlewatch_integration::cri::{ContainerdRelease, CriNode, Pod};
use throttlewatch_integration::daemons::{Agent, PrivateConfig};
use throttlewatch_integration::fixtures::http_get;
use throttlewatch_integration::{bin, cpu_lock, of_type, read_log};

use ContainerdRelease::{V1_6, V2_3};

const HANDLER_SHIM: &str = "throttlewatch";
const HANDLER_WRAPPER: &str = "throttlewatch-runc";
const BURST_ANNOTATION: &str = "throttlewatch.io/cpu-burst";
const HOOK: &str = "throttlewatch-hook";
/// Throttled time to reach before the pod is stopped.
const THROTTLED_NS: u64 = 300_000_000;

/// The style-B handler as an operator copies it by hand from
/// configs/containerd/runc-binaryname.toml: on the node before the install,
/// which must keep it.
fn wrapper_handler(release: ContainerdRelease) -> String {
    let wrapper = bin("throttlewatch-runtime");
    release.handler_toml(
        HANDLER_WRAPPER,
        "io.containerd.runc.v2",
        &[("BinaryName", wrapper.to_str().unwrap())],
    )
}

/// `throttlewatch install containerd` on the node's configuration tree:
/// it must keep the runtimes there and add handler `throttlewatch`.
fn install(node: &CriNode, tw: &PrivateConfig) {
    let bins = bin("throttlewatch");
    let out = Command::new(&bins)
        .args(["install", "containerd", "--config"])
        .arg(&tw.path)
        .arg("--etc-root")
        .arg(&node.etc_root)
        .arg("--bin-dir")
        .arg(bins.parent().unwrap())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let config = std::fs::read_to_string(node.config_path()).unwrap();
    assert!(
        out.status.success(),
        "throttlewatch install containerd: {}{}\n{config}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // In the release's CRI runtime plugin, whatever the quoting.
    let doc: toml::Table = config.parse().unwrap();
    let plugin = node.release.runtime_plugin();
    let runtimes = &doc["plugins"][plugin]["containerd"]["runtimes"];
    for handler in ["runc", HANDLER_WRAPPER, HANDLER_SHIM] {
        assert!(
            runtimes.get(handler).is_some(),
            "{plugin} runtime {handler} missing after the install:\n{config}"
        );
    }
    assert_eq!(
        runtimes[HANDLER_SHIM]["runtime_type"].as_str(),
        Some("io.containerd.throttlewatch.v2"),
        "{config}"
    );
}

/// A private throttlewatch configuration with metrics on a free port.
fn tw_config() -> (PrivateConfig, u16) {
    let cfg = PrivateConfig::new("");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let text = std::fs::read_to_string(&cfg.path).unwrap().replace(
        "metrics_addr = \"\"",
        &format!("metrics_addr = \"127.0.0.1:{port}\"\nsnapshot_interval_s = 1"),
    );
    std::fs::write(&cfg.path, text).unwrap();
    (cfg, port)
}

/// A node whose containerd finds our shim (target/debug first in its PATH)
/// and passes our configuration on to shims, wrapper and hook.
fn node(release: ContainerdRelease, tw: &PrivateConfig) -> CriNode {
    let bins = bin("containerd-shim-throttlewatch-v2")
        .parent()
        .unwrap()
        .to_path_buf();
    CriNode::new_on(
        release,
        &wrapper_handler(release),
        &[bins],
        &[("THROTTLEWATCH_CONFIG", tw.path.to_str().unwrap())],
    )
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn spec_text(node: &CriNode, id: &str) -> String {
    let p = node.bundle(id).join("config.json");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect()
}

/// A pod through the default handler: a container runs, its spec and the
/// sandbox's carry none of our hooks, and nothing of ours ran (no hook.log,
/// no log). Stopped and removed, it leaves no shim.
fn default_pod_runs_untouched(node: &CriNode, tw: &PrivateConfig, name: &str) {
    let pod = node
        .run_pod(
            "",
            node.pod_config(name, "default", &[(BURST_ANNOTATION, "20ms")]),
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
    let id = node
        .create_container(&pod, "app", &["sleep", "1000"], Some((30_000, 100_000)))
        .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
    node.start_container(&id).unwrap();
    assert_eq!(
        node.container_state(&id).unwrap().0,
        ContainerState::ContainerRunning
    );
    for task in [&pod.id, &id] {
        assert!(
            !spec_text(node, task).contains(HOOK),
            "{name}: the default handler's spec of {task} got our hook"
        );
    }
    node.stop_pod(&pod).unwrap();
    node.remove_pod(&pod).unwrap();
    assert_eq!(
        files_in(&tw.log_dir),
        Vec::<PathBuf>::new(),
        "{name}: throttlewatch wrote for a default-handler pod"
    );
    wait_until("the runc shim to exit", Duration::from_secs(10), || {
        node.shim_pids().is_empty()
    });
}

fn default_handler_pods_run_before_and_after_the_install(release: ContainerdRelease) {
    let (tw, _) = tw_config();
    let mut node = node(release, &tw);
    node.start();
    default_pod_runs_untouched(&node, &tw, "before-install");
    let e = node
        .run_pod(HANDLER_SHIM, node.pod_config("early", "default", &[]))
        .err()
        .expect("handler throttlewatch must not exist before the install");
    assert!(e.contains(HANDLER_SHIM), "{e}");

    node.stop();
    install(&node, &tw);
    node.start();
    default_pod_runs_untouched(&node, &tw, "after-install");
}

fn agent_status(tw: &PrivateConfig) -> Response {
    call(&tw.socket, &Request::Status, Duration::from_secs(5)).unwrap()
}

/// Names under `dir` (recursively) that contain `needle`.
fn names_containing(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut v = vec![];
    for p in files_in(dir) {
        if p.file_name()
            .is_some_and(|n| n.to_string_lossy().contains(needle))
        {
            v.push(p.clone());
        }
        if p.is_dir() && !p.is_symlink() {
            v.extend(names_containing(&p, needle));
        }
    }
    v
}

/// A pod through `handler` on the installed configuration, as kubelet runs
/// a pod with a 0.3-CPU limit and our burst annotation.
fn throttled_pod_is_watched(release: ContainerdRelease, handler: &str) {
    let _cpu = cpu_lock();
    let t_test = Instant::now();
    let (tw, port) = tw_config();
    let _agent = Agent::start(&tw);
    let mut node = node(release, &tw);
    let what = format!("{handler} on {}", release.name());
    install(&node, &tw);
    node.start();

    let t_pod = Instant::now();
    let pod: Pod = node
        .run_pod(
            handler,
            node.pod_config("trainer", "ml", &[(BURST_ANNOTATION, "20ms")]),
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
    let id = node
        .create_container(
            &pod,
            "burner",
            // Spins for 4 s, then sleeps: the pod is stopped once it has
            // (below), so the comparison is not one of a kill mid-freeze,
            // whose last episode the kernel adds to cpu.stat only when the
            // next period unthrottles the emptied group (fc3: the probe
            // 35 ms above the `end`'s cpu.stat read before that).
            &[
                "sh",
                "-c",
                "timeout 4 sh -c 'while :; do :; done'; exec sleep 600",
            ],
            Some((30_000, 100_000)),
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
    node.start_container(&id)
        .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
    eprintln!("{what}: pod running in {} ms", t_pod.elapsed().as_millis());

    // The sandbox is left as the CRI made it; the container has our hooks.
    assert!(
        !spec_text(&node, &pod.id).contains(HOOK),
        "the pause container got our hook"
    );
    assert!(
        spec_text(&node, &id).contains(HOOK),
        "the container has no hook of ours"
    );
    // The burst (a pod annotation) is in the container's cgroup, under the pod's.
    let pid = node.container_pid(&id).unwrap();
    let h = Hierarchies::discover().unwrap();
    let rel = cpu_cgroup_of_pid(Path::new("/proc"), pid, h.mode).unwrap();
    let parent = &pod.config.linux.as_ref().unwrap().cgroup_parent;
    assert_eq!(rel, format!("{parent}/{id}"), "the container's cgroup");
    let cg = CpuCgroup::open(&h, &rel).unwrap();
    let l = cg.limits().unwrap();
    assert_eq!(
        (l.quota_us, l.burst_us),
        (Some(30_000), Some(20_000)),
        "quota from the CRI, burst from the pod annotation"
    );
    let cg_dir = cg.cpu_dir.clone();

    // Let it throttle (0.7 s of every second on an idle machine; longer
    // when other work holds the CPUs).
    let t_burn = Instant::now();
    wait_until("300 ms of throttling", Duration::from_secs(20), || {
        cg.cpu_stat().unwrap().throttled_ns >= THROTTLED_NS
    });
    eprintln!(
        "{what}: {THROTTLED_NS} ns throttled after {} ms",
        t_burn.elapsed().as_millis()
    );
    let st = agent_status(&tw);
    assert_eq!(
        st.watched.clone().unwrap_or_default(),
        vec![id.clone()],
        "the agent watches the container, not the sandbox"
    );
    let metrics = http_get(port, "/metrics");
    let series = metrics
        .lines()
        .find(|l| l.starts_with("throttlewatch_") && l.contains(&id))
        .unwrap_or_else(|| panic!("no series for {id}:\n{metrics}"));
    for label in [
        "namespace=\"ml\"",
        "pod=\"trainer\"",
        "container=\"burner\"",
    ] {
        assert!(series.contains(label), "{label} missing in {series}");
    }

    // The spinner done: the group's CPU use stops growing.
    let mut last = (cg.usage_ns().map_or(0, |(ns, _)| ns), Instant::now());
    wait_until("the spinner to finish", Duration::from_secs(30), || {
        let used = cg.usage_ns().map_or(0, |(ns, _)| ns);
        if used.saturating_sub(last.0) > 5_000_000 {
            last = (used, Instant::now());
        }
        last.1.elapsed() > Duration::from_millis(500)
    });
    let t_stop = Instant::now();
    node.stop_pod(&pod)
        .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
    let log_path = tw.log_of(&id);
    wait_until("the end record", Duration::from_secs(10), || {
        log_path.exists() && !of_type(&read_log(&log_path), "end").is_empty()
    });
    node.remove_pod(&pod)
        .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
    eprintln!(
        "{what}: pod stopped and removed in {} ms",
        t_stop.elapsed().as_millis()
    );

    let log = read_log(&log_path);
    let start = &log[0];
    assert_eq!(start["type"], "start", "{start}");
    assert_eq!(start["container_name"], "burner", "{start}");
    for (k, v) in [
        ("k8s_pod", "trainer"),
        ("k8s_namespace", "ml"),
        ("k8s_container", "burner"),
    ] {
        assert_eq!(start["labels"][k], v, "start.labels.{k}: {start}");
    }
    assert_eq!(start["burst_us"], 20_000, "{start}");
    assert!(!of_type(&log, "throttle").is_empty(), "throttle records");
    assert_eq!(log.last().unwrap()["type"], "end", "the log ends with end");
    let end = of_type(&log, "end")[0];
    let probe = end["probe_throttled_ns"].as_u64().unwrap();
    let kernel = end["kernel_throttled_ns"].as_u64().unwrap();
    assert!(kernel >= THROTTLED_NS, "too little throttling: {end}");
    let err = (probe as f64 - kernel as f64).abs() / kernel as f64;
    eprintln!(
        "{what}: probe {probe} ns, kernel {kernel} ns, error {:.3} %",
        err * 100.0
    );
    assert!(
        err <= 0.005,
        "probe {probe} vs kernel {kernel}: {:.3} % > 0.5 %",
        err * 100.0
    );
    // One log: the container's. The pause container has none.
    assert!(!tw.log_of(&pod.id).exists(), "the sandbox has a log");
    let logs: Vec<_> = files_in(&tw.log_dir)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    assert_eq!(logs, vec![log_path.clone()], "one log per pod container");

    // Nothing left: shims, runc state, fifos and CRI dirs, cgroups, watches.
    wait_until("the shims to exit", Duration::from_secs(10), || {
        node.shim_pids().is_empty()
    });
    for task in [&pod.id, &id] {
        for d in CriNode::runc_state_dirs(task)
            .into_iter()
            .chain(node.cri_dirs(task))
        {
            assert!(!d.exists(), "{} is left", d.display());
        }
        for dir in [Path::new("/run/containerd/fifo"), &node.dir.0] {
            let left = names_containing(dir, task);
            assert!(left.is_empty(), "left behind: {left:?}");
        }
    }
    assert!(!cg_dir.exists(), "cgroup {} is left", cg_dir.display());
    let st = agent_status(&tw);
    assert_eq!(st.watched.unwrap_or_default(), Vec::<String>::new());
    assert_eq!(st.watch_map_entries, Some(0), "BPF watch map entries left");
    assert_eq!(tw.hook_log(), "", "the hook reported problems");
    eprintln!("{what}: test took {} ms", t_test.elapsed().as_millis());
}

/// Issue 31: a container's stats through the CRI, what kubelet reads
/// (memory usage, working set, RSS, page faults) and, on containerd 2.x,
/// the names of the pod metrics (`container_oom_events_total` comes from
/// memory.oom_control), are there with our shim when they are there with
/// the runc shim. Ours used to leave out memory.stat and oom_control.
fn container_stats_are_those_of_the_runc_shim(release: ContainerdRelease) {
    let (tw, _) = tw_config();
    let _agent = Agent::start(&tw);
    let mut node = node(release, &tw);
    install(&node, &tw);
    node.start();
    let mut seen = vec![];
    for handler in ["", HANDLER_SHIM] {
        let pod = node
            .run_pod(handler, node.pod_config("stats", "default", &[]))
            .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
        let id = node
            .create_container(&pod, "app", &["sleep", "1000"], Some((50_000, 100_000)))
            .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
        node.start_container(&id).unwrap();
        let nonzero =
            |v: &Option<k8s_cri::v1::UInt64Value>| v.as_ref().is_some_and(|v| v.value > 0);
        let mut memory = None;
        wait_until("memory stats", Duration::from_secs(15), || {
            memory = node.container_stats(&id).ok().and_then(|s| s.memory);
            memory.as_ref().is_some_and(|m| nonzero(&m.usage_bytes))
        });
        let m = memory.unwrap();
        let shape = [
            ("usage_bytes", nonzero(&m.usage_bytes)),
            ("working_set_bytes", nonzero(&m.working_set_bytes)),
            ("rss_bytes", nonzero(&m.rss_bytes)),
            ("page_faults", nonzero(&m.page_faults)),
        ];
        let names = match release {
            V1_6 => vec![],
            V2_3 => {
                let mut names = vec![];
                wait_until("pod metrics", Duration::from_secs(15), || {
                    names = node.container_metric_names(&id).unwrap_or_default();
                    !names.is_empty()
                });
                names
            }
        };
        eprintln!(
            "{} {handler:?}: memory {m:?}\n  metrics {names:?}",
            release.name()
        );
        node.stop_pod(&pod).unwrap();
        node.remove_pod(&pod).unwrap();
        seen.push((shape, names));
    }
    assert!(
        seen[0].0.iter().all(|(_, nz)| *nz),
        "the runc shim's stats on {}: {:?}",
        release.name(),
        seen[0]
    );
    assert_eq!(
        seen[1],
        seen[0],
        "{}: ours vs the runc shim",
        release.name()
    );
}

#[test]
fn container_stats_are_those_of_the_runc_shim_on_containerd_1_6() {
    container_stats_are_those_of_the_runc_shim(V1_6);
}

#[test]
fn container_stats_are_those_of_the_runc_shim_on_containerd_2_3() {
    container_stats_are_those_of_the_runc_shim(V2_3);
}

#[test]
fn default_handler_pods_run_before_and_after_the_install_on_containerd_1_6() {
    default_handler_pods_run_before_and_after_the_install(V1_6);
}

#[test]
fn default_handler_pods_run_before_and_after_the_install_on_containerd_2_3() {
    default_handler_pods_run_before_and_after_the_install(V2_3);
}

#[test]
fn pod_through_the_throttlewatch_shim_on_containerd_1_6() {
    throttled_pod_is_watched(V1_6, HANDLER_SHIM);
}

#[test]
fn pod_through_the_throttlewatch_shim_on_containerd_2_3() {
    throttled_pod_is_watched(V2_3, HANDLER_SHIM);
}

#[test]
fn pod_through_the_runc_shim_with_our_wrapper_on_containerd_1_6() {
    throttled_pod_is_watched(V1_6, HANDLER_WRAPPER);
}

#[test]
fn pod_through_the_runc_shim_with_our_wrapper_on_containerd_2_3() {
    throttled_pod_is_watched(V2_3, HANDLER_WRAPPER);
}
