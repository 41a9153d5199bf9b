//! Issue 11, finding 2: the log volume a container can cause. The real
//! agent watches a real cgroup with a quota and many spinning threads
//! (threshold 0: every freeze is due a record): the log's byte budget folds
//! freezes into `throttle_summary` records while `end` stays exact, logs are
//! rotated at their size with the kept count, and the log directory's cap
//! removes the oldest closed logs, never an open one.
//!
//! `LOG_BUDGET_THREADS=500 cargo test -p throttlewatch-integration --test
//! log_budget -- --nocapture` measures with more threads (default 64).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Value};
use throttlewatch_cgroup::{Hierarchies, TransientCgroup};
use throttlewatch_core::protocol::{call, Register, Request};
use throttlewatch_integration::daemons::{Agent, DetachedAgents, PrivateConfig};
use throttlewatch_integration::{burn_in, cpu_lock, of_type, unique};

/// A measurement knob: `LOG_BUDGET_THREADS` (64 spinning threads at 0.5
/// CPU), `LOG_BUDGET_MS` (3000), `LOG_BUDGET_RATE` (4096 B/s),
/// `LOG_BUDGET_BURST` (8192 B).
fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |v| v.parse().expect(name))
}

/// The agent's CPU time so far (user + system), in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let f: Vec<&str> = s.rsplit_once(") ").unwrap().1.split(' ').collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// What a watched workload left: its log (every part, oldest first) and
/// the agent's CPU time while it ran.
struct Watched {
    log: Vec<Value>,
    bytes: u64,
    agent_ticks: u64,
    path: PathBuf,
}

/// Watch `tw-burn --threads N --ms MS` in a cgroup of 0.5 CPU with the
/// agent of `cfg`, end it as poststop would, and read its log.
fn watch_burn(cfg: &PrivateConfig, agent: &Agent, tag: &str, n: &str, ms: u64) -> Watched {
    let h = Hierarchies::discover().unwrap();
    let rel = format!("/tw-test-budget-{tag}-{}-{}", std::process::id(), unique());
    let cg = TransientCgroup::create(&h, &rel).unwrap();
    cg.group.set_quota(Some(50_000), 100_000).unwrap();
    // The most weight, so that the group reaches its quota on a loaded
    // machine (with the default weight, builds beside it kept it under).
    let (file, weight) = match cg.group.cpu_dir.join("cpu.shares").exists() {
        true => ("cpu.shares", "262144"),
        false => ("cpu.weight", "10000"),
    };
    std::fs::write(cg.group.cpu_dir.join(file), weight).unwrap();
    let mut burn = burn_in(&cg, &["--threads", n, "--ms", &ms.to_string()]);
    let id = format!("{tag}-{}", unique());
    let ticks = cpu_ticks(agent.child.id());
    let r = call(
        &cfg.socket,
        &Request::Register(Register {
            container_id: id.clone(),
            container_name: tag.into(),
            pid: Some(burn.id()),
            cgroup_path: cg.group.rel.clone(),
            ..Default::default()
        }),
        Duration::from_secs(5),
    )
    .unwrap();
    assert!(r.ok, "{r:?}");
    let path = PathBuf::from(r.log_path.expect("the agent names the log"));
    assert!(burn.wait().unwrap().success());
    // As the hook's poststop sends it (the cgroup still exists: cpu.stat is read).
    let unregister: Request = serde_json::from_value(json!({
        "op": "unregister", "container_id": id, "reason": "poststop", "exit_code": 0
    }))
    .unwrap();
    let r = call(&cfg.socket, &unregister, Duration::from_secs(5)).unwrap();
    assert!(r.ok, "{r:?}");
    let agent_ticks = cpu_ticks(agent.child.id()) - ticks;
    let (log, bytes) = read_parts(&path);
    Watched {
        log,
        bytes,
        agent_ticks,
        path,
    }
}

