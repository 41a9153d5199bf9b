//! GPU sampling where there is no NVIDIA GPU or management library (these
//! build machines): the agent says so once, not once per container — at
//! its start without a GPU in PCI sysfs, when a container first uses one
//! without the library — and watches as before: freezes logged, `cpu_stat`
//! records without GPU samples, the report without a GPU section. And through the whole agent with the stub library
//! (agent/src/pipeline/gpu/stub_nvml.c, built here with cc) and a fake PCI
//! sysfs in a mount namespace of the agent's own: samples (SM activity
//! included) logged, the gauges served, the report's figures; a slow
//! `nvmlInit` delays no registration; the dashboard's GPU panel and the
//! GPU-idle-while-frozen alert through a real Prometheus (pending for the
//! idle GPU alone). The alignment itself is unit-tested
//! on recorded series (report/src/gpu_tests.rs, agent/src/pipeline/gpu/).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use throttlewatch_cgroup::{Hierarchies, TransientCgroup};
use throttlewatch_core::protocol::{call, Register, Request};
use throttlewatch_integration::daemons::{Agent, PrivateConfig};
use throttlewatch_integration::prometheus::{free_port, http_get};
use throttlewatch_integration::{bin, burn_in, cpu_lock, of_type, read_log, unique, Scratch};
#[path = "gpu/prometheus.rs"]
mod prometheus;

const NO_LIBRARY: &str = "/nonexistent/libnvidia-ml.so.1";
const NOT_SAMPLED_END: &str = "freezes are watched as before (nvml_library in throttlewatch.toml or THROTTLEWATCH_NVML_LIB names the library if it is elsewhere)";

/// Register `id` (its process `pid` in cgroup `rel`); how long the agent
/// took to answer.
fn register(socket: &Path, id: &str, pid: u32, rel: &str) -> Duration {
    let t = Instant::now();
    let r = call(
        socket,
        &Request::Register(Register {
            container_id: id.into(),
            pid: Some(pid),
            cgroup_path: rel.into(),
            ..Default::default()
        }),
        Duration::from_secs(5),
    )
    .unwrap();
    let took = t.elapsed();
    assert!(r.ok, "register {id}: {r:?}");
    took
}

/// Unregister `id`; its log.
fn unregister(socket: &Path, id: &str) -> PathBuf {
    let r = call(
        socket,
        &Request::Unregister {
            container_id: id.into(),
            scope: None,
            reason: throttlewatch_core::EndReason::Poststop,
            exit_code: Some(0),
        },
        Duration::from_secs(5),
    )
    .unwrap();
    assert!(r.ok, "{r:?}");
    PathBuf::from(r.log_path.unwrap())
}

/// A cgroup at 0.2 CPUs.
fn limited(h: &Hierarchies, tag: &str) -> TransientCgroup {
    let rel = format!("/tw-test-gpu-{tag}-{}-{}", std::process::id(), unique());
    let cg = TransientCgroup::create(h, &rel).unwrap();
    cg.group.set_quota(Some(20_000), 100_000).unwrap();
    cg
}

/// Two busy threads for `ms` in `cg`, with the container's GPU 0.
fn gpu_burner(cg: &TransientCgroup, ms: u32) -> Child {
    gpu_burner_on(cg, ms, "0")
}

/// Two busy threads for `ms` in `cg`, with the container's GPUs `gpus`
/// (`NVIDIA_VISIBLE_DEVICES`).
fn gpu_burner_on(cg: &TransientCgroup, ms: u32, gpus: &str) -> Child {
    let b = Command::new(bin("tw-burn"))
        .args(["--threads", "2", "--ms", &ms.to_string()])
        .env("NVIDIA_VISIBLE_DEVICES", gpus)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    cg.group.add_pid(b.id()).unwrap();
    b
}

