//! GPU sampling where there is no NVIDIA management library (these build
//! machines): the agent says so once, not once per container, and watches
//! as before — freezes logged, `cpu_stat` records without GPU samples, the
//! report without a GPU section. And through the whole agent with a stub
//! library (built here with cc) and a fake PCI sysfs in a mount namespace
//! of the agent's own: samples logged, the gauge served, the report's
//! figures. The alignment itself is unit-tested on recorded series
//! (report/src/gpu_tests.rs, agent/src/pipeline/gpu/).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use throttlewatch_cgroup::{Hierarchies, TransientCgroup};
use throttlewatch_core::protocol::{call, Register, Request};
use throttlewatch_integration::daemons::{Agent, PrivateConfig};
use throttlewatch_integration::prometheus::{free_port, http_get};
use throttlewatch_integration::{bin, burn_in, cpu_lock, of_type, read_log, unique, Scratch};

const NO_LIBRARY: &str = "/nonexistent/libnvidia-ml.so.1";

#[test]
fn without_the_library_the_agent_says_so_once_and_still_logs_freezes() {
    let _l = cpu_lock();
    // Read by the agent at its start (inherited by the child).
    std::env::set_var("THROTTLEWATCH_NVML_LIB", NO_LIBRARY);
    let cfg = PrivateConfig::new("snapshot_interval_s = 1");
    let agent = Agent::start(&cfg);
    let h = Hierarchies::discover().unwrap();
    let mut logs = vec![];
    let groups: Vec<TransientCgroup> = (0..2)
        .map(|i| {
            let rel = format!("/tw-test-gpu-{i}-{}-{}", std::process::id(), unique());
            let cg = TransientCgroup::create(&h, &rel).unwrap();
            cg.group.set_quota(Some(20_000), 100_000).unwrap();
            cg
        })
        .collect();
    let mut burners: Vec<_> = groups
        .iter()
        .map(|cg| burn_in(cg, &["--threads", "2", "--ms", "2500"]))
        .collect();
    for (i, (cg, b)) in groups.iter().zip(&burners).enumerate() {
        let r = call(
            &cfg.socket,
            &Request::Register(Register {
                container_id: format!("gpu-{i}"),
                pid: Some(b.id()),
                cgroup_path: cg.group.rel.clone(),
                ..Default::default()
            }),
            Duration::from_secs(5),
        )
        .unwrap();
        assert!(r.ok, "register: {r:?}");
    }
    for b in &mut burners {
        assert!(b.wait().unwrap().success());
    }
    for i in 0..2 {
        let r = call(
            &cfg.socket,
            &Request::Unregister {
                container_id: format!("gpu-{i}"),
                scope: None,
                reason: throttlewatch_core::EndReason::Poststop,
                exit_code: Some(0),
            },
            Duration::from_secs(5),
        )
        .unwrap();
        assert!(r.ok, "{r:?}");
        logs.push(PathBuf::from(r.log_path.unwrap()));
    }
    let out = agent.output();
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
    assert!(
        said[0].ends_with(
            "freezes are watched as before (nvml_library in throttlewatch.toml or THROTTLEWATCH_NVML_LIB names the library if it is elsewhere)"
        ),
        "{}",
        said[0]
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
        let o = Command::new(bin("throttlewatch"))
            .args(["report", "--json"])
            .arg(log)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
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
        out.contains(&format!(
            "GPU utilisation is not sampled: no NVIDIA management library ({configured}: "
        )),
        "{out}"
    );
}

/// A stub of NVIDIA's library: one GPU, 90 % busy, 4 of 80 GiB in use.
const STUB: &str = r#"
#include <stdio.h>
typedef struct { unsigned int gpu; unsigned int memory; } nvmlUtilization_t;
typedef struct { unsigned long long total; unsigned long long free; unsigned long long used; } nvmlMemory_t;
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int r) { return "Unknown Error"; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = 1; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **d) { *d = (void *)(unsigned long)(i + 1); return 0; }
int nvmlDeviceGetUUID(void *d, char *u, unsigned int len) { snprintf(u, len, "GPU-stub-%lu", (unsigned long)d); return 0; }
int nvmlDeviceGetUtilizationRates(void *d, nvmlUtilization_t *u) { u->gpu = 90; u->memory = 40; return 0; }
int nvmlDeviceGetMemoryInfo(void *d, nvmlMemory_t *m) {
    m->total = 80ULL << 30; m->used = 4ULL << 30; m->free = m->total - m->used; return 0;
}
"#;

/// The agent in a mount namespace of its own where PCI sysfs shows one
/// NVIDIA GPU (`fake`), with the stub library.
fn agent_with_a_gpu(cfg: &PrivateConfig, fake: &Path, stub: &Path) -> std::process::Child {
    let out = std::fs::File::create(cfg.dir.0.join("agent-output")).unwrap();
    let child = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg("mount --bind \"$1\" /sys/bus/pci/devices && exec \"$2\" agent --config \"$3\"")
        .arg("sh")
        .arg(fake)
        .arg(bin("throttlewatch"))
        .arg(&cfg.path)
        .env("THROTTLEWATCH_NVML_LIB", stub)
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
    child
}

