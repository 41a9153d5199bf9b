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
