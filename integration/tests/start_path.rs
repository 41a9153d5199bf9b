//! The create path after issue 16: the agent answers the register as soon as
//! the container's cgroup is in the kernel's watch map and writes the log,
//! its `start` record and the state file after answering (`wait_for_log`,
//! asked under fail-closed, answers after). Who registers: the createRuntime
//! hook under `run -d`; the wrapper's helper between `create` (the wrapper
//! execs runc's; the helper works once runc has written the pid file) and
//! `start`, with no hook of ours in the spec. Real runc, the real
//! wrapper, hook and agent: a container that throttles from its first
//! instruction has that episode in its log and totals within 0.5 % of
//! `cpu.stat`, both ways and in both fail modes; a register held by a
//! stopped agent, then an agent killed and restarted, still leave one whole
//! log (start, resume, end).

use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use std::process::Output;

use throttlewatch_integration::bundle::{text, Bundle, ContainerOpts, OciCli};
use throttlewatch_integration::daemons::{Agent, PrivateConfig};
use throttlewatch_integration::{cpu_lock, of_type, read_log, unique};

fn id(tag: &str) -> String {
    format!("tw-sp-{tag}-{}-{}", std::process::id(), unique())
}

/// How long plain runc takes to create (and so to run our front end's part
/// after) a container here: the bounds below are "no wait beyond runc's
/// own time", which under the VM lane's emulation is itself over a second.
fn plain_runc_create() -> Duration {
    let rt = OciCli::new("runc");
    let b = Bundle::new(&id("plain"), &ContainerOpts::sh("sleep 30"));
    let t0 = std::time::Instant::now();
    let o = rt.create(&b);
    let took = t0.elapsed();
    assert!(o.status.success(), "plain runc create: {}", text(&o));
    let _ = rt.delete(&b.id);
    took
}

/// Two busy threads under 0.1 CPU: the first period is throttled after
/// 10 ms of CPU, long before the container could be seen late.
fn throttled_from_the_start(tag: &str) -> Bundle {
    Bundle::new(&id(tag), &ContainerOpts::busy(2, 2).quota(10_000, 100_000))
}

/// How the container is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Launch {
    /// `run -d`: the wrapper puts our createRuntime hook in the spec.
    Run,
    /// `create` then `start`, as containerd's runc shim (and so dockerd)
    /// calls the runtime: the wrapper registers between the two.
    CreateStart,
}

const LAUNCHES: [Launch; 2] = [Launch::Run, Launch::CreateStart];

fn launch(rt: &OciCli, b: &Bundle, how: Launch) -> Output {
    match how {
        Launch::Run => rt.run_detached(b),
        Launch::CreateStart => {
            let o = rt.create(b);
            if !o.status.success() {
                return o;
            }
            // What the cgroup was throttled before the entrypoint: runc's
            // bootstrap under the container's quota (the watch begins once
            // `create` has returned).
            eprintln!(
                "{}: cpu.stat throttled when create returned: {} ns",
                b.id,
                b.throttled_ns()
            );
            rt.run(&["start", &b.id])
        }
    }
}

/// The wrapper's create helpers for container `id` still running: once
/// `create` has returned, a process whose command line is still the
/// wrapper's `create ... id` (runc's exec replaced the wrapper's own).
fn helper_pids(id: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let argv = std::fs::read(e.path().join("cmdline")).ok()?;
            let argv: Vec<&[u8]> = argv.split(|b| *b == 0).collect();
            let ours = argv
                .first()
                .is_some_and(|a0| a0.ends_with(b"throttlewatch-runtime"))
                && argv.contains(&b"create".as_slice())
                && argv.contains(&id.as_bytes());
            ours.then_some(pid)
        })
        .collect()
}

/// Wait (up to 10 s) until the wrapper's create helper for `id` has
/// exited (a process still running the wrapper's `create ... id` command
/// line once `create` has returned is the helper), then check that it sent
/// the register: `id`'s `pending/` record is no longer the empty mark.
fn wait_sent(cfg: &PrivateConfig, id: &str) {
    let t0 = std::time::Instant::now();
    while !helper_pids(id).is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{id}: the create helper still runs 10 s after create"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let sent = std::fs::read_dir(cfg.state_dir.join("pending"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            (name == id || name.starts_with(&format!("{id}@")))
                && e.metadata().is_ok_and(|m| m.len() > 0)
        });
    assert!(sent, "{id}: the helper left no register in pending/");
}