/// `report --json` of `log`.
fn report_json(log: &Path) -> serde_json::Value {
    let o = Command::new(bin("throttlewatch"))
        .args(["report", "--json"])
        .arg(log)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// The `gpu` samples of a log's `cpu_stat` records.
fn samples_of(v: &[serde_json::Value]) -> Vec<&serde_json::Value> {
    of_type(v, "cpu_stat")
        .into_iter()
        .flat_map(|c| c["gpu"].as_array().into_iter().flatten())
        .collect()
}

#[test]
fn without_the_library_the_agent_says_so_once_and_still_logs_freezes() {
    let _l = cpu_lock();
    // Read by the agent at its start (inherited by the child).
    std::env::set_var("THROTTLEWATCH_NVML_LIB", NO_LIBRARY);
    let cfg = PrivateConfig::new("snapshot_interval_s = 1");
    let agent = Agent::start(&cfg);
    let h = Hierarchies::discover().unwrap();
    let mut logs = vec![];
    let groups: Vec<TransientCgroup> = (0..2).map(|i| limited(&h, &i.to_string())).collect();
    let mut burners: Vec<_> = groups
        .iter()
        .map(|cg| burn_in(cg, &["--threads", "2", "--ms", "2500"]))
        .collect();
    for (i, (cg, b)) in groups.iter().zip(&burners).enumerate() {
        register(&cfg.socket, &format!("gpu-{i}"), b.id(), &cg.group.rel);
    }
    for b in &mut burners {
        assert!(b.wait().unwrap().success());
    }
    for i in 0..2 {
        logs.push(unregister(&cfg.socket, &format!("gpu-{i}")));
    }
    let out = agent.output();
    eprintln!("{out}");
    // No NVIDIA GPU in this machine's PCI sysfs, so no container can have
    // one: said once, at the start; NVML is never opened.
    let said: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("GPU utilisation") || l.contains("NVML"))
        .collect();
    assert_eq!(said.len(), 1, "once per agent, not per container: {out}");
    assert_eq!(
        said[0],
        format!("throttlewatch agent: GPU utilisation is not sampled: no NVIDIA GPU in PCI sysfs (NVML, {NO_LIBRARY}, is not opened); {NOT_SAMPLED_END}")
    );
    for log in &logs {
        let v = read_log(log);
        assert!(
            !of_type(&v, "throttle").is_empty(),
            "freezes logged: {log:?}"
        );
        let stats = of_type(&v, "cpu_stat");
        assert!(!stats.is_empty(), "periodic cpu_stat records");
        assert!(stats.iter().all(|s| s.get("gpu").is_none()), "{stats:?}");
        let end = of_type(&v, "end")[0];
        assert!(end["kernel_throttled_ns"].as_u64().unwrap() > 100_000_000);
        let doc = report_json(log);
        let c = &doc["containers"][0];
        assert!(c["kernel_throttled_ns"].as_u64().unwrap() > 0);
        assert!(c.get("gpu").is_none(), "no samples, no GPU section: {c}");
    }
    drop(agent);

    // The configuration's `nvml_library`, where the environment names none.
    std::env::remove_var("THROTTLEWATCH_NVML_LIB");
    let configured = "/nonexistent/configured/libnvidia-ml.so.1";
    let cfg = PrivateConfig::new(&format!("nvml_library = {configured:?}"));
    let out = Agent::start(&cfg).output();
    assert!(
        out.contains(&format!("(NVML, {configured}, is not opened)")),
        "{out}"
    );
}

/// The agent, in a mount namespace of its own where PCI sysfs shows one
/// NVIDIA GPU, with `library` for NVML and `env` (the stub's settings);
/// killed on drop.
struct GpuAgent {
    child: Child,
    output: PathBuf,
}

impl GpuAgent {
    fn start(cfg: &PrivateConfig, library: &Path, env: &[(&str, &str)]) -> GpuAgent {
        let gpus = env
            .iter()
            .find(|(k, _)| *k == "STUB_NVML_GPUS")
            .map_or(1, |(_, v)| v.parse().unwrap());
        let fake = fake_pci(&cfg.dir.0, gpus);
        let output = cfg.dir.0.join("agent-output");
        let out = std::fs::File::create(&output).unwrap();
        let child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg("mount --bind \"$1\" /sys/bus/pci/devices && exec \"$2\" agent --config \"$3\"")
            .arg("sh")
            .arg(fake)
            .arg(bin("throttlewatch"))
            .arg(&cfg.path)
            .env("THROTTLEWATCH_NVML_LIB", library)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        let t = Instant::now();
        while !call(&cfg.socket, &Request::Status, Duration::from_secs(1)).is_ok_and(|r| r.ok) {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "the agent did not answer"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        GpuAgent { child, output }
    }

    /// SIGTERM, and what it printed.
    fn stop(mut self) -> String {
        // SAFETY: the agent's pid (unshare's sh exec'd into it), still ours.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        std::fs::read_to_string(&self.output).unwrap()
    }
}

impl Drop for GpuAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fake PCI sysfs directory with `gpus` NVIDIA 3D controllers.
fn fake_pci(dir: &Path, gpus: usize) -> PathBuf {
    for i in 0..gpus {
        let dev = dir.join(format!("pci/0000:{:02x}:00.0", 0x3b + i));
        std::fs::create_dir_all(&dev).unwrap();
        for (f, v) in [
            ("vendor", "0x10de"),
            ("class", "0x030200"),
            ("numa_node", "-1"),
        ] {
            std::fs::write(dev.join(f), v).unwrap();
        }
    }
    dir.join("pci")
}

/// The stub library (one GPU, 90 % busy, 4 of 80 GiB in use, SM activity
/// 37.5 % where GPM is on) built into `dir`.
fn stub_library(dir: &Path) -> PathBuf {
    let lib = dir.join("libnvidia-ml.so.1");
    let src = dir.join("stub_nvml.c");
    std::fs::write(&src, STUB).unwrap();
    let cc = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .expect("cc (the stub library is built here)");
    assert!(cc.success());
    lib
}

const STUB: &str = include_str!("../../agent/src/pipeline/gpu/stub_nvml.c");

/// A private configuration serving metrics on `port`, at `metrics_detail =
/// "full"` (the GPUs' SM and memory gauges are `full` only).
fn with_metrics(port: u16) -> PrivateConfig {
    PrivateConfig::serving_metrics(
        port,
        "snapshot_interval_s = 1\nmetrics_grace_s = 60\nmetrics_detail = \"full\"",
    )
}

/// The `name{...}` lines of a scrape.
fn gauge<'a>(metrics: &'a str, name: &str) -> Vec<&'a str> {
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .collect()
}

