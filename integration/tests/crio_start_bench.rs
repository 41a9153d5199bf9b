//! Benchmark (issue 47): what throttlewatch adds to CreateContainer and
//! StartContainer on CRI-O 1.37, both ways in, against neither, in one
//! run. Two private CRI-Os on the same machine: `nri` has
//! `throttlewatch-nri` connected on its `nri_listen` (no hook files);
//! `hooks` has the files of `throttlewatch install crio` (no plugin). Per
//! round, in a rotating order: an unannotated container on `hooks` (no
//! hook matches, no plugin: **none**), an annotated one on `nri` (**nri**),
//! an annotated one on `hooks` (**hook**). The annotation is
//! `throttlewatch.io/cpu-burst=10ms`; every container runs `sleep 600`
//! under a 50 ms / 100 ms quota and is removed after its round.
//!
//! Two clocks: `crictl create` / `crictl start` as a process (what a
//! script sees; crictl's own start-up is in every figure alike) and CRI-O's
//! own log, from "Creating container" to "Created container" and from
//! "Starting container" to "Started container" (the server's time, no
//! client). The hook runs at createRuntime, inside CreateContainer; the
//! plugin answers CreateContainer (QoS) and StartContainer (register).
//!
//! Not part of the suite (ignored); `bench/crio-start.sh` runs it with
//! release binaries. `TW_BENCH_CONTAINERS` (default 20) per kind.

use std::time::{Duration, Instant};

use throttlewatch_integration::bundle::text;
use throttlewatch_integration::crio::{Crio, NriPlugin, Pod};
use throttlewatch_integration::daemons::{Agent, PrivateConfig};
use throttlewatch_integration::{bin, cpu_lock, of_type, read_log};

const KINDS: [&str; 3] = ["none", "nri", "hook"];
const BURST: [(&str, &str); 1] = [("throttlewatch.io/cpu-burst", "10ms")];

#[derive(Default)]
struct Samples {
    create: Vec<Duration>,
    start: Vec<Duration>,
    create_server: Vec<Duration>,
    start_server: Vec<Duration>,
}

/// Seconds of the day of a CRI-O log line's `time="…T12:34:56.123456789Z"`.
fn line_time(l: &str) -> Option<f64> {
    let t = l.split("time=\"").nth(1)?.split('"').next()?;
    let hms = t.split('T').nth(1)?.trim_end_matches('Z');
    let mut it = hms.split(':');
    let h: f64 = it.next()?.parse().ok()?;
    let m: f64 = it.next()?.parse().ok()?;
    let s: f64 = it.next()?.parse().ok()?;
    Some(h * 3600.0 + m * 60.0 + s)
}

/// The time between the first line with all of `from` and the first after
/// it with all of `to`, in CRI-O's log.
fn between(log: &str, from: &[&str], to: &[&str]) -> Option<Duration> {
    let has = |l: &str, w: &[&str]| w.iter().all(|x| l.contains(x));
    let mut lines = log.lines().skip_while(|l| !has(l, from));
    let t0 = line_time(lines.next()?)?;
    let t1 = line_time(lines.find(|l| has(l, to))?)?;
    let d = if t1 < t0 { t1 + 86400.0 - t0 } else { t1 - t0 };
    Some(Duration::from_secs_f64(d))
}

fn timed(f: impl FnOnce() -> String) -> (String, Duration) {
    let t0 = Instant::now();
    let out = f();
    (out, t0.elapsed())
}

/// One container of `kind`: created and started (both timed), then removed.
fn one(crio: &Crio, pod: &Pod, kind: &str, n: usize, s: &mut Samples) -> String {
    let name = format!("b-{kind}-{n}");
    let ann: &[(&str, &str)] = if kind == "none" { &[] } else { &BURST };
    let (id, create) = timed(|| crio.create_container(pod, &name, "sleep 600", Some(50_000), ann));
    let (_, start) = timed(|| crio.crictl_ok(&["start", &id]));
    let log = crio.log();
    let short = &id[..12.min(id.len())];
    s.create.push(create);
    s.start.push(start);
    s.create_server.extend(between(
        &log,
        &["Creating container:", &format!("/{name}")],
        &["Created container", &format!("/{name}")],
    ));
    s.start_server.extend(between(
        &log,
        &["Starting container:", short],
        &["Started container", short],
    ));
    crio.crictl_ok(&["rm", "-f", &id]);
    id
}

fn stats(v: &mut [Duration]) -> String {
    if v.is_empty() {
        return "n/a".into();
    }
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let p99 = v[((v.len() as f64 * 0.99).ceil() as usize).clamp(1, v.len()) - 1];
    format!(
        "median {:7.2} ms  p99 {:7.2} ms  (n={})",
        ms(v[v.len() / 2]),
        ms(p99),
        v.len()
    )
}

#[test]
#[ignore = "a benchmark: bench/crio-start.sh"]
fn crio_start_latency_with_nri_hook_and_neither() {
    let rounds: usize = std::env::var("TW_BENCH_CONTAINERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let _cpu = cpu_lock();
    let cfg = PrivateConfig::new("");
    let _agent = Agent::start(&cfg);
    let with_nri = Crio::start();
    let _plugin = NriPlugin::start(&with_nri, &cfg.path);
    let with_hooks = Crio::start();
    let o = std::process::Command::new(bin("throttlewatch"))
        .arg("--config")
        .arg(&cfg.path)
        .args(["install", "crio", "--crio-config"])
        .arg(&with_hooks.config)
        .arg("--crio-config-dir")
        .arg(&with_hooks.config_dir)
        .arg("--bin-dir")
        .arg(bin("throttlewatch-hook").parent().unwrap())
        .output()
        .unwrap();
    assert!(o.status.success(), "install crio: {}", text(&o));
    std::thread::sleep(Duration::from_secs(1));
    let pods = [
        with_hooks.run_pod("none", &[]),
        with_nri.run_pod("nri", &[]),
        with_hooks.run_pod("hook", &[]),
    ];
    let crios = [&with_hooks, &with_nri, &with_hooks];
    let mut samples: [Samples; 3] = Default::default();
    let mut watched = vec![];
    // One warm-up round per kind, not counted.
    for k in 0..3 {
        let mut warm = Samples::default();
        one(crios[k], &pods[k], KINDS[k], 1000 + k, &mut warm);
    }
    for r in 0..rounds {
        for j in 0..3 {
            let k = (r + j) % 3;
            let id = one(crios[k], &pods[k], KINDS[k], r, &mut samples[k]);
            if k > 0 {
                watched.push(id);
            }
        }
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("CRI-O 1.37, {rounds} containers per kind, interleaved; load average {load}");
    for (k, s) in samples.iter_mut().enumerate() {
        let kind = KINDS[k];
        println!("{kind:>4} crictl create : {}", stats(&mut s.create));
        println!(
            "{kind:>4} CreateContainer (CRI-O's log): {}",
            stats(&mut s.create_server)
        );
        println!("{kind:>4} crictl start  : {}", stats(&mut s.start));
        println!(
            "{kind:>4} StartContainer (CRI-O's log): {}",
            stats(&mut s.start_server)
        );
    }
    // Every annotated container was watched (a log with its start), none other.
    std::thread::sleep(Duration::from_secs(2));
    for id in &watched {
        let log = read_log(&cfg.log_of(id));
        assert!(!of_type(&log, "start").is_empty(), "{id}: no log");
    }
    assert_eq!(
        std::fs::read_dir(&cfg.log_dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".jsonl"))
            .count(),
        watched.len() + 2,
        "the annotated containers (and the two warm-up ones) have logs, none other"
    );
}
