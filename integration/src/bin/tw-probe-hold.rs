//! Benchmark helper: load the throttle probe, watch N cgroup ids, print
//! "ready", hold until stdin closes.
//! `tw-probe-hold N [--raw-tp] [--no-runq] [--cold-start CPU_CGROUP_DIR]
//!  [--watch CPU_CGROUP_DIR] [--watch-under CPU_CGROUP_DIR]`:
//! `--cold-start` also watches that cpu cgroup and arms a cold start in it
//! whose CPU target is never reached, so the first exec there and every
//! thread it starts are followed (the cold-start part of each switch).
//! `--watch CPU_CGROUP_DIR` watches that cgroup alone (its tasks' switches
//! and wake-ups run the watched paths: run-queue wait, wake-up chains).
//! `--watch-under CPU_CGROUP_DIR`: the N watched ids are those of the
//! first N sub-directories of that directory (by name), real cgroups watched
//! the way the agent watches a container (its `cgroup.procs` walked),
//! instead of N made-up ids (bench/probe-scale.py).

use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use throttlewatch_bpf::{ProbeOptions, ThrottleProbe};

/// The value after `flag`, if the flag is given.
fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter().position(|a| a == flag).map(|i| {
        args.get(i + 1)
            .unwrap_or_else(|| panic!("{flag} takes a cpu cgroup directory"))
            .as_str()
    })
}

/// The cgroup id the BPF side sees: the cpu-controller directory's inode.
fn cgroup_id(flag: &str, dir: &str) -> u64 {
    std::fs::metadata(dir)
        .unwrap_or_else(|e| panic!("{flag} {dir}: {e}"))
        .ino()
}

/// Watch N ids: the first N sub-directories of `under`, or made-up ones.
fn watch_n(p: &ThrottleProbe, n: u64, under: Option<&str>) {
    let Some(parent) = under else {
        // Made-up ids: an unfrozen switch never reads the map.
        for i in 0..n {
            p.watch(1_000_000 + i).expect("watch");
        }
        return;
    };
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(parent)
        .unwrap_or_else(|e| panic!("--watch-under {parent}: {e}"))
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    dirs.sort();
    assert!(
        dirs.len() as u64 >= n,
        "--watch-under {parent}: {} sub-directories, {n} needed",
        dirs.len()
    );
    for d in dirs.iter().take(n as usize) {
        let id = cgroup_id("--watch-under", &d.to_string_lossy());
        p.watch_group(id, &Path::new(d).join("cgroup.procs"))
            .expect("watch a cgroup");
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: u64 = args
        .get(1)
        .and_then(|a| a.parse().ok())
        .expect("usage: tw-probe-hold N [--raw-tp] [--no-runq] [--cold-start DIR] [--watch DIR] [--watch-under DIR]");
    let mut p = ThrottleProbe::load(&ProbeOptions {
        force_raw_tp: args.iter().any(|a| a == "--raw-tp"),
        no_runq: args.iter().any(|a| a == "--no-runq"),
        ..Default::default()
    })
    .expect("load probe");
    watch_n(&p, n, flag_value(&args, "--watch-under"));
    let cold_start = flag_value(&args, "--cold-start").map(|dir| {
        let id = cgroup_id("--cold-start", dir);
        p.watch(id).expect("watch the cold-start cgroup");
        let armed = p
            .arm_cold_start(id, u64::MAX / 2)
            .expect("arm the cold start");
        assert!(armed, "--cold-start {dir}: not armed (no run-queue part?)");
        id
    });
    if let Some(dir) = flag_value(&args, "--watch") {
        p.watch(cgroup_id("--watch", dir))
            .expect("watch the cgroup");
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
