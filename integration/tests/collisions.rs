//! Issue 11, finding 7: the same container id in two runc roots keeps its
//! own log, burst record and exclusive cores (everything is keyed by
//! (scope, id), the scope being the runc root); and finding 5: the agent
//! does not spin at its descriptor limit. Real runc, wrapper, hook and agent.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use throttlewatch_core::protocol::{call, Request};
use throttlewatch_core::{ContainerKey, Scope};
use throttlewatch_integration::bundle::{text, Bundle, ContainerOpts, OciCli};
use throttlewatch_integration::containerd::{
    build_busybox_image, Containerd, IMAGE_NAME, SHIM_RUNTIME,
};
use throttlewatch_integration::daemons::{Agent, PrivateConfig};
use throttlewatch_integration::shim::containerd_with_shim;
use throttlewatch_integration::{of_type, read_log, unique};

/// One id, used in both roots.
fn shared_id(tag: &str) -> String {
    format!("{tag}-{}-{}", std::process::id(), unique())
}

/// The key the front ends give a container of `rt` (its `--root`).
fn key_in(rt: &OciCli, id: &str) -> ContainerKey {
    ContainerKey::new(id, Scope::of_runc_root(&rt.root.0, Path::new("/")))
}

fn log_in(cfg: &PrivateConfig, rt: &OciCli, id: &str) -> PathBuf {
    cfg.log_dir.join(key_in(rt, id).log_file_name())
}

/// `web` under `--root A` and `--root B` at once: two logs, each with its
/// own start (its own cgroup) and its own end, in the order they ended.
#[test]
fn same_id_in_two_runc_roots_has_two_logs() {
    let cfg = PrivateConfig::new("");
    let _agent = Agent::start(&cfg);
    let (a, b) = (OciCli::throttlewatch(&cfg), OciCli::throttlewatch(&cfg));
    let id = shared_id("web");
    let opts = ContainerOpts::sh("sleep 30").quota(50_000, 100_000);
    let (ba, bb) = (Bundle::new(&id, &opts), Bundle::new(&id, &opts));
    for (rt, bundle) in [(&a, &ba), (&b, &bb)] {
        let o = rt.run_detached(bundle);
        assert!(o.status.success(), "run -d {id}: {}", text(&o));
    }
    let (la, lb) = (log_in(&cfg, &a, &id), log_in(&cfg, &b, &id));
    assert_ne!(la, lb);
    for (l, bundle) in [(&la, &ba), (&lb, &bb)] {
        let log = read_log(l);
        let starts = of_type(&log, "start");
        assert_eq!(starts.len(), 1, "{}: {log:?}", l.display());
        assert_eq!(starts[0]["container_id"], id.as_str());
        assert_eq!(
            starts[0]["cgroup_path"],
            bundle.cgroup_path.as_str(),
            "{}",
            l.display()
        );
    }
    // Ending A leaves B watched.
    assert!(a.run(&["delete", "-f", &id]).status.success());
    assert_eq!(of_type(&read_log(&la), "end").len(), 1, "A ended");
    assert!(
        of_type(&read_log(&lb), "end").is_empty(),
        "B still watched: {:?}",
        read_log(&lb)
    );
    let st = call(&cfg.socket, &Request::Status, Duration::from_secs(2)).unwrap();
    assert_eq!(
        st.watched.unwrap_or_default(),
        vec![id.clone()],
        "B's session"
    );
    assert!(b.run(&["delete", "-f", &id]).status.success());
    let log_b = read_log(&lb);
    assert_eq!(of_type(&log_b, "end").len(), 1, "{log_b:?}");
    assert_eq!(log_b.last().unwrap()["type"], "end");
    // Nothing was written under the bare id.
    assert!(!cfg.log_dir.join(format!("{id}.jsonl")).exists());
    // `throttlewatch report ID` names both logs; the file stem picks one.
    let report = |what: &str| {
        std::process::Command::new(throttlewatch_integration::bin("throttlewatch"))
            .arg("--config")
            .arg(&cfg.path)
            .args(["report", "--json", what])
            .output()
            .unwrap()
    };
    let o = report(&id);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("matches 2 logs"),
        "{}",
        text(&o)
    );
    let stem = key_in(&b, &id).file_stem();
    let o = report(&stem);
    assert!(o.status.success(), "report {stem}: {}", text(&o));
}

fn burst_record(cfg: &PrivateConfig, rt: &OciCli, id: &str) -> (Value, std::time::SystemTime) {
    let p = throttlewatch_core::StateDir::new(&cfg.state_dir).burst_file(&key_in(rt, id));
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let mtime = std::fs::metadata(&p).unwrap().modified().unwrap();
    (serde_json::from_str(&text).unwrap(), mtime)
}

