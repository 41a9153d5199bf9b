//! The plugin node-wide (`--watch-all`) against containerd 2.3.4.

use super::*;

/// Node-wide (`--watch-all`, as the DaemonSet's option or `watch = "all"` in
/// the runtime's plugin configuration): a pod without any annotation is
/// logged from its start to its end; `throttlewatch.io/watch: "false"`
/// still opts a pod out.
#[test]
fn node_wide_the_plugin_watches_every_pod_but_those_that_opt_out() {
    let _cpu = cpu_lock();
    let tw = PrivateConfig::new("");
    let _agent = Agent::start(&tw);
    let (node, socket) = started_node(&tw);
    let mut plugin = plugin_up_with(&node, &tw, &socket, 1, &["--watch-all"]);
    let (pod, id, _) = pod_with_container(&node, "plain", &[], &["sleep", "600"]);
    let (out_pod, out, _) = pod_with_container(
        &node,
        "opted-out",
        &[("throttlewatch.io/watch", "false")],
        &["sleep", "600"],
    );
    wait_until(
        "the unannotated pod's start record",
        || has_start(&tw, &id),
        || plugin.output(),
    );
    let path = tw.log_of(&id);
    node.stop_and_remove(&pod);
    node.stop_and_remove(&out_pod);
    let log = throttlewatch_integration::assert_whole_log(&path);
    assert_eq!(log[0]["container_name"], "work", "{}", log[0]);
    assert_eq!(
        logs_in(&tw.log_dir),
        vec![path],
        "one log: the unannotated pod's, none for {out}"
    );
    assert_eq!(leftovers(&tw), Vec::<PathBuf>::new(), "state left behind");
    assert_eq!(tw.hook_log(), "", "the plugin reported problems");
    plugin.stop();
}
