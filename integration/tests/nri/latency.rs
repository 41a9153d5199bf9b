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
    let (node, socket) = started_node(&tw);
    let closed = |node: &CriNode| log_lines(node, &["connection to plugin", "closed"]);
    let watch = [("throttlewatch.io/watch", "true")];
    let (mut with, mut without) = (vec![], vec![]);
    // What the plugin took to answer each event (it says so with
    // THROTTLEWATCH_NRI_TIMINGS=1, which NriDaemon sets), by event.
    let mut answers: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
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
        for l in plugin.output().lines() {
            let Some((event, us)) = l
                .strip_prefix("throttlewatch-nri: ")
                .and_then(|r| r.split_once(" answered in "))
            else {
                continue;
            };
            if let Some(us) = us.strip_suffix(" us").and_then(|u| u.parse().ok()) {
                answers.entry(event.to_string()).or_default().push(us);
            }
        }
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
    for (event, us) in &mut answers {
        us.sort_unstable();
        eprintln!(
            "{event}: the plugin answered in median {} us, max {} us ({} events)",
            us[us.len() / 2],
            us[us.len() - 1],
            us.len()
        );
    }
    // Every event of a pod's life reached the plugin and was answered.
    for event in [
        "CreateContainer",
        "StartContainer",
        "StopContainer",
        "RemoveContainer",
    ] {
        assert!(
            answers.get(event).is_some_and(|v| v.len() >= ROUNDS),
            "{event}: {:?}",
            answers.get(event)
        );
    }
    assert_eq!(
        logs_in(&tw.log_dir).len(),
        ROUNDS,
        "one log per pod started with the plugin"
    );
}