/// A fake PCI sysfs directory with one NVIDIA 3D controller.
fn fake_pci(dir: &Path) -> PathBuf {
    let dev = dir.join("pci/0000:3b:00.0");
    std::fs::create_dir_all(&dev).unwrap();
    for (f, v) in [
        ("vendor", "0x10de"),
        ("class", "0x030200"),
        ("numa_node", "-1"),
    ] {
        std::fs::write(dev.join(f), v).unwrap();
    }
    dir.join("pci")
}

#[test]
fn a_containers_gpu_is_sampled_logged_exported_and_reported() {
    let _l = cpu_lock();
    let scratch = Scratch::new("gpu-stub");
    let stub = scratch.0.join("libnvidia-ml.so.1");
    let src = scratch.0.join("stub.c");
    std::fs::write(&src, STUB).unwrap();
    let cc = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&stub)
        .arg(&src)
        .status()
        .expect("cc (the stub library is built here)");
    assert!(cc.success());
    let port = free_port();
    let cfg = PrivateConfig::new(&format!(
        "snapshot_interval_s = 1\nmetrics_grace_s = 60\nmetrics_addr = \"127.0.0.1:{port}\""
    ));
    let text = std::fs::read_to_string(&cfg.path).unwrap();
    std::fs::write(&cfg.path, text.replacen("metrics_addr = \"\"\n", "", 1)).unwrap();
    let mut agent = agent_with_a_gpu(&cfg, &fake_pci(&scratch.0), &stub);

    let h = Hierarchies::discover().unwrap();
    let rel = format!("/tw-test-gpu-stub-{}-{}", std::process::id(), unique());
    let cg = TransientCgroup::create(&h, &rel).unwrap();
    cg.group.set_quota(Some(20_000), 100_000).unwrap();
    let mut b = Command::new(bin("tw-burn"))
        .args(["--threads", "2", "--ms", "3500"])
        .env("NVIDIA_VISIBLE_DEVICES", "0")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    cg.group.add_pid(b.id()).unwrap();
    let r = call(
        &cfg.socket,
        &Request::Register(Register {
            container_id: "gpu-stub".into(),
            pid: Some(b.id()),
            cgroup_path: cg.group.rel.clone(),
            ..Default::default()
        }),
        Duration::from_secs(5),
    )
    .unwrap();
    assert!(r.ok, "register: {r:?}");
    std::thread::sleep(Duration::from_millis(2500));
    let metrics = http_get(port, "/metrics");
    let gauge: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("throttlewatch_gpu_utilization_ratio{"))
        .collect();
    assert_eq!(gauge.len(), 1, "{metrics}");
    assert!(
        gauge[0].contains("gpu=\"0\"") && gauge[0].contains("container_id=\"gpu-stub\""),
        "{}",
        gauge[0]
    );
    assert!(gauge[0].ends_with(" 0.9"), "{}", gauge[0]);
    assert!(b.wait().unwrap().success());
    let r = call(
        &cfg.socket,
        &Request::Unregister {
            container_id: "gpu-stub".into(),
            scope: None,
            reason: throttlewatch_core::EndReason::Poststop,
            exit_code: Some(0),
        },
        Duration::from_secs(5),
    )
    .unwrap();
    assert!(r.ok, "{r:?}");
    unsafe { libc::kill(agent.id() as i32, libc::SIGTERM) };
    let _ = agent.wait();
    let said = std::fs::read_to_string(cfg.dir.0.join("agent-output")).unwrap();
    eprintln!("{said}");
    assert!(
        said.contains("GPU utilisation from ") && said.contains(": 1 GPUs (GPU-stub-1)"),
        "{said}"
    );

    let log = PathBuf::from(r.log_path.unwrap());
    let v = read_log(&log);
    assert_eq!(v[0]["topology"]["container_gpus"], serde_json::json!([0]));
    let samples: Vec<&serde_json::Value> = of_type(&v, "cpu_stat")
        .iter()
        .flat_map(|c| c["gpu"].as_array().into_iter().flatten())
        .collect();
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
    let o = Command::new(bin("throttlewatch"))
        .args(["report", "--json"])
        .arg(&log)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let g = &doc["containers"][0]["gpu"]["gpus"][0];
    eprintln!("report: {g}");
    assert_eq!(g["samples"].as_u64(), Some(samples.len() as u64));
    assert!(g["frozen_ns"].as_u64().unwrap() > 0, "quota 0.2 CPUs: {g}");
    assert_eq!(g["util_frozen_pct"].as_f64(), Some(90.0));
    assert_eq!(g["util_unfrozen_pct"].as_f64(), Some(90.0));
}
