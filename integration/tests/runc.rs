//! The real runc 1.1.5 through `throttlewatch-runtime` and the hook, with the
//! real agent: one log per container from `start` to `end`, throttle records
//! that agree with the kernel, burst kept across `update` (with or without
//! its record), an agent the hook starts itself (`start_agent = true`, one
//! for concurrent creates), and bad input that never breaks a container
//! (fail-open) or refuses it (fail-closed).

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use throttlewatch_integration::bundle::{text, Bundle, ContainerOpts, OciCli};
use throttlewatch_integration::daemons::{lock_holder, Agent, DetachedAgents, PrivateConfig};
use throttlewatch_integration::{bin, cpu_lock, of_type, read_log, unique};

fn id(tag: &str) -> String {
    format!("tw-{tag}-{}-{}", std::process::id(), unique())
}

/// Run a busy container to completion, delete it, return (log, cpu.stat throttled ns).
fn busy_container(rt: &OciCli, cfg: &PrivateConfig, b: &Bundle) -> (Vec<Value>, u64) {
    let o = rt.run_detached(b);
    assert!(o.status.success(), "run -d: {}", text(&o));
    rt.wait_stopped(&b.id, Duration::from_secs(30));
    let kernel = b.throttled_ns();
    let o = rt.delete(&b.id);
    assert!(o.status.success(), "delete: {}", text(&o));
    (read_log(&cfg.log_of(&b.id)), kernel)
}

/// start … throttle … end, fidelity within 2 % of the kernel; returns the start record.
fn assert_lifecycle(log: &[Value], cgroup_throttled_ns: u64, what: &str) -> Value {
    assert_eq!(of_type(log, "start").len(), 1, "{what}: one start record");
    assert_eq!(
        log.first().unwrap()["type"],
        "start",
        "{what}: log begins with start"
    );
    assert_eq!(
        log.last().unwrap()["type"],
        "end",
        "{what}: log ends with end"
    );
    let start = of_type(log, "start")[0].clone();
    let end = of_type(log, "end")[0];
    let recs = of_type(log, "throttle");
    assert!(!recs.is_empty(), "{what}: no throttle records");
    for r in &recs {
        assert_eq!(
            r["cgroup_id"], start["cgroup_id"],
            "{what}: throttle record of another cgroup: {r}"
        );
    }
    let probe = end["probe_throttled_ns"].as_u64().unwrap();
    let kernel = end["kernel_throttled_ns"].as_u64().unwrap();
    assert!(
        kernel > 100_000_000,
        "{what}: too little throttling to compare: {end}"
    );
    let err = |a: u64, b: u64| (a as f64 - b as f64).abs() / b as f64;
    eprintln!(
        "{what}: probe {probe} ns, end.kernel {kernel} ns, cgroup cpu.stat {cgroup_throttled_ns} ns, error {:.3} % / {:.3} %, {} throttle records",
        err(probe, kernel) * 100.0,
        err(probe, cgroup_throttled_ns) * 100.0,
        recs.len()
    );
    assert!(
        err(probe, kernel) <= 0.02,
        "{what}: probe {probe} vs kernel {kernel}"
    );
    assert!(
        err(probe, cgroup_throttled_ns) <= 0.02,
        "{what}: probe {probe} vs cpu.stat {cgroup_throttled_ns}"
    );
    assert_eq!(
        end["reason"], "exit",
        "{what}: end written at the exit, before delete"
    );
    start
}

#[test]
fn runc_container_logs_start_throttle_end_within_2_percent() {
    let _cpu = cpu_lock();
    let cfg = PrivateConfig::new("");
    let _agent = Agent::start(&cfg);
    let rt = OciCli::throttlewatch(&cfg);
    let b = Bundle::new(
        &id("fid"),
        &ContainerOpts::busy(3, 3).quota(30_000, 100_000),
    );
    let (log, kernel) = busy_container(&rt, &cfg, &b);
    let start = assert_lifecycle(&log, kernel, "runc 0.3 CPU, 3 threads");
    assert_eq!(start["container_id"], b.id.as_str());
    assert!(
        cfg.stray_files().is_empty(),
        "written outside the log dir: {:?}",
        cfg.stray_files()
    );
}