/// `id`'s log begins with its `start` record and hook.log says nothing
/// started unwatched.
fn watched_from_the_start(cfg: &PrivateConfig, id: &str) {
    let log = first_records(cfg, id);
    assert_eq!(
        log.first().map(|r| r["type"].clone()),
        Some("start".into()),
        "{id}: {log:?}"
    );
    assert!(!cfg.hook_log().contains("unwatched"), "{}", cfg.hook_log());
}

/// `id`'s log once it has a record. The agent answers the register once
/// the cgroup is in the watch map and writes the log after (issue 16), so
/// right after `start` the file may not be there yet: with two other busy
/// processes on the machine it was not, 2 runs of 10.
fn first_records(cfg: &PrivateConfig, id: &str) -> Vec<Value> {
    let t0 = std::time::Instant::now();
    loop {
        let path = cfg.log_of(id);
        if path.exists() {
            let log = read_log(&path);
            if !log.is_empty() || t0.elapsed() > Duration::from_secs(10) {
                return log;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{id}: no log 10 s after start"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn rel_err(a: u64, b: u64) -> f64 {
    (a as f64 - b as f64).abs() / b as f64
}

/// One `start` first, one `end` last; returns the end record.
fn whole_log<'a>(log: &'a [Value], what: &str) -> &'a Value {
    assert_eq!(of_type(log, "start").len(), 1, "{what}: one start");
    assert_eq!(
        log.first().unwrap()["type"],
        "start",
        "{what}: begins with start"
    );
    assert_eq!(log.last().unwrap()["type"], "end", "{what}: ends with end");
    assert_eq!(of_type(log, "end").len(), 1, "{what}: one end");
    log.last().unwrap()
}

/// How far the cgroup's own total may stand from `end.kernel` (which runs
/// from the watch's start): runc's bootstrap runs in the cgroup under its
/// quota before the watch — with the hook (`run -d`) until createRuntime,
/// with `create` + `start` until runc's whole create has returned — and on
/// cgroup v2 a period throttled when the last task exits is added at its
/// unthrottle, after the test's read. Throttled time is summed over CPUs,
/// so what passed before the watch is at most the launch's wall time per
/// CPU, plus that last period. Well under a millisecond on the host; under
/// the VM lane's emulated CPU at 0.1 CPU: 90–190 ms with the hook, 280–870
/// ms with `create` + `start`. The probe itself is held to 0.5 % of
/// `end.kernel`.
fn before_watch_max_ns(launch_took: Duration) -> u64 {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    launch_took.as_nanos() as u64 * cpus + 200_000_000
}

/// Run to completion, delete; (log, cpu.stat throttled ns).
fn run_to_end(rt: &OciCli, cfg: &PrivateConfig, b: &Bundle) -> (Vec<Value>, u64) {
    rt.wait_stopped(&b.id, Duration::from_secs(30));
    let kernel = b.throttled_ns();
    let o = rt.delete(&b.id);
    assert!(o.status.success(), "delete: {}", text(&o));
    (read_log(&cfg.log_of(&b.id)), kernel)
}

#[test]
fn first_episode_is_logged_whether_the_agent_answers_early_or_after_the_log() {
    let _cpu = cpu_lock();
    // fail-open: answered once watched; fail-closed: `wait_for_log`.
    for (how, mode) in LAUNCHES
        .into_iter()
        .flat_map(|h| ["open", "closed"].map(|m| (h, m)))
    {
        let mode = &format!("{how:?}, fail-{mode}") as &str;
        let cfg = PrivateConfig::new(&format!(
            "fail_mode = {:?}",
            mode.rsplit('-').next().unwrap()
        ));
        let _agent = Agent::start(&cfg);
        let rt = OciCli::throttlewatch(&cfg);
        let b = throttled_from_the_start(if how == Launch::Run { "r" } else { "c" });
        let t0 = std::time::Instant::now();
        let o = launch(&rt, &b, how);
        let launch_took = t0.elapsed();
        assert!(o.status.success(), "{mode}: launch: {}", text(&o));
        let (log, kernel) = run_to_end(&rt, &cfg, &b);
        let end = whole_log(&log, mode);
        let probe = end["probe_throttled_ns"].as_u64().unwrap();
        let end_kernel = end["kernel_throttled_ns"].as_u64().unwrap();
        eprintln!(
            "{mode}: probe {probe} ns, end.kernel {end_kernel} ns, cpu.stat {kernel} ns, episodes {} (nr_throttled {}), {} throttle records",
            end["probe_episodes"], end["nr_throttled"], of_type(&log, "throttle").len()
        );
        assert!(kernel > 500_000_000, "{mode}: too little throttling: {end}");
        // A missed first episode is ~90 ms of ~1.8 s: 5 %. The end's
        // kernel figure runs from the watch's start (the hook, before the
        // entrypoint's first instruction), as the probe's does; the
        // cgroup's own total also holds runc's bootstrap before the hook,
        // throttled too under a slow emulated CPU (the VM lane: ~90 ms).
        assert!(
            rel_err(probe, end_kernel) <= 0.005,
            "{mode}: probe {probe} vs end.kernel (cpu.stat since the watch began) {end_kernel}: {end}"
        );
        // Either way round: runc's bootstrap before the watch, and on
        // cgroup v2 a period still throttled when the last task exits is
        // added to cpu.stat at its unthrottle, after the test's read.
        assert!(
            kernel.abs_diff(end_kernel) <= before_watch_max_ns(launch_took),
            "{mode}: cpu.stat {kernel} vs end.kernel {end_kernel}: more apart than runc's bootstrap ({launch_took:?})"
        );
        assert_eq!(end["unwatched_throttled_ns"], 0, "{mode}: {end}");
        // Not one episode per throttled period: `nr_throttled` counts every
        // period a run-queue stays throttled, and in the VM lane with the
        // host busy a run-queue was throttled for several (76 episodes, 88
        // periods): the totals above are the check.
        assert!(
            end["probe_episodes"].as_u64().unwrap() > 0,
            "{mode}: episodes: {end}"
        );
        assert!(
            !of_type(&log, "throttle").is_empty(),
            "{mode}: throttle records"
        );
        assert!(
            !cfg.hook_log().contains("error"),
            "{mode}: hook.log: {}",
            cfg.hook_log()
        );
    }
}

#[test]
fn register_held_by_a_stopped_agent_then_a_restart_keep_the_log_whole() {
    let _cpu = cpu_lock();
    for how in LAUNCHES {
        held_then_restarted(how);
    }
}

fn held_then_restarted(how: Launch) {
    // Longer than the stop below: the hook waits for the late answer.
    let cfg = PrivateConfig::new("agent_timeout_ms = 5000");
    let agent = Agent::start(&cfg);
    let rt = OciCli::throttlewatch(&cfg);
    let b = Bundle::new(
        &id(&format!("held-{how:?}")),
        &ContainerOpts::busy(2, 4).quota(10_000, 100_000),
    );
    let pid = Pid::from_raw(agent.child.id() as i32);
    kill(pid, Signal::SIGSTOP).unwrap();
    let (create, launch_took) = std::thread::scope(|s| {
        let h = s.spawn(|| {
            let t0 = std::time::Instant::now();
            (launch(&rt, &b, how), t0.elapsed())
        });
        std::thread::sleep(Duration::from_millis(400));
        kill(pid, Signal::SIGCONT).unwrap();
        h.join().unwrap()
    });
    assert!(create.status.success(), "{how:?}: {}", text(&create));
    // Killed while the container throttles, then back: `resume`.
    std::thread::sleep(Duration::from_millis(1500));
    agent.kill();
    let at_kill = b.group().cpu_stat().unwrap();
    let (persisted_ns, persisted_episodes) = persisted_probe(&cfg);
    std::thread::sleep(Duration::from_millis(300));
    let _agent = Agent::start(&cfg);
    let restarted = b.group().cpu_stat().unwrap();
    rt.wait_stopped(&b.id, Duration::from_secs(30));
    let stopped = b.group().cpu_stat().unwrap();
    let (log, kernel) = run_to_end(&rt, &cfg, &b);
    let end = whole_log(&log, &format!("{how:?}: held, restarted"));
    assert!(
        !of_type(&log, "resume").is_empty(),
        "{how:?}: a resume record"
    );
    let probe = end["probe_throttled_ns"].as_u64().unwrap();
    let unwatched = end["unwatched_throttled_ns"].as_u64().unwrap();
    let end_kernel = end["kernel_throttled_ns"].as_u64().unwrap();
    eprintln!("{how:?}: held, restarted: probe {probe} + unwatched {unwatched} vs end.kernel {end_kernel}, cpu.stat {kernel}");
    // Where a difference lies: the first agent's share (persisted at its
    // last tick), the kernel's count at the kill and once the restarted
    // agent answered, the second agent's share against the kernel's after it.
    let episodes = end["probe_episodes"].as_u64().unwrap();
    eprintln!(
        "{how:?}: first agent persisted probe {persisted_ns} ns ({persisted_episodes} episodes); cpu.stat throttled at the kill {} ns ({} periods), once the restart answered {} ns ({} periods), stopped {} ns ({} periods); second agent: probe {} ns ({} episodes) vs cpu.stat since the restart answered {} ns ({} periods)",
        at_kill.throttled_ns,
        at_kill.nr_throttled,
        restarted.throttled_ns,
        restarted.nr_throttled,
        stopped.throttled_ns,
        stopped.nr_throttled,
        probe.saturating_sub(persisted_ns),
        episodes.saturating_sub(persisted_episodes),
        kernel.saturating_sub(restarted.throttled_ns),
        stopped.nr_throttled.saturating_sub(restarted.nr_throttled),
    );
    assert!(unwatched > 0, "{how:?}: the restart's gap is said: {end}");
    // end.kernel runs from the first watch (the hook); the cgroup's total
    // also holds runc's bootstrap before it (see before_watch_max_ns).
    assert!(
        kernel.abs_diff(end_kernel) <= before_watch_max_ns(launch_took),
        "{how:?}: end.kernel {end_kernel} vs cpu.stat {kernel}: from the first instruction"
    );
    // An episode open on a CPU when the new agent attaches is opened at the
    // kernel's own throttle stamp by its group's timer run (dequeue.bpf.h):
    // its time before the attach is not in `unwatched` (the kernel adds it
    // at the unthrottle), so the two views add up to the kernel's total
    // since the first watch. Measured 0.005-0.5 % apart on the host (load
    // up to 9) and 0.01-0.07 % in the VM lane; once over 1 % on the host at
    // load 9, hence 2 % (the old bound let one period per CPU go missing:
    // ~5 % here).
    let both = probe + unwatched;
    assert!(
        both.abs_diff(end_kernel) <= end_kernel / 50,
        "{how:?}: probe {probe} + unwatched {unwatched} = {both} vs end.kernel {end_kernel}: {} ns apart",
        both.abs_diff(end_kernel)
    );
}

/// The probe totals the agent last persisted for the one container of
/// `cfg` (its state file): (throttled ns, episodes).
fn persisted_probe(cfg: &PrivateConfig) -> (u64, u64) {
    let dir = cfg.state_dir.join("containers");
    let files: Vec<Value> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok())
        .collect();
    assert_eq!(
        files.len(),
        1,
        "one state file in {}: {files:?}",
        dir.display()
    );
    let b = &files[0]["baseline"];
    (
        b["probe_ns"].as_u64().unwrap_or(0),
        b["probe_episodes"].as_u64().unwrap_or(0),
    )
}

