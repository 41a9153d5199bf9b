//! The plugin after it was down (containerd goes on without a plugin that
//! is not connected): at the next `Synchronize` a container it registered
//! that stopped and was removed meanwhile gets its `end` and leaves nothing
//! in the state dir (its burst record, its exclusive cores), while another front end's container in the same
//! containerd namespace is left alone; running containers get their
//! annotation QoS again (one that started while the plugin was down gets
//! its burst then). And a burst held off for an update that fails in the
//! runtime (no `PostUpdateContainer` comes) is written back.

use throttlewatch_core::{ContainerKey, Scope};
use throttlewatch_integration::containerd::{IMAGE_NAME, SHIM_RUNTIME};

use super::*;

/// The pod cpu-burst annotation of these tests.
const BURST: (&str, &str) = ("throttlewatch.io/cpu-burst", "20ms");

fn key_of(id: &str) -> ContainerKey {
    ContainerKey::new(id, Some(Scope::of_namespace("k8s.io")))
}

fn burst_of(node: &CriNode, id: &str) -> u64 {
    node.cpu_cgroup_of(id)
        .limits()
        .unwrap()
        .burst_us
        .unwrap_or(0)
}

/// The exclusive cores held, as the allocator's file has them (a dead
/// holder's are still there until someone allocates again).
fn exclusive_holders(tw: &PrivateConfig) -> Vec<String> {
    let p = tw.state_dir.join("cpusets/cpusets.json");
    let v: serde_json::Value = std::fs::read_to_string(&p)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    v["holdings"]
        .as_object()
        .map(|h| h.keys().cloned().collect())
        .unwrap_or_default()
}

fn stop_and_remove_container(node: &CriNode, id: &str) {
    let stop = api::StopContainerRequest {
        container_id: id.into(),
        timeout: 0,
    };
    node.call("StopContainer", node.runtime().stop_container(stop))
        .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
    let remove = api::RemoveContainerRequest {
        container_id: id.into(),
    };
    node.call("RemoveContainer", node.runtime().remove_container(remove))
        .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
}

/// Stop the plugin and wait until containerd has seen `n` of its
/// connections closed in all.
fn plugin_down(node: &CriNode, plugin: &mut NriDaemon, n: usize) {
    plugin.stop();
    wait_until(
        "containerd to see the plugin gone",
        || log_lines(node, &["connection to plugin", "closed"]) >= n,
        || node.log(),
    );
}

fn wait_for_start(tw: &PrivateConfig, id: &str, plugin: &NriDaemon) -> PathBuf {
    wait_until(
        "the start record",
        || has_start(tw, id),
        || {
            format!(
                "logs: {:?}\nplugin:\n{}\nhook.log:\n{}",
                logs_in(&tw.log_dir),
                plugin.output(),
                tw.hook_log()
            )
        },
    );
    tw.log_of(id)
}

fn wait_for_output(plugin: &NriDaemon, line: &str) {
    wait_until(
        &format!("the plugin to say {line:?}"),
        || plugin.output().contains(line),
        || plugin.output(),
    );
}