#[test]
fn two_containers_get_two_logs_and_no_event_crosses_over() {
    let _cpu = cpu_lock();
    let cfg = PrivateConfig::new("");
    let _agent = Agent::start(&cfg);
    let rt = OciCli::throttlewatch(&cfg);
    let a = Bundle::new(&id("a"), &ContainerOpts::busy(2, 3).quota(20_000, 100_000));
    let b = Bundle::new(&id("b"), &ContainerOpts::busy(2, 3).quota(30_000, 100_000));
    for x in [&a, &b] {
        let o = rt.run_detached(x);
        assert!(o.status.success(), "run -d: {}", text(&o));
    }
    let mut results = vec![];
    for x in [&a, &b] {
        rt.wait_stopped(&x.id, Duration::from_secs(30));
        let kernel = x.throttled_ns();
        assert!(rt.delete(&x.id).status.success());
        results.push((read_log(&cfg.log_of(&x.id)), kernel));
    }
    let sa = assert_lifecycle(&results[0].0, results[0].1, "container a");
    let sb = assert_lifecycle(&results[1].0, results[1].1, "container b");
    assert_ne!(sa["cgroup_id"], sb["cgroup_id"]);
    let pids = |log: &[Value]| {
        of_type(log, "throttle")
            .iter()
            .map(|r| r["pid"].as_u64().unwrap())
            .collect::<BTreeSet<_>>()
    };
    let (pa, pb) = (pids(&results[0].0), pids(&results[1].0));
    assert!(
        pa.is_disjoint(&pb),
        "pids in both logs: {:?}",
        pa.intersection(&pb).collect::<Vec<_>>()
    );
}

#[test]
fn agent_restart_continues_the_log_without_a_second_start() {
    let _cpu = cpu_lock();
    let cfg = PrivateConfig::new("");
    let agent = Agent::start(&cfg);
    let rt = OciCli::throttlewatch(&cfg);
    let b = Bundle::new(
        &id("restart"),
        &ContainerOpts::busy(3, 6).quota(30_000, 100_000),
    );
    let o = rt.run_detached(&b);
    assert!(o.status.success(), "run -d: {}", text(&o));
    std::thread::sleep(Duration::from_millis(1500));
    agent.kill();
    let _agent = Agent::start(&cfg);
    rt.wait_stopped(&b.id, Duration::from_secs(30));
    let kernel = b.throttled_ns();
    assert!(rt.delete(&b.id).status.success());
    let log = read_log(&cfg.log_of(&b.id));
    assert_eq!(of_type(&log, "start").len(), 1, "no second start");
    assert!(!of_type(&log, "resume").is_empty(), "a resume record");
    let end = of_type(&log, "end");
    assert_eq!(end.len(), 1);
    assert!(
        end[0]["lost_events"].is_u64(),
        "lost events recorded: {}",
        end[0]
    );
    let k = end[0]["kernel_throttled_ns"].as_u64().unwrap();
    eprintln!("restart: end {} vs cpu.stat {kernel}", end[0]);
    assert!(
        (k as f64 - kernel as f64).abs() / kernel as f64 <= 0.02,
        "kernel total from the original start"
    );
}

#[test]
fn burst_annotation_is_written_and_update_keeps_it() {
    let cfg = PrivateConfig::new("");
    let rt = OciCli::throttlewatch(&cfg);
    let opts = ContainerOpts::default()
        .quota(30_000, 100_000)
        .annotation("throttlewatch.io/cpu-burst", "20ms");
    let b = Bundle::new(&id("burst"), &opts);
    let o = rt.run_detached(&b);
    assert!(o.status.success(), "run -d: {}", text(&o));
    assert_eq!(b.burst_us(), 20_000);
    let o = rt.run(&["update", "--cpu-quota", "50000", &b.id]);
    assert!(o.status.success(), "update: {}", text(&o));
    assert_eq!(b.quota_us(), Some(50_000));
    assert_eq!(b.burst_us(), 20_000, "burst kept across update");
    // A quota below the burst: runc's write succeeds and the burst is clamped.
    let o = rt.run(&["update", "--cpu-quota", "15000", &b.id]);
    assert!(o.status.success(), "update: {}", text(&o));
    assert_eq!(b.quota_us(), Some(15_000));
    assert_eq!(b.burst_us(), 15_000);
    // The spec holds our hooks exactly once.
    let spec = b.config();
    assert_eq!(spec["hooks"]["createRuntime"].as_array().unwrap().len(), 1);
    assert!(rt.run(&["delete", "-f", &b.id]).status.success());
}