/// `X.jsonl.N` … `X.jsonl.1`, then `X.jsonl` (the report's reader order),
/// every line whole JSON; and their bytes.
fn read_parts(path: &Path) -> (Vec<Value>, u64) {
    let mut parts: Vec<PathBuf> = (1..)
        .map(|n| PathBuf::from(format!("{}.{n}", path.display())))
        .take_while(|p| p.is_file())
        .collect();
    parts.reverse();
    parts.push(path.to_path_buf());
    let (mut log, mut bytes) = (vec![], 0);
    for p in parts {
        let text = std::fs::read_to_string(&p).unwrap();
        bytes += text.len() as u64;
        assert!(text.ends_with('\n'), "{}: a cut line", p.display());
        for l in text.lines() {
            log.push(serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")));
        }
    }
    (log, bytes)
}

fn sum(recs: &[&Value], k: &str) -> u64 {
    recs.iter().map(|r| r[k].as_u64().unwrap()).sum()
}

/// The agent with a private configuration and `extra` keys.
fn agent_with(extra: &str) -> (PrivateConfig, Agent) {
    let cfg = PrivateConfig::new(&format!("snapshot_interval_s = 1\n{extra}"));
    let agent = Agent::start(&cfg);
    (cfg, agent)
}

#[test]
fn budget_folds_freezes_and_end_stays_exact() {
    let _l = cpu_lock();
    let n = knob("LOG_BUDGET_THREADS", 64).to_string();
    let ms = knob("LOG_BUDGET_MS", 3000);
    let (budget, burst) = (
        knob("LOG_BUDGET_RATE", 4096),
        knob("LOG_BUDGET_BURST", 8192),
    );
    let (cfg0, agent0) = agent_with("log_budget_bytes_per_s = 0\n");
    let free = watch_burn(&cfg0, &agent0, "free", &n, ms);
    drop(agent0);
    let (cfg, agent) = agent_with(&format!(
        "log_budget_bytes_per_s = {budget}\nlog_budget_burst_bytes = {burst}\n"
    ));
    let w = watch_burn(&cfg, &agent, "budget", &n, ms);

    let end = of_type(&w.log, "end")[0];
    let secs = end["duration_ns"].as_f64().unwrap() / 1e9;
    let free_secs = of_type(&free.log, "end")[0]["duration_ns"]
        .as_f64()
        .unwrap()
        / 1e9;
    let (rate, free_rate) = (w.bytes as f64 / secs, free.bytes as f64 / free_secs);
    let tick_ms = 1000.0 / 100.0;
    eprintln!(
        "{n} threads at 0.5 CPU: {free_rate:.0} B/s without a budget (agent CPU {:.0} ms), {rate:.0} B/s with {budget} B/s (agent CPU {:.0} ms); {} bytes in {secs:.1} s",
        free.agent_ticks as f64 * tick_ms,
        w.agent_ticks as f64 * tick_ms,
        w.bytes
    );
    assert!(
        free_rate > 3.0 * budget as f64,
        "the workload must need the budget: {free_rate:.0} B/s unbudgeted: {}",
        of_type(&free.log, "end")[0]
    );
    // The budget, its burst, and per interval (1 s) a cpu_stat, a runq and
    // the summary of the threads past the budget; start, cold_start, end.
    let slack = 12_000.0 + 1200.0 * secs.ceil();
    let bound = budget as f64 * secs + burst as f64 + slack;
    assert!(
        (w.bytes as f64) <= bound,
        "{} bytes in {secs:.1} s > {bound:.0}",
        w.bytes
    );

    let throttles = of_type(&w.log, "throttle");
    let summaries = of_type(&w.log, "throttle_summary");
    assert!(!summaries.is_empty() && !throttles.is_empty(), "{end}");
    let folded = sum(&summaries, "freezes");
    assert_eq!(end["folded_freezes"].as_u64(), Some(folded), "{end}");
    assert_eq!(end["below_threshold"], 0);
    assert_eq!(
        end["freezes"].as_u64().unwrap(),
        throttles.len() as u64 + folded,
        "every freeze is in one record or one summary: {end}"
    );
    assert_eq!(
        end["frozen_ns"].as_u64().unwrap(),
        sum(&throttles, "frozen_ns") + sum(&summaries, "frozen_ns"),
        "{end}"
    );
    for s in &summaries {
        assert!(
            s["max_frozen_ns"].as_u64() <= s["frozen_ns"].as_u64(),
            "{s}"
        );
        assert!(
            s["interval_start_ns"].as_u64() < s["interval_end_ns"].as_u64(),
            "{s}"
        );
    }
    // The episode totals come from the kernel map, never from the records.
    let (p, k) = (
        end["probe_throttled_ns"].as_f64().unwrap(),
        end["kernel_throttled_ns"].as_f64().unwrap(),
    );
    assert!(k > 1e8, "too little throttling to compare: {end}");
    assert!((p - k).abs() / k <= 0.02, "probe {p} vs kernel {k}: {end}");
    assert!(end["kernel_stale"].is_null(), "{end}");
    // The report reads the summaries (it refused an unknown record type).
    let o = std::process::Command::new(throttlewatch_integration::bin("throttlewatch"))
        .args(["report", "--json"])
        .arg(&w.path)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Without the budget: one record per freeze, none folded.
    let fend = of_type(&free.log, "end")[0];
    assert!(of_type(&free.log, "throttle_summary").is_empty());
    assert_eq!(
        fend["freezes"].as_u64().unwrap(),
        of_type(&free.log, "throttle").len() as u64
    );
}

#[test]
fn logs_rotate_at_their_size_and_keep_the_count() {
    let _l = cpu_lock();
    let (cfg, agent) =
        agent_with("log_budget_bytes_per_s = 0\nlog_max_bytes = 8192\nlog_keep = 2\n");
    let w = watch_burn(&cfg, &agent, "rotate", "16", 2000);
    let part = |n: u32| PathBuf::from(format!("{}.{n}", w.path.display()));
    // A part is cut before the line that would pass 8192 bytes; a line
    // longer than a part (the `end` with its 32 wake-up edges, ~11 KB) is
    // never split: it goes alone into a part of its own.
    for p in [w.path.clone(), part(1), part(2)] {
        let text = std::fs::read_to_string(&p).unwrap();
        let lines = text.lines().count();
        assert!(
            text.ends_with('\n') && (text.len() <= 8192 || lines == 1),
            "{}: {} bytes in {lines} lines",
            p.display(),
            text.len()
        );
    }
    assert!(!part(3).exists(), "only log_keep = 2 parts are kept");
    let end = of_type(&w.log, "end")[0];
    let cut = end["rotations"].as_u64().unwrap_or(0);
    eprintln!("rotation: {cut} parts cut, {} bytes kept", w.bytes);
    assert!(cut > 2, "more parts were cut than kept: {end}");
    assert_eq!(
        w.log.last().unwrap()["type"],
        "end",
        "the newest part ends the log"
    );
    assert!(
        of_type(&w.log, "start").is_empty(),
        "the oldest parts (with start) are gone"
    );
    // Every part is whole lines of the log, in time order.
    let ts: Vec<u64> = w.log.iter().map(|v| v["ts"].as_u64().unwrap()).collect();
    assert!(ts.windows(2).all(|p| p[0] <= p[1]), "parts out of order");
}

/// A closed log of `kib` KiB whose last write was `age` ago.
fn closed_log(dir: &Path, name: &str, kib: usize, age: Duration) {
    let p = dir.join(name);
    let line = "{\"v\":1,\"ts\":1,\"type\":\"cpu_stat\"}\n";
    let mut text = line.repeat(kib * 1024 / line.len());
    text.push_str("{\"v\":1,\"ts\":2,\"type\":\"end\"}\n");
    std::fs::write(&p, text).unwrap();
    let f = std::fs::File::options().write(true).open(&p).unwrap();
    f.set_modified(SystemTime::now() - age).unwrap();
}

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < timeout, "{what} within {timeout:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn dir_cap_removes_the_oldest_closed_logs_never_an_open_one() {
    let h = Hierarchies::discover().unwrap();
    let cfg = PrivateConfig::new("snapshot_interval_s = 1\nlog_dir_max_bytes = 100000\n");
    std::fs::create_dir_all(&cfg.log_dir).unwrap();
    let hour = Duration::from_secs(3600);
    closed_log(&cfg.log_dir, "oldest.jsonl", 40, 3 * hour);
    closed_log(&cfg.log_dir, "older.jsonl", 40, 2 * hour);
    closed_log(&cfg.log_dir, "recent.jsonl", 40, hour);
    let agent = Agent::start(&cfg);
    // An open log that is older than all of them by its start: a sleeping
    // container watched since before the sweep.
    let cg = TransientCgroup::create(
        &h,
        &format!("/tw-test-budget-cap-{}-{}", std::process::id(), unique()),
    )
    .unwrap();
    let mut sleeper = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    cg.group.add_pid(sleeper.id()).unwrap();
    let r = call(
        &cfg.socket,
        &Request::Register(Register {
            container_id: "open".into(),
            container_name: "open".into(),
            pid: Some(sleeper.id()),
            cgroup_path: cg.group.rel.clone(),
            ..Default::default()
        }),
        Duration::from_secs(5),
    )
    .unwrap();
    assert!(r.ok, "{r:?}");
    let open = PathBuf::from(r.log_path.unwrap());
    let said = || agent.output();
    wait_for("a sweep", Duration::from_secs(10), || {
        said().contains("over log_dir_max_bytes")
    });
    // 120 KiB of closed logs against 100 000 bytes: the oldest one goes.
    assert!(!cfg.log_dir.join("oldest.jsonl").exists(), "{}", said());
    assert!(cfg.log_dir.join("older.jsonl").exists(), "{}", said());
    assert!(cfg.log_dir.join("recent.jsonl").exists());
    assert!(said().contains("removed 1 closed logs"), "{}", said());
    assert!(said().contains("oldest.jsonl"), "{}", said());
    // Over again: the next oldest closed log goes; the open one never.
    closed_log(&cfg.log_dir, "later.jsonl", 40, Duration::ZERO);
    wait_for("the second sweep", Duration::from_secs(10), || {
        !cfg.log_dir.join("older.jsonl").exists()
    });
    assert!(cfg.log_dir.join("recent.jsonl").exists());
    assert!(cfg.log_dir.join("later.jsonl").exists());
    assert!(open.exists());
    std::thread::sleep(Duration::from_secs(2));
    let lines = said().matches("over log_dir_max_bytes").count();
    assert_eq!(
        lines,
        2,
        "once per sweep that removed something: {}",
        said()
    );
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    drop(cg);
    // The container's end is written whole into the log that stayed.
    wait_for("the end of the open log", Duration::from_secs(10), || {
        std::fs::read_to_string(&open).is_ok_and(|t| t.contains("\"type\":\"end\""))
    });
}

