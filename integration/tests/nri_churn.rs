//! Issue 48: pods churned through the CRI with `crictl` on a private
//! containerd 2.3.4 with the NRI plugin (`throttlewatch-nri`, an external
//! plugin) and the agent, and three faults injected mid-churn, one at a
//! time: the agent SIGKILLed (pods removed and started while it is down) and started
//! again; the plugin restarted (pods started and removed while it is down);
//! containerd restarted under running pods. Pods are created and started
//! while older ones are stopped and removed around every fault; a few have
//! three containers, one of which is stopped and removed on its own before
//! its pod.
//!
//! Afterwards nothing is lost and nothing is left: every container
//! lifetime has exactly one log, with one `start` record first and one
//! `end` record last; no other log; no state file in the agent's state dir;
//! no container or sandbox cgroup; the agent watches nothing and its
//! kernel watch map is empty; the plugin reported no problem in hook.log.
//!
//! The CI test runs 30 pods; `nri_churn/bench.rs` is the 110-pod benchmark
//! (`bench/pods-110.sh`, ignored in the suite). Run `cargo build
//! --workspace --bins` first.

use std::time::{Duration, Instant};

use throttlewatch_integration::cpu_lock;
use throttlewatch_integration::daemons::PrivateConfig;

#[path = "nri_churn/bench.rs"]
mod bench;
#[path = "nri_churn/checks.rs"]
mod checks;
#[path = "nri_churn/churn.rs"]
mod churn;

use churn::Churn;

/// Every wait of these tests is bounded by this.
const WAIT: Duration = Duration::from_secs(30);

/// Wait for `f`, at most `WAIT`; on a timeout, panic with what `seen` says.
fn wait_until(what: &str, mut f: impl FnMut() -> bool, seen: impl Fn() -> String) {
    let t0 = Instant::now();
    while !f() {
        if t0.elapsed() > WAIT {
            panic!(
                "timed out after {WAIT:?} waiting for {what}; seen:\n{}",
                seen()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// 18 pods started, then the three faults, each with 2 pods removed and 2
/// started around it and 2 more of each after it: 30 pods, every eighth
/// with 3 containers (4 of them), 38 container lifetimes.
#[test]
fn thirty_pods_churned_through_three_faults() {
    let _cpu = cpu_lock();
    let t0 = Instant::now();
    let tw = PrivateConfig::new("");
    let mut c = Churn::start(&tw, 8);
    c.add_pods(18);
    c.wait_watched();
    eprintln!(
        "18 pods running, watched, {:.1} s in",
        t0.elapsed().as_secs_f64()
    );
    c.faults(2);
    c.remove_all();
    let summary = checks::nothing_lost(&c);
    assert_eq!(c.made, 30, "pods made");
    assert_eq!(summary.lifetimes, 38, "container lifetimes");
    for e in &c.events {
        eprintln!("{e}");
    }
    eprintln!(
        "{}; {:.1} s in all",
        summary.line(),
        t0.elapsed().as_secs_f64()
    );
}