#[test]
fn malformed_config_json_fail_open_and_fail_closed() {
    for mode in ["open", "closed"] {
        let cfg = PrivateConfig::new(&format!("fail_mode = {mode:?}"));
        let rt = OciCli::throttlewatch(&cfg);
        let b = Bundle::new(&id("badjson"), &ContainerOpts::default());
        std::fs::write(b.config_path(), "{\"ociVersion\": \"1.0.2\", \"process\": ").unwrap();
        let log = b.dir().join("runc-log.json");
        let o = rt.run(&[
            "--log",
            log.to_str().unwrap(),
            "--log-format",
            "json",
            "run",
            "-d",
            "--bundle",
            b.dir().to_str().unwrap(),
            &b.id,
        ]);
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(
            !o.status.success(),
            "{mode}: runc cannot run a broken config: {}",
            text(&o)
        );
        assert!(
            err.contains("throttlewatch-runtime:")
                && err.contains("config.json")
                && err.contains("not valid JSON"),
            "{mode}: {err}"
        );
        let ours: Vec<Value> = std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let line = ours
            .iter()
            .find(|v| {
                v["msg"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("throttlewatch-runtime:"))
            })
            .expect("our line in --log");
        assert_eq!(line["level"], "error");
        assert!(line["time"].is_string());
        let runc_ran = ours.len() > 1 || err.lines().count() > 1;
        match mode {
            "open" => assert!(
                runc_ran && err.contains("fail-open"),
                "open: runc reports its own error too: {err}"
            ),
            _ => assert!(
                err.contains("fail-closed: create refused") && !runc_ran,
                "closed: runc not run: {err}"
            ),
        }
    }
}

#[test]
fn bad_annotations_start_the_container_and_are_named() {
    let cfg = PrivateConfig::new("");
    let _agent = Agent::start(&cfg);
    let rt = OciCli::throttlewatch(&cfg);
    let opts = ContainerOpts::default()
        .quota(30_000, 100_000)
        .annotation("throttlewatch.io/cpu-burst", "abc")
        .annotation("throttlewatch.io/cpu-brust", "1ms")
        .annotation("throttlewatch.io/threshold", "99s");
    let b = Bundle::new(&id("badann"), &opts);
    let o = rt.run_detached(&b);
    assert!(
        o.status.success(),
        "fail-open: the container starts: {}",
        text(&o)
    );
    assert_eq!(rt.status(&b.id).as_deref(), Some("running"));
    let hook_log = cfg.hook_log();
    for want in [
        "throttlewatch.io/cpu-burst=\"abc\": expected",
        "throttlewatch.io/cpu-brust=\"1ms\"",
        "throttlewatch.io/threshold=\"99s\"",
    ] {
        assert!(hook_log.contains(want), "hook.log lacks {want}: {hook_log}");
    }
    assert!(rt.delete(&b.id).status.success() || rt.run(&["delete", "-f", &b.id]).status.success());
    let log = read_log(&cfg.log_of(&b.id));
    let refused = of_type(&log, "start")[0]["qos"]["refused_text"].to_string();
    assert!(
        refused.contains("cpu-burst") && refused.contains("abc") && refused.contains("cpu-brust"),
        "{refused}"
    );

    let cfg = PrivateConfig::new("fail_mode = \"closed\"");
    let rt = OciCli::throttlewatch(&cfg);
    let b = Bundle::new(&id("badann-closed"), &opts);
    let o = rt.run_detached(&b);
    assert!(
        !o.status.success(),
        "fail-closed: create refused: {}",
        text(&o)
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("throttlewatch.io/cpu-burst=\\\"abc\\\"")
            || String::from_utf8_lossy(&o.stderr).contains("throttlewatch.io/cpu-burst=\"abc\""),
        "{}",
        text(&o)
    );
}

