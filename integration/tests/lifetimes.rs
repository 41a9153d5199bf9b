//! Every lifetime of a container id keeps its own whole log (`start` …
//! `end`), the latest as `<id>[@<scope>].jsonl`, the earlier ones as
//! `<id>…+<start ts>.jsonl` (docs/log-format.md, "Lifetimes"): runc deleting
//! and re-creating an id, dockerd's start / restart / restart policy, and
//! containerd through our shim. Real runtimes, real agent.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;
use throttlewatch_cgroup::{Hierarchies, TransientCgroup};
use throttlewatch_core::protocol::{call, ErrorCode, Register, Request};
use throttlewatch_core::EndReason;
use throttlewatch_integration::bundle::{text, Bundle, ContainerOpts, OciCli};
use throttlewatch_integration::daemons::{Agent, Dockerd, PrivateConfig, BUSYBOX_IMAGE};
use throttlewatch_integration::shim::{run_args, setup, wait_until};
use throttlewatch_integration::{assert_whole_log, bin, burn_in, of_type, unique};
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

/// A container whose log the agent ended on its own, then the agent
/// restarted before the front end's end came (a node's agent upgraded
/// between a container's exit and its removal): the restarted agent
/// remembers nothing, reads the log's last record and answers the end with
/// the log, writing nothing. Both orders: the exit seen by the first agent
/// (reason `exit`), and the exit while no agent ran (the restarted one
/// finds it gone: `ended-while-agent-down`). A front end's own end, once
/// written, is not answered twice; an id never registered stays
/// `not-watched`.
#[test]
fn a_restarted_agent_answers_the_end_of_a_log_ended_before_it() {
    let cfg = PrivateConfig::new("");
    let h = Hierarchies::discover().unwrap();
    for (exit_seen_by_first, want) in [(true, "exit"), (false, "ended-while-agent-down")] {
        let agent = Agent::start(&cfg);
        let id = format!("tw-restart-end-{}-{}", std::process::id(), unique());
        let cg = TransientCgroup::create(&h, &format!("/{id}")).unwrap();
        let mut burner = burn_in(&cg, &["--threads", "1", "--ms", "600"]);
        let reg = Register {
            container_id: id.clone(),
            pid: Some(burner.id()),
            cgroup_path: cg.group.rel.clone(),
            ..Default::default()
        };
        let r = call(&cfg.socket, &Request::Register(reg), Duration::from_secs(5)).unwrap();
        assert!(r.ok, "register: {r:?}");
        let log = cfg.log_of(&id);
        let ended = || {
            wait_until("the agent's own end", Duration::from_secs(10), || {
                std::fs::read_to_string(&log).is_ok_and(|t| t.contains("\"type\":\"end\""))
            })
        };
        // The end written by the agent that saw the exit, or by the one
        // started after it (restore finds the init gone); then the agent
        // that answers the front end's end is a fresh one either way.
        let mut agent = agent;
        if !exit_seen_by_first {
            // Killed once it holds the container in its state (the answer
            // comes a moment before the state file; a kill in between
            // loses the resume, which is not what this test is about).
            let state = throttlewatch_core::StateDir::new(&cfg.state_dir)
                .container_file(&throttlewatch_core::ContainerKey::new(id.clone(), None));
            wait_until("the agent's state of it", Duration::from_secs(10), || {
                state.exists()
            });
            agent.kill();
            burner.wait().unwrap();
            agent = Agent::start(&cfg);
        } else {
            burner.wait().unwrap();
        }
        ended();
        agent.kill();
        let agent = Agent::start(&cfg);
        let r = call(
            &cfg.socket,
            &Request::Unregister {
                container_id: id.clone(),
                scope: None,
                reason: EndReason::Delete,
                exit_code: Some(0),
            },
            Duration::from_secs(5),
        )
        .unwrap();
        assert!(
            r.ok,
            "the front end's end after the restart: {r:?}\n{}",
            agent.output()
        );
        assert_eq!(r.log_path.as_deref(), Some(log.to_str().unwrap()), "{r:?}");
        let whole = assert_whole_log(&log);
        let ends = of_type(&whole, "end");
        assert_eq!(ends.len(), 1, "one end, the agent's: {ends:?}");
        assert_eq!(ends[0]["reason"], want, "{}", ends[0]);
        drop(cg);
        drop(agent);
    }
    // A front end's end already written is not answered again, and an id
    // never registered is not watched.
    let agent = Agent::start(&cfg);
    let id = format!("tw-restart-end-{}-{}", std::process::id(), unique());
    let cg = TransientCgroup::create(&h, &format!("/{id}")).unwrap();
    let reg = Register {
        container_id: id.clone(),
        cgroup_path: cg.group.rel.clone(),
        ..Default::default()
    };
    assert!(
        call(&cfg.socket, &Request::Register(reg), Duration::from_secs(5))
            .unwrap()
            .ok
    );
    let u = |id: &str| Request::Unregister {
        container_id: id.into(),
        scope: None,
        reason: EndReason::Poststop,
        exit_code: Some(0),
    };
    assert!(
        call(&cfg.socket, &u(&id), Duration::from_secs(5))
            .unwrap()
            .ok
    );
    drop(agent);
    let _agent = Agent::start(&cfg);
    for id in [id.as_str(), "tw-never-registered"] {
        let r = call(&cfg.socket, &u(id), Duration::from_secs(5)).unwrap();
        assert!(
            !r.ok && r.code == Some(ErrorCode::NotWatched),
            "{id}: {r:?}"
        );
    }
    assert!(cfg.stray_files().is_empty(), "{:?}", cfg.stray_files());
}

