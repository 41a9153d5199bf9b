//! Per-thread CPU split with the real kernel, runc and agent: the `end`
//! record's `thread_cpu` (running per thread from the scheduler, run-queue
//! wait = run delay less frozen, frozen) sums to what the kernel's cpuacct
//! charged the container, and the report shows it per thread.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use throttlewatch_integration::bundle::{text, Bundle, ContainerOpts, OciCli};
use throttlewatch_integration::daemons::{Agent, PrivateConfig};
use throttlewatch_integration::{bin, cpu_lock, of_type, read_log, unique};

fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("{k} not a number in {v}"))
}

/// `tw-burn ARGS` (host-built, host libraries bound read-only) under a quota.
fn burn_bundle(args: &[&str], quota_us: i64) -> Bundle {
    let mut all = vec!["/tw-burn".to_string()];
    all.extend(args.iter().map(|a| a.to_string()));
    let opts = ContainerOpts {
        args: all,
        ..Default::default()
    }
    .quota(quota_us, 100_000);
    let b = Bundle::new(&format!("tw-tc-{}-{}", std::process::id(), unique()), &opts);
    std::fs::copy(bin("tw-burn"), b.dir().join("rootfs/tw-burn")).unwrap();
    b.edit(|v| {
        let mounts = v["mounts"].as_array_mut().unwrap();
        for d in ["/lib", "/lib64", "/usr/lib"] {
            if Path::new(d).exists() {
                std::fs::create_dir_all(b.dir().join("rootfs").join(d.trim_start_matches('/')))
                    .unwrap();
                mounts.push(json!({"destination": d, "type": "bind", "source": d, "options": ["rbind", "ro"]}));
            }
        }
    });
    b
}

#[test]
fn per_thread_running_sums_to_the_cgroups_cpu_usage() {
    let _cpu = cpu_lock();
    let cfg = PrivateConfig::new("");
    let _agent = Agent::start(&cfg);
    let rt = OciCli::throttlewatch(&cfg);
    // Three busy workers under 0.1 CPUs for 1.5 s: frozen most of the time
    // however busy the machine is.
    let b = burn_bundle(&["--threads", "3", "--ms", "1500"], 10_000);
    let o = rt.run_detached(&b);
    assert!(o.status.success(), "run -d: {}", text(&o));
    rt.wait_stopped(&b.id, Duration::from_secs(60));
    // cpuacct charges every thread that ran in the group; read it before
    // `delete` removes the group.
    let usage_file = Path::new("/sys/fs/cgroup/cpuacct")
        .join(b.cgroup_path.trim_start_matches('/'))
        .join("cpuacct.usage");
    let usage: u64 = std::fs::read_to_string(&usage_file)
        .unwrap_or_else(|e| panic!("{}: {e}", usage_file.display()))
        .trim()
        .parse()
        .unwrap();
    assert!(rt.delete(&b.id).status.success());
    let log_path = cfg.log_of(&b.id);
    let log = read_log(&log_path);
    let end = of_type(&log, "end")[0];
    let tc = &end["thread_cpu"];
    let running = u(tc, "running_ns");
    let err = (running as f64 - usage as f64).abs() / usage as f64;
    eprintln!(
        "threads {}: running {:.1} ms summed over threads, cpuacct.usage {:.1} ms, error {:.2} %; run delay {:.1} ms, frozen {:.1} ms",
        u(tc, "threads"),
        running as f64 / 1e6,
        usage as f64 / 1e6,
        err * 100.0,
        u(tc, "run_delay_ns") as f64 / 1e6,
        u(end, "frozen_ns") as f64 / 1e6
    );
    // The kernel reads a thread's CPU time at its exit, before its last
    // moments on the CPU: a few ticks short over all threads at most.
    assert!(
        err <= 0.05,
        "per-thread running {running} ns vs cpuacct {usage} ns"
    );
    // Each worker: ~0.1/3 CPU of 1.5 s running (50 ms), frozen most of the rest.
    let top = tc["top"].as_array().unwrap();
    let workers: Vec<&Value> = top
        .iter()
        .filter(|t| t["comm"].as_str().unwrap().starts_with("burn-"))
        .collect();
    assert_eq!(workers.len(), 3, "{tc}");
    for w in &workers {
        assert!(u(w, "running_ns") > 20_000_000, "{w}");
        assert!(u(w, "frozen_ns") > u(w, "running_ns"), "{w}");
    }
    // The report shows the split per thread (no more nulls).
    let out = Command::new(bin("throttlewatch"))
        .args(["report", "--json", log_path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    let c = &r["containers"][0];
    let threads = c["top_threads"].as_array().unwrap();
    let t0 = &threads[0]["split"];
    assert!(
        t0["running_ns"].as_u64().unwrap() > 0 && t0["runqueue_wait_ns"].is_u64(),
        "{t0}"
    );
    assert_eq!(c["split"]["running_ns"].as_u64(), Some(running), "{c}");
}
