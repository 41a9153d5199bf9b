//! Benchmark helper: load the throttle probe, watch N cgroup ids, print
//! "ready", hold until stdin closes.
//! `tw-probe-hold N [--raw-tp] [--no-runq] [--cold-start CPU_CGROUP_DIR]`:
//! `--cold-start` also watches that cpu cgroup and arms a cold start in it
//! whose CPU target is never reached, so the first exec there and every
//! thread it starts are followed (the cold-start part of each switch).
//! `--watch CPU_CGROUP_DIR` watches that cgroup alone (its tasks' switches
//! and wake-ups run the watched paths: run-queue wait, wake-up chains).

use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;

use throttlewatch_bpf::{ProbeOptions, ThrottleProbe};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: u64 = args
        .get(1)
        .and_then(|a| a.parse().ok())
        .expect("usage: tw-probe-hold N [--raw-tp]");
    let raw = args.iter().any(|a| a == "--raw-tp");
    let no_runq = args.iter().any(|a| a == "--no-runq");
    let mut p = ThrottleProbe::load(&ProbeOptions {
        force_raw_tp: raw,
        no_runq,
        ..Default::default()
    })
    .expect("load probe");
    // Real ids do not matter for the cost: an unfrozen switch never reads the map.
    for i in 0..n {
        p.watch(1_000_000 + i).expect("watch");
    }
    let cold_start = args
        .iter()
        .position(|a| a == "--cold-start")
        .map(|i| {
            args.get(i + 1)
                .expect("--cold-start takes a cpu cgroup directory")
        })
        .map(|dir| {
            // The cgroup id the BPF side sees: the cpu-controller directory's inode.
            let id = std::fs::metadata(dir)
                .unwrap_or_else(|e| panic!("--cold-start {dir}: {e}"))
                .ino();
            p.watch(id).expect("watch the cold-start cgroup");
            let armed = p
                .arm_cold_start(id, u64::MAX / 2)
                .expect("arm the cold start");
            assert!(armed, "--cold-start {dir}: not armed (no run-queue part?)");
            id
        });
    if let Some(dir) = args.iter().position(|a| a == "--watch").map(|i| {
        args.get(i + 1)
            .expect("--watch takes a cpu cgroup directory")
    }) {
        let id = std::fs::metadata(dir)
            .unwrap_or_else(|e| panic!("--watch {dir}: {e}"))
            .ino();
        p.watch(id).expect("watch the cgroup");
    }
    println!(
        "ready {} {} runq={}",
        p.kind().as_str(),
        p.watched_count(),
        p.runq_available()
    );
    std::io::stdout().flush().unwrap();
    let mut buf = [0u8; 64];
    while std::io::stdin()
        .read(&mut buf)
        .map(|n| n > 0)
        .unwrap_or(false)
    {}
    let _ = p.poll();
    if let Some(id) = cold_start {
        // What the followed threads did: all zero means nothing was followed.
        eprintln!("cold start split: {:?}", p.cold_start_split(id));
    }
}