#[test]
fn a_containers_gpu_is_sampled_logged_exported_and_reported() {
    let _l = cpu_lock();
    let scratch = Scratch::new("gpu-stub");
    let stub = stub_library(&scratch.0);
    let port = free_port();
    let cfg = with_metrics(port);
    let agent = GpuAgent::start(&cfg, &stub, &[]);

    let h = Hierarchies::discover().unwrap();
    let cg = limited(&h, "stub");
    let mut b = gpu_burner(&cg, 4500);
    register(&cfg.socket, "gpu-stub", b.id(), &cg.group.rel);
    // Opened at the first tick with the container, read from the next.
    std::thread::sleep(Duration::from_millis(3500));
    let metrics = http_get(port, "/metrics");
    let util = gauge(&metrics, "throttlewatch_gpu_utilization_ratio");
    assert_eq!(util.len(), 1, "{metrics}");
    assert!(
        util[0].contains("gpu=\"0\"") && util[0].contains("container_id=\"gpu-stub\""),
        "{}",
        util[0]
    );
    assert!(util[0].ends_with(" 0.9"), "{}", util[0]);
    let sm = gauge(&metrics, "throttlewatch_gpu_sm_active_ratio");
    assert_eq!(sm.len(), 1, "{metrics}");
    assert!(
        sm[0].ends_with(" 0.38") && sm[0].contains("gpu=\"0\""),
        "{}",
        sm[0]
    );
    assert!(b.wait().unwrap().success());
    let log = unregister(&cfg.socket, "gpu-stub");
    let said = agent.stop();
    eprintln!("{said}");
    assert!(
        said.contains("GPU utilisation from ")
            && said.contains(": 1 GPUs (GPU-stub-1); SM activity (GPM) on every GPU"),
        "{said}"
    );

    let v = read_log(&log);
    assert_eq!(v[0]["topology"]["container_gpus"], serde_json::json!([0]));
    let samples = samples_of(&v);
    eprintln!("{} GPU samples; first {:?}", samples.len(), samples.first());
    assert!(samples.len() >= 2, "a sample a second: {samples:?}");
    for s in &samples {
        assert_eq!(
            (s["gpu"].as_u64(), s["util_pct"].as_u64()),
            (Some(0), Some(90))
        );
        assert_eq!(s["mem_used_bytes"].as_u64(), Some(4 << 30));
        let i = s["interval_ns"].as_u64().unwrap();
        assert!(i > 500_000_000 && i <= 1_000_000_000, "{s}");
    }
    // GPM: from the second reading on (two samples make a figure).
    assert_eq!(samples[0].get("sm_active_pct"), None, "{:?}", samples[0]);
    let with_sm: Vec<_> = samples
        .iter()
        .filter_map(|s| s.get("sm_active_pct"))
        .collect();
    assert!(
        !with_sm.is_empty() && with_sm.iter().all(|v| **v == 38),
        "{samples:?}"
    );
    let doc = report_json(&log);
    let g = &doc["containers"][0]["gpu"]["gpus"][0];
    eprintln!("report: {g}");
    assert_eq!(g["samples"].as_u64(), Some(samples.len() as u64));
    assert!(g["frozen_ns"].as_u64().unwrap() > 0, "quota 0.2 CPUs: {g}");
    assert_eq!(g["util_frozen_pct"].as_f64(), Some(90.0));
    assert_eq!(g["util_unfrozen_pct"].as_f64(), Some(90.0));
    assert_eq!(g["sm_active_unfrozen_pct"].as_f64(), Some(38.0));
    assert!(g["sm_sampled_ns"].as_u64().unwrap() > 0, "{g}");
}