/// `create` through the wrapper (fail-open): when it returns, it has not
/// started and the spec holds our poststop hook and no createRuntime hook of
/// ours; once `start` returns (the helper's work done: `start` waits for
/// it), its QoS is in the cgroup, no pid file is left, and its log begins
/// with `start` and ends whole. Fail-closed keeps the hook: the spec has it.
/// With no agent, fail-open creates it unwatched (said in hook.log by the
/// helper) and fail-closed refuses it, names the socket, and leaves no
/// container.
#[test]
fn create_registers_before_start_without_a_hook() {
    let cfg = PrivateConfig::new("");
    let agent = Agent::start(&cfg);
    let rt = OciCli::throttlewatch(&cfg);
    let b = Bundle::new(
        &id("nohook"),
        &ContainerOpts::busy(1, 1)
            .quota(20_000, 100_000)
            .annotation("throttlewatch.io/cpu-burst", "10ms"),
    );
    let o = rt.create(&b);
    assert!(o.status.success(), "create: {}", text(&o));
    assert_eq!(rt.status(&b.id).as_deref(), Some("created"));
    let spec = b.config();
    let ours = |stage: &str| {
        spec["hooks"][stage]
            .as_array()
            .map(|l| {
                l.iter()
                    .filter(|h| {
                        h["path"]
                            .as_str()
                            .unwrap_or("")
                            .ends_with("throttlewatch-hook")
                    })
                    .count()
            })
            .unwrap_or(0)
    };
    assert_eq!(ours("createRuntime"), 0, "{spec}");
    assert_eq!(ours("poststop"), 1, "{spec}");
    let o = rt.run(&["start", &b.id]);
    assert!(o.status.success(), "start: {}", text(&o));
    assert_eq!(
        b.burst_us(),
        10_000,
        "the burst annotation, applied before the entrypoint ran"
    );
    let pids = cfg.state_dir.join("pids");
    assert_eq!(
        std::fs::read_dir(&pids).map(|d| d.count()).unwrap_or(0),
        0,
        "the wrapper's pid file is removed"
    );
    let (log, _) = run_to_end(&rt, &cfg, &b);
    let end = whole_log(&log, "create + start");
    assert!(end["probe_throttled_ns"].as_u64().unwrap() > 0, "{end}");
    assert!(!cfg.hook_log().contains("error"), "{}", cfg.hook_log());
    agent.kill();

    let closed = PrivateConfig::new("fail_mode = \"closed\"");
    let _agent = Agent::start(&closed);
    let rt = OciCli::throttlewatch(&closed);
    let c = Bundle::new(&id("closed-hook"), &ContainerOpts::sh("true"));
    let o = rt.create(&c);
    assert!(o.status.success(), "create (fail-closed): {}", text(&o));
    assert_eq!(
        c.config()["hooks"]["createRuntime"]
            .as_array()
            .map_or(0, |l| l.len()),
        1,
        "fail-closed keeps our createRuntime hook"
    );
    assert!(rt.run(&["delete", "-f", &c.id]).status.success());

    for mode in ["open", "closed"] {
        let cfg = PrivateConfig::new(&format!("fail_mode = {mode:?}\nstart_agent = false"));
        let rt = OciCli::throttlewatch(&cfg);
        let b = Bundle::new(&id(&format!("noagent-{mode}")), &ContainerOpts::default());
        let o = rt.create(&b);
        // Fail-open: the helper says it in hook.log after `create` returned.
        let said = || {
            let log = cfg.hook_log();
            let err = match mode {
                "open" => log.as_str().into(),
                _ => String::from_utf8_lossy(&o.stderr),
            };
            err.contains("no agent answers") && log.contains("start_agent = false")
        };
        let t0 = std::time::Instant::now();
        while !said() && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            said(),
            "{mode}: {} / hook.log: {}",
            text(&o),
            cfg.hook_log()
        );
        if mode == "open" {
            assert!(o.status.success(), "{mode}: {}", text(&o));
            assert_eq!(rt.status(&b.id).as_deref(), Some("created"));
            assert!(rt.run(&["delete", "-f", &b.id]).status.success());
        } else {
            assert!(!o.status.success(), "{mode}: refused");
            assert_eq!(rt.status(&b.id), None, "{mode}: nothing left behind");
        }
    }
}