#[test]
fn weird_ids_keep_the_log_inside_the_log_dir() {
    let cfg = PrivateConfig::new("");
    let _agent = Agent::start(&cfg);
    let rt = OciCli::throttlewatch(&cfg);
    let b = Bundle::new("a..b", &ContainerOpts::default());
    let o = rt.run_detached(&b);
    assert!(o.status.success(), "run -d a..b: {}", text(&o));
    assert!(rt.run(&["delete", "-f", "a..b"]).status.success());
    // `<escaped id>@<scope of the private runc root>.jsonl`.
    assert!(
        cfg.log_of("a..b").is_file()
            && cfg
                .log_of("a..b")
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("a%2E%2Eb@root-"),
        "{:?}",
        std::fs::read_dir(&cfg.log_dir).unwrap().collect::<Vec<_>>()
    );
    // runc itself refuses an id with '/': nothing is created anywhere.
    let b = Bundle::new("../escape", &ContainerOpts::default());
    let o = rt.run_detached(&b);
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("invalid"),
        "{}",
        text(&o)
    );
    assert!(cfg.stray_files().is_empty(), "{:?}", cfg.stray_files());
    assert!(!cfg.dir.0.parent().unwrap().join("escape.jsonl").exists());
}

#[test]
fn missing_agent_still_starts_the_container() {
    let cfg = PrivateConfig::new("start_agent = false");
    let rt = OciCli::throttlewatch(&cfg);
    let b = Bundle::new(&id("noagent"), &ContainerOpts::default());
    let o = rt.run_detached(&b);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        cfg.hook_log().contains("no agent answers on")
            && cfg.hook_log().contains("start_agent = false"),
        "{}",
        cfg.hook_log()
    );
    assert!(rt.run(&["delete", "-f", &b.id]).status.success());

    let cfg = PrivateConfig::new("start_agent = false\nfail_mode = \"closed\"");
    let rt = OciCli::throttlewatch(&cfg);
    let b = Bundle::new(&id("noagent-closed"), &ContainerOpts::default());
    let o = rt.run_detached(&b);
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("no agent answers"),
        "{}",
        text(&o)
    );
}

/// `start_agent = false` and no agent: the container starts (fail-open)
/// and its register waits in `pending/`; the agent that starts later takes
/// it (its process still runs in its cgroup), so the lifetime gets its log
/// from that `start` to the `end` at delete, and nothing is left.
#[test]
fn a_container_started_while_no_agent_listens_is_taken_by_the_next_agent() {
    let cfg = PrivateConfig::new("start_agent = false");
    let rt = OciCli::throttlewatch(&cfg);
    let b = Bundle::new(&id("later"), &ContainerOpts::default());
    let o = rt.run_detached(&b);
    assert!(o.status.success(), "{}", text(&o));
    let pending = cfg.state_dir.join("pending");
    let kept = || {
        std::fs::read_dir(&pending)
            .map(|d| d.flatten().count())
            .unwrap_or(0)
    };
    assert!(
        cfg.hook_log().contains("its register waits in") && kept() == 1,
        "the register is kept for the next agent: {} record(s)\n{}",
        kept(),
        cfg.hook_log()
    );
    let agent = Agent::start(&cfg);
    let log = cfg.log_of(&b.id);
    let t = std::time::Instant::now();
    let started = || log.exists() && !of_type(&read_log(&log), "start").is_empty();
    while !started() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the agent did not take the kept register:\n{}",
            agent.output()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(kept(), 0, "the record goes once taken");
    assert!(
        agent.output().contains("watched from now"),
        "{}",
        agent.output()
    );
    assert!(rt.run(&["delete", "-f", &b.id]).status.success());
    let recs = read_log(&log);
    assert_eq!(of_type(&recs, "start").len(), 1, "{recs:?}");
    assert_eq!(recs.last().unwrap()["type"], "end", "{recs:?}");
    assert_eq!(kept(), 0);
    drop(agent);
}

#[test]
fn garbage_on_the_hook_stdin() {
    for (mode, code) in [("open", 0), ("closed", 1)] {
        let cfg = PrivateConfig::new(&format!("fail_mode = {mode:?}"));
        let mut child = Command::new(bin("throttlewatch-hook"))
            .args(["createRuntime", "--config"])
            .arg(&cfg.path)
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"\x00garbage{{")
            .unwrap();
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{mode}: {err}");
        assert!(
            err.starts_with("throttlewatch-hook: stdin: expected the OCI state JSON"),
            "{mode}: {err}"
        );
        assert!(cfg
            .hook_log()
            .contains("stdin: expected the OCI state JSON"));
        assert!(cfg.stray_files().is_empty(), "{:?}", cfg.stray_files());
    }
}

