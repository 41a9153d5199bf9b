//! The control benchmark's driver (bench/control.sh): a request-serving
//! workload (`tw-serve`) under one quota, three ways, interleaved round by
//! round: `static` limits; `auto` (the agent's controller); `koord`, a
//! Koordinator-style baseline implemented here: every second, quota ×1.2
//! when the last second was throttled (up to 300 %), ×0.8 (down to the
//! original) when CPU PSI some avg10 (what a 1 s poller reads) is past
//! 60 %, off unless `--neighbour`, like the agent's guard.
//! With `--neighbour`, a CPU-hungry neighbour (tw-burn, 4 threads, no
//! quota, default weight, in a cgroup of its own) runs in the middle third
//! of every run, and the node guard is on (`auto`: the agent's defaults,
//! PSI some >= 60 % of the last 0.5 s and idle <= 10 %; `koord`: PSI
//! avg10 >= 60 % on its 1-second poll). `--guard node` (default) reads
//! `/proc/pressure/cpu`; `--guard neighbour` the neighbour's own cgroup2
//! `cpu.pressure` (on a shared machine, the node's PSI carries other jobs).
//! The server's limit (quota + burst, CPUs) is sampled every 100 ms: its
//! mean before, during (second half) and after the neighbour, how long the
//! controller took to hand it back to the original, the neighbour's CPU,
//! and one `auto` run's limit over time.
//!
//! tw-control-bench [--rounds R] [--secs S] [--quota-us Q] [--burst-us U]
//!                  [--neighbour [--guard node|neighbour]]
//! (U: CPU of each of the 4 heavy requests that arrive together every second)

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use throttlewatch_cgroup::{CpuCgroup, Hierarchies, TransientCgroup};
use throttlewatch_core::protocol::{call, Request};
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