/// The agent answers a register once the cgroup is in the watch map and
/// writes the log, its `start` and the state file just after; a SIGKILL in
/// between leaves what this test makes (the kill itself cannot be aimed at
/// a window of a millisecond): the journal's `answered/<key>`, no state
/// file, and no log or one holding that `start` alone. The next agent takes
/// the container: one log, one `start`, the end at the front end's end.
#[test]
fn an_agent_killed_between_its_answer_and_its_log_leaves_the_container_to_the_next() {
    let cfg = PrivateConfig::new("");
    let h = Hierarchies::discover().unwrap();
    let layout = throttlewatch_core::StateDir::new(&cfg.state_dir);
    for lone_start in [true, false] {
        let agent = Agent::start(&cfg);
        let id = format!("tw-answered-{}-{}", std::process::id(), unique());
        let key = throttlewatch_core::ContainerKey::new(id.clone(), None);
        let cg = TransientCgroup::create(&h, &format!("/{id}")).unwrap();
        let mut burner = burn_in(
            &cg,
            &[
                "--threads",
                "1",
                "--ms",
                "300000",
                "--spin",
                "1",
                "--sleep",
                "100",
            ],
        );
        let reg = Register {
            container_id: id.clone(),
            pid: Some(burner.id()),
            cgroup_path: cg.group.rel.clone(),
            ..Default::default()
        };
        let r = call(
            &cfg.socket,
            &Request::Register(reg.clone()),
            Duration::from_secs(5),
        )
        .unwrap();
        assert!(r.ok, "register: {r:?}");
        let state = layout.container_file(&key);
        wait_until("the agent's state of it", Duration::from_secs(10), || {
            state.exists()
        });
        assert!(
            !layout.answered_file(&key).exists(),
            "the journal entry goes once the state file is written"
        );
        agent.kill();
        let log = cfg.log_of(&id);
        std::fs::remove_file(&state).unwrap();
        std::fs::create_dir_all(layout.answered_dir()).unwrap();
        std::fs::write(
            layout.answered_file(&key),
            serde_json::to_vec(&reg).unwrap(),
        )
        .unwrap();
        if lone_start {
            let text = std::fs::read_to_string(&log).unwrap();
            let first = text.lines().next().unwrap();
            assert!(first.contains("\"type\":\"start\""), "{first}");
            std::fs::write(&log, format!("{first}\n")).unwrap();
        } else {
            std::fs::remove_file(&log).unwrap();
        }
        let agent = Agent::start(&cfg);
        assert!(
            agent
                .output()
                .contains("answered by an agent that stopped before its log: watched from now"),
            "{}",
            agent.output()
        );
        assert!(
            !layout.answered_file(&key).exists(),
            "the journal entry is taken"
        );
        let u = Request::Unregister {
            container_id: id.clone(),
            scope: None,
            reason: EndReason::Delete,
            exit_code: None,
        };
        let r = call(&cfg.socket, &u, Duration::from_secs(5)).unwrap();
        assert!(r.ok, "the front end's end: {r:?}\n{}", agent.output());
        let whole = assert_whole_log(&log);
        assert_eq!(of_type(&whole, "start").len(), 1, "one start: {whole:?}");
        assert!(
            earlier_lifetimes(&log).is_empty(),
            "one lifetime, one log: {:?}",
            earlier_lifetimes(&log)
        );
        let _ = burner.kill();
        let _ = burner.wait();
        drop(cg);
        drop(agent);
    }
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
