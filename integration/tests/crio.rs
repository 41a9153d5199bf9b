//! CRI-O 1.37 (`../shared/bin`) on a private configuration, pods through
//! `crictl`, both ways in:
//! - the OCI hook files that `throttlewatch install crio --crio-config …
//!   --crio-config-dir …` writes into the hooks_dir CRI-O really runs with
//!   (read from its configuration; CRI-O loads them without a restart, and
//!   drops them at `uninstall`, which restores the directory byte for byte);
//! - `throttlewatch-nri` as an external NRI plugin on its `nri_listen`.
//!
//! For each: the container's log exists from its start and ends at its exit
//! (before `crictl rm`), the burst annotation is in its cgroup before the
//! workload runs, the log's kernel total equals the cgroup's `cpu.stat`,
//! probe and kernel agree within 2 %, and the pod sandbox gets no log. The
//! hook path also honours an annotation set on the pod only (CRI-O copies
//! pod annotations into the container's spec). Run `cargo build --workspace
//! --bins` first; needs conmon, runc and skopeo (`scripts/setup.sh --test`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;
use throttlewatch_integration::bundle::text;
use throttlewatch_integration::crio::{Crio, NriPlugin, Pod};
use throttlewatch_integration::daemons::{Agent, PrivateConfig};
use throttlewatch_integration::{bin, cpu_lock, of_type, read_log};

/// Three busy loops under a 20 ms / 100 ms quota for 3 s, then exit 3.
const BUSY: &str =
    "for i in 1 2 3; do (while :; do :; done) & done; sleep 3; kill $(jobs -p); sleep 0.3; exit 3";
const QUOTA_US: i64 = 20_000;

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(
            t0.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn read(p: PathBuf) -> String {
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .to_string()
}

/// `throttled_time` of the container's cpu.stat (ns).
fn cpu_stat_throttled_ns(crio: &Crio, id: &str) -> u64 {
    read(crio.cgroup_dir("cpu", id).join("cpu.stat"))
        .lines()
        .find_map(|l| l.strip_prefix("throttled_time "))
        .and_then(|v| v.parse().ok())
        .expect("throttled_time in cpu.stat")
}

fn has_end(cfg: &PrivateConfig, id: &str) -> bool {
    !of_type(&read_log(&cfg.log_of(id)), "end").is_empty()
}

/// The `.jsonl` logs in the log directory, by file name.
fn logs(cfg: &PrivateConfig) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(&cfg.log_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".jsonl"))
        .collect();
    v.sort();
    v
}

/// A busy container of `pod`: its log exists once `crictl start` returns
/// and has the burst; its cgroup has the burst; it exits; its log ends at
/// the exit (before `crictl rm`), with totals equal to cpu.stat. Returns the
/// `end` record and the time from start to the exit.
fn busy_container_ends_at_exit(
    crio: &Crio,
    cfg: &PrivateConfig,
    pod: &Pod,
    annotations: &[(&str, &str)],
) -> (Value, Duration) {
    let t0 = Instant::now();
    let id = crio.run_container(pod, "busy", BUSY, Some(QUOTA_US), annotations);
    let log_path = cfg.log_of(&id);
    assert!(log_path.exists(), "no log once started: {}", cfg.hook_log());
    let start = read_log(&log_path)[0].clone();
    assert_eq!(start["type"], "start", "{start}");
    assert_eq!(start["qos"]["applied"]["burst_us"], 10_000, "{start}");
    let cpu = crio.cgroup_dir("cpu", &id);
    assert_eq!(read(cpu.join("cpu.cfs_quota_us")), QUOTA_US.to_string());
    assert_eq!(
        read(cpu.join("cpu.cfs_burst_us")),
        "10000",
        "the burst annotation"
    );
    crio.wait_exited(&id, Duration::from_secs(30));
    let ran = t0.elapsed();
    wait_for(
        "the end record at the exit",
        Duration::from_secs(10),
        || has_end(cfg, &id),
    );
    let kernel_now = cpu_stat_throttled_ns(crio, &id);
    // Removed a while after its exit: the log keeps the exit's end.
    std::thread::sleep(Duration::from_secs(2));
    crio.crictl_ok(&["rm", &id]);
    let log = read_log(&log_path);
    assert_eq!(of_type(&log, "start").len(), 1, "{log:?}");
    let ends = of_type(&log, "end");
    assert_eq!(ends.len(), 1, "one end: {log:?}");
    assert_eq!(log.last().unwrap()["type"], "end");
    let end = ends[0].clone();
    let probe = end["probe_throttled_ns"].as_u64().unwrap();
    let kernel = end["kernel_throttled_ns"].as_u64().unwrap();
    let err = (probe as f64 - kernel as f64).abs() / kernel.max(1) as f64;
    eprintln!(
        "probe {probe} ns, end.kernel {kernel} ns, cpu.stat {kernel_now} ns, error {:.3} %, \
         reason {}, exit_code {}, duration {} ns",
        err * 100.0,
        end["reason"],
        end["exit_code"],
        end["duration_ns"]
    );
    assert!(kernel > 100_000_000, "too little throttling: {end}");
    assert_eq!(kernel, kernel_now, "the log's kernel total is cpu.stat's");
    assert!(err <= 0.02, "probe {probe} vs kernel {kernel}");
    let dur = Duration::from_nanos(end["duration_ns"].as_u64().unwrap());
    assert!(
        dur <= ran + Duration::from_millis(500),
        "duration {dur:?}: to the exit ({ran:?} after create), not to the rm 2 s later"
    );
    (end, ran)
}

