//! The shim `containerd-shim-throttlewatch-v2` under a real, private
//! containerd 1.6 (`ctr run --runtime io.containerd.throttlewatch.v2`):
//! output and exit codes, exec, kill, delete, memory, one shim per sandbox.
//! The terminal and stdin tests are in containerd_stdio.rs, those with the
//! agent in containerd_agent.rs. Run `cargo build --workspace --bins` first.
//! Set TW_SHIM_DIR to a folder holding another build of the shim (e.g.
//! target/release) to measure that one.

use std::time::Duration;

use throttlewatch_integration::containerd::{mem_summary, vm_rss_kb, IMAGE_NAME, SHIM_RUNTIME};
use throttlewatch_integration::shim::{run_args, setup, text, wait_until};

#[test]
fn shim_runs_containers_with_output_and_exit_codes() {
    let s = setup();
    let out = s.ctd.ctr(&run_args("echo1", &[], &["echo", "hello"]));
    assert!(
        out.status.success(),
        "ctr run: {}\n{}",
        text(&out.stderr),
        s.ctd.log()
    );
    assert_eq!(text(&out.stdout), "hello\n");
    let out = s.ctd.ctr(&run_args(
        "exit3",
        &[],
        &["sh", "-c", "echo oops >&2; exit 3"],
    ));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("oops"),
        "stderr passed through: {}",
        text(&out.stderr)
    );
    wait_until("shims to exit", Duration::from_secs(5), || {
        s.ctd.shim_pids().is_empty()
    });
    // Issue 19: nothing of the namespace's cgroup parent is left behind.
    let ns = s.ctd.namespace.clone();
    drop(s);
    let root = std::path::Path::new("/sys/fs/cgroup");
    let left: Vec<_> = std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .map(|h| h.path().join(&ns))
        .chain([root.join(&ns)])
        .filter(|p| p.exists())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn shim_exec_kill_delete_and_memory() {
    let s = setup();
    let ctr = |a: &[&str]| s.ctd.ctr(a);
    s.run_detached(&[], "long1", &["sleep", "1000"]);
    let out = ctr(&["task", "exec", "--exec-id", "e1", "long1", "echo", "hi"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "hi\n");
    let out = ctr(&[
        "task",
        "exec",
        "--exec-id",
        "e2",
        "long1",
        "sh",
        "-c",
        "exit 5",
    ]);
    assert_eq!(out.status.code(), Some(5), "{}", text(&out.stderr));
    let out = ctr(&["task", "ps", "long1"]);
    assert!(
        out.status.success() && text(&out.stdout).lines().count() >= 2,
        "ps: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let out = ctr(&["task", "metrics", "long1"]);
    assert!(out.status.success(), "metrics: {}", text(&out.stderr));

    let shims = s.ctd.shim_pids();
    assert_eq!(shims.len(), 1, "one shim for one container");
    assert!(vm_rss_kb(shims[0]).is_some(), "shim {} is gone", shims[0]);
    eprintln!(
        "shim with one running container: {} ({})",
        mem_summary(shims[0]),
        bin_kind()
    );

    let out = ctr(&["task", "kill", "-s", "SIGKILL", "long1"]);
    assert!(out.status.success(), "kill: {}", text(&out.stderr));
    wait_until("the task to stop", Duration::from_secs(5), || {
        text(&ctr(&["task", "ls"]).stdout).contains("STOPPED")
    });
    let out = ctr(&["task", "delete", "long1"]);
    assert!(out.status.success(), "task delete: {}", text(&out.stderr));
    let out = ctr(&["containers", "rm", "long1"]);
    assert!(out.status.success(), "containers rm: {}", text(&out.stderr));
    wait_until("the shim to exit", Duration::from_secs(5), || {
        s.ctd.shim_pids().is_empty()
    });
    let _ = &s.tw;
}

#[test]
fn containers_of_one_sandbox_share_one_shim() {
    let s = setup();
    let ann = ["--annotation", "io.kubernetes.cri.sandbox-id=sandbox1"];
    for id in ["pod1a", "pod1b"] {
        let mut a = vec!["run", "-d", "--runtime", SHIM_RUNTIME];
        a.extend_from_slice(&ann);
        a.extend_from_slice(&[IMAGE_NAME, id, "sleep", "1000"]);
        let out = s.ctd.ctr(&a);
        assert!(
            out.status.success(),
            "{id}: {}\n{}",
            text(&out.stderr),
            s.ctd.log()
        );
    }
    let shims = s.ctd.shim_pids();
    assert_eq!(shims.len(), 1, "one shim for the sandbox: {shims:?}");
    eprintln!(
        "shim with two containers of one sandbox: {} ({})",
        mem_summary(shims[0]),
        bin_kind()
    );
    for id in ["pod1a", "pod1b"] {
        assert!(s
            .ctd
            .ctr(&["task", "kill", "-s", "SIGKILL", id])
            .status
            .success());
    }
    // The first container's exit must not take the shared shim down.
    wait_until("both tasks to stop", Duration::from_secs(5), || {
        text(&s.ctd.ctr(&["task", "ls"]).stdout)
            .matches("STOPPED")
            .count()
            == 2
    });
    for id in ["pod1a", "pod1b"] {
        let out = s.ctd.ctr(&["task", "delete", id]);
        assert!(out.status.success(), "delete {id}: {}", text(&out.stderr));
        if id == "pod1a" {
            assert_eq!(
                s.ctd.shim_pids(),
                shims,
                "the shim stays while pod1b is left"
            );
        }
        assert!(s.ctd.ctr(&["containers", "rm", id]).status.success());
    }
    wait_until("the shim to exit", Duration::from_secs(5), || {
        s.ctd.shim_pids().is_empty()
    });
}

fn bin_kind() -> String {
    std::env::var("TW_SHIM_DIR")
        .map(|d| format!("shim from {d}"))
        .unwrap_or_else(|_| "debug build".into())
}