/// `ctr ARGS` in the CRI's namespace, run in containerd's mount namespace
/// (its private /run holds the FIFOs a `ctr run` opens).
fn ctr_in_node(node: &CriNode, args: &[&str]) -> std::process::Output {
    node.nsenter_cmd(&node.release.ctr())
        .arg("-a")
        .arg(&node.socket)
        .args(["-n", "k8s.io"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("ctr")
}

/// A container of the throttlewatch shim run by `ctr` in the CRI's
/// namespace: keyed by the agent like the plugin's (`<id>@ns-k8s.io`), its
/// own burst record, and not a CRI container (NRI does not list it).
fn shim_container(node: &CriNode, id: &str) {
    let out = ctr_in_node(
        node,
        &[
            "run",
            "-d",
            "--runtime",
            SHIM_RUNTIME,
            "--cpu-quota",
            "50000",
            "--cpu-period",
            "100000",
            "--env",
            "THROTTLEWATCH_CPU_BURST=20ms",
            IMAGE_NAME,
            id,
            "sleep",
            "600",
        ],
    );
    assert!(
        out.status.success(),
        "ctr run: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        node.log()
    );
}

fn remove_shim_container(node: &CriNode, id: &str) {
    for args in [
        &["task", "kill", "-s", "SIGKILL", id][..],
        &["task", "delete", "--force", id],
        &["containers", "rm", id],
    ] {
        let _ = ctr_in_node(node, args);
    }
}

#[test]
fn a_container_that_ends_while_the_plugin_is_down() {
    let _cpu = cpu_lock();
    let tw = PrivateConfig::new("[qos]\nenv_keys = [\"cpu-burst\"]\n");
    let _agent = Agent::start(&tw);
    let (node, socket) = started_node(&tw);
    let mut plugin = plugin_up(&node, &tw, &socket, 1);
    let exclusive = ("throttlewatch.io/cpuset", "1,exclusive");
    let (pod, id, _) = pod_with_container(
        &node,
        "ends-while-down",
        &[BURST, exclusive],
        &["sleep", "600"],
    );
    let path = wait_for_start(&tw, &id, &plugin);
    assert_eq!(burst_of(&node, &id), 20_000, "the annotated burst");
    let st = StateDir::new(&tw.state_dir);
    let key = key_of(&id);
    assert_eq!(exclusive_holders(&tw), vec![key.qualified()], "CPU 1 held");
    assert!(
        st.nri_file(&key).exists() && st.burst_file(&key).exists(),
        "the plugin's registration and the burst record: {:?}",
        leftovers(&tw)
    );
    // Another front end in the same id space, which NRI does not list.
    let other = format!("other-{}", std::process::id());
    shim_container(&node, &other);
    let other_log = wait_for_start(&tw, &other, &plugin);
    let other_burst = st.burst_file(&key_of(&other));
    assert!(
        other_burst.exists(),
        "the shim's burst record: {:?}",
        leftovers(&tw)
    );

    plugin_down(&node, &mut plugin, 1);
    stop_and_remove_container(&node, &id);
    let t0 = Instant::now();
    let plugin = plugin_up(&node, &tw, &socket, 2);
    wait_until(
        "the end record, the burst record and the registration gone",
        || {
            !of_type(&read_log(&path), "end").is_empty()
                && !st.burst_file(&key).exists()
                && !st.nri_file(&key).exists()
                && exclusive_holders(&tw).is_empty()
        },
        || {
            format!(
                "log: {:?}\nleft: {:?}, exclusive cores held by {:?}\nplugin:\n{}",
                read_log(&path),
                leftovers(&tw),
                exclusive_holders(&tw),
                plugin.output()
            )
        },
    );
    eprintln!(
        "plugin started again: ended and cleaned up {} ms later",
        t0.elapsed().as_millis()
    );
    wait_for_output(
        &plugin,
        "Synchronize: 1 containers registered by this plugin are no longer running",
    );
    let log = throttlewatch_integration::assert_whole_log(&path);
    let ends = of_type(&log, "end");
    assert_eq!(ends.len(), 1, "{log:?}");
    eprintln!(
        "its end: reason {}, kernel_source {}",
        ends[0]["reason"], ends[0]["kernel_source"]
    );
    // The other front end's container: still watched, its record kept.
    assert!(other_burst.exists(), "the shim's burst record was removed");
    assert!(
        of_type(&read_log(&other_log), "end").is_empty(),
        "the shim's container was ended: {:?}",
        read_log(&other_log)
    );
    remove_shim_container(&node, &other);
    wait_until(
        "the shim container's end",
        || !of_type(&read_log(&other_log), "end").is_empty(),
        || format!("{:?}", read_log(&other_log)),
    );
    node.stop_and_remove(&pod);
    assert_eq!(leftovers(&tw), Vec::<PathBuf>::new(), "state left behind");
    assert_eq!(tw.hook_log(), "", "problems reported");
}

#[test]
fn synchronize_applies_the_annotation_qos_again() {
    let _cpu = cpu_lock();
    let tw = PrivateConfig::new("");
    let _agent = Agent::start(&tw);
    let (node, socket) = started_node(&tw);
    let mut plugin = plugin_up(&node, &tw, &socket, 1);
    let (pod, id, _) = pod_with_container(&node, "resync", &[BURST], &["sleep", "600"]);
    let path = wait_for_start(&tw, &id, &plugin);
    assert_eq!(burst_of(&node, &id), 20_000, "the annotated burst");

    // Restarted with nothing changed: the same burst, one start record.
    plugin_down(&node, &mut plugin, 1);
    let mut plugin = plugin_up(&node, &tw, &socket, 2);
    wait_for_output(&plugin, "Synchronize: 1 of 1 running containers watched");
    assert_eq!(burst_of(&node, &id), 20_000, "the burst after a restart");
    assert_eq!(of_type(&read_log(&path), "start").len(), 1);

    // While the plugin is down: the first container's burst is lost (as
    // an update through runc 1.1 without the plugin loses it), and a pod
    // starts with no plugin to give it its burst or its log.
    plugin_down(&node, &mut plugin, 2);
    node.cpu_cgroup_of(&id).set_burst(0).unwrap();
    let (pod2, id2, _) = pod_with_container(&node, "while-down", &[BURST], &["sleep", "600"]);
    assert_eq!(burst_of(&node, &id2), 0, "a burst without the plugin");
    assert!(!tw.log_of(&id2).exists(), "a log without the plugin");
    let t0 = Instant::now();
    let plugin = plugin_up(&node, &tw, &socket, 3);
    wait_for_output(&plugin, "Synchronize: 2 of 2 running containers watched");
    eprintln!(
        "plugin started again: both containers' QoS applied {} ms later",
        t0.elapsed().as_millis()
    );
    assert_eq!(burst_of(&node, &id), 20_000, "the lost burst back");
    assert_eq!(
        burst_of(&node, &id2),
        20_000,
        "the burst of the pod started while down"
    );
    let path2 = wait_for_start(&tw, &id2, &plugin);
    assert_eq!(of_type(&read_log(&path), "start").len(), 1, "{path:?}");
    assert_eq!(of_type(&read_log(&path2), "start").len(), 1, "{path2:?}");

    for p in [&pod, &pod2] {
        node.stop_and_remove(p);
    }
    for p in [&path, &path2] {
        wait_until(
            "the end record",
            || !of_type(&read_log(p), "end").is_empty(),
            || format!("{:?}\n{}", read_log(p), plugin.output()),
        );
        throttlewatch_integration::assert_whole_log(p);
    }
    assert_eq!(leftovers(&tw), Vec::<PathBuf>::new(), "state left behind");
    assert_eq!(tw.hook_log(), "", "problems reported");
}

/// A quota below the kernel's 1 ms minimum: runc's write of it fails, the
/// runtime answers the resize with an error and sends no
/// `PostUpdateContainer`. The burst the plugin held off for it comes back
/// after twice NRI's request timeout (4 s), for the quota the container
/// still has.
#[test]
fn a_failed_update_gets_its_burst_back() {
    let _cpu = cpu_lock();
    let tw = PrivateConfig::new("");
    let _agent = Agent::start(&tw);
    let (node, socket) = started_node(&tw);
    let plugin = plugin_up(&node, &tw, &socket, 1);
    let (pod, id, _) = pod_with_container(&node, "failed-update", &[BURST], &["sleep", "600"]);
    let path = wait_for_start(&tw, &id, &plugin);
    assert_eq!(burst_of(&node, &id), 20_000, "the annotated burst");
    let t0 = Instant::now();
    let refused = try_update_quota(&node, &id, 500);
    let held = burst_of(&node, &id);
    eprintln!("resize to a 0.5 ms quota: {refused:?}; burst right after: {held}");
    assert!(refused.is_err(), "the runtime took a 0.5 ms quota");
    assert_eq!(held, 0, "the burst is held off for the update");
    wait_until(
        "the burst back",
        || burst_of(&node, &id) == 20_000,
        || plugin.output(),
    );
    let took = t0.elapsed();
    eprintln!("burst back {} ms after the failed resize", took.as_millis());
    assert!(
        took >= Duration::from_millis(3500),
        "back after {took:?}: before the hold limit"
    );
    wait_for_output(&plugin, "no PostUpdateContainer within 4s");
    let limits = node.cpu_cgroup_of(&id).limits().unwrap();
    assert_eq!(
        (limits.quota_us, limits.burst_us),
        (Some(50_000), Some(20_000)),
        "the quota kept, the burst for it"
    );
    // A resize that works afterwards is still clamped and restored.
    update_quota(&node, &id, 10_000);
    assert_eq!(burst_of(&node, &id), 10_000, "clamped to the new quota");
    node.stop_and_remove(&pod);
    wait_until(
        "the end record",
        || !of_type(&read_log(&path), "end").is_empty(),
        || plugin.output(),
    );
    assert_eq!(leftovers(&tw), Vec::<PathBuf>::new(), "state left behind");
}
