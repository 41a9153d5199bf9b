//! Cold start with the real kernel, runc and agent (issue 12, "Cold start,
//! right first"): an entrypoint that starts worker threads which burn CPU
//! and joins them. Its first run is its exec, its CPU target counts the
//! workers, and the time to the target splits into running, run-queue wait,
//! frozen and blocked, which add up to it.

use std::time::Duration;

use serde_json::Value;
use throttlewatch_integration::bundle::{text, tw_burn_bundle, Bundle, ContainerOpts, OciCli};
use throttlewatch_integration::daemons::{Agent, PrivateConfig};
use throttlewatch_integration::{cpu_lock, of_type, read_log, unique};

fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("{k} not a number in {v}"))
}

/// `tw-burn ARGS` (host-built, host libraries bound read-only) under a quota,
/// with a cold-start CPU target.
fn burn_bundle(args: &[&str], quota_us: i64, target: &str) -> Bundle {
    let opts = ContainerOpts::default()
        .quota(quota_us, 100_000)
        .annotation("throttlewatch.io/cold-start-cpu", target);
    tw_burn_bundle("cs", args, opts)
}

fn stage(cs: &Value, name: &str) -> u64 {
    let s = cs["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["stage"] == name)
        .unwrap_or_else(|| panic!("no {name} stage: {cs}"));
    u(s, "unix_ns")
}

#[test]
fn workers_joined_by_the_entrypoint_complete_the_cold_start() {
    let _cpu = cpu_lock();
    let cfg = PrivateConfig::new("");
    let _agent = Agent::start(&cfg);
    let rt = OciCli::throttlewatch(&cfg);
    // The main thread starts two workers and blocks in join at once; they
    // burn under 0.2 CPUs, so 60 ms of CPU take at least three periods.
    let b = burn_bundle(&["--threads", "2", "--ms", "1500"], 20_000, "60ms");
    let o = rt.run_detached(&b);
    assert!(o.status.success(), "run -d: {}", text(&o));
    rt.wait_stopped(&b.id, Duration::from_secs(60));
    assert!(rt.delete(&b.id).status.success());
    let log = read_log(&cfg.log_of(&b.id));
    let cs = of_type(&log, "cold_start");
    assert_eq!(cs.len(), 1, "one cold_start record: {log:?}");
    let cs = cs[0];
    eprintln!("cold start: {cs}");
    assert_eq!(cs["complete"], true, "{cs}");
    assert_eq!(cs["comm"], "tw-burn");
    assert_eq!(u(cs, "cpu_target_ns"), 60_000_000);
    let (exec, first, cpu) = (stage(cs, "exec"), stage(cs, "first_run"), stage(cs, "cpu"));
    // The entrypoint runs from its exec on (it used to be its first
    // switch-in after blocking in join: seconds later).
    assert!(
        first >= exec && first - exec <= 5_000_000,
        "first_run {} ns after exec: {cs}",
        first - exec
    );
    let to_target = cpu - exec;
    let s = &cs["exec_to_cpu"];
    let (running, runq, frozen, blocked) = (
        u(s, "running_ns"),
        u(s, "runq_ns"),
        u(s, "frozen_ns"),
        u(s, "blocked_ns"),
    );
    let sum = running + runq + frozen + blocked;
    eprintln!(
        "exec -> cpu {:.1} ms = running {:.1} + run-queue {:.1} + frozen {:.1} + blocked {:.1} (sum {:.1})",
        to_target as f64 / 1e6,
        running as f64 / 1e6,
        runq as f64 / 1e6,
        frozen as f64 / 1e6,
        blocked as f64 / 1e6,
        sum as f64 / 1e6
    );
    // The split is counted in the kernel up to the very moment of the
    // target: only the clock conversion of the two stages can differ.
    assert!(
        sum.abs_diff(to_target) <= 100_000.max(to_target / 100),
        "split sums to {sum} ns, exec -> cpu is {to_target} ns: {cs}"
    );
    // Two workers ran side by side at most: 60 ms of CPU need 30 ms of
    // running at least, and 0.2 CPUs froze them for most of each period.
    assert!(running >= 30_000_000, "{cs}");
    assert!(frozen > 0, "a 0.2-CPU quota froze nothing: {cs}");
    assert!(
        frozen >= running,
        "three periods of 20 ms quota leave ~80 ms frozen each: {cs}"
    );
    assert!(to_target < 2_000_000_000, "{cs}");
}

#[test]
fn a_sleeping_entrypoint_is_blocked_not_running() {
    let _cpu = cpu_lock();
    let cfg = PrivateConfig::new("");
    let _agent = Agent::start(&cfg);
    let rt = OciCli::throttlewatch(&cfg);
    // The shell sleeps 200 ms in a child process (`sleep`, followed from
    // fork), then burns the rest of its 300 ms target itself; no quota. The
    // target is far above what the shell, its fork and the child's exec
    // cost before the sleep, even emulated (the VM lane under TCG: > 10 ms,
    // which once completed a 10 ms and once a 100 ms target before the
    // sleep began); the loop burns ~0.8 s of CPU on the 6.18 host, more
    // under emulation.
    let script = "sleep 0.2; i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done";
    let b = Bundle::new(
        &format!("tw-cs-{}-{}", std::process::id(), unique()),
        &ContainerOpts::sh(script).annotation("throttlewatch.io/cold-start-cpu", "300ms"),
    );
    let o = rt.run_detached(&b);
    assert!(o.status.success(), "run -d: {}", text(&o));
    rt.wait_stopped(&b.id, Duration::from_secs(60));
    assert!(rt.delete(&b.id).status.success());
    let log = read_log(&cfg.log_of(&b.id));
    let cs = of_type(&log, "cold_start")[0];
    eprintln!("cold start: {cs}");
    assert_eq!(cs["complete"], true, "{cs}");
    assert_eq!(u(cs, "cpu_target_ns"), 300_000_000, "{cs}");
    let to_target = stage(cs, "cpu") - stage(cs, "exec");
    let s = &cs["exec_to_cpu"];
    let sum = u(s, "running_ns") + u(s, "runq_ns") + u(s, "frozen_ns") + u(s, "blocked_ns");
    assert!(
        sum.abs_diff(to_target) <= 100_000.max(to_target / 100),
        "{cs}"
    );
    assert!(u(s, "blocked_ns") >= 190_000_000, "the 200 ms sleep: {cs}");
    assert_eq!(u(s, "frozen_ns"), 0, "no quota: {cs}");
    // One thread at a time (the shell waits for `sleep`): running is the
    // whole target.
    assert!(u(s, "running_ns") >= 270_000_000, "{cs}");
}
