//! Debian's dockerd 20.10, private (own data-root, exec-root and socket),
//! with the runtime `throttlewatch` = our wrapper: `docker run --runtime
//! throttlewatch --cpus 0.2 -e THROTTLEWATCH_CPU_BURST=10ms` gives a log from
//! `start` to `end` that agrees with the kernel, and `docker update` keeps
//! the burst.

use std::time::{Duration, Instant};

use throttlewatch_integration::bundle::text;
use throttlewatch_integration::daemons::{Agent, Dockerd, PrivateConfig, BUSYBOX_IMAGE};
use throttlewatch_integration::{cpu_lock, of_type, read_log};

fn read(p: std::path::PathBuf) -> String {
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .to_string()
}

#[test]
fn docker_run_with_throttlewatch_runtime_logs_and_keeps_the_burst() {
    let _cpu = cpu_lock();
    let cfg = PrivateConfig::new("");
    let _agent = Agent::start(&cfg);
    let d = Dockerd::start(&cfg);
    eprintln!("dockerd storage driver: {}", d.storage_driver);
    let busy = "for i in 1 2 3; do (while :; do :; done) & done; sleep 4; kill $(jobs -p); true";
    let o = d.docker(&[
        "run",
        "-d",
        "--network",
        "none",
        "--runtime",
        "throttlewatch",
        "--cpus",
        "0.2",
        "-e",
        "THROTTLEWATCH_CPU_BURST=10ms",
        BUSYBOX_IMAGE,
        "sh",
        "-c",
        busy,
    ]);
    assert!(o.status.success(), "docker run: {}\n{}", text(&o), d.log());
    let id = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let cpu = d.cgroup_dir("cpu", &id);
    assert_eq!(read(cpu.join("cpu.cfs_quota_us")), "20000");
    assert_eq!(
        read(cpu.join("cpu.cfs_burst_us")),
        "10000",
        "burst from THROTTLEWATCH_CPU_BURST"
    );

    let o = d.docker(&["update", "--cpus", "0.3", &id]);
    assert!(o.status.success(), "docker update: {}", text(&o));
    assert_eq!(read(cpu.join("cpu.cfs_quota_us")), "30000");
    assert_eq!(
        read(cpu.join("cpu.cfs_burst_us")),
        "10000",
        "burst kept across docker update"
    );

    let o = d.docker(&["wait", &id]);
    assert!(o.status.success(), "docker wait: {}", text(&o));
    let o = d.docker(&["rm", &id]);
    assert!(o.status.success(), "docker rm: {}", text(&o));
    let path = cfg.log_of(&id);
    let t = Instant::now();
    while of_type(&read_log(&path), "end").is_empty() && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = read_log(&path);
    assert_eq!(of_type(&log, "start").len(), 1);
    assert_eq!(log[0]["type"], "start");
    assert_eq!(log.last().unwrap()["type"], "end");
    let start = of_type(&log, "start")[0];
    assert_eq!(start["container_id"], id.as_str());
    assert_eq!(start["qos"]["applied"]["burst_us"], 10_000);
    let recs = of_type(&log, "throttle");
    assert!(!recs.is_empty(), "throttle records");
    assert!(recs.iter().all(|r| r["cgroup_id"] == start["cgroup_id"]));
    let end = of_type(&log, "end")[0];
    let probe = end["probe_throttled_ns"].as_u64().unwrap();
    let kernel = end["kernel_throttled_ns"].as_u64().unwrap();
    let err = (probe as f64 - kernel as f64).abs() / kernel.max(1) as f64;
    eprintln!("docker: probe {probe} ns, kernel {kernel} ns, error {:.3} %, {} throttle records, bursts {}", err * 100.0, recs.len(), end["nr_bursts"]);
    assert!(kernel > 100_000_000, "too little throttling: {end}");
    assert!(err <= 0.02, "probe {probe} vs kernel {kernel}");
    assert!(cfg.stray_files().is_empty(), "{:?}", cfg.stray_files());
}

/// `docker start` of a stopped container, `docker restart` and a
/// `--restart on-failure` policy reuse the container id: every lifetime
/// keeps its own whole log (`start` … `end`), the latest as `<id>…jsonl`.
#[test]
fn docker_restarts_keep_every_lifetimes_log() {
    let cfg = PrivateConfig::new("");
    let _agent = Agent::start(&cfg);
    let d = Dockerd::start(&cfg);
    let lifetimes_of = |id: &str| {
        let latest = cfg.log_of(id);
        let mut all = throttlewatch_report::reader::earlier_lifetimes(&latest);
        all.push(latest);
        all
    };
    let whole = |p: &std::path::Path| {
        let t = Instant::now();
        while of_type(&read_log(p), "end").is_empty() && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(100));
        }
        let log = read_log(p);
        assert_eq!(
            log.first().map(|r| r["type"].clone()),
            Some("start".into()),
            "{}",
            p.display()
        );
        assert_eq!(
            log.last().map(|r| r["type"].clone()),
            Some("end".into()),
            "{}",
            p.display()
        );
        assert_eq!(of_type(&log, "start").len(), 1, "{}", p.display());
    };
    // run (exits at once) → start → restart → rm: three lifetimes.
    let o = d.docker(&[
        "run",
        "-d",
        "--network",
        "none",
        "--runtime",
        "throttlewatch",
        BUSYBOX_IMAGE,
        "true",
    ]);
    assert!(o.status.success(), "docker run: {}\n{}", text(&o), d.log());
    let id = String::from_utf8_lossy(&o.stdout).trim().to_string();
    assert!(d.docker(&["wait", &id]).status.success());
    let o = d.docker(&["start", "-a", &id]);
    assert!(o.status.success(), "docker start: {}", text(&o));
    let o = d.docker(&["restart", &id]);
    assert!(o.status.success(), "docker restart: {}", text(&o));
    assert!(d.docker(&["wait", &id]).status.success());
    let o = d.docker(&["rm", &id]);
    assert!(o.status.success(), "docker rm: {}", text(&o));
    let logs = lifetimes_of(&id);
    assert_eq!(logs.len(), 3, "three lifetimes: {logs:?}");
    logs.iter().for_each(|p| whole(p));

    // A restart policy: exit 1 twice more after the first run, then stop.
    let o = d.docker(&[
        "run",
        "-d",
        "--network",
        "none",
        "--runtime",
        "throttlewatch",
        "--restart",
        "on-failure:2",
        BUSYBOX_IMAGE,
        "sh",
        "-c",
        "exit 1",
    ]);
    assert!(o.status.success(), "docker run: {}\n{}", text(&o), d.log());
    let id = String::from_utf8_lossy(&o.stdout).trim().to_string();
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
    let logs = lifetimes_of(&id);
    assert_eq!(logs.len(), 3, "the first run and two restarts: {logs:?}");
    logs.iter().for_each(|p| whole(p));
    assert!(cfg.stray_files().is_empty(), "{:?}", cfg.stray_files());
}
