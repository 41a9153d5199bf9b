//! The NRI front end on the node users run now: containerd 2.3.4 with its
//! CRI plugin and NRI on a private socket, `throttlewatch-nri` as a daemon
//! dialing it, pods through the CRI with the default `runc` handler (no
//! runtime class of ours). An annotated pod's container is logged from its
//! start to its end with the burst it asked for in its cgroup; an
//! unannotated one is left alone; a restarted plugin is synchronized again
//! without a second `start` record; nothing is left behind. `nri/restart.rs`:
//! what the plugin does at a `Synchronize` after it was down, and an update
//! that fails in the runtime. Run `cargo build --workspace --bins` first.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_cri::v1 as api;
use throttlewatch_core::state_dir::StateDir;
use throttlewatch_integration::cri::{CriNode, Pod};
use throttlewatch_integration::daemons::{Agent, PrivateConfig};
use throttlewatch_integration::modern_node::{containerd_2_node, logs_in};
use throttlewatch_integration::nri_plugin::{self, leftovers, NriDaemon};
use throttlewatch_integration::{bin, cpu_lock, of_type, read_log};

#[path = "nri/fail_open.rs"]
mod fail_open;
#[path = "nri/fidelity.rs"]
mod fidelity;
#[path = "nri/latency.rs"]
mod latency;
#[path = "nri/node_wide.rs"]
mod node_wide;
#[path = "nri/restart.rs"]
mod restart;

/// Every wait of this test is bounded by this.
const WAIT: Duration = Duration::from_secs(30);
/// The name the plugin registers under, as containerd's log names it.
const PLUGIN: &str = "10-throttlewatch";

