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
//! instead of N made-up ids.
//! `--serve`: one load for a whole benchmark (bench/probe-scale.py). After
//! "ready", each stdin line `N` or `N DIR` sets the watch map to the first N
//! sub-directories of `--watch-under` (N−1 of them and DIR where DIR is
//! given), adding and removing only the difference as the agent does when
//! containers come and go, and answers `watching N`.

use std::collections::BTreeSet;
use std::io::{BufRead, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

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
    for (id, d) in first_ids(parent, n as usize) {
        p.watch_group(id, &d.join("cgroup.procs"))
            .expect("watch a cgroup");
    }
}

/// The sub-directories of `parent` by name, with their cgroup ids.
fn sub_dirs(parent: &str) -> Vec<(u64, PathBuf)> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(parent)
        .unwrap_or_else(|e| panic!("--watch-under {parent}: {e}"))
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    dirs.sort();
    dirs.into_iter()
        .map(|d| (cgroup_id("--watch-under", &d.to_string_lossy()), d))
        .collect()
}

/// The first `n` of [`sub_dirs`].
fn first_ids(parent: &str, n: usize) -> Vec<(u64, PathBuf)> {
    let mut dirs = sub_dirs(parent);
    assert!(
        dirs.len() >= n,
        "--watch-under {parent}: {} sub-directories, {n} needed",
        dirs.len()
    );
    dirs.truncate(n);
    dirs
}

/// `--serve`: one probe load, the watch map set line by line from stdin.
fn serve(p: &ThrottleProbe, under: &str) {
    let all = sub_dirs(under);
    let mut now: BTreeSet<u64> = BTreeSet::new();
    let mut out = std::io::stdout();
    for line in std::io::stdin().lock().lines() {
        let line = line.expect("stdin");
        let mut words = line.split_whitespace();
        let Some(n) = words.next() else { continue };
        let n: usize = n
            .parse()
            .unwrap_or_else(|_| panic!("--serve: line {line:?}: expected N [DIR]"));
        let extra = words
            .next()
            .map(|d| (cgroup_id("--serve", d), PathBuf::from(d)));
        let others = n - usize::from(extra.is_some());
        assert!(
            others <= all.len(),
            "--serve: {n} asked, {} sub-directories",
            all.len()
        );
        let want: Vec<&(u64, PathBuf)> = all[..others].iter().chain(extra.iter()).collect();
        let ids: BTreeSet<u64> = want.iter().map(|(id, _)| *id).collect();
        for gone in now.difference(&ids) {
            p.unwatch(*gone).expect("unwatch");
        }
        for (id, dir) in want.iter().filter(|(id, _)| !now.contains(id)) {
            p.watch_group(*id, &dir.join("cgroup.procs"))
                .expect("watch a cgroup");
        }
        now = ids;
        writeln!(out, "watching {}", p.watched_count()).unwrap();
        out.flush().unwrap();
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: u64 = args
        .get(1)
        .and_then(|a| a.parse().ok())
        .expect("usage: tw-probe-hold N [--raw-tp] [--no-runq] [--cold-start DIR] [--watch DIR] [--watch-under DIR [--serve]]");
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
    if args.iter().any(|a| a == "--serve") {
        let under = flag_value(&args, "--watch-under").expect("--serve needs --watch-under DIR");
        serve(&p, under);
        return;
    }
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