/// `throttlewatch ARGS --crio-config … --crio-config-dir …` against `crio`'s files.
fn throttlewatch(cfg: &PrivateConfig, crio: &Crio, args: &[&str]) -> Output {
    let bin_dir = bin("throttlewatch-hook").parent().unwrap().to_path_buf();
    let mut c = Command::new(bin("throttlewatch"));
    c.arg("--config").arg(&cfg.path).args(args);
    c.arg("--crio-config").arg(&crio.config);
    c.arg("--crio-config-dir").arg(&crio.config_dir);
    if args[0] == "install" {
        c.arg("--bin-dir").arg(bin_dir);
    }
    let o = c.output().unwrap();
    assert!(o.status.success(), "throttlewatch {args:?}: {}", text(&o));
    o
}

fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| (e.path(), std::fs::read(e.path()).unwrap()))
        .collect();
    v.sort();
    v
}

#[test]
fn the_hook_path_logs_a_pod_annotation_and_ends_at_the_exit() {
    let _cpu = cpu_lock();
    let cfg = PrivateConfig::new("");
    let _agent = Agent::start(&cfg);
    let crio = Crio::start();
    let conf_before = std::fs::read(&crio.config).unwrap();
    let hooks_before = files(&crio.hooks_dir);
    let o = throttlewatch(&cfg, &crio, &["install", "crio"]);
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(
        said.contains(&crio.hooks_dir.display().to_string()),
        "{said}"
    );
    assert!(
        said.contains("no restart needed") && !said.contains("restart crio"),
        "{said}"
    );
    assert_eq!(files(&crio.hooks_dir).len(), 2, "{said}");
    // CRI-O reads the new files by itself (inotify), no restart.
    std::thread::sleep(Duration::from_secs(1));

    // The burst is asked for on the pod only: CRI-O copies pod annotations
    // into the container's spec.
    let pod = crio.run_pod("hook", &[("throttlewatch.io/cpu-burst", "10ms")]);
    let (end, ran) = busy_container_ends_at_exit(&crio, &cfg, &pod, &[]);
    assert_eq!(end["reason"], "exit", "ended at its exit, not at rm: {end}");
    assert!(
        end["exit_code"].is_null() || end["exit_code"] == 3,
        "conmon reaps the init at once: the code where the zombie was read first: {end}"
    );
    eprintln!("hook path: ran {ran:?}");

    // Without our annotations: no hook, no log.
    let plain = crio.run_pod("plain", &[]);
    let id = crio.run_container(&plain, "plain", "true", None, &[]);
    crio.wait_exited(&id, Duration::from_secs(30));
    crio.crictl_ok(&["rm", &id]);
    let names = logs(&cfg);
    assert_eq!(names.len(), 1, "only the annotated container: {names:?}");
    assert!(
        !names
            .iter()
            .any(|n| n.contains(&pod.id) || n.contains(&plain.id)),
        "a pod sandbox has a log: {names:?}"
    );

    // uninstall: the hooks directory and the configuration as they were,
    // and CRI-O runs the hook no more.
    throttlewatch(&cfg, &crio, &["uninstall", "crio"]);
    assert_eq!(files(&crio.hooks_dir), hooks_before);
    assert_eq!(std::fs::read(&crio.config).unwrap(), conf_before);
    std::thread::sleep(Duration::from_secs(1));
    let id = crio.run_container(&pod, "after", "true", None, &[]);
    crio.wait_exited(&id, Duration::from_secs(30));
    assert!(!cfg.log_of(&id).exists(), "a log after uninstall");
    assert!(cfg.stray_files().is_empty(), "{:?}", cfg.stray_files());
}