#[test]
fn without_the_library_a_container_with_a_gpu_has_it_said_once() {
    let _l = cpu_lock();
    let cfg = PrivateConfig::new("snapshot_interval_s = 1");
    let agent = GpuAgent::start(&cfg, Path::new(NO_LIBRARY), &[]);
    let h = Hierarchies::discover().unwrap();
    let groups: Vec<TransientCgroup> = (0..2).map(|i| limited(&h, &format!("nolib-{i}"))).collect();
    let mut burners: Vec<Child> = groups.iter().map(|cg| gpu_burner(cg, 2500)).collect();
    for (i, (cg, b)) in groups.iter().zip(&burners).enumerate() {
        register(&cfg.socket, &format!("nolib-{i}"), b.id(), &cg.group.rel);
    }
    for b in &mut burners {
        assert!(b.wait().unwrap().success());
    }
    let logs: Vec<PathBuf> = (0..2)
        .map(|i| unregister(&cfg.socket, &format!("nolib-{i}")))
        .collect();
    let out = agent.stop();
    eprintln!("{out}");
    let said: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("GPU utilisation"))
        .collect();
    assert_eq!(said.len(), 1, "once per agent, not per container: {out}");
    let want = format!(
        "throttlewatch agent: GPU utilisation is not sampled: no NVIDIA management library ({NO_LIBRARY}: "
    );
    assert!(said[0].starts_with(&want), "{}", said[0]);
    assert!(said[0].ends_with(NOT_SAMPLED_END), "{}", said[0]);
    for log in &logs {
        let v = read_log(log);
        assert_eq!(v[0]["topology"]["container_gpus"], serde_json::json!([0]));
        assert!(
            !of_type(&v, "throttle").is_empty(),
            "freezes logged: {log:?}"
        );
        assert!(samples_of(&v).is_empty());
    }
}

#[test]
fn a_slow_nvml_init_delays_no_registration_and_samples_still_arrive() {
    let _l = cpu_lock();
    let scratch = Scratch::new("gpu-slow");
    let stub = stub_library(&scratch.0);
    let mark = scratch.0.join("nvml-init-began");
    let port = free_port();
    let cfg = with_metrics(port);
    // nvmlInit_v2 takes 2 s; GPM says no: utilisation only.
    let env = [
        ("STUB_NVML_INIT_SLEEP_MS", "2000"),
        ("STUB_NVML_INIT_MARK", mark.to_str().unwrap()),
        ("STUB_NVML_GPM", "0"),
    ];
    let agent = GpuAgent::start(&cfg, &stub, &env);
    assert!(!mark.exists(), "NVML opened at the agent's start");
    let h = Hierarchies::discover().unwrap();
    let (a, b) = (limited(&h, "slow-a"), limited(&h, "slow-b"));
    let mut pa = gpu_burner(&a, 7000);
    let first = register(&cfg.socket, "slow-a", pa.id(), &a.group.rel);
    // The next tick starts nvmlInit (in its thread); register while it runs.
    let t = Instant::now();
    while !mark.exists() {
        assert!(t.elapsed() < Duration::from_secs(5), "nvmlInit never began");
        std::thread::sleep(Duration::from_millis(10));
    }
    let began = Instant::now();
    let mut pb = gpu_burner(&b, 6000);
    let second = register(&cfg.socket, "slow-b", pb.id(), &b.group.rel);
    let during = began.elapsed();
    let status = Instant::now();
    let r = call(&cfg.socket, &Request::Status, Duration::from_secs(5)).unwrap();
    let status = status.elapsed();
    assert!(r.ok);
    eprintln!(
        "register before NVML: {first:?}; while nvmlInit sleeps (answered {during:?} after it began): {second:?}; status {status:?}"
    );
    assert!(
        during < Duration::from_millis(2000),
        "not while init ran: {during:?}"
    );
    for took in [first, second, status] {
        assert!(took < Duration::from_millis(200), "{took:?}");
    }
    // Init done about 2 s after it began; a tick later, readings.
    std::thread::sleep(Duration::from_millis(4500));
    let metrics = http_get(port, "/metrics");
    let util = gauge(&metrics, "throttlewatch_gpu_utilization_ratio");
    assert_eq!(util.len(), 2, "both containers' GPU: {metrics}");
    assert!(gauge(&metrics, "throttlewatch_gpu_sm_active_ratio").is_empty());
    assert!(pa.wait().unwrap().success() && pb.wait().unwrap().success());
    let logs = [
        unregister(&cfg.socket, "slow-a"),
        unregister(&cfg.socket, "slow-b"),
    ];
    let said = agent.stop();
    eprintln!("{said}");
    assert!(
        said.contains(
            ": 1 GPUs (GPU-stub-1); no SM activity (GPM not supported): utilisation only"
        ),
        "{said}"
    );
    for log in &logs {
        let samples = samples_of(&read_log(log)).len();
        eprintln!("{}: {samples} GPU samples", log.display());
        assert!(samples >= 2, "{log:?}");
        assert!(samples_of(&read_log(log))
            .iter()
            .all(|s| s.get("sm_active_pct").is_none()));
    }
}
