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

/// Nearest-rank percentile `p` (0..=100) of sorted `v`.
fn percentile(v: &[Duration], p: usize) -> Duration {
    let rank = (p * v.len()).div_ceil(100).max(1);
    v[rank - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// bench/nri-start.sh: the CRI's CreateContainer and StartContainer on two
/// containerd 2.3.4 nodes of one run, one with the plugin connected, one
/// without, container by container in turn (the order swapped every
/// round), in one annotated pod each; medians and p99; the plugin's own
/// answer times against NRI's request and registration timeouts
/// (containerd's defaults `plugin_request_timeout = '2s'`,
/// `plugin_registration_timeout = '5s'`). A benchmark: ignored in the suite.
/// Rounds: TW_NRI_BENCH_ROUNDS (default 24).
#[test]
#[ignore = "a benchmark: bench/nri-start.sh"]
fn start_container_latency_bench() {
    let rounds: usize = std::env::var("TW_NRI_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let _cpu = cpu_lock();
    let tw = PrivateConfig::new("");
    let _agent = Agent::start(&tw);
    let (with_node, socket) = started_node(&tw);
    let tw_off = PrivateConfig::new("");
    let (without_node, _) = started_node(&tw_off);
    let t0 = Instant::now();
    let plugin = plugin_up(&with_node, &tw, &socket, 1);
    let registered = t0.elapsed();
    let watch = [("throttlewatch.io/watch", "true")];
    let pod_of = |node: &CriNode, name: &str| {
        node.run_pod("runc", node.pod_config(name, "default", &watch))
            .unwrap_or_else(|e| panic!("{e}\n{}", node.log()))
    };
    let pods = [pod_of(&with_node, "with"), pod_of(&without_node, "without")];
    let nodes = [&with_node, &without_node];
    // [with, without] x [create, start]
    let mut took: [[Vec<Duration>; 2]; 2] = Default::default();
    let mut ids = vec![];
    for round in 0..rounds {
        for k in [round % 2, 1 - round % 2] {
            let (node, pod) = (nodes[k], &pods[k]);
            let t = Instant::now();
            let id = node
                .create_container(
                    pod,
                    &format!("c{round}"),
                    &["sleep", "600"],
                    Some((50_000, 100_000)),
                )
                .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
            let created = t.elapsed();
            node.start_container(&id)
                .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
            took[k][0].push(created);
            took[k][1].push(t.elapsed() - created);
            if k == 0 {
                ids.push(id);
            }
        }
    }
    for (k, pod) in pods.iter().enumerate() {
        nodes[k].stop_and_remove(pod);
    }
    let mut lines = vec![format!(
        "containerd 2.3.4 CRI, {rounds} containers per side, interleaved (one run):"
    )];
    for (call, c) in ["CreateContainer", "StartContainer"].iter().zip(0..) {
        let mut w = took[0][c].clone();
        let mut wo = took[1][c].clone();
        w.sort();
        wo.sort();
        lines.push(format!(
            "  {call}: with the plugin median {} p99 {}; without median {} p99 {}; added (medians) {:+.1} ms",
            ms(percentile(&w, 50)),
            ms(percentile(&w, 99)),
            ms(percentile(&wo, 50)),
            ms(percentile(&wo, 99)),
            (percentile(&w, 50).as_secs_f64() - percentile(&wo, 50).as_secs_f64()) * 1e3
        ));
    }
    let mut answers: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
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
    for (event, us) in &mut answers {
        us.sort_unstable();
        let p99 = us[(99 * us.len()).div_ceil(100).max(1) - 1];
        lines.push(format!(
            "  the plugin answered {event} in median {} us, p99 {} us, max {} us ({} events): max {:.3} % of the 2 s request timeout",
            us[us.len() / 2],
            p99,
            us[us.len() - 1],
            us.len(),
            us[us.len() - 1] as f64 / 2e6 * 100.0
        ));
    }
    lines.push(format!(
        "  registration: plugin start to containerd's \"synchronized\" {} (registration timeout 5 s)",
        ms(registered)
    ));
    println!("{}", lines.join("\n"));
    for event in ["CreateContainer", "StartContainer"] {
        assert!(
            answers.get(event).is_some_and(|v| v.len() >= rounds),
            "{event}: {:?}",
            answers.get(event)
        );
    }
    let watched = ids.iter().filter(|id| has_start(&tw, id)).count();
    assert_eq!(
        watched, rounds,
        "every container of the plugin's node watched"
    );
}
