//! Issue 11, finding 6: a full kernel map no longer drops inserts silently.
//! With the `episodes` map cut to one entry (the test knob
//! THROTTLEWATCH_PROBE_EPISODES), a container throttled on both CPUs needs
//! two and the refused inserts reach `end.map_full`; a normal run counts none.

use std::process::Command;

use serde_json::Value;
use throttlewatch_cgroup::{Hierarchies, TransientCgroup};
use throttlewatch_integration::{bin, burn_in, cpu_lock, of_type, read_log, unique, Scratch};

/// `throttlewatch watch` of two spinning threads (one per CPU) under a
/// quota of 0.1 CPU (throttled on both CPUs every period even on a loaded
/// machine), for 1.5 s; the `end` record.
fn end_of_watch(episodes_env: Option<&str>) -> Value {
    let h = Hierarchies::discover().unwrap();
    let cg = TransientCgroup::create(
        &h,
        &format!("/tw-test-mapfull-{}-{}", std::process::id(), unique()),
    )
    .unwrap();
    cg.group.set_quota(Some(10_000), 100_000).unwrap();
    let mut b = burn_in(&cg, &["--threads", "2", "--ms", "3000", "--pin", "spread"]);
    let d = Scratch::new("mapfull");
    let log = d.0.join("w.jsonl");
    let mut c = Command::new(bin("throttlewatch"));
    c.args([
        "watch",
        "--pid",
        &b.id().to_string(),
        "--duration",
        "1500ms",
        "--log",
    ])
    .arg(&log);
    match episodes_env {
        Some(v) => c.env("THROTTLEWATCH_PROBE_EPISODES", v),
        None => c.env_remove("THROTTLEWATCH_PROBE_EPISODES"),
    };
    let o = c.output().unwrap();
    let _ = b.kill();
    let _ = b.wait();
    assert!(
        o.status.success(),
        "watch: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let log = read_log(&log);
    let end = of_type(&log, "end");
    assert_eq!(end.len(), 1, "{log:?}");
    end[0].clone()
}

#[test]
fn a_full_episodes_map_is_counted_in_end() {
    let _l = cpu_lock();
    // Two CPUs must be throttled at once; with other work on the machine
    // the two threads may not run side by side for a whole watch (seen:
    // one episode per period). Up to three watches.
    let mut end = end_of_watch(Some("1"));
    for attempt in 2..=3 {
        if end["map_full"]["episodes"].as_u64() > Some(0) {
            break;
        }
        eprintln!(
            "watch {}: {} episodes in {} throttled periods, none while another was open; again",
            attempt - 1,
            end["probe_episodes"],
            end["nr_throttled"]
        );
        end = end_of_watch(Some("1"));
    }
    eprintln!("one-entry episodes map: {}", end["map_full"]);
    assert!(
        end["nr_throttled"].as_u64().unwrap() > 0,
        "not throttled: {end}"
    );
    assert!(
        end["map_full"]["episodes"].as_u64().unwrap() > 0,
        "a second CPU's episode had no room: {end}"
    );
    let end = end_of_watch(None);
    assert!(
        end["nr_throttled"].as_u64().unwrap() > 0,
        "not throttled: {end}"
    );
    assert_eq!(
        end["map_full"],
        serde_json::json!({"episodes": 0, "frozen_by_tid": 0, "bandwidth_timers": 0}),
        "{end}"
    );
}

#[test]
fn a_bad_episodes_knob_is_refused_naming_it() {
    let o = Command::new(bin("throttlewatch"))
        .args(["run", "--quiet", "--", "true"])
        .env("THROTTLEWATCH_PROBE_EPISODES", "lots")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("THROTTLEWATCH_PROBE_EPISODES=\"lots\"") && err.contains("whole number"),
        "{err}"
    );
}
