//! The control benchmark's driver (bench/control.sh): a request-serving
//! workload (`tw-serve`) under one quota, three ways, interleaved round by
//! round: `static` limits; `auto` (the agent's controller); `koord`, a
//! Koordinator-style baseline implemented here: every second, quota ×1.2
//! when the last second was throttled (up to 300 %), ×0.8 (down to the
//! original) when the node's CPU PSI some avg10 is past 60 % (the same
//! node guard as the agent's: off unless `--neighbour`, like the agent's).
//! With `--neighbour`, a CPU-hungry neighbour (tw-burn, no quota) runs
//! beside it in every mode, and its CPU is reported too.
//!
//! tw-control-bench [--rounds R] [--secs S] [--quota-us Q] [--burst-us U] [--neighbour]
//! (U: CPU of each of the 4 heavy requests that arrive together every second)

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use throttlewatch_cgroup::{CpuCgroup, Hierarchies, TransientCgroup};
use throttlewatch_core::protocol::{call, Register, Request};
use throttlewatch_integration::daemons::{Agent, PrivateConfig};
use throttlewatch_integration::{bin, unique, Scratch};

const PERIOD: u64 = 100_000;
/// `unlimited` (no quota) is the floor this machine allows at the time.
const MODES: [&str; 4] = ["static", "auto", "koord", "unlimited"];

fn num(args: &[String], k: &str, d: u64) -> u64 {
    args.iter()
        .position(|a| a == k)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().expect(k))
        .unwrap_or(d)
}

/// CPU used by a group, ns (`CpuCgroup::usage_ns`; 0 when unreadable).
fn cpu_used_ns(g: &CpuCgroup) -> u64 {
    g.usage_ns().map_or(0, |(ns, _)| ns)
}

fn psi() -> f64 {
    std::fs::read_to_string("/proc/pressure/cpu")
        .ok()
        .and_then(|t| {
            t.lines()
                .next()?
                .split_whitespace()
                .find_map(|f| f.strip_prefix("avg10="))?
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

/// The baseline: a 1-second cpu.stat poll, ×1.2 / ×0.8, ceiling 300 %.
fn koord(
    g: CpuCgroup,
    quota: u64,
    psi_max: f64,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut q = quota;
        let mut last = g.cpu_stat().map(|s| s.nr_throttled).unwrap_or(0);
        let mut changes = 0;
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_secs(1));
            let now = g.cpu_stat().map(|s| s.nr_throttled).unwrap_or(last);
            let next = if psi() >= psi_max {
                ((q as f64 * 0.8) as u64).max(quota)
            } else if now > last {
                ((q as f64 * 1.2) as u64).min(3 * quota)
            } else {
                q
            };
            last = now;
            if next != q && g.set_quota(Some(next), PERIOD).is_ok() {
                q = next;
                changes += 1;
            }
        }
        changes
    })
}