/// A container's log: `start` first, `end` last, with `reason`: `exit` for
/// one that exited before its delete, `delete` for one `delete -f` stopped.
fn assert_start_to_end(cfg: &PrivateConfig, b: &Bundle, reason: &str) {
    let log = read_log(&cfg.log_of(&b.id));
    assert_eq!(
        log.first().map(|r| r["type"].clone()),
        Some("start".into()),
        "{}: {log:?}",
        b.id
    );
    assert_eq!(of_type(&log, "start")[0]["container_id"], b.id.as_str());
    assert_eq!(
        log.last().map(|r| r["type"].clone()),
        Some("end".into()),
        "{}: {log:?}",
        b.id
    );
    assert_eq!(of_type(&log, "end")[0]["reason"], reason);
}

#[test]
fn hook_starts_the_agent_when_none_answers() {
    let _cpu = cpu_lock(); // loading the probe is CPU work: keep it away from the fidelity tests
    let cfg = PrivateConfig::new("start_agent = true");
    let agents = DetachedAgents::new(&cfg);
    assert!(
        agents.pids().is_empty(),
        "an agent on a fresh private config: {:?}",
        agents.pids()
    );
    let rt = OciCli::throttlewatch(&cfg);
    let b = Bundle::new(&id("autostart"), &ContainerOpts::sh("sleep 1"));
    let o = rt.run_detached(&b);
    assert!(o.status.success(), "run -d: {}", text(&o));
    let pids = agents.settle(Duration::from_secs(10));
    assert_eq!(pids.len(), 1, "one agent started: {pids:?}");
    assert_eq!(
        lock_holder(&cfg.state_dir),
        Some(pids[0]),
        "the started agent holds the lock"
    );
    assert!(
        !cfg.hook_log().contains("not watched"),
        "{}",
        cfg.hook_log()
    );
    rt.wait_stopped(&b.id, Duration::from_secs(30));
    let o = rt.delete(&b.id);
    assert!(o.status.success(), "delete: {}", text(&o));
    assert_start_to_end(&cfg, &b, "exit");
    // A second container uses the running agent: still one.
    let b2 = Bundle::new(&id("autostart2"), &ContainerOpts::default());
    assert!(rt.run_detached(&b2).status.success());
    assert_eq!(agents.settle(Duration::from_secs(10)), pids);
    assert!(rt.run(&["delete", "-f", &b2.id]).status.success());
    assert_start_to_end(&cfg, &b2, "delete");
}

#[test]
fn concurrent_creates_start_only_one_agent() {
    let _cpu = cpu_lock();
    let cfg = PrivateConfig::new("start_agent = true");
    let agents = DetachedAgents::new(&cfg);
    let rt = OciCli::throttlewatch(&cfg);
    let a = Bundle::new(&id("race-a"), &ContainerOpts::default());
    let b = Bundle::new(&id("race-b"), &ContainerOpts::default());
    let (oa, ob) = std::thread::scope(|s| {
        let ha = s.spawn(|| rt.run_detached(&a));
        let hb = s.spawn(|| rt.run_detached(&b));
        (ha.join().unwrap(), hb.join().unwrap())
    });
    assert!(
        oa.status.success() && ob.status.success(),
        "run -d: {}\n{}",
        text(&oa),
        text(&ob)
    );
    let pids = agents.settle(Duration::from_secs(10));
    assert_eq!(pids.len(), 1, "the lock lets one agent run: {pids:?}");
    assert_eq!(lock_holder(&cfg.state_dir), Some(pids[0]));
    // Both containers were registered with that agent (the loser of the
    // start race waited for the winner instead of giving up).
    assert!(
        !cfg.hook_log().contains("not watched"),
        "{}",
        cfg.hook_log()
    );
    for x in [&a, &b] {
        assert!(rt.run(&["delete", "-f", &x.id]).status.success());
        assert_start_to_end(&cfg, x, "delete");
    }
}