/// agent.log (the detached agent's stdout and stderr) is rotated at
/// `log_max_bytes`: the old part keeps what was written, the agent goes on
/// writing to a fresh agent.log.
#[test]
fn agent_log_is_rotated_at_its_size() {
    let cfg = PrivateConfig::new("snapshot_interval_s = 1\nlog_max_bytes = 4096\nlog_keep = 1\n");
    std::fs::create_dir_all(&cfg.log_dir).unwrap();
    let log = cfg.log_dir.join("agent.log");
    std::fs::write(&log, "an older agent's line\n".repeat(250)).unwrap();
    let agents = DetachedAgents::new(&cfg);
    let o = std::process::Command::new(throttlewatch_integration::bin("throttlewatch"))
        .arg("--config")
        .arg(&cfg.path)
        .args(["agent", "--detach"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let pid = agents.settle(Duration::from_secs(10))[0];
    let part = cfg.log_dir.join("agent.log.1");
    wait_for("agent.log.1", Duration::from_secs(10), || part.exists());
    let old = std::fs::read_to_string(&part).unwrap();
    assert!(old.starts_with("an older agent's line\n"), "{old}");
    assert!(old.contains("probe"), "the agent's first lines: {old}");
    // The rename comes first, the agent's reopen of fd 1 and 2 right after.
    for fd in [1, 2] {
        let to = || std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).ok();
        wait_for(
            &format!("fd {fd} moved to the fresh agent.log"),
            Duration::from_secs(10),
            || to().as_deref() == Some(log.as_path()),
        );
    }
    assert!(std::fs::metadata(&log).unwrap().len() < 4096);
    assert!(!cfg.log_dir.join("agent.log.2").exists(), "log_keep = 1");
}