fn psi(file: &Path) -> f64 {
    std::fs::read_to_string(file)
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
    psi_file: PathBuf,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut q = quota;
        let mut last = g.cpu_stat().map(|s| s.nr_throttled).unwrap_or(0);
        let mut changes = 0;
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_secs(1));
            let now = g.cpu_stat().map(|s| s.nr_throttled).unwrap_or(last);
            let next = if psi(&psi_file) >= psi_max {
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

/// The neighbour's cgroup (cpu hierarchy) and, on a hybrid host, a
/// cgroup2 group for its PSI; `psi` is the file the guard reads.
struct Neighbour {
    cg: TransientCgroup,
    v2: Option<PathBuf>,
    psi: PathBuf,
}

impl Neighbour {
    fn new(h: &Hierarchies, guard_on_neighbour: bool) -> Neighbour {
        let cg = TransientCgroup::create(h, &format!("/tw-bench-neighbour-{}", std::process::id()))
            .unwrap();
        let own = cg.group.cpu_dir.join("cpu.pressure");
        let (v2, group_psi) = if own.exists() {
            (None, own)
        } else {
            let root = std::fs::read_to_string("/proc/self/mounts")
                .unwrap()
                .lines()
                .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
                .find(|f| f.get(2).map(String::as_str) == Some("cgroup2"))
                .map(|f| PathBuf::from(&f[1]))
                .expect("a cgroup2 mount");
            let d = root.join(cg.group.rel.trim_start_matches('/'));
            let _ = std::fs::create_dir(&d);
            let f = d.join("cpu.pressure");
            (Some(d), f)
        };
        let psi = match guard_on_neighbour {
            true => group_psi,
            false => PathBuf::from("/proc/pressure/cpu"),
        };
        Neighbour { cg, v2, psi }
    }
}

/// The neighbour: 4 spinning threads for `ms`, in its cpu group (and its
/// cgroup2 group on a hybrid host).
fn spawn_neighbour(g: &CpuCgroup, v2: Option<&Path>, ms: u64) -> Child {
    let c = Command::new(bin("tw-burn"))
        .args(["--threads", "4", "--ms", &ms.to_string()])
        .stdout(Stdio::null())
        .spawn()
        .expect("tw-burn");
    g.add_pid(c.id()).expect("the neighbour into its group");
    for t in std::fs::read_dir(format!("/proc/{}/task", c.id()))
        .into_iter()
        .flatten()
        .flatten()
    {
        let _ = std::fs::write(
            g.cpu_dir.join("tasks"),
            t.file_name().to_string_lossy().as_bytes(),
        );
    }
    if let Some(d) = v2 {
        let _ = std::fs::write(d.join("cgroup.procs"), c.id().to_string());
    }
    c
}

impl Drop for Neighbour {
    fn drop(&mut self) {
        if let Some(d) = &self.v2 {
            let t = Instant::now();
            while std::fs::remove_dir(d).is_err() && t.elapsed() < Duration::from_secs(2) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// (seconds, quota CPUs, quota + burst CPUs) every 100 ms, the neighbour's
/// phase (s), its CPU there (ns).
type Samples = (Vec<(f64, f64, f64)>, (f64, f64), u64);
/// A time series: (seconds, CPUs).
type Series = Vec<(f64, f64)>;

/// Every 100 ms: (seconds since the load started, quota, quota + burst in CPUs);
/// with a neighbour, it runs from a third to two thirds of `secs`.
/// Returns the samples, the neighbour's phase (s) and its CPU there (ns).
fn sample(
    g: CpuCgroup,
    secs: u64,
    neighbour: Option<(CpuCgroup, Option<PathBuf>)>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Samples> {
    std::thread::spawn(move || {
        let t = Instant::now();
        let (t1, t2) = (secs as f64 / 3.0, 2.0 * secs as f64 / 3.0);
        let mut v = vec![];
        let mut child: Option<Child> = None;
        let (mut n0, mut ncpu) = (0, 0);
        let mut done = false;
        while !stop.load(Ordering::Relaxed) {
            let now = t.elapsed().as_secs_f64();
            if let Some((ng, v2)) = &neighbour {
                if child.is_none() && !done && now >= t1 {
                    n0 = cpu_used_ns(ng);
                    let ms = ((t2 - t1) * 1000.0) as u64 + 200;
                    child = Some(spawn_neighbour(ng, v2.as_deref(), ms));
                } else if now >= t2 && !done {
                    if let Some(mut c) = child.take() {
                        ncpu = cpu_used_ns(ng) - n0;
                        let _ = c.kill();
                        let _ = c.wait();
                        done = true;
                    }
                }
            }
            if let Ok(l) = g.limits() {
                let quota = l
                    .quota_us
                    .map_or(f64::NAN, |q| q as f64 / l.period_us as f64);
                let lim = l.quota_us.map_or(f64::NAN, |q| {
                    (q + l.burst_us.unwrap_or(0)) as f64 / l.period_us as f64
                });
                v.push((now, quota, lim));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Some(mut c) = child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        (v, (t1, t2), ncpu)
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
    neighbour: Option<&Neighbour>,
) -> Value {
    let h = Hierarchies::discover().unwrap();
    let g = TransientCgroup::create(&h, &format!("/tw-bench-control-{mode}-{}", unique())).unwrap();
    g.group.set_burst(0).unwrap();
    let q = (mode != "unlimited").then_some(quota);
    g.group.set_quota(q, PERIOD).unwrap();
    // The most weight: on a shared machine the quota, not the neighbours'
    // builds, should be what holds the server back.
    throttlewatch_integration::max_cpu_weight(&g.group.cpu_dir);
    let scratch = Scratch::new("serve");
    let socket = scratch.0.join("s.sock");
    let mut server = start_server(&socket, &g);
    let id = format!("bench-{mode}-{}", unique());
    let log = cfg.register_control(&id, &g.group.rel, server.id(), mode == "auto");
    let stop = Arc::new(AtomicBool::new(false));
    let k = (mode == "koord").then(|| {
        koord(
            g.group.clone(),
            quota,
            if neighbour.is_some() { 60.0 } else { 101.0 },
            neighbour.map_or(PathBuf::from("/proc/pressure/cpu"), |n| n.psi.clone()),
            stop.clone(),
        )
    });
    let (s0, c0) = (g.group.cpu_stat().unwrap(), cpu_used_ns(&g.group));
    let sampler = sample(
        g.group.clone(),
        secs,
        neighbour.map(|n| (n.cg.group.clone(), n.v2.clone())),
        stop.clone(),
    );
    let t = Instant::now();
    let load_start_unix_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
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
    stop.store(true, Ordering::Relaxed);
    let koord_changes = k.map(|h| h.join().unwrap());
    let (limits, (t1, t2), ncpu) = sampler.join().unwrap();
    let (limits, quotas): (Series, Series) =
        limits.into_iter().map(|(t, q, l)| ((t, l), (t, q))).unzip();
    let unregister: Request = serde_json::from_value(json!({
        "op": "unregister", "container_id": id, "reason": "poststop", "exit_code": 0
    }))
    .unwrap();
    let _ = call(&cfg.socket, &unregister, Duration::from_secs(5));
    let _ = server.kill();
    let _ = server.wait();
    let mut v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    let records: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("\"type\":\"control\""))
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let controls = records.len();
    // What the controller did, for the round's line on stderr: seconds
    // since the load started, action, cause, quota/burst ms after.
    v["control_log"] = json!(records
        .iter()
        .map(|r| format!(
            "{:.2}s {} {} {}/{}",
            (r["ts"].as_u64().unwrap_or(0) as f64 - load_start_unix_ns as f64) / 1e9,
            r["action"].as_str().unwrap_or(""),
            r["cause"].as_str().unwrap_or(""),
            r["after"]["quota_us"].as_u64().unwrap_or(0) / 1000,
            r["after"]["burst_us"].as_u64().unwrap_or(0) / 1000
        ))
        .collect::<Vec<_>>());
    v["mode"] = json!(mode);
    v["throttled_ms"] = json!(d.throttled_ns / 1_000_000);
    v["cpu_ms"] = json!(cpu / 1_000_000);
    v["cpu_per_s"] = json!(cpu as f64 / 1e9 / wall);
    v["changes"] = json!(koord_changes.unwrap_or(controls as u64));
    let mean_of = |xs: &[(f64, f64)], a: f64, b: f64| {
        let x: Vec<f64> = xs
            .iter()
            .filter(|(t, l)| *t >= a && *t < b && l.is_finite())
            .map(|x| x.1)
            .collect();
        x.iter().sum::<f64>() / x.len().max(1) as f64
    };
    let mean = |a: f64, b: f64| mean_of(&limits, a, b);
    // The CPU the limit allotted over the counted part: the quota, and
    // quota + burst (a burst only lends quota left unused in earlier periods).
    v["limit_mean"] = json!(mean(2.0, secs as f64));
    v["quota_mean"] = json!(mean_of(&quotas, 2.0, secs as f64));
    if neighbour.is_some() {
        let orig = quota as f64 / PERIOD as f64;
        v["neighbour_cpu_per_s"] = json!(ncpu as f64 / 1e9 / (t2 - t1));
        v["limit_before"] = json!(mean(1.0, t1));
        v["limit_during"] = json!(mean((t1 + t2) / 2.0, t2));
        v["limit_after"] = json!(mean(t2 + 0.5, secs as f64));
        v["limit_at_start"] = json!(limits.iter().find(|(t, _)| *t >= t1).map_or(orig, |x| x.1));
        // From the neighbour's start to the original, where it was raised then.
        let raised = limits
            .iter()
            .find(|(t, _)| *t >= t1)
            .is_some_and(|x| x.1 > orig + 1e-9);
        v["given_back_s"] = json!(raised
            .then(|| limits
                .iter()
                .find(|(t, l)| *t >= t1 && *l <= orig + 1e-9)
                .map(|x| x.0 - t1))
            .flatten());
        v["timeline"] = json!(limits
            .iter()
            .step_by(5)
            .map(|x| format!("{:.2}", x.1))
            .collect::<Vec<_>>());
        v["neighbour_s"] = json!([t1, t2]);
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
    let on_neighbour = match args
        .iter()
        .position(|a| a == "--guard")
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
    {
        None | Some("node") => false,
        Some("neighbour") => true,
        Some(o) => panic!("--guard {o}: expected node or neighbour"),
    };
    let h = Hierarchies::discover().unwrap();
    let ng = neighbour.then(|| Neighbour::new(&h, on_neighbour));
    let guard = match &ng {
        Some(n) => format!("pressure_psi_file = {:?}\n", n.psi.display().to_string()),
        None => "pressure_psi_some_percent = 100.0\npressure_idle_percent = 0.0\n".into(),
    };
    let cfg = PrivateConfig::new(&format!("[control]\nenabled = true\n{guard}"));
    let _agent = Agent::start(&cfg);
    let mut all: Vec<Value> = vec![];
    for r in 0..rounds {
        for i in 0..MODES.len() {
            let mode = MODES[(i + r as usize) % MODES.len()];
            let v = run_one(&cfg, mode, secs, quota, burst_us, ng.as_ref());
            eprintln!("round {r} {v}");
            all.push(v);
        }
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    println!(
        "quota {quota} us / {PERIOD} us, {secs} s per run, {rounds} rounds interleaved, medians{}; load average at the end {}:",
        match (&ng, on_neighbour) {
            (None, _) => String::new(),
            (Some(_), false) => ", CPU-hungry neighbour in the middle third, guard on the node's PSI".into(),
            (Some(n), true) => format!(", CPU-hungry neighbour in the middle third, guard on its PSI ({})", n.psi.display()),
        },
        load.join(" ")
    );
    println!(
        "| mode | p50 ms | p99 ms | heavy p99 ms | throttled ms | CPU used (CPUs) | mean quota / quota + burst (CPUs) | changes |{}",
        if neighbour {
            " limit before / at neighbour start / during / after (CPUs) | back to original in s | neighbour CPUs |"
        } else {
            ""
        }
    );
    println!(
        "|---|---|---|---|---|---|---|---|{}",
        if neighbour { "---|---|---|" } else { "" }
    );
    for m in MODES {
        let runs: Vec<&Value> = all.iter().filter(|v| v["mode"] == m).collect();
        let of = |k: &str| median(runs.iter().map(|v| v[k].as_f64().unwrap_or(0.0)).collect());
        print!(
            "| {m} | {:.1} | {:.1} | {:.1} | {:.0} | {:.3} | {} | {:.0} |",
            of("p50_us") / 1000.0,
            of("p99_us") / 1000.0,
            of("heavy_p99_us") / 1000.0,
            of("throttled_ms"),
            of("cpu_per_s"),
            match m {
                "unlimited" => "no quota".to_string(),
                _ => format!("{:.2} / {:.2}", of("quota_mean"), of("limit_mean")),
            },
            of("changes")
        );
        if neighbour {
            let back: Vec<f64> = runs
                .iter()
                .filter_map(|v| v["given_back_s"].as_f64())
                .collect();
            let limits = match m {
                "unlimited" => "no quota".to_string(),
                _ => format!(
                    "{:.2} / {:.2} / {:.2} / {:.2}",
                    of("limit_before"),
                    of("limit_at_start"),
                    of("limit_during"),
                    of("limit_after")
                ),
            };
            print!(
                " {limits} | {} | {:.3} |",
                match back.len() {
                    0 => "-".to_string(),
                    n => format!(
                        "{:.1} ({n} of {} runs raised then)",
                        median(back),
                        runs.len()
                    ),
                },
                of("neighbour_cpu_per_s")
            );
        }
        println!();
    }
    if neighbour {
        for m in ["auto", "koord"] {
            if let Some(v) = all.iter().rev().find(|v| v["mode"] == m) {
                println!(
                    "{m}, last run: limit (quota + burst, CPUs) every 0.5 s, neighbour {:.1}-{:.1} s: {}",
                    v["neighbour_s"][0].as_f64().unwrap_or(0.0),
                    v["neighbour_s"][1].as_f64().unwrap_or(0.0),
                    v["timeline"]
                        .as_array()
                        .map(|a| a.iter().filter_map(|x| x.as_str()).collect::<Vec<_>>().join(" "))
                        .unwrap_or_default()
                );
            }
        }
    }
}
