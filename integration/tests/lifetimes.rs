//! Every lifetime of a container id keeps its own whole log (`start` …
//! `end`), the latest as `<id>[@<scope>].jsonl`, the earlier ones as
//! `<id>…+<start ts>.jsonl` (docs/log-format.md, "Lifetimes"): runc deleting
//! and re-creating an id, dockerd's start / restart / restart policy, and
//! containerd through our shim. Real runtimes, real agent.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;
use throttlewatch_integration::bundle::{text, Bundle, ContainerOpts, OciCli};
use throttlewatch_integration::daemons::{Agent, Dockerd, PrivateConfig, BUSYBOX_IMAGE};
use throttlewatch_integration::shim::{run_args, setup, wait_until};
use throttlewatch_integration::{assert_whole_log, bin, of_type, unique};
use throttlewatch_report::reader::earlier_lifetimes;

/// The latest lifetime's log of `id` and the earlier ones, oldest first.
fn lifetimes_of(cfg: &PrivateConfig, id: &str) -> Vec<PathBuf> {
    let latest = cfg.log_of(id);
    let mut all = earlier_lifetimes(&latest);
    all.push(latest);
    all
}

/// runc delete + create of one id (what a test suite or a runc user does;
/// Docker and Podman restarts keep the id too): each lifetime keeps its own
/// whole log, `start` to `end`, and `throttlewatch report ID` lists them and
/// reports the latest.
#[test]
fn a_recreated_id_keeps_each_lifetimes_log_whole() {
    let cfg = PrivateConfig::new("");
    let _agent = Agent::start(&cfg);
    let rt = OciCli::throttlewatch(&cfg);
    let id = format!("tw-again-{}-{}", std::process::id(), unique());
    let b = Bundle::new(&id, &ContainerOpts::sh("echo hi"));
    for round in 0..3 {
        let o = rt.run_detached(&b);
        assert!(o.status.success(), "run -d #{round}: {}", text(&o));
        rt.wait_stopped(&b.id, Duration::from_secs(30));
        assert!(rt.delete(&b.id).status.success(), "delete #{round}");
    }
    let logs = lifetimes_of(&cfg, &b.id);
    assert_eq!(logs.len(), 3, "two earlier lifetimes kept: {logs:?}");
    let mut starts = Vec::new();
    for p in &logs {
        let log = assert_whole_log(p);
        assert_eq!(of_type(&log, "end")[0]["reason"], "exit");
        starts.push(log[0]["ts"].as_u64().unwrap());
    }
    assert!(
        starts.windows(2).all(|w| w[0] < w[1]),
        "oldest first: {starts:?}"
    );
    let name = |p: &Path| p.file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(
        name(&logs[0]),
        name(&logs[2]).replace(".jsonl", &format!("+{}.jsonl", starts[0]))
    );
    let o = Command::new(bin("throttlewatch"))
        .args([
            "--config",
            cfg.path.to_str().unwrap(),
            "report",
            &b.id,
            "--json",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "report: {}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("3 lifetimes of this container"), "{err}");
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v.to_string().contains(&b.id), "the latest reported: {v}");
    assert!(cfg.stray_files().is_empty(), "{:?}", cfg.stray_files());
}

/// A container that exits after ~2 s and is deleted ~4 s later, through the
/// runtime wrapper over runc: its log ends at the exit (reason `exit`,
/// `duration_ns` about 2 s, not 6 s); the later `delete` finds it ended, no
/// second `end`, and the log is whole.
#[test]
fn the_wrapper_ends_the_log_at_the_exit_not_at_delete() {
    let cfg = PrivateConfig::new("");
    let _agent = Agent::start(&cfg);
    let rt = OciCli::throttlewatch(&cfg);
    let id = format!("tw-exit-{}-{}", std::process::id(), unique());
    let b = Bundle::new(&id, &ContainerOpts::sh("sleep 2; exit 3"));
    let t0 = Instant::now();
    let o = rt.run_detached(&b);
    assert!(o.status.success(), "run -d: {}", text(&o));
    rt.wait_stopped(&b.id, Duration::from_secs(30));
    let ran = t0.elapsed();
    // The log is ended while the container, exited, is not deleted yet.
    wait_until(
        "the end record, before any delete",
        Duration::from_secs(10),
        || std::fs::read_to_string(cfg.log_of(&b.id)).is_ok_and(|t| t.contains("\"type\":\"end\"")),
    );
    std::thread::sleep(Duration::from_secs(4));
    assert!(rt.delete(&b.id).status.success(), "delete");
    let log = assert_whole_log(&cfg.log_of(&b.id));
    let ends = of_type(&log, "end");
    assert_eq!(ends.len(), 1, "one end: {log:?}");
    let end = ends[0];
    assert_eq!(end["reason"], "exit", "{end}");
    assert!(
        end["exit_code"].is_null() || end["exit_code"] == 3,
        "the exit code, where the zombie was read before its reap: {end}"
    );
    let dur = Duration::from_nanos(end["duration_ns"].as_u64().unwrap());
    eprintln!(
        "ran {ran:?}, log duration {dur:?}, exit_code {}",
        end["exit_code"]
    );
    assert!(
        dur >= Duration::from_millis(1800) && dur <= ran + Duration::from_millis(500),
        "duration {dur:?}: the exit (~2 s, the run took {ran:?}), not the delete 4 s later"
    );
    assert!(cfg.stray_files().is_empty(), "{:?}", cfg.stray_files());
}

/// `docker run -d --network none --runtime throttlewatch EXTRA.. busybox CMD..`:
/// the container's id.
fn docker_run(d: &Dockerd, extra: &[&str], cmd: &[&str]) -> String {
    let mut a = vec![
        "run",
        "-d",
        "--network",
        "none",
        "--runtime",
        "throttlewatch",
    ];
    a.extend_from_slice(extra);
    a.push(BUSYBOX_IMAGE);
    a.extend_from_slice(cmd);
    let o: Output = d.docker(&a);
    assert!(o.status.success(), "docker run: {}\n{}", text(&o), d.log());
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// `docker start` of a stopped container, `docker restart` and a
/// `--restart on-failure` policy reuse the container id: every lifetime
/// keeps its own whole log (`start` … `end`), the latest as `<id>…jsonl`.
#[test]
fn docker_restarts_keep_every_lifetimes_log() {
    let cfg = PrivateConfig::new("");
    let _agent = Agent::start(&cfg);
    let d = Dockerd::start(&cfg);
    // run (exits at once) → start → restart → rm: three lifetimes.
    let id = docker_run(&d, &[], &["true"]);
    assert!(d.docker(&["wait", &id]).status.success());
    let o = d.docker(&["start", "-a", &id]);
    assert!(o.status.success(), "docker start: {}", text(&o));
    let o = d.docker(&["restart", &id]);
    assert!(o.status.success(), "docker restart: {}", text(&o));
    assert!(d.docker(&["wait", &id]).status.success());
    let o = d.docker(&["rm", &id]);
    assert!(o.status.success(), "docker rm: {}", text(&o));
    let logs = lifetimes_of(&cfg, &id);
    assert_eq!(logs.len(), 3, "three lifetimes: {logs:?}");
    logs.iter().for_each(|p| drop(assert_whole_log(p)));

    // A restart policy: exit 1 twice more after the first run, then stop.
    let id = docker_run(&d, &["--restart", "on-failure:2"], &["sh", "-c", "exit 1"]);
    let t = Instant::now();
    loop {
        let o = d.docker(&[
            "inspect",
            "-f",
            "{{.RestartCount}} {{.State.Running}} {{.State.Restarting}}",
            &id,
        ]);
        let s = String::from_utf8_lossy(&o.stdout).trim().to_string();
        if s == "2 false false" {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "restarts: {s}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let o = d.docker(&["rm", &id]);
    assert!(o.status.success(), "docker rm: {}", text(&o));
    let logs = lifetimes_of(&cfg, &id);
    assert_eq!(logs.len(), 3, "the first run and two restarts: {logs:?}");
    logs.iter().for_each(|p| drop(assert_whole_log(p)));
    assert!(cfg.stray_files().is_empty(), "{:?}", cfg.stray_files());
}

/// containerd re-creating one id (`ctr run --rm` twice, what a client that
/// deletes and re-creates a container does): each lifetime keeps its own
/// whole log through the shim, the latest as `<id>@<scope>.jsonl`.
#[test]
fn a_recreated_container_keeps_each_lifetimes_log_through_the_shim() {
    let s = setup();
    let _agent = s.start_agent();
    for round in 0..2 {
        let o = s.ctd.ctr(&run_args("again", &[], &["true"]));
        assert!(
            o.status.success(),
            "round {round}: {}\n{}",
            String::from_utf8_lossy(&o.stderr),
            s.ctd.log()
        );
    }
    let logs: Vec<PathBuf> = std::fs::read_dir(s.tw.0.join("logs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy().into_owned();
            n.starts_with("again@") && n.ends_with(".jsonl")
        })
        .collect();
    assert_eq!(logs.len(), 2, "two lifetimes: {logs:?}");
    logs.iter().for_each(|p| drop(assert_whole_log(p)));
    wait_until("the shim to exit", Duration::from_secs(5), || {
        s.ctd.shim_pids().is_empty()
    });
}
