//! The shim with the throttlewatch agent, under a real, private containerd
//! 1.6: fifty short-lived containers leak nothing, a throttled container's
//! log agrees with cpu.stat, pause, resume and update keep the burst, and
//! with no agent fail-open runs a container and fail-closed refuses it.
//! Run `cargo build --workspace --bins` first.

use std::path::Path;
use std::time::{Duration, Instant};

use throttlewatch_cgroup::proc::cpu_cgroup_of_pid;
use throttlewatch_cgroup::{CpuCgroup, Hierarchies};
use throttlewatch_integration::shim::{run_args, setup, shim_update, text, wait_until, Setup};
use throttlewatch_integration::{cpu_lock, of_type, read_log};

fn count_dir(p: &Path) -> usize {
    std::fs::read_dir(p).map(|d| d.count()).unwrap_or(0)
}

#[test]
fn fifty_short_lived_containers_leak_nothing() {
    let s = setup();
    let agent = s.start_agent();
    // Warm-up: the first container creates the namespace's directories.
    assert!(
        s.ctd
            .ctr(&run_args("warm", &[], &["true"]))
            .status
            .success(),
        "{}",
        s.ctd.log()
    );
    let fds0 = agent.fds();
    let t0 = Instant::now();
    for i in 0..50 {
        let id = format!("short{i}");
        let out = s.ctd.ctr(&run_args(&id, &[], &["true"]));
        assert!(
            out.status.success(),
            "{id}: {}\n{}",
            text(&out.stderr),
            s.ctd.log()
        );
    }
    let took = t0.elapsed();
    eprintln!(
        "50 containers in {:.1} s ({:.0} ms each)",
        took.as_secs_f64(),
        took.as_secs_f64() * 20.0
    );
    wait_until("shims to exit", Duration::from_secs(10), || {
        s.ctd.shim_pids().is_empty()
    });
    let ns = &s.ctd.namespace;
    let runc_root = Path::new("/run/containerd/throttlewatch").join(ns);
    assert_eq!(
        count_dir(&runc_root),
        0,
        "runc state left in {}",
        runc_root.display()
    );
    let cg = Path::new("/sys/fs/cgroup/cpu").join(ns);
    let left: Vec<_> = std::fs::read_dir(&cg)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().is_dir())
        .collect();
    assert!(
        left.is_empty(),
        "cgroups left under {}: {left:?}",
        cg.display()
    );
    let fifos = Path::new("/run/containerd/fifo");
    let ours = walk_names(fifos)
        .into_iter()
        .filter(|n| n.starts_with("short"))
        .collect::<Vec<_>>();
    assert!(ours.is_empty(), "fifos left: {ours:?}");
    let bundles = s
        .ctd
        .dir
        .0
        .join("state/io.containerd.runtime.v2.task")
        .join(ns);
    assert_eq!(
        count_dir(&bundles),
        0,
        "bundles left in {}",
        bundles.display()
    );
    // Only this containerd's shims: other tests run theirs in parallel.
    assert_eq!(
        s.ctd.shim_pids(),
        Vec::<u32>::new(),
        "no shim of this containerd should be left"
    );
    wait_until(
        "the agent to forget the containers",
        Duration::from_secs(5),
        || agent.watched().is_empty(),
    );
    let fds1 = agent.fds();
    assert!(fds1 <= fds0 + 2, "agent fds grew from {fds0} to {fds1}");
    let logs = count_dir(&s.tw.0.join("logs"));
    assert!(logs >= 50, "one log per container: {logs}");
}

fn walk_names(dir: &Path) -> Vec<String> {
    let mut v = vec![];
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        v.push(e.file_name().to_string_lossy().into_owned());
        if e.path().is_dir() {
            v.extend(walk_names(&e.path()));
        }
    }
    v
}

#[test]
fn throttled_container_log_agrees_with_cpu_stat() {
    let _cpu = cpu_lock();
    let s = setup();
    let agent = s.start_agent();
    let path = s.run_throttled_burn("throttled1");
    let log = read_log(&path);
    assert_eq!(
        log.first().unwrap()["type"],
        "start",
        "log begins with start"
    );
    assert_eq!(log.last().unwrap()["type"], "end", "log ends with end");
    assert!(!of_type(&log, "throttle").is_empty(), "throttle records");
    let end = of_type(&log, "end")[0];
    assert_eq!(
        end["exit_code"], 0,
        "the shim reports the exit status: {end}"
    );
    let probe = end["probe_throttled_ns"].as_u64().unwrap();
    let kernel = end["kernel_throttled_ns"].as_u64().unwrap();
    assert!(
        kernel > 100_000_000,
        "too little throttling to compare: {end}"
    );
    let err = (probe as f64 - kernel as f64).abs() / kernel as f64;
    eprintln!(
        "containerd shim fidelity: probe {probe} ns, kernel {kernel} ns, error {:.3} %",
        err * 100.0
    );
    assert!(
        err <= 0.02,
        "probe {probe} vs kernel {kernel}: {:.2} % > 2 %",
        err * 100.0
    );
    assert!(
        agent.watched().is_empty(),
        "agent still watches: {:?}",
        agent.watched()
    );
}