/// Fail-open `create` through the wrapper sends the register and returns
/// without the answer (a `pending/` record until the agent takes it): with
/// the agent stopped it still returns at once; `start` lets the entrypoint
/// run only once the agent has the container. A register
/// the agent refuses (here: its kernel maps hold one container) does not
/// make `start` wait out `agent_timeout_ms`: the agent marks it unwatched,
/// and the container starts unwatched with that said in hook.log.
#[test]
fn fail_open_create_does_not_wait_and_start_waits_for_the_watch() {
    let cfg = PrivateConfig::new("agent_timeout_ms = 3000\nmax_containers = 1");
    let agent = Agent::start(&cfg);
    let rt = OciCli::throttlewatch(&cfg);
    // Records only: the helper replaces the mark by rename, through a
    // `.NAME.PID.tmp` file that a listing can catch.
    let pending = |what: &str| {
        let n = std::fs::read_dir(cfg.state_dir.join("pending"))
            .map(|d| {
                d.flatten()
                    .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                    .count()
            })
            .unwrap_or(0);
        eprintln!("{what}: {n} pending");
        n
    };
    let bound = Duration::from_millis(1500) + plain_runc_create();
    let a = Bundle::new(&id("async-a"), &ContainerOpts::sh("sleep 30"));
    let pid = Pid::from_raw(agent.child.id() as i32);
    kill(pid, Signal::SIGSTOP).unwrap();
    let t0 = std::time::Instant::now();
    let o = rt.create(&a);
    let took = t0.elapsed();
    let left = pending("after create, the agent stopped");
    kill(pid, Signal::SIGCONT).unwrap();
    assert!(o.status.success(), "create a: {}", text(&o));
    assert!(
        took < bound,
        "create waited {took:?} for a stopped agent (bound {bound:?})"
    );
    assert_eq!(
        left, 1,
        "the register is pending while the agent is stopped"
    );
    let o = rt.run(&["start", &a.id]);
    assert!(o.status.success(), "start a: {}", text(&o));
    assert_eq!(pending("after start"), 0, "the agent took it");
    watched_from_the_start(&cfg, &a.id);

    let b = Bundle::new(&id("async-b"), &ContainerOpts::sh("sleep 30"));
    let o = rt.create(&b);
    assert!(o.status.success(), "create b: {}", text(&o));
    let t0 = std::time::Instant::now();
    let o = rt.run(&["start", &b.id]);
    let took = t0.elapsed();
    assert!(o.status.success(), "start b: {}", text(&o));
    assert_eq!(rt.status(&b.id).as_deref(), Some("running"));
    let said = cfg.hook_log();
    assert!(
        said.contains(&b.id) && said.contains("starts unwatched") && said.contains("refused"),
        "hook.log: {said}"
    );
    assert!(
        took < Duration::from_millis(1500),
        "start waited {took:?} for a refused register (agent_timeout_ms = 3000)"
    );
    for c in [&a, &b] {
        assert!(rt.run(&["delete", "-f", &c.id]).status.success());
    }
}

