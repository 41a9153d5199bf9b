//! What the plugin adds to a pod's start, against the real containerd 2.3.4.

use super::*;

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// What the plugin adds to a pod's start: RunPodSandbox + CreateContainer +
/// StartContainer of an annotated pod with the plugin connected (it
/// registers the container before its entrypoint runs) and without it,
/// interleaved in the same run; the figures are printed, not judged.
#[test]
fn pod_start_latency_with_and_without_the_plugin() {
    const ROUNDS: usize = 9;
    let _cpu = cpu_lock();
    let tw = PrivateConfig::new("");
    let _agent = Agent::start(&tw);
    let mut node = containerd_2_node(&tw);
    node.start();
    let socket = node.dir.0.join("nri/nri.sock");
    wait_until("containerd's NRI socket", || socket.exists(), || node.log());
    let closed = |node: &CriNode| log_lines(node, &["connection to plugin", "closed"]);
    let watch = [("throttlewatch.io/watch", "true")];
    let (mut with, mut without) = (vec![], vec![]);
    for round in 0..ROUNDS {
        let mut plugin = plugin_up(&node, &tw, &socket, round + 1);
        let (pod, id, t) =
            pod_with_container(&node, &format!("with-{round}"), &watch, &["sleep", "600"]);
        with.push(t);
        node.stop_and_remove(&pod);
        wait_until(
            "the end record",
            || {
                let p = tw.log_of(&id);
                p.exists() && !of_type(&read_log(&p), "end").is_empty()
            },
            || {
                format!(
                    "logs: {:?}\nplugin:\n{}",
                    logs_in(&tw.log_dir),
                    plugin.output()
                )
            },
        );
        plugin.stop();
        wait_until(
            "containerd to see the plugin gone",
            || closed(&node) > round,
            || node.log(),
        );
        let (pod, _, t) = pod_with_container(
            &node,
            &format!("without-{round}"),
            &watch,
            &["sleep", "600"],
        );
        without.push(t);
        node.stop_and_remove(&pod);
        eprintln!(
            "round {round}: with the plugin {} ms, without {} ms",
            with[round].as_millis(),
            without[round].as_millis()
        );
    }
    let (w, wo) = (median(&mut with), median(&mut without));
    eprintln!(
        "pod start (RunPodSandbox + CreateContainer + StartContainer), median of {ROUNDS}: \
         with the plugin {} ms, without {} ms, added {} ms",
        w.as_millis(),
        wo.as_millis(),
        w.as_millis() as i128 - wo.as_millis() as i128
    );
    assert_eq!(
        logs_in(&tw.log_dir).len(),
        ROUNDS,
        "one log per pod started with the plugin"
    );
}