/// `update` of the quota on A holds A's burst across it; B (same id, other
/// root, other burst) keeps its cgroup and its burst record untouched.
#[test]
fn update_in_one_root_leaves_the_other_roots_burst_alone() {
    let cfg = PrivateConfig::new("");
    let (a, b) = (OciCli::throttlewatch(&cfg), OciCli::throttlewatch(&cfg));
    let id = shared_id("burst");
    let with_burst = |burst: &str| {
        ContainerOpts::sh("sleep 30")
            .quota(30_000, 100_000)
            .annotation("throttlewatch.io/cpu-burst", burst)
    };
    let (ba, bb) = (
        Bundle::new(&id, &with_burst("20ms")),
        Bundle::new(&id, &with_burst("10ms")),
    );
    for (rt, bundle) in [(&a, &ba), (&b, &bb)] {
        let o = rt.run_detached(bundle);
        assert!(o.status.success(), "run -d: {}", text(&o));
    }
    assert_eq!((ba.burst_us(), bb.burst_us()), (20_000, 10_000));
    let before = burst_record(&cfg, &b, &id);
    std::thread::sleep(Duration::from_millis(20)); // a rewrite would show in the mtime
    let o = a.run(&["update", "--cpu-quota", "15000", &id]);
    assert!(o.status.success(), "update on A: {}", text(&o));
    assert_eq!(ba.quota_us(), Some(15_000));
    assert_eq!(ba.burst_us(), 15_000, "A's burst clamped to its new quota");
    assert_eq!(burst_record(&cfg, &a, &id).0["applied_us"], 15_000);
    assert_eq!(
        (bb.quota_us(), bb.burst_us()),
        (Some(30_000), 10_000),
        "B's cgroup untouched"
    );
    assert_eq!(
        burst_record(&cfg, &b, &id),
        before,
        "B's burst record untouched"
    );
    for rt in [&a, &b] {
        assert!(rt.run(&["delete", "-f", &id]).status.success());
    }
}

fn holdings(cfg: &PrivateConfig) -> Value {
    let p = cfg.state_dir.join("cpusets").join("cpusets.json");
    serde_json::from_str(
        &std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())),
    )
    .unwrap()
}

/// A holds CPU 1 exclusively; the poststop of B (same id, other root)
/// frees nothing of A's, so a third container cannot take CPU 1.
#[test]
fn exclusive_cores_survive_the_other_roots_poststop() {
    let cfg = PrivateConfig::new("");
    let (a, b) = (OciCli::throttlewatch(&cfg), OciCli::throttlewatch(&cfg));
    let id = shared_id("excl");
    let ba = Bundle::new(
        &id,
        &ContainerOpts::sh("sleep 30").annotation("throttlewatch.io/cpuset", "1,exclusive"),
    );
    let bb = Bundle::new(&id, &ContainerOpts::sh("sleep 30"));
    for (rt, bundle) in [(&a, &ba), (&b, &bb)] {
        let o = rt.run_detached(bundle);
        assert!(o.status.success(), "run -d: {}", text(&o));
    }
    let held = holdings(&cfg);
    let a_key = key_in(&a, &id).qualified();
    assert!(
        held["holdings"][&a_key].is_object(),
        "A holds under {a_key}: {held}"
    );
    assert!(
        b.run(&["delete", "-f", &id]).status.success(),
        "B's delete and poststop"
    );
    let held = holdings(&cfg);
    assert_eq!(
        held["holdings"].as_object().map(|h| h.len()),
        Some(1),
        "{held}"
    );
    assert!(
        held["holdings"][&a_key].is_object(),
        "A still holds after B's poststop: {held}"
    );
    // A third container asking for CPU 1 exclusively is refused.
    let c = OciCli::throttlewatch(&cfg);
    let bc = Bundle::new(
        &shared_id("third"),
        &ContainerOpts::sh("sleep 30").annotation("throttlewatch.io/cpuset", "1,exclusive"),
    );
    let o = c.run_detached(&bc);
    assert!(o.status.success(), "run -d third: {}", text(&o));
    let hook_log = cfg.hook_log();
    assert!(
        hook_log.contains(&bc.id) && hook_log.contains("cannot hold CPUs exclusively"),
        "{hook_log}"
    );
    assert!(c.run(&["delete", "-f", &bc.id]).status.success());
    assert!(a.run(&["delete", "-f", &id]).status.success());
    let held = holdings(&cfg);
    assert_eq!(
        held["holdings"].as_object().map(|h| h.len()),
        Some(0),
        "{held}"
    );
}