/// The task's status and init pid as `ctr task ls` shows them.
fn task_row(s: &Setup, id: &str) -> Option<(u32, String)> {
    let out = s.ctd.ctr(&["task", "ls"]);
    text(&out.stdout).lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() >= 3 && f[0] == id).then(|| (f[1].parse().unwrap_or(0), f[2].to_string()))
    })
}

#[test]
fn shim_pause_resume_and_update_keep_the_burst() {
    let s = setup();
    let ctr = |a: &[&str]| s.ctd.ctr(a);
    s.run_detached(
        &[
            "--cpu-quota",
            "50000",
            "--cpu-period",
            "100000",
            "--env",
            "THROTTLEWATCH_CPU_BURST=20ms",
        ],
        "upd1",
        &["sleep", "1000"],
    );
    let (pid, status) = task_row(&s, "upd1").expect("task listed");
    assert_eq!(status, "RUNNING");
    let h = Hierarchies::discover().unwrap();
    let g = CpuCgroup::open(
        &h,
        &cpu_cgroup_of_pid(Path::new("/proc"), pid, h.mode).unwrap(),
    )
    .unwrap();
    let limits = || {
        let l = g.limits().unwrap();
        (l.quota_us, l.burst_us)
    };
    assert_eq!(limits(), (Some(50_000), Some(20_000)), "burst from the env");

    // Pause and resume: the cgroup freezer, the status containerd sees.
    let out = ctr(&["task", "pause", "upd1"]);
    assert!(out.status.success(), "pause: {}", text(&out.stderr));
    assert_eq!(task_row(&s, "upd1").unwrap().1, "PAUSED");
    let out = ctr(&["task", "pause", "upd1"]);
    assert!(!out.status.success(), "pausing a paused task must fail");
    let out = ctr(&["task", "resume", "upd1"]);
    assert!(out.status.success(), "resume: {}", text(&out.stderr));
    assert_eq!(task_row(&s, "upd1").unwrap().1, "RUNNING");
    let out = ctr(&["task", "exec", "--exec-id", "e1", "upd1", "echo", "thawed"]);
    assert_eq!(text(&out.stdout), "thawed\n", "{}", text(&out.stderr));

    // An update (Kubernetes in-place resize) through the shim: runc alone
    // leaves the burst at 0; the shim clamps it to a smaller quota and
    // restores the request when the quota grows again.
    shim_update(&s, "upd1", r#"{"cpu":{"quota":15000,"period":100000}}"#).unwrap();
    assert_eq!(
        limits(),
        (Some(15_000), Some(15_000)),
        "clamped to the quota"
    );
    shim_update(&s, "upd1", r#"{"cpu":{"quota":60000,"period":100000}}"#).unwrap();
    assert_eq!(limits(), (Some(60_000), Some(20_000)), "the request again");

    let out = ctr(&["task", "kill", "-s", "SIGKILL", "upd1"]);
    assert!(out.status.success(), "kill: {}", text(&out.stderr));
    wait_until("the task to stop", Duration::from_secs(5), || {
        task_row(&s, "upd1").is_some_and(|r| r.1 == "STOPPED")
    });
    assert!(ctr(&["task", "delete", "upd1"]).status.success());
    assert!(ctr(&["containers", "rm", "upd1"]).status.success());
    let _ = &s.tw;
}

/// The shim does the create work itself (no createRuntime hook of ours in
/// the spec it hands runc). With no agent: fail-open runs the container and
/// says why it is not watched; fail-closed refuses the task, names the
/// socket, and leaves no runc state behind.
#[test]
fn shim_without_an_agent_runs_fail_open_and_refuses_fail_closed() {
    let s = setup();
    let out = s.ctd.ctr(&run_args("noagent-open", &[], &["echo", "ran"]));
    assert!(
        out.status.success() && text(&out.stdout) == "ran\n",
        "fail-open: {}\n{}",
        text(&out.stderr),
        s.ctd.log()
    );
    let hook_log = std::fs::read_to_string(s.tw.0.join("logs/hook.log")).unwrap_or_default();
    assert!(
        hook_log.contains("noagent-open") && hook_log.contains("no agent answers"),
        "hook.log: {hook_log}"
    );
    let mut cfg = std::fs::read_to_string(&s.config).unwrap();
    cfg.push_str("fail_mode = \"closed\"\n");
    std::fs::write(&s.config, cfg).unwrap();
    let out = s
        .ctd
        .ctr(&run_args("noagent-closed", &[], &["echo", "ran"]));
    assert!(
        !out.status.success() && text(&out.stderr).contains("no agent answers"),
        "fail-closed: {} / {}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(!text(&out.stdout).contains("ran"));
    let runc_state = Path::new("/run/containerd/throttlewatch")
        .join(&s.ctd.namespace)
        .join("noagent-closed");
    assert!(!runc_state.exists(), "{} left", runc_state.display());
}