#[test]
fn update_without_a_burst_record_derives_it_from_the_bundle() {
    let cfg = PrivateConfig::new("");
    let rt = OciCli::throttlewatch(&cfg);
    // Keyed by (scope of the wrapper's private --root, id).
    let record = |id: &str| {
        let scope = throttlewatch_core::Scope::of_runc_root(&rt.root.0, std::path::Path::new("/"));
        throttlewatch_core::StateDir::new(&cfg.state_dir)
            .burst_file(&throttlewatch_core::ContainerKey::new(id, scope))
    };
    // From an annotation.
    let opts = ContainerOpts::default()
        .quota(30_000, 100_000)
        .annotation("throttlewatch.io/cpu-burst", "20ms");
    let b = Bundle::new(&id("norecord"), &opts);
    let o = rt.run_detached(&b);
    assert!(o.status.success(), "run -d: {}", text(&o));
    assert_eq!(b.burst_us(), 20_000);
    std::fs::remove_file(record(&b.id)).expect("the hook recorded the burst");
    // A quota below the burst: without clearing it first the kernel refuses the quota.
    let o = rt.run(&["update", "--cpu-quota", "15000", &b.id]);
    assert!(o.status.success(), "update: {}", text(&o));
    assert_eq!(b.quota_us(), Some(15_000));
    assert_eq!(
        b.burst_us(),
        15_000,
        "burst derived again, clamped to the quota"
    );
    assert!(
        record(&b.id).is_file(),
        "the derived record is kept for the next update"
    );
    std::fs::remove_file(record(&b.id)).unwrap();
    let o = rt.run(&["update", "--cpu-quota", "50000", &b.id]);
    assert!(o.status.success(), "update: {}", text(&o));
    assert_eq!(
        b.burst_us(),
        20_000,
        "the request, not the last clamped value"
    );
    assert!(rt.run(&["delete", "-f", &b.id]).status.success());

    // From the environment (Docker 20.10 has no annotations).
    let opts = ContainerOpts::default()
        .quota(20_000, 100_000)
        .env("THROTTLEWATCH_CPU_BURST=10ms");
    let b = Bundle::new(&id("norecord-env"), &opts);
    assert!(rt.run_detached(&b).status.success());
    std::fs::remove_file(record(&b.id)).unwrap();
    let o = rt.run(&["update", "--cpu-quota", "40000", &b.id]);
    assert!(o.status.success(), "update: {}", text(&o));
    assert_eq!(b.quota_us(), Some(40_000));
    assert_eq!(b.burst_us(), 10_000);
    assert!(rt.run(&["delete", "-f", &b.id]).status.success());

    // No burst asked for: update passes through and writes no record.
    let b = Bundle::new(
        &id("norecord-none"),
        &ContainerOpts::default().quota(20_000, 100_000),
    );
    assert!(rt.run_detached(&b).status.success());
    let o = rt.run(&["update", "--cpu-quota", "40000", &b.id]);
    assert!(o.status.success(), "update: {}", text(&o));
    assert_eq!(b.burst_us(), 0);
    assert!(!record(&b.id).exists());
    assert!(rt.run(&["delete", "-f", &b.id]).status.success());
}

/// Issue 19: a container's cgroup leaves nothing behind in any hierarchy
/// (no shared parent such as `/tw-test` that runc never removes).
#[test]
fn a_deleted_container_leaves_no_cgroup_directory() {
    let rt = OciCli::new("runc");
    let b = Bundle::new(&id("leftover"), &ContainerOpts::default());
    let top = b
        .cgroup_path
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let o = rt.run_detached(&b);
    assert!(o.status.success(), "{}", text(&o));
    let cpu = b.group().cpu_dir;
    assert!(
        cpu.exists(),
        "the container has its cgroup: {}",
        cpu.display()
    );
    assert!(rt.run(&["delete", "-f", &b.id]).status.success());
    drop(b);
    let left: Vec<_> = std::fs::read_dir("/sys/fs/cgroup")
        .unwrap()
        .flatten()
        .map(|c| c.path().join(&top))
        .chain([std::path::Path::new("/sys/fs/cgroup").join(&top)])
        .filter(|p| p.exists())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
