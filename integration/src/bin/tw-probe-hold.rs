//! Benchmark helper: load the throttle probe, watch N cgroup ids, print
//! "ready", hold until stdin closes. `tw-probe-hold N [--raw-tp] [--no-runq]`.

use std::io::{Read, Write};

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
}