#[test]
fn the_nri_plugin_logs_and_ends_at_the_exit_with_its_code() {
    let _cpu = cpu_lock();
    let cfg = PrivateConfig::new("");
    let _agent = Agent::start(&cfg);
    let crio = Crio::start();
    let plugin = NriPlugin::start(&crio, &cfg.path);
    let pod = crio.run_pod("nri", &[]);
    let (end, ran) =
        busy_container_ends_at_exit(&crio, &cfg, &pod, &[("throttlewatch.io/cpu-burst", "10ms")]);
    // CRI-O sends StopContainer when the container exits by itself.
    assert_eq!(end["exit_code"], 3, "{end}\n{}", plugin.output_text());
    eprintln!("NRI path: ran {ran:?}, end reason {}", end["reason"]);
    let names = logs(&cfg);
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(
        !names[0].contains(&pod.id),
        "the pod sandbox has a log: {names:?}"
    );
    assert!(cfg.stray_files().is_empty(), "{:?}", cfg.stray_files());
}

/// `install crio` / `uninstall crio` against the configuration `crio
/// config` prints (CRI-O's defaults, as a node starts with them), its
/// hooks_dir pointed at a private directory by a drop-in: the hook files go
/// there, and uninstall leaves every file byte for byte as it was.
#[test]
fn install_against_the_config_crio_prints_is_byte_exact() {
    let cfg = PrivateConfig::new("");
    let d = throttlewatch_integration::Scratch::new("crio-config");
    let o = Command::new(throttlewatch_integration::shared_bin("crio"))
        .arg("--config")
        .arg("/dev/null")
        .arg("config")
        .output()
        .unwrap();
    assert!(o.status.success(), "crio config: {}", text(&o));
    let conf = d.0.join("crio.conf");
    std::fs::write(&conf, &o.stdout).unwrap();
    let dropins = d.0.join("crio.conf.d");
    std::fs::create_dir_all(&dropins).unwrap();
    let hooks = d.0.join("hooks.d");
    std::fs::create_dir_all(&hooks).unwrap();
    std::fs::write(
        dropins.join("10-hooks.conf"),
        format!("[crio.runtime]\nhooks_dir = [\"{}\"]\n", hooks.display()),
    )
    .unwrap();
    let tree = |p: &Path| -> Vec<(PathBuf, Vec<u8>)> {
        let mut all = vec![];
        for e in walk(p) {
            all.push((e.clone(), std::fs::read(&e).unwrap()));
        }
        all
    };
    let before = tree(&d.0);
    let run = |args: &[&str]| {
        let mut c = Command::new(bin("throttlewatch"));
        c.arg("--config").arg(&cfg.path).args(args);
        c.arg("--crio-config")
            .arg(&conf)
            .arg("--crio-config-dir")
            .arg(&dropins);
        let o = c.output().unwrap();
        assert!(o.status.success(), "{args:?}: {}", text(&o));
    };
    run(&["install", "crio", "--bin-dir", "/usr/local/bin"]);
    assert_eq!(
        files(&hooks).len(),
        2,
        "the files in the drop-in's hooks_dir"
    );
    run(&["uninstall", "crio"]);
    assert_eq!(tree(&d.0), before, "uninstall restores every file");
}

fn walk(p: &Path) -> Vec<PathBuf> {
    let mut v = vec![];
    for e in std::fs::read_dir(p).unwrap().flatten() {
        if e.path().is_dir() {
            v.extend(walk(&e.path()));
        } else {
            v.push(e.path());
        }
    }
    v.sort();
    v
}