/// Wait for `f`, at most `WAIT`; on a timeout, panic with what `seen` says.
fn wait_until(what: &str, mut f: impl FnMut() -> bool, seen: impl Fn() -> String) {
    let t0 = Instant::now();
    while !f() {
        if t0.elapsed() > WAIT {
            panic!(
                "timed out after {WAIT:?} waiting for {what}; seen:\n{}",
                seen()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How many times containerd's log says the plugin connected and synchronized.
fn synchronized(node: &CriNode) -> usize {
    log_lines(node, &["connected and synchronized"])
}

/// containerd's log lines naming the plugin and each of `words`.
fn log_lines(node: &CriNode, words: &[&str]) -> usize {
    nri_plugin::log_lines(node, PLUGIN, words)
}

/// A containerd 2.3.4 node for `tw`, started, and its NRI socket once there.
fn started_node(tw: &PrivateConfig) -> (CriNode, PathBuf) {
    let mut node = containerd_2_node(tw);
    node.start();
    let socket = node.dir.0.join("nri/nri.sock");
    wait_until("containerd's NRI socket", || socket.exists(), || node.log());
    (node, socket)
}

/// Whether the container `id`'s log has its `start` record.
fn has_start(tw: &PrivateConfig, id: &str) -> bool {
    let p = tw.log_of(id);
    p.exists() && !of_type(&read_log(&p), "start").is_empty()
}

/// Start the plugin and wait until containerd has synchronized it `n` times in all.
fn plugin_up(node: &CriNode, tw: &PrivateConfig, socket: &Path, n: usize) -> NriDaemon {
    plugin_up_with(node, tw, socket, n, &[])
}

/// [`plugin_up`] with `extra` arguments (`--watch-all`).
fn plugin_up_with(
    node: &CriNode,
    tw: &PrivateConfig,
    socket: &Path,
    n: usize,
    extra: &[&str],
) -> NriDaemon {
    let out = node.dir.0.join(format!("nri-plugin-{n}.out"));
    let plugin = NriDaemon::start(tw, socket, out, extra);
    wait_until(
        &format!("containerd to synchronize {PLUGIN} (time {n})"),
        || synchronized(node) >= n,
        || {
            format!(
                "plugin output:\n{}\ncontainerd log:\n{}",
                plugin.output(),
                node.log()
            )
        },
    );
    plugin
}

/// RunPodSandbox (runc handler), CreateContainer, StartContainer; the
/// container's id and the time the three calls took.
fn pod_with_container(
    node: &CriNode,
    name: &str,
    annotations: &[(&str, &str)],
    cmd: &[&str],
) -> (Pod, String, Duration) {
    let t0 = Instant::now();
    let config = node.pod_config(name, "default", annotations);
    let pod = node
        .run_pod("runc", config)
        .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
    let id = node
        .create_container(&pod, "work", cmd, Some((50_000, 100_000)))
        .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
    node.start_container(&id)
        .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
    (pod, id, t0.elapsed())
}

fn update_quota(node: &CriNode, id: &str, quota: i64) {
    try_update_quota(node, id, quota).unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
}

/// UpdateContainerResources to `quota` µs per 100 ms; the runtime's error.
fn try_update_quota(node: &CriNode, id: &str, quota: i64) -> Result<(), String> {
    let req = api::UpdateContainerResourcesRequest {
        container_id: id.into(),
        linux: Some(api::LinuxContainerResources {
            cpu_quota: quota,
            cpu_period: 100_000,
            cpu_shares: (quota * 1024 / 100_000).max(2),
            ..Default::default()
        }),
        ..Default::default()
    };
    node.call(
        "UpdateContainerResources",
        node.runtime().update_container_resources(req),
    )
    .map(drop)
}

#[test]
fn nri_plugin_on_a_containerd_2_node() {
    let _cpu = cpu_lock();
    let tw = PrivateConfig::new("");
    let _agent = Agent::start(&tw);
    let mut node = containerd_2_node(&tw);
    let t0 = Instant::now();
    node.start();
    eprintln!("containerd 2.3.4 ready in {} ms", t0.elapsed().as_millis());
    let socket = node.dir.0.join("nri/nri.sock");
    wait_until("containerd's NRI socket", || socket.exists(), || node.log());
    let t0 = Instant::now();
    let mut plugin = plugin_up(&node, &tw, &socket, 1);
    eprintln!(
        "plugin registered and synchronized in {} ms:\n{}",
        t0.elapsed().as_millis(),
        plugin.output()
    );

    // Not annotated: the plugin sees it and leaves it alone.
    let (plain_pod, plain, took) = pod_with_container(&node, "plain", &[], &["sleep", "600"]);
    eprintln!(
        "unannotated pod + container started in {} ms",
        took.as_millis()
    );
    assert_eq!(
        node.cpu_cgroup_of(&plain)
            .limits()
            .unwrap()
            .burst_us
            .unwrap_or(0),
        0,
        "an unannotated container got a burst"
    );
    node.stop_and_remove(&plain_pod);
    assert_eq!(
        logs_in(&tw.log_dir),
        Vec::<PathBuf>::new(),
        "an unannotated pod got a log"
    );

    // Annotated: logged from its start, the burst in its cgroup.
    let (pod, id, took) = pod_with_container(
        &node,
        "burst",
        &[("throttlewatch.io/cpu-burst", "20ms")],
        &["sleep", "600"],
    );
    eprintln!(
        "annotated pod + container started in {} ms",
        took.as_millis()
    );
    // The log's name has the container's scope: resolved once it exists.
    wait_until(
        "the start record",
        || has_start(&tw, &id),
        || {
            format!(
                "logs: {:?}\nplugin:\n{}\nhook.log:\n{}",
                logs_in(&tw.log_dir),
                plugin.output(),
                tw.hook_log()
            )
        },
    );
    let path = tw.log_of(&id);
    eprintln!("log: {}", path.display());
    let cg = node.cpu_cgroup_of(&id);
    let limits = cg.limits().unwrap();
    eprintln!("annotated container's cgroup: {limits:?}");
    assert_eq!(limits.quota_us, Some(50_000), "quota");
    assert_eq!(
        limits.burst_us,
        Some(20_000),
        "the annotated burst in the cgroup"
    );

    // The plugin restarts: synchronized again, the container registered
    // again, no second start record.
    plugin.stop();
    let t0 = Instant::now();
    let mut plugin = plugin_up(&node, &tw, &socket, 2);
    eprintln!(
        "plugin restarted and synchronized in {} ms",
        t0.elapsed().as_millis()
    );
    // Synchronize's registers run behind its answer: the plugin says when
    // they are done.
    wait_until(
        "the re-synchronized container to be registered again",
        || {
            plugin
                .output()
                .contains("Synchronize: 1 of 1 running containers watched")
        },
        || plugin.output(),
    );
    let log = read_log(&path);
    assert_eq!(
        of_type(&log, "start").len(),
        1,
        "start records after the restart: {log:?}"
    );
    assert!(
        of_type(&log, "end").is_empty(),
        "ended by the restart: {log:?}"
    );

    // A resize below the burst: the quota is taken and the burst clamped to it.
    update_quota(&node, &id, 10_000);
    let limits = cg.limits().unwrap();
    eprintln!("after the resize to 10 ms: {limits:?}");
    assert_eq!(limits.quota_us, Some(10_000), "quota after the resize");
    assert_eq!(
        limits.burst_us,
        Some(10_000),
        "burst clamped to the new quota"
    );
    update_quota(&node, &id, 50_000);
    let limits = cg.limits().unwrap();
    assert_eq!(
        (limits.quota_us, limits.burst_us),
        (Some(50_000), Some(20_000)),
        "burst back after the resize up"
    );

    // The pod stops: the log ends.
    node.stop_and_remove(&pod);
    wait_until(
        "the end record",
        || !of_type(&read_log(&path), "end").is_empty(),
        || format!("log: {:?}\nplugin:\n{}", read_log(&path), plugin.output()),
    );
    let log = throttlewatch_integration::assert_whole_log(&path);
    assert_eq!(of_type(&log, "start").len(), 1, "{log:?}");
    assert_eq!(log[0]["container_name"], "work", "{}", log[0]);
    // StopContainer comes before the runtime's low-level delete: the shim's
    // reason, with the exit code the runtime gives.
    let end = of_type(&log, "end")[0];
    eprintln!(
        "end at StopContainer: reason {}, exit_code {}, kernel_source {}",
        end["reason"], end["exit_code"], end["kernel_source"]
    );
    assert_eq!(end["reason"], "delete", "{end}");
    assert!(end["exit_code"].is_i64(), "{end}");

    // containerd restarts under a running pod: the daemon dials again and
    // is synchronized again; the running container keeps its one log (no
    // second `start`), is ended when it stops after the restart, and a pod
    // started after the restart is watched. (The node keeps its /run, where
    // containerd 2.x has its shims' sockets, across the restart.)
    let (pod_across, id_across, _) = pod_with_container(
        &node,
        "across-restart",
        &[("throttlewatch.io/cpu-burst", "20ms")],
        &["sleep", "600"],
    );
    wait_until(
        "the start record of the pod that runs across the restart",
        || has_start(&tw, &id_across),
        || plugin.output(),
    );
    let path_across = tw.log_of(&id_across);
    node.stop();
    let t0 = Instant::now();
    node.start();
    wait_until(
        "the plugin to be synchronized by the restarted containerd",
        || synchronized(&node) >= 3,
        || {
            format!(
                "plugin output:\n{}\ncontainerd log:\n{}",
                plugin.output(),
                node.log()
            )
        },
    );
    eprintln!(
        "containerd restarted, plugin synchronized again in {} ms",
        t0.elapsed().as_millis()
    );
    assert_eq!(
        node.container_state(&id_across)
            .unwrap_or_else(|e| panic!("{e}\n{}", node.log()))
            .0,
        api::ContainerState::ContainerRunning,
        "the container across the restart"
    );
    assert_eq!(
        node.cpu_cgroup_of(&id_across).limits().unwrap().burst_us,
        Some(20_000),
        "the burst across the restart (Synchronize applies it again)"
    );
    node.stop_and_remove(&pod_across);
    let log_across = throttlewatch_integration::assert_whole_log(&path_across);
    let end = of_type(&log_across, "end")[0];
    assert_eq!(end["reason"], "delete", "{end}");
    eprintln!(
        "across containerd's restart: {} records, one start, ended at its stop",
        log_across.len()
    );
    let (pod2, id2, took) = pod_with_container(
        &node,
        "after-restart",
        &[("throttlewatch.io/watch", "true")],
        &["sleep", "600"],
    );
    eprintln!(
        "annotated pod after containerd's restart started in {} ms",
        took.as_millis()
    );
    wait_until(
        "the start record after containerd's restart",
        || has_start(&tw, &id2),
        || {
            format!(
                "logs: {:?}\nplugin:\n{}",
                logs_in(&tw.log_dir),
                plugin.output()
            )
        },
    );
    let path2 = tw.log_of(&id2);
    node.stop_and_remove(&pod2);
    let log2 = throttlewatch_integration::assert_whole_log(&path2);
    eprintln!(
        "after containerd's restart: {} records, start to end",
        log2.len()
    );

    // Nothing left: the two logs, no state for the containers, no errors.
    let mut logs = logs_in(&tw.log_dir);
    logs.sort();
    let mut want = vec![path.clone(), path_across.clone(), path2.clone()];
    want.sort();
    assert_eq!(logs, want, "logs");
    assert_eq!(leftovers(&tw), Vec::<PathBuf>::new(), "state left behind");
    assert_eq!(tw.hook_log(), "", "the plugin reported problems");
    assert_eq!(
        tw.stray_files(),
        Vec::<PathBuf>::new(),
        "files outside the log and state dirs"
    );
    plugin.stop();
    eprintln!("plugin output:\n{}", plugin.output());
}

/// The processes whose executable is `exe` (by inode: the link's text
/// differs under the VM lane's shared root).
fn pids_of(exe: &Path) -> Vec<u32> {
    use std::os::unix::fs::MetadataExt;
    let want = std::fs::metadata(exe).map(|m| (m.dev(), m.ino())).ok();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let m = std::fs::metadata(format!("/proc/{pid}/exe"));
            want.is_some() && m.map(|m| (m.dev(), m.ino())).ok() == want
        })
        .collect()
}

/// The plugin as the runtime launches it: installed in containerd's NRI
/// plugin directory as `10-throttlewatch`, throttlewatch's configuration
/// named in `conf.d/10-throttlewatch.conf` (a launched plugin gets no
/// arguments and none of containerd's environment: NRI hands it that
/// file's text in `Configure`). containerd starts it with the connection
/// open (`NRI_PLUGIN_SOCKET`) and its stderr on /dev/null: its own lines
/// go to `throttlewatch-nri.log` in that configuration's `log_dir`, from
/// its first; it exits with containerd.
#[test]
fn plugin_launched_by_containerd() {
    let _cpu = cpu_lock();
    let tw = PrivateConfig::new("");
    let _agent = Agent::start(&tw);
    let mut node = containerd_2_node(&tw);
    let plugins = node.dir.0.join("nri/plugins");
    let confs = node.dir.0.join("nri/conf.d");
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::create_dir_all(&confs).unwrap();
    let exe = plugins.join(PLUGIN);
    std::fs::copy(bin("throttlewatch-nri"), &exe).unwrap();
    let conf = format!("config = {:?}\n", tw.path.to_str().unwrap());
    std::fs::write(confs.join(format!("{PLUGIN}.conf")), conf).unwrap();
    node.start();
    wait_until(
        "containerd to launch and synchronize the plugin",
        || {
            log_lines(
                &node,
                &["pre-installed NRI plugin", "synchronization success"],
            ) >= 1
        },
        || node.log(),
    );
    let pids = pids_of(&exe);
    eprintln!("launched plugin: pids {pids:?}");
    assert_eq!(pids.len(), 1, "one launched plugin: {pids:?}");

    let (pod, id, took) = pod_with_container(
        &node,
        "launched",
        &[("throttlewatch.io/watch", "true")],
        &["sleep", "600"],
    );
    eprintln!(
        "annotated pod + container started in {} ms",
        took.as_millis()
    );
    wait_until(
        "the start record",
        || has_start(&tw, &id),
        || {
            format!(
                "logs: {:?}\ncontainerd log:\n{}",
                logs_in(&tw.log_dir),
                node.log()
            )
        },
    );
    let path = tw.log_of(&id);
    node.stop_and_remove(&pod);
    let log = throttlewatch_integration::assert_whole_log(&path);
    eprintln!("launched plugin: {} records, start to end", log.len());

    // containerd goes: the plugin's connection ends and it exits.
    node.stop();
    wait_until(
        "the launched plugin to exit with containerd",
        || {
            pids.iter().all(|p| {
                std::fs::read_to_string(format!("/proc/{p}/stat"))
                    .map_or(true, |st| st.contains(") Z "))
            })
        },
        || format!("still running: {:?}", pids_of(&exe)),
    );
    assert_eq!(logs_in(&tw.log_dir), vec![path], "logs");
    assert_eq!(leftovers(&tw), Vec::<PathBuf>::new(), "state left behind");
    assert_eq!(tw.hook_log(), "", "the plugin reported problems");
    let own = std::fs::read_to_string(tw.log_dir.join("throttlewatch-nri.log"))
        .expect("the launched plugin's own log in the node's log_dir");
    eprintln!("launched plugin's own lines:\n{own}");
    let lines: Vec<&str> = own.lines().collect();
    assert!(
        lines[0].starts_with("throttlewatch-nri: launched by the runtime as 10-throttlewatch"),
        "its first line, said before Configure named the file: {own}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("registered as 10-throttlewatch")),
        "{own}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("configured by containerd/")),
        "{own}"
    );
    assert!(
        lines
            .last()
            .unwrap()
            .contains("the runtime closed the connection"),
        "its last line, at containerd's stop: {own}"
    );
}