/// The wrapper's create helper works after `create` has returned. Held up
/// (here: hook.log locked while it reports a refused annotation), it holds
/// nothing of the caller's — `create` returned at once and none of the
/// helper's descriptors is the caller's output — and `start` does not let
/// the entrypoint run until it has registered: `start` is still waiting
/// half a second later, goes on once hook.log is unlocked, and the
/// container's log begins with its `start` record.
#[test]
fn a_held_up_create_helper_holds_neither_the_caller_nor_an_early_start() {
    use std::os::fd::AsRawFd;
    let cfg = PrivateConfig::new("agent_timeout_ms = 5000");
    let _agent = Agent::start(&cfg);
    let rt = OciCli::throttlewatch(&cfg);
    std::fs::create_dir_all(&cfg.log_dir).unwrap();
    let hook_log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(cfg.log_dir.join("hook.log"))
        .unwrap();
    // SAFETY: flock on a descriptor owned by `hook_log`; released when it closes.
    assert_eq!(
        unsafe { libc::flock(hook_log.as_raw_fd(), libc::LOCK_EX) },
        0
    );
    let b = Bundle::new(
        &id("held-helper"),
        &ContainerOpts::sh("sleep 30").annotation("throttlewatch.io/cpu-burst", "soon"),
    );
    let bound = Duration::from_millis(1500) + plain_runc_create();
    let t0 = std::time::Instant::now();
    let o = rt.create(&b);
    let took = t0.elapsed();
    assert!(o.status.success(), "create: {}", text(&o));
    assert!(took < bound, "create took {took:?} (bound {bound:?})");
    let helpers = helper_pids(&b.id);
    assert_eq!(
        helpers.len(),
        1,
        "the helper, held on hook.log: {helpers:?}"
    );
    let fds: Vec<std::path::PathBuf> = std::fs::read_dir(format!("/proc/{}/fd", helpers[0]))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .collect();
    assert!(
        fds.iter().all(|p| !p.starts_with(&rt.root.0)),
        "the helper holds the caller's output files: {fds:?}"
    );
    std::thread::scope(|s| {
        let start = s.spawn(|| rt.run(&["start", &b.id]));
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            !start.is_finished(),
            "start went on before the helper registered the container"
        );
        drop(hook_log);
        let o = start.join().unwrap();
        assert!(o.status.success(), "start: {}", text(&o));
    });
    let log = first_records(&cfg, &b.id);
    assert_eq!(
        log.first().map(|r| r["type"].clone()),
        Some("start".into()),
        "{log:?}"
    );
    assert!(cfg.hook_log().contains("soon"), "{}", cfg.hook_log());
    assert!(rt.run(&["delete", "-f", &b.id]).status.success());
}