fn start_server(socket: &Path, g: &TransientCgroup) -> Child {
    let mut c = Command::new(bin("tw-serve"))
        .args(["serve", "--socket"])
        .arg(socket)
        .stdout(Stdio::piped())
        .spawn()
        .expect("tw-serve");
    g.group.add_pid(c.id()).expect("into the cgroup");
    let mut line = String::new();
    BufReader::new(c.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    c
}

fn run_one(
    cfg: &PrivateConfig,
    mode: &str,
    secs: u64,
    quota: u64,
    burst_us: u64,
    neighbour: bool,
) -> Value {
    let h = Hierarchies::discover().unwrap();
    let g = TransientCgroup::create(&h, &format!("/tw-bench-control-{mode}-{}", unique())).unwrap();
    g.group.set_burst(0).unwrap();
    let q = (mode != "unlimited").then_some(quota);
    g.group.set_quota(q, PERIOD).unwrap();
    // The most weight: on a shared machine the quota, not the neighbours'
    // builds, should be what holds the server back.
    let (file, weight) = match g.group.cpu_dir.join("cpu.shares").exists() {
        true => ("cpu.shares", "262144"),
        false => ("cpu.weight", "10000"),
    };
    std::fs::write(g.group.cpu_dir.join(file), weight).unwrap();
    let scratch = Scratch::new("serve");
    let socket = scratch.0.join("s.sock");
    let mut server = start_server(&socket, &g);
    let id = format!("bench-{mode}-{}", unique());
    let mut annotations = std::collections::BTreeMap::new();
    if mode == "auto" {
        annotations.insert("throttlewatch.io/cpu-control".into(), "auto".into());
    }
    let r = call(
        &cfg.socket,
        &Request::Register(Register {
            container_id: id.clone(),
            container_name: id.clone(),
            pid: Some(server.id()),
            cgroup_path: g.group.rel.clone(),
            annotations,
            ..Default::default()
        }),
        Duration::from_secs(5),
    )
    .unwrap();
    assert!(r.ok, "{r:?}");
    let log = PathBuf::from(r.log_path.unwrap());
    let ng = neighbour.then(|| {
        let n = TransientCgroup::create(&h, &format!("/tw-bench-neighbour-{}", unique())).unwrap();
        let c = throttlewatch_integration::burn_in(
            &n,
            &["--threads", "2", "--ms", &(secs * 1000 + 500).to_string()],
        );
        (n, c)
    });
    let stop = Arc::new(AtomicBool::new(false));
    let k = (mode == "koord").then(|| {
        koord(
            g.group.clone(),
            quota,
            if neighbour { 60.0 } else { 101.0 },
            stop.clone(),
        )
    });
    let (s0, c0) = (g.group.cpu_stat().unwrap(), cpu_used_ns(&g.group));
    let n0 = ng.as_ref().map(|(n, _)| cpu_used_ns(&n.group));
    let t = Instant::now();
    let out = Command::new(bin("tw-serve"))
        .args(["load", "--socket"])
        .arg(&socket)
        .args([
            "--secs",
            &secs.to_string(),
            "--burst-us",
            &burst_us.to_string(),
        ])
        .output()
        .expect("tw-serve load");
    let wall = t.elapsed().as_secs_f64();
    let d = g.group.cpu_stat().unwrap().since(&s0);
    let cpu = cpu_used_ns(&g.group) - c0;
    let ncpu = ng
        .as_ref()
        .zip(n0)
        .map(|((n, _), n0)| cpu_used_ns(&n.group) - n0);
    stop.store(true, Ordering::Relaxed);
    let koord_changes = k.map(|h| h.join().unwrap());
    let unregister: Request = serde_json::from_value(json!({
        "op": "unregister", "container_id": id, "reason": "poststop", "exit_code": 0
    }))
    .unwrap();
    let _ = call(&cfg.socket, &unregister, Duration::from_secs(5));
    let _ = server.kill();
    let _ = server.wait();
    if let Some((_, mut c)) = ng {
        let _ = c.kill();
        let _ = c.wait();
    }
    let mut v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    let controls = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("\"type\":\"control\""))
        .count();
    v["mode"] = json!(mode);
    v["throttled_ms"] = json!(d.throttled_ns / 1_000_000);
    v["cpu_ms"] = json!(cpu / 1_000_000);
    v["cpu_per_s"] = json!(cpu as f64 / 1e9 / wall);
    v["changes"] = json!(koord_changes.unwrap_or(controls as u64));
    if let Some(n) = ncpu {
        v["neighbour_cpu_per_s"] = json!(n as f64 / 1e9 / wall);
    }
    v
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rounds = num(&args, "--rounds", 3);
    let secs = num(&args, "--secs", 8);
    let quota = num(&args, "--quota-us", 80_000);
    let burst_us = num(&args, "--burst-us", 30_000);
    let neighbour = args.iter().any(|a| a == "--neighbour");
    let guard = if neighbour {
        ""
    } else {
        "pressure_psi_some_percent = 100.0\npressure_idle_percent = 0.0\n"
    };
    let cfg = PrivateConfig::new(&format!("[control]\nenabled = true\n{guard}"));
    let _agent = Agent::start(&cfg);
    let mut all: Vec<Value> = vec![];
    for r in 0..rounds {
        for i in 0..MODES.len() {
            let mode = MODES[(i + r as usize) % MODES.len()];
            let v = run_one(&cfg, mode, secs, quota, burst_us, neighbour);
            eprintln!("round {r} {v}");
            all.push(v);
        }
    }
    println!(
        "quota {quota} us / {PERIOD} us, {secs} s per run, {rounds} rounds interleaved, medians{}:",
        if neighbour {
            ", CPU-hungry neighbour beside it"
        } else {
            ""
        }
    );
    println!(
        "| mode | p50 ms | p99 ms | heavy p99 ms | throttled ms | CPU used (CPUs) | changes |{}",
        if neighbour { " neighbour CPUs |" } else { "" }
    );
    println!(
        "|---|---|---|---|---|---|---|{}",
        if neighbour { "---|" } else { "" }
    );
    for m in MODES {
        let of = |k: &str| {
            median(
                all.iter()
                    .filter(|v| v["mode"] == m)
                    .map(|v| v[k].as_f64().unwrap_or(0.0))
                    .collect(),
            )
        };
        print!(
            "| {m} | {:.1} | {:.1} | {:.1} | {:.0} | {:.3} | {:.0} |",
            of("p50_us") / 1000.0,
            of("p99_us") / 1000.0,
            of("heavy_p99_us") / 1000.0,
            of("throttled_ms"),
            of("cpu_per_s"),
            of("changes")
        );
        if neighbour {
            print!(" {:.3} |", of("neighbour_cpu_per_s"));
        }
        println!();
    }
}
