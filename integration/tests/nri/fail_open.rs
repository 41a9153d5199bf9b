//! The plugin with the agent stopped: no pod held up.

use super::*;

/// Fail-open against the real runtime: with the agent stopped (SIGSTOP: it
/// accepts nothing and answers nothing), a pod still starts, its
/// StartContainer answered by the plugin's deadline (three quarters of
/// NRI's 2 s request timeout) instead of failing at NRI's timeout; once the
/// agent runs again the register, still waiting behind the answer, lands
/// and the container is logged.
#[test]
fn a_stopped_agent_holds_no_pod_up() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let _cpu = cpu_lock();
    // The agent's own timeout above the plugin's deadline: the deadline
    // is what answers.
    let tw = PrivateConfig::new("agent_timeout_ms = 5000");
    let agent = Agent::start(&tw);
    let (node, socket) = started_node(&tw);
    let plugin = plugin_up(&node, &tw, &socket, 1);
    let agent_pid = Pid::from_raw(agent.child.id() as i32);
    kill(agent_pid, Signal::SIGSTOP).unwrap();
    let t0 = Instant::now();
    let config = node.pod_config("frozen", "default", &[("throttlewatch.io/watch", "true")]);
    let started = node.run_pod("runc", config).and_then(|pod| {
        let id = node.create_container(&pod, "work", &["sleep", "600"], Some((50_000, 100_000)))?;
        let t1 = Instant::now();
        node.start_container(&id)?;
        Ok((pod, id, t1.elapsed()))
    });
    // The agent runs again whatever happened above.
    kill(agent_pid, Signal::SIGCONT).unwrap();
    let (pod, id, start_took) =
        started.unwrap_or_else(|e| panic!("{e}\nplugin:\n{}\n{}", plugin.output(), node.log()));
    eprintln!(
        "agent stopped: pod started in {} ms, StartContainer {} ms",
        t0.elapsed().as_millis(),
        start_took.as_millis()
    );
    // A plugin past NRI's timeout fails the StartContainer above; the
    // plugin says it answered without the agent.
    assert!(
        plugin
            .output()
            .contains("answered without waiting (fail-open)"),
        "{}",
        plugin.output()
    );
    wait_until(
        "the start record once the agent runs again",
        || has_start(&tw, &id),
        || {
            format!(
                "logs: {:?}\nplugin:\n{}",
                logs_in(&tw.log_dir),
                plugin.output()
            )
        },
    );
    let path = tw.log_of(&id);
    node.stop_and_remove(&pod);
    throttlewatch_integration::assert_whole_log(&path);
}