/// A register lost with its agent: `create` (fail-open) sent it to an agent
/// that was stopped, then killed with it unread; another agent is up by
/// `start`, which sees the socket changed, sends the register again and
/// waits for it. The container throttles from its first instruction and
/// its log is whole and within 0.5 % of `cpu.stat`.
#[test]
fn a_register_lost_with_its_agent_is_sent_again_at_start() {
    let _cpu = cpu_lock();
    let cfg = PrivateConfig::new("agent_timeout_ms = 3000");
    let first = Agent::start(&cfg);
    let rt = OciCli::throttlewatch(&cfg);
    let b = throttled_from_the_start("lost");
    kill(Pid::from_raw(first.child.id() as i32), Signal::SIGSTOP).unwrap();
    let o = rt.create(&b);
    assert!(o.status.success(), "create: {}", text(&o));
    // The helper sends the register once runc's create has returned: lost
    // with the first agent only once it went there (the record names it).
    wait_sent(&cfg, &b.id);
    first.kill();
    let _second = Agent::start(&cfg);
    let t0 = std::time::Instant::now();
    let o = rt.run(&["start", &b.id]);
    let took = t0.elapsed();
    assert!(o.status.success(), "start: {}", text(&o));
    assert!(
        took < Duration::from_millis(1500),
        "start took {took:?}: it should see the agent gone at once"
    );
    let (log, kernel) = run_to_end(&rt, &cfg, &b);
    let end = whole_log(&log, "lost register");
    let probe = end["probe_throttled_ns"].as_u64().unwrap();
    let end_kernel = end["kernel_throttled_ns"].as_u64().unwrap();
    eprintln!("lost register: probe {probe} ns, end.kernel {end_kernel} ns, cpu.stat {kernel} ns");
    assert!(kernel > 500_000_000, "too little throttling: {end}");
    assert!(
        rel_err(probe, end_kernel) <= 0.005,
        "probe {probe} vs end.kernel {end_kernel}: {end}"
    );
    assert_eq!(end["unwatched_throttled_ns"], 0, "{end}");
    assert!(!cfg.hook_log().contains("unwatched"), "{}", cfg.hook_log());
}

