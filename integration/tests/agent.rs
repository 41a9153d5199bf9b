//! The node agent with the real probe: register/unregister over its socket,
//! one log per container from `start` to `end`, metrics, restart resumes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use throttlewatch_cgroup::{Hierarchies, TransientCgroup};
use throttlewatch_core::protocol::{call, Register, Request, Response};
use throttlewatch_integration::{bin, burn_in, cpu_lock, of_type, read_log, Scratch};

struct Agent {
    dir: Scratch,
    child: Option<Child>,
    metrics_port: u16,
}

impl Agent {
    fn start(dir: Scratch, metrics_port: u16) -> Agent {
        let cfg = format!(
            "log_dir = \"{d}/logs\"\nsocket = \"{d}/run/agent.sock\"\nstate_dir = \"{d}/state\"\nmetrics_addr = \"127.0.0.1:{metrics_port}\"\nsnapshot_interval_s = 1\nmetrics_grace_s = 0\n",
            d = dir.0.display()
        );
        std::fs::write(dir.0.join("tw.toml"), cfg).unwrap();
        let mut a = Agent {
            dir,
            child: None,
            metrics_port,
        };
        a.spawn();
        a
    }

    fn spawn(&mut self) {
        let child = Command::new(bin("throttlewatch"))
            .args([
                "--config",
                self.dir.0.join("tw.toml").to_str().unwrap(),
                "agent",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        self.child = Some(child);
        for _ in 0..200 {
            if call(&self.socket(), &Request::Status, Duration::from_secs(1)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("agent did not come up");
    }

    fn stop(&mut self, sig: i32) {
        if let Some(mut c) = self.child.take() {
            unsafe { libc::kill(c.id() as i32, sig) };
            c.wait().unwrap();
        }
    }

    fn socket(&self) -> PathBuf {
        self.dir.0.join("run/agent.sock")
    }

    fn call(&self, r: Request) -> Response {
        call(&self.socket(), &r, Duration::from_secs(5)).unwrap()
    }

    fn logs(&self) -> PathBuf {
        self.dir.0.join("logs")
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop(libc::SIGKILL);
    }
}

fn burner(cg: &TransientCgroup, threads: &str, ms: &str) -> Child {
    burn_in(cg, &["--threads", threads, "--ms", ms])
}

/// Wait for a burner to finish its run (seconds); fail with the cgroup's
/// state rather than hang when it does not (seen once in the VM lane: a
/// quota'd burner never finished after an agent restart).
fn wait_burner(b: &mut Child, cg: &TransientCgroup) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(st) = b.try_wait().unwrap() {
            assert!(st.success(), "tw-burn: {st}");
            return;
        }
        if std::time::Instant::now() > deadline {
            let stat =
                |f: &str| std::fs::read_to_string(cg.group.cpu_dir.join(f)).unwrap_or_default();
            let threads: Vec<String> = std::fs::read_dir(format!("/proc/{}/task", b.id()))
                .into_iter()
                .flatten()
                .flatten()
                .map(|t| std::fs::read_to_string(t.path().join("stat")).unwrap_or_default())
                .collect();
            let _ = b.kill();
            panic!(
                "tw-burn {} still running after 60 s; cpu.stat:\n{}\nthreads:\n{}",
                b.id(),
                stat("cpu.stat"),
                threads.join("")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn register(a: &Agent, id: &str, cg: &TransientCgroup, pid: u32) -> Response {
    let mut ann = BTreeMap::new();
    ann.insert("io.kubernetes.pod.namespace".to_string(), "ml".to_string());
    ann.insert(
        "io.kubernetes.pod.name".to_string(),
        format!("trainer-{id}"),
    );
    a.call(Request::Register(Register {
        container_id: id.into(),
        container_name: format!("name-{id}"),
        pid: Some(pid),
        cgroup_path: cg.group.rel.clone(),
        annotations: ann,
        ..Default::default()
    }))
}

fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn socket_mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn two_containers_two_logs_metrics_and_clean_unregister() {
    let _l = cpu_lock();
    let a = Agent::start(Scratch::new("agent2"), 19477);
    assert_eq!(socket_mode(&a.socket()), 0o600, "socket is root-only");
    let h = Hierarchies::discover().unwrap();
    let me = std::process::id();
    let c1 = TransientCgroup::create(&h, &format!("/tw-test-agent-a-{me}")).unwrap();
    let c2 = TransientCgroup::create(&h, &format!("/tw-test-agent-b-{me}")).unwrap();
    c1.group.set_quota(Some(20_000), 100_000).unwrap();
    c2.group.set_quota(Some(30_000), 100_000).unwrap();
    let mut b1 = burner(&c1, "2", "2500");
    let mut b2 = burner(&c2, "2", "2500");
    assert!(register(&a, "ctr/one", &c1, b1.id()).ok);
    assert!(register(&a, "ctr-two", &c2, b2.id()).ok);
    let st = a.call(Request::Status);
    assert_eq!(st.watch_map_entries, Some(2));
    // While they run (2.5 s; their logs end at their exit, and with
    // metrics_grace_s = 0 their series with them): scraped until the
    // series are there, for up to 2 s.
    let t0 = std::time::Instant::now();
    let metrics = loop {
        std::thread::sleep(Duration::from_millis(200));
        let m = http_get(a.metrics_port, "/metrics");
        let all = m.contains("throttlewatch_freeze_duration_seconds_bucket")
            && m.contains("pod=\"trainer-ctr-two\"")
            && m.contains("namespace=\"ml\"")
            && m.contains("throttlewatch_throttled_periods_total")
            && m.contains("throttlewatch_watched_containers 2");
        if all || t0.elapsed() > Duration::from_secs(2) {
            break m;
        }
    };
    assert!(
        metrics.contains("throttlewatch_freeze_duration_seconds_bucket"),
        "{metrics}"
    );
    assert!(
        metrics.contains("pod=\"trainer-ctr-two\"") && metrics.contains("namespace=\"ml\""),
        "{metrics}"
    );
    assert!(metrics.contains("throttlewatch_throttled_periods_total"));
    assert!(metrics.contains("throttlewatch_watched_containers 2"));
    wait_burner(&mut b1, &c1);
    wait_burner(&mut b2, &c2);
    for (id, cg, pid) in [("ctr/one", &c1, b1.id()), ("ctr-two", &c2, b2.id())] {
        let r = a.call(Request::Unregister {
            container_id: id.into(),
            scope: None,
            reason: throttlewatch_core::EndReason::Poststop,
            exit_code: Some(0),
        });
        assert!(r.ok, "{r:?}");
        let path = PathBuf::from(r.log_path.unwrap());
        assert_eq!(path.parent().unwrap(), a.logs(), "log stays in the log dir");
        let log = read_log(&path);
        assert_eq!(log[0]["type"], "start");
        assert_eq!(log.last().unwrap()["type"], "end");
        assert_eq!(of_type(&log, "start").len(), 1);
        let cgid = cg.group.id().unwrap();
        let recs = of_type(&log, "throttle");
        assert!(!recs.is_empty());
        for r in recs {
            assert_eq!(
                r["cgroup_id"].as_u64().unwrap(),
                cgid,
                "no event crosses over"
            );
            assert_eq!(r["pid"].as_u64().unwrap(), pid as u64);
        }
        let end = of_type(&log, "end")[0];
        let (p, k) = (
            end["probe_throttled_ns"].as_f64().unwrap(),
            end["kernel_throttled_ns"].as_f64().unwrap(),
        );
        assert!(
            k > 1e8 && (p - k).abs() / k <= 0.02,
            "{id}: probe {p} kernel {k}"
        );
        assert!(
            !of_type(&log, "cpu_stat").is_empty(),
            "periodic cpu_stat snapshots"
        );
    }
    let st = a.call(Request::Status);
    assert_eq!(st.watch_map_entries, Some(0), "watch map emptied");
    let left: Vec<String> = http_get(a.metrics_port, "/metrics")
        .lines()
        .filter(|l| l.contains("ctr-two"))
        .map(str::to_string)
        .collect();
    assert!(
        left.is_empty(),
        "series of ended containers are dropped (metrics_grace_s = 0): {left:?}"
    );
    let bad = a.call(Request::Register(Register {
        container_id: "x".into(),
        cgroup_path: "/no/such/cgroup".into(),
        ..Default::default()
    }));
    assert!(!bad.ok && bad.error.unwrap().contains("/no/such/cgroup"));
}

#[test]
fn restart_resumes_the_log() {
    let _l = cpu_lock();
    let mut a = Agent::start(Scratch::new("agentr"), 19478);
    let h = Hierarchies::discover().unwrap();
    let cg =
        TransientCgroup::create(&h, &format!("/tw-test-agent-r-{}", std::process::id())).unwrap();
    cg.group.set_quota(Some(25_000), 100_000).unwrap();
    let mut b = burner(&cg, "2", "4000");
    assert!(register(&a, "resumer", &cg, b.id()).ok);
    std::thread::sleep(Duration::from_millis(1500));
    a.stop(libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(500));
    a.spawn();
    assert_eq!(
        a.call(Request::Status).watched,
        Some(vec!["resumer".to_string()])
    );
    wait_burner(&mut b, &cg);
    let r = a.call(Request::Unregister {
        container_id: "resumer".into(),
        scope: None,
        reason: throttlewatch_core::EndReason::Poststop,
        exit_code: None,
    });
    assert!(r.ok);
    let log = read_log(Path::new(&r.log_path.unwrap()));
    assert_eq!(of_type(&log, "start").len(), 1, "no second start");
    let resume = of_type(&log, "resume");
    assert_eq!(resume.len(), 1);
    assert!(
        resume[0]["unwatched_throttled_ns"].as_u64().unwrap() > 0,
        "the gap is accounted: {}",
        resume[0]
    );
    let end = of_type(&log, "end")[0];
    let p = end["probe_throttled_ns"].as_f64().unwrap()
        + end["unwatched_throttled_ns"].as_f64().unwrap();
    let k = end["kernel_throttled_ns"].as_f64().unwrap();
    assert!(
        (p - k).abs() / k <= 0.03,
        "probe+unwatched {p} vs kernel {k}: {end}"
    );
    assert_eq!(log.last().unwrap()["type"], "end");
}
