//! Annotation QoS applied for real through runc, the wrapper and the hook,
//! on whatever cgroup layout the machine has (v1 here, pure v2 in the VM
//! lane): CPU burst at work in the kernel's counters, and cpusets.

use std::time::Duration;

use serde_json::{json, Value};
use throttlewatch_cgroup::{CpuCgroup, CpuStat, Hierarchies};
use throttlewatch_integration::bundle::{text, tw_burn_bundle, Bundle, ContainerOpts, OciCli};
use throttlewatch_integration::daemons::{Agent, PrivateConfig};
use throttlewatch_integration::{cpu_lock, of_type, read_log, unique};

/// A bundle that runs the host-built `tw-burn` (host libraries bound read-only).
fn burn_bundle(tag: &str, args: &[&str], quota_us: i64) -> Bundle {
    tw_burn_bundle(tag, args, ContainerOpts::default().quota(quota_us, 100_000))
}

struct Outcome {
    stat: CpuStat,
    limits: throttlewatch_cgroup::CpuLimits,
    log: Vec<Value>,
}

/// Run to completion; counters read before delete (runc removes the cgroup).
fn run_to_end(rt: &OciCli, cfg: &PrivateConfig, b: &Bundle) -> Outcome {
    let h = Hierarchies::discover().unwrap();
    let o = rt.run_detached(b);
    assert!(o.status.success(), "run -d: {}", text(&o));
    let g = CpuCgroup::open(&h, &b.cgroup_path).expect("container cgroup");
    let limits = g.limits().unwrap();
    rt.wait_stopped(&b.id, Duration::from_secs(120));
    let stat = g.cpu_stat().unwrap();
    assert!(rt.delete(&b.id).status.success());
    Outcome {
        stat,
        limits,
        log: read_log(&cfg.log_of(&b.id)),
    }
}

#[test]
fn burst_annotation_cuts_throttling_of_a_bursty_workload() {
    let _l = cpu_lock();
    let cfg = PrivateConfig::new("");
    let _agent = Agent::start(&cfg);
    let rt = OciCli::throttlewatch(&cfg);
    // One thread: 120 ms busy, 230 ms idle, under 0.5 CPU (50 ms per 100 ms
    // period). A busy phase spans at most two periods, 100 ms of quota: it
    // is always throttled without burst. With a 50 ms burst the idle
    // periods bank enough to cover it. The 350 ms cycle is not a multiple
    // of the period, so no run is locked to a lucky phase.
    let work = [
        "--threads",
        "1",
        "--ms",
        "3200",
        "--spin",
        "120",
        "--sleep",
        "230",
    ];
    let plain = run_to_end(&rt, &cfg, &burn_bundle("noburst", &work, 50_000));
    let b = burn_bundle("burst", &work, 50_000);
    b.edit(|v| v["annotations"]["throttlewatch.io/cpu-burst"] = json!("100%"));
    let burst = run_to_end(&rt, &cfg, &b);

    assert_eq!(plain.limits.burst_us, Some(0));
    assert_eq!(
        burst.limits.burst_us,
        Some(50_000),
        "100% of the quota in the burst file"
    );
    assert_eq!(plain.stat.nr_bursts, 0);
    assert!(
        burst.stat.nr_bursts > 0,
        "nr_bursts grows: {:?}",
        burst.stat
    );
    eprintln!(
        "burst: without {:.1} ms throttled in {} periods; with 50ms burst {:.1} ms throttled in {} periods, {} bursts, {:.1} ms burst time",
        plain.stat.throttled_ns as f64 / 1e6,
        plain.stat.nr_throttled,
        burst.stat.throttled_ns as f64 / 1e6,
        burst.stat.nr_throttled,
        burst.stat.nr_bursts,
        burst.stat.burst_ns as f64 / 1e6
    );
    assert!(
        (burst.stat.throttled_ns as f64) < 0.5 * plain.stat.throttled_ns as f64,
        "throttled time drops with burst: {} vs {}",
        burst.stat.throttled_ns,
        plain.stat.throttled_ns
    );
    let start = of_type(&burst.log, "start")[0];
    assert_eq!(start["burst_us"], 50_000, "{start}");
    assert!(
        start["qos"].to_string().contains("50000") || start["qos"].to_string().contains("50ms"),
        "{}",
        start["qos"]
    );
    let end = of_type(&burst.log, "end")[0];
    assert!(end["nr_bursts"].as_u64().unwrap() > 0, "{end}");
}

#[test]
fn cpuset_annotations_land_in_the_cgroup() {
    let _l = cpu_lock();
    let cfg = PrivateConfig::new("");
    let _agent = Agent::start(&cfg);
    let rt = OciCli::throttlewatch(&cfg);
    let last = std::thread::available_parallelism().unwrap().get() - 1;
    for (value, want) in [
        (last.to_string(), last.to_string()),
        ("numa:0".to_string(), String::new()),
    ] {
        let opts = ContainerOpts::sh("sleep 1").annotation("throttlewatch.io/cpuset", &value);
        let b = Bundle::new(
            &format!("tw-cpuset-{}-{}", std::process::id(), unique()),
            &opts,
        );
        let o = rt.run_detached(&b);
        assert!(o.status.success(), "run -d: {}", text(&o));
        let h = Hierarchies::discover().unwrap();
        let g = CpuCgroup::open(&h, &b.cgroup_path).unwrap();
        let cpus = g.limits().unwrap().cpus.unwrap_or_default();
        let want = if want.is_empty() {
            std::fs::read_to_string("/sys/devices/system/node/node0/cpulist")
                .map(|s| s.trim().to_string())
                .unwrap_or(cpus.clone())
        } else {
            want
        };
        assert_eq!(cpus, want, "cpuset={value}");
        rt.wait_stopped(&b.id, Duration::from_secs(60));
        assert!(rt.delete(&b.id).status.success());
        let log = read_log(&cfg.log_of(&b.id));
        let start = of_type(&log, "start")[0];
        assert_eq!(
            start["cpus"],
            want.as_str(),
            "start record lists the cpuset"
        );
    }
    // A CPU that does not exist: the container starts without it, the refusal is named.
    let opts = ContainerOpts::sh("true").annotation("throttlewatch.io/cpuset", "4000");
    let b = Bundle::new(
        &format!("tw-cpuset-bad-{}-{}", std::process::id(), unique()),
        &opts,
    );
    let o = rt.run_detached(&b);
    assert!(o.status.success(), "fail-open: {}", text(&o));
    rt.wait_stopped(&b.id, Duration::from_secs(60));
    assert!(rt.delete(&b.id).status.success());
    let hook_log = cfg.hook_log();
    assert!(
        hook_log.contains("throttlewatch.io/cpuset=\"4000\""),
        "hook.log names the value: {hook_log}"
    );
    let log = read_log(&cfg.log_of(&b.id));
    assert!(of_type(&log, "start")[0]["qos"]
        .to_string()
        .contains("4000"));
}
