//! Issue 31: task metrics (`Stats`) answered in the type and with the
//! figures of containerd-shim-runc-v2 2.3.4, under containerd 2.3.4
//! (../shared/bin), for the same kind of container run by both: on a pure
//! cgroup v2 node the v2 `Metrics` (`ctr task metrics` prints
//! `cpu.usage_usec`, `memory.usage_limit`…; the CRI reads the working set
//! as usage - inactive_file from it), on a v1 or hybrid node the v1 one.
//! Runs on the host (hybrid v1) and in the VM lane (pure v2). Run `cargo
//! build --workspace --bins` first.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use throttlewatch_integration::containerd::{IMAGE_NAME, SHIM_RUNTIME};
use throttlewatch_integration::shim::{setup_2x, text, wait_until, Setup};

const RUNC: &str = "io.containerd.runc.v2";
const LIMIT: u64 = 64 << 20;

/// The node's container cgroups are cgroup v2 (no v1 hierarchies): what
/// the runc shim's cgroups.Mode() calls Unified.
fn unified() -> bool {
    Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
}

/// `ctr task metrics`: the metric names of its table (the type's), and
/// its JSON (Go's encoding of the decoded message: zero figures left out).
fn metrics(s: &Setup, id: &str) -> (BTreeSet<String>, Value) {
    let t = s.ctd.ctr(&["task", "metrics", id]);
    assert!(t.status.success(), "{id}: {}", text(&t.stderr));
    let rows = text(&t.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|m| m.contains('.'))
        .map(str::to_string)
        .collect();
    let j = s.ctd.ctr(&["task", "metrics", "--format", "json", id]);
    assert!(j.status.success(), "{id}: {}", text(&j.stderr));
    let v = serde_json::from_slice(&j.stdout)
        .unwrap_or_else(|e| panic!("{id}: {e}: {}", text(&j.stdout)));
    (rows, v)
}

fn n(v: &Value, path: &[&str]) -> u64 {
    path.iter().fold(v, |v, k| &v[*k]).as_u64().unwrap_or(0)
}

/// The keys of `v`, and for each object or array under it the keys it holds
/// (figures that are zero are left out of Go's JSON, so only structure).
fn shape(v: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (k, sub) in v.as_object().into_iter().flatten() {
        out.insert(k.clone());
        for (k2, sub2) in sub.as_object().into_iter().flatten() {
            if !sub2.is_number() {
                out.insert(format!("{k}.{k2}"));
            }
        }
        if let Some(a) = sub.as_array() {
            out.insert(format!("{k}[{}]", a.len()));
        }
    }
    out
}

#[test]
fn task_metrics_are_the_runc_shims_type_and_figures() {
    let v2 = unified();
    let s = setup_2x();
    let mut seen = Vec::new();
    for (i, runtime) in [SHIM_RUNTIME, RUNC].iter().enumerate() {
        let id = format!("metrics{i}");
        // Page cache (8 MiB written), anon memory (the shell), some CPU.
        let o = s.ctd.ctr(&[
            "run",
            "-d",
            "--runtime",
            runtime,
            "--memory-limit",
            &LIMIT.to_string(),
            IMAGE_NAME,
            &id,
            "sh",
            "-c",
            "dd if=/dev/zero of=/tmp/f bs=1M count=8 2>/dev/null; \
             i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; exec sleep 120",
        ]);
        assert!(o.status.success(), "{runtime}: {}", text(&o.stderr));
        let cache = |v: &Value| match v2 {
            true => n(v, &["memory", "file"]),
            false => n(v, &["memory", "total_cache"]),
        };
        wait_until("8 MiB written", Duration::from_secs(60), || {
            cache(&metrics(&s, &id).1) >= 8 << 20
        });
        let running = metrics(&s, &id);
        let _ = s.ctd.ctr(&["task", "kill", "-s", "SIGKILL", &id]);
        wait_until("the task to stop", Duration::from_secs(20), || {
            text(&s.ctd.ctr(&["task", "ls"]).stdout)
                .lines()
                .any(|l| l.starts_with(&id) && l.contains("STOPPED"))
        });
        let stopped = metrics(&s, &id);
        for args in [&["task", "delete", &id][..], &["container", "rm", &id]] {
            let _ = s.ctd.ctr(args);
        }
        eprintln!("{runtime}: running {}\nstopped {}", running.1, stopped.1);
        seen.push((running, stopped));
    }
    let [(ours, ours_stopped), (runc, runc_stopped)] = &seen[..] else {
        unreachable!()
    };
    assert_eq!(ours.0, runc.0, "ctr's table: the same metrics type");
    assert_eq!(ours_stopped.0, runc_stopped.0, "the same type once stopped");
    assert_eq!(ours.0, ours_stopped.0);
    if !v2 {
        assert!(ours.0.contains("memory.usage_in_bytes"), "v1: {:?}", ours.0);
        for v in [&ours.1, &runc.1] {
            assert_eq!(n(v, &["memory", "usage", "limit"]), LIMIT, "{v}");
            assert!(n(v, &["memory", "total_inactive_file"]) > 0, "{v}");
            assert!(n(v, &["cpu", "usage", "total"]) > 0, "{v}");
        }
        return;
    }
    for m in [
        "cpu.usage_usec",
        "cpu.throttled_usec",
        "memory.usage_limit",
        "pids.current",
    ] {
        assert!(ours.0.contains(m), "v2 table lacks {m}: {:?}", ours.0);
    }
    assert_eq!(shape(&ours.1), shape(&runc.1), "the same v2 message shape");
    assert!(ours.1["memory_events"].is_object(), "{}", ours.1);
    for (a, b) in [(&ours.1, &runc.1), (&ours_stopped.1, &runc_stopped.1)] {
        for k in ["usage_limit", "swap_limit"] {
            assert_eq!(n(a, &["memory", k]), n(b, &["memory", k]), "memory.{k}");
        }
        assert_eq!(n(a, &["memory", "usage_limit"]), LIMIT);
        assert_eq!(n(a, &["pids", "limit"]), n(b, &["pids", "limit"]));
    }
    // The figures the same workload makes non-zero are non-zero in both.
    let nonzero = |v: &Value| -> Vec<(&str, bool)> {
        [
            "usage",
            "max_usage",
            "anon",
            "file",
            "shmem",
            "file_mapped",
            "pgfault",
            "slab",
        ]
        .iter()
        .map(|k| (*k, n(v, &["memory", k]) > 0))
        .chain([
            (
                "inactive_file+active_file",
                n(v, &["memory", "inactive_file"]) + n(v, &["memory", "active_file"]) > 0,
            ),
            ("cpu.usage_usec", n(v, &["cpu", "usage_usec"]) > 0),
            ("cpu.user_usec", n(v, &["cpu", "user_usec"]) > 0),
            ("pids.current", n(v, &["pids", "current"]) > 0),
        ])
        .collect()
    };
    assert_eq!(nonzero(&ours.1), nonzero(&runc.1), "non-zero figures");
    let file = n(&ours.1, &["memory", "file"]);
    assert!(file >= 8 << 20, "the 8 MiB written: {}", ours.1);
    assert!(n(&ours.1, &["cpu", "usage_usec"]) > 1000, "{}", ours.1);
    // The working set kubelet computes is the runc shim's, give or take
    // the two shells' own pages (2 MiB).
    let ws =
        |v: &Value| n(v, &["memory", "usage"]).saturating_sub(n(v, &["memory", "inactive_file"]));
    let (a, b) = (ws(&ours.1), ws(&runc.1));
    assert!(a.abs_diff(b) < 2 << 20, "working set {a} vs runc shim {b}");
}
