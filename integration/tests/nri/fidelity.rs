//! A throttled container of a pod through the plugin (default `runc`
//! handler): its log's totals against the kernel's. The agent is told
//! about the container at `StartContainer`, before its entrypoint runs, so
//! the kernel's throttled time since the watch began is all of what the
//! cgroup's `cpu.stat` counts since the cgroup was made, and the probe's
//! (cgroup, CPU) episodes add up to it.

use super::*;

#[test]
fn a_throttled_pod_agrees_with_cpu_stat_from_its_first_period() {
    let _cpu = cpu_lock();
    let tw = PrivateConfig::new("");
    let _agent = Agent::start(&tw);
    let (node, socket) = started_node(&tw);
    let mut plugin = plugin_up(&node, &tw, &socket, 1);

    // Two spinners for 3 s under 0.3 CPU, from the entrypoint's first
    // instruction; then asleep, so the cgroup's cpu.stat stays readable.
    let burn = "(timeout 3 sh -c 'while :; do :; done') & timeout 3 sh -c 'while :; do :; done'; wait; exec sleep 600";
    let config = node.pod_config("burner", "default", &[("throttlewatch.io/watch", "true")]);
    let pod = node
        .run_pod("runc", config)
        .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
    let id = node
        .create_container(&pod, "burner", &["sh", "-c", burn], Some((30_000, 100_000)))
        .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
    node.start_container(&id)
        .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
    let cg = node.cpu_cgroup_of(&id);
    assert_eq!(cg.limits().unwrap().quota_us, Some(30_000), "quota");

    // The spinners are done when the group's CPU use stops growing.
    let t0 = Instant::now();
    let mut last = (0u64, Instant::now());
    wait_until(
        "the spinners to finish",
        || {
            let used = cg.usage_ns().map_or(0, |(ns, _)| ns);
            if used != last.0 && used - last.0 > 5_000_000 {
                last = (used, Instant::now());
            }
            t0.elapsed() > Duration::from_secs(3) && last.1.elapsed() > Duration::from_millis(500)
        },
        || format!("cpu.stat: {:?}", cg.cpu_stat()),
    );
    let total = cg.cpu_stat().unwrap();
    eprintln!("cpu.stat after the spinners: {total:?}");
    assert!(
        total.throttled_ns > 1_000_000_000,
        "too little throttling for a comparison: {total:?}"
    );

    node.stop_and_remove(&pod);
    let path = tw.log_of(&id);
    let log = throttlewatch_integration::assert_whole_log(&path);
    assert!(!of_type(&log, "throttle").is_empty(), "no throttle records");
    let end = of_type(&log, "end")[0];
    assert_eq!(end["reason"], "delete", "{end}");
    assert_eq!(end["kernel_source"], "cpu.stat", "{end}");
    let probe = end["probe_throttled_ns"].as_u64().unwrap();
    let kernel = end["kernel_throttled_ns"].as_u64().unwrap();
    let err = |a: u64, b: u64| (a as f64 - b as f64).abs() / b as f64;
    eprintln!(
        "NRI plugin, runc handler, containerd 2.3.4: cgroup's cpu.stat {} ns in all, \
         the log's kernel {kernel} ns ({:.3} % off), probe {probe} ns ({:.3} % off the log's kernel)",
        total.throttled_ns,
        err(kernel, total.throttled_ns) * 100.0,
        err(probe, kernel) * 100.0
    );
    // Watched before the entrypoint ran: nothing throttled before it.
    assert!(
        err(kernel, total.throttled_ns) <= 0.001,
        "the log's kernel count {kernel} ns is not all of cpu.stat's {} ns: watched late\n{end}",
        total.throttled_ns
    );
    assert!(
        err(probe, kernel) <= 0.005,
        "probe {probe} vs cpu.stat {kernel}: {:.3} % > 0.5 %",
        err(probe, kernel) * 100.0
    );
    assert_eq!(logs_in(&tw.log_dir), vec![path], "one log: the burner's");
    assert_eq!(leftovers(&tw), Vec::<PathBuf>::new(), "state left behind");
    assert_eq!(tw.hook_log(), "", "the plugin reported problems");
    plugin.stop();
}