/// The start ticket of `id` (`/run/throttlewatch/start/<id>@<scope>`,
/// throttlewatch_runtime::ticket), if there is one.
fn ticket_of(id: &str) -> Option<Vec<u8>> {
    // throttlewatch_runtime::ticket::DIR (a fixed path: `start` finds it
    // without the configuration).
    let dir = std::path::Path::new("/run/throttlewatch/start");
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .find(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("{id}@"))
        })
        .and_then(|e| std::fs::read(e.path()).ok())
}

/// `id`'s register is no longer pending (the agent has it).
fn taken(cfg: &PrivateConfig, id: &str) -> bool {
    !std::fs::read_dir(cfg.state_dir.join("pending"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("{id}@"))
        })
}

fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let t0 = std::time::Instant::now();
    while !done() {
        assert!(t0.elapsed() < timeout, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The wrapper's `start` after its `create` execs the runtime its start
/// ticket names without loading the configuration — and still only once
/// the agent has the container: with the register held by a stopped agent
/// it goes the whole way and waits; given another configuration file than
/// its `create` was, it loads that one. `delete` removes the ticket. Which
/// way `start` went is read from its THROTTLEWATCH_TIMING line (`ticket=`
/// for the ticket, `config=` for the whole way).
#[test]
fn start_takes_its_creates_ticket_and_still_waits_for_the_watch() {
    let cfg = PrivateConfig::new("agent_timeout_ms = 5000");
    let agent = Agent::start(&cfg);
    let rt = OciCli::throttlewatch(&cfg);
    let timing = cfg.dir.0.join("timing");
    let start_line = || {
        let all = std::fs::read_to_string(&timing).unwrap_or_default();
        let line = all
            .lines()
            .rfind(|l| l.starts_with("throttlewatch-runtime start "))
            .map(str::to_string);
        let _ = std::fs::remove_file(&timing);
        line.unwrap_or_else(|| panic!("no start line in {all:?}"))
    };
    let start = |args: Vec<String>, id: &str| {
        let mut c = match args.is_empty() {
            true => rt.command(),
            false => {
                let mut c = std::process::Command::new(&rt.bin);
                c.args(&args).arg("--root").arg(&rt.root.0);
                c
            }
        };
        c.env("THROTTLEWATCH_TIMING", &timing)
            .args(["start", id])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };

    // The usual case: the register taken by the time of `start`.
    let a = Bundle::new(&id("ticket-a"), &ContainerOpts::sh("sleep 30"));
    let o = rt.create(&a);
    assert!(o.status.success(), "create a: {}", text(&o));
    wait_until("a's ticket", Duration::from_secs(5), || {
        ticket_of(&a.id).is_some()
    });
    let t = ticket_of(&a.id).unwrap();
    let has = |p: &std::path::Path| {
        t.windows(p.as_os_str().len())
            .any(|w| w == p.as_os_str().as_encoded_bytes())
    };
    assert!(has(&cfg.path), "the config file in {t:?}");
    assert!(
        has(&cfg.state_dir.join("pending")),
        "the pending record in {t:?}"
    );
    assert!(has(std::path::Path::new("runc")), "the runtime in {t:?}");
    wait_until("a's register taken", Duration::from_secs(5), || {
        taken(&cfg, &a.id)
    });
    let o = start(vec![], &a.id).wait_with_output().unwrap();
    assert!(o.status.success(), "start a: {}", text(&o));
    let line = start_line();
    assert!(
        line.contains(" ticket=") && !line.contains(" config="),
        "{line}"
    );
    assert_eq!(rt.status(&a.id).as_deref(), Some("running"));
    assert!(rt.run(&["delete", "-f", &a.id]).status.success());
    assert_eq!(ticket_of(&a.id), None, "delete removes the ticket");
    let log = read_log(&cfg.log_of(&a.id));
    whole_log(&log, "a");

    // The register held by a stopped agent: `start` waits for it.
    let b = Bundle::new(&id("ticket-b"), &ContainerOpts::sh("sleep 30"));
    let pid = Pid::from_raw(agent.child.id() as i32);
    kill(pid, Signal::SIGSTOP).unwrap();
    let o = rt.create(&b);
    assert!(o.status.success(), "create b: {}", text(&o));
    wait_until("b's ticket", Duration::from_secs(5), || {
        ticket_of(&b.id).is_some()
    });
    let mut s = start(vec![], &b.id);
    std::thread::sleep(Duration::from_millis(500));
    let early = s.try_wait().unwrap();
    kill(pid, Signal::SIGCONT).unwrap();
    assert!(
        early.is_none(),
        "start did not wait for a register the agent had not taken: {early:?}"
    );
    let o = s.wait_with_output().unwrap();
    assert!(o.status.success(), "start b: {}", text(&o));
    let line = start_line();
    assert!(line.contains(" config="), "the whole way: {line}");
    watched_from_the_start(&cfg, &b.id);
    assert!(rt.run(&["delete", "-f", &b.id]).status.success());

    // `start` given another configuration file than its `create`.
    let c = Bundle::new(&id("ticket-c"), &ContainerOpts::sh("sleep 30"));
    let o = rt.create(&c);
    assert!(o.status.success(), "create c: {}", text(&o));
    wait_until("c's ticket", Duration::from_secs(5), || {
        ticket_of(&c.id).is_some()
    });
    wait_until("c's register taken", Duration::from_secs(5), || {
        taken(&cfg, &c.id)
    });
    let other = cfg.dir.0.join("same-elsewhere.toml");
    std::fs::copy(&cfg.path, &other).unwrap();
    let args = vec![
        "--throttlewatch-config".to_string(),
        other.to_string_lossy().into_owned(),
    ];
    let o = start(args, &c.id).wait_with_output().unwrap();
    assert!(o.status.success(), "start c: {}", text(&o));
    let line = start_line();
    assert!(
        line.contains(" config="),
        "another configuration: the whole way: {line}"
    );
    assert!(rt.run(&["delete", "-f", &c.id]).status.success());
    assert_eq!(ticket_of(&c.id), None, "delete removes the ticket");

    // A create that fails (no root file system) leaves no ticket once its
    // helper is done.
    let d = Bundle::new(&id("ticket-d"), &ContainerOpts::sh("true"));
    d.edit(|v| v["root"]["path"] = "/nonexistent-rootfs".into());
    let o = rt.create(&d);
    assert!(!o.status.success(), "create d should fail: {}", text(&o));
    wait_until("d's helper", Duration::from_secs(10), || {
        helper_pids(&d.id).is_empty()
    });
    assert_eq!(ticket_of(&d.id), None, "a failed create leaves no ticket");
}

/// This process's scheduling policy (`/proc/PID/stat`, field 41).
fn policy_of(pid: u32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_comm = stat.rsplit_once(") ")?.1;
    after_comm.split_whitespace().nth(41 - 3)?.parse().ok()
}

/// While runc creates, the wrapper's create helper runs at `SCHED_IDLE`: what
/// it prepares then takes no CPU time the runtime wants. Once runc has
/// exited it has its policy back for the work `start` waits on (the switch
/// and its way back: `runtime/src/create.rs`, `background_is_idle_until_left`;
/// it goes back to idle for its exit), and the container is watched from its
/// start. runc's create is held for a second by a createRuntime hook that
/// sleeps.
#[test]
fn the_create_helper_yields_the_cpus_while_runc_creates() {
    let cfg = PrivateConfig::new("");
    let _agent = Agent::start(&cfg);
    let rt = OciCli::throttlewatch(&cfg);
    let b = Bundle::new(&id("idle"), &ContainerOpts::sh("sleep 30"));
    b.edit(|v| {
        v["hooks"]["createRuntime"] = serde_json::json!([
            {"path": "/bin/sleep", "args": ["sleep", "1"]}
        ])
    });
    std::thread::scope(|s| {
        let create = s.spawn(|| rt.create(&b));
        wait_until("the create helper", Duration::from_secs(5), || {
            !helper_pids(&b.id).is_empty()
        });
        std::thread::sleep(Duration::from_millis(300));
        let during: Vec<i32> = helper_pids(&b.id)
            .into_iter()
            .filter_map(policy_of)
            .collect();
        assert!(
            !create.is_finished(),
            "runc's create did not wait for its createRuntime hook"
        );
        assert_eq!(
            during,
            [libc::SCHED_IDLE],
            "the helper's policy while runc creates"
        );
        let o = create.join().unwrap();
        assert!(o.status.success(), "create: {}", text(&o));
    });
    let o = rt.run(&["start", &b.id]);
    assert!(o.status.success(), "start: {}", text(&o));
    watched_from_the_start(&cfg, &b.id);
}