/// (utime + stime) of a process, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after_comm.split(' ').collect();
    // Fields 14 and 15 of stat(5); after the comm, index 0 is field 3.
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Finding 5: at its descriptor limit (EMFILE) with connections pending,
/// the agent pauses between accepts instead of spinning, and serves again
/// once the clients are gone.
#[test]
fn agent_at_its_descriptor_limit_does_not_spin() {
    let cfg = PrivateConfig::new("");
    let agent = Agent::start(&cfg);
    let pid = agent.child.id();
    // Lower the running agent's limit (it raises its soft limit to the hard
    // one at start): a few descriptors above what it holds now.
    let limit = open_fds(pid) as u64 + 6;
    let r = libc::rlimit {
        rlim_cur: limit,
        rlim_max: limit,
    };
    // SAFETY: prlimit on our own child with a valid struct.
    let rc = unsafe { libc::prlimit(pid as i32, libc::RLIMIT_NOFILE, &r, std::ptr::null_mut()) };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
    // Many idle clients: the agent takes a few, the rest wait in the backlog.
    let clients: Vec<UnixStream> = (0..100)
        .filter_map(|_| UnixStream::connect(&cfg.socket).ok())
        .collect();
    assert!(clients.len() >= 50, "only {} connects", clients.len());
    let t = Instant::now();
    // Full: every descriptor number below the limit is taken (a few taken
    // before may lie above it, so count at least limit - 1 of them).
    while (open_fds(pid) as u64) < limit - 1 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let fds = open_fds(pid) as u64;
    assert!(
        fds >= limit - 1,
        "the agent holds {fds} descriptors, limit {limit}"
    );
    let (cpu0, t0) = (cpu_seconds(pid), Instant::now());
    std::thread::sleep(Duration::from_secs(2));
    let share = (cpu_seconds(pid) - cpu0) / t0.elapsed().as_secs_f64();
    eprintln!("agent CPU at EMFILE: {:.1} % of one CPU", share * 100.0);
    assert!(
        share < 0.20,
        "the agent used {:.0} % of a CPU at EMFILE",
        share * 100.0
    );
    drop(clients);
    let t = Instant::now();
    let served = loop {
        match call(&cfg.socket, &Request::Status, Duration::from_secs(1)) {
            Ok(r) if r.ok => break true,
            _ if t.elapsed() > Duration::from_secs(10) => break false,
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    assert!(
        served,
        "the agent serves again once the clients are gone: {}",
        agent.output()
    );
}

/// `ctr -a SOCK -n NS args…` of a private containerd.
fn ctr_in(ctd: &Containerd, ns: &str, args: &[&str]) -> std::process::Command {
    let mut c = std::process::Command::new("ctr");
    c.arg("-a").arg(&ctd.socket).args(["-n", ns]).args(args);
    c.stdin(std::process::Stdio::null());
    c
}

/// The same id in two containerd namespaces, through our shim, at once:
/// two logs (`<id>@ns-<namespace>.jsonl`), each from start to end.
#[test]
fn same_id_in_two_containerd_namespaces_has_two_logs() {
    let cfg = PrivateConfig::new("");
    let _agent = Agent::start(&cfg);
    let ctd = containerd_with_shim(&cfg.path);
    let img = throttlewatch_integration::Scratch::new("img");
    let tar = build_busybox_image(&img.0);
    let namespaces = [ctd.namespace.clone(), format!("{}b", ctd.namespace)];
    for ns in &namespaces {
        let o = ctr_in(&ctd, ns, &["images", "import", tar.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(o.status.success(), "import into {ns}: {}", text(&o));
    }
    let id = shared_id("web");
    let runs: Vec<_> = namespaces
        .iter()
        .map(|ns| {
            ctr_in(
                &ctd,
                ns,
                &[
                    "run",
                    "--rm",
                    "--runtime",
                    SHIM_RUNTIME,
                    IMAGE_NAME,
                    &id,
                    "sleep",
                    "2",
                ],
            )
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
        })
        .collect();
    for r in runs {
        let o = r.wait_with_output().unwrap();
        assert!(o.status.success(), "ctr run: {}\n{}", text(&o), ctd.log());
    }
    for ns in &namespaces {
        let log = cfg
            .log_dir
            .join(ContainerKey::new(id.as_str(), Some(Scope::of_namespace(ns))).log_file_name());
        let t = Instant::now();
        while of_type(&read_log(&log), "end").is_empty() && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(100));
        }
        let lines = read_log(&log);
        assert_eq!(
            of_type(&lines, "start").len(),
            1,
            "{}: {lines:?}",
            log.display()
        );
        assert_eq!(
            of_type(&lines, "end").len(),
            1,
            "{}: {lines:?}",
            log.display()
        );
    }
}
