//! The shim where it must do what containerd's runc shim does, side by side
//! with it in one private containerd: a failed exec, an OOM kill.
//! Run `cargo build --workspace --bins` first.

use std::process::Stdio;
use std::time::Duration;

use throttlewatch_integration::containerd::SHIM_RUNTIME;
use throttlewatch_integration::shim::{setup, text, wait_until};

/// An exec whose binary is not there (`crictl exec CTR /no/such/binary`):
/// the runc shim answers at once with runc's own error, as "OCI runtime exec
/// failed: …", wakes the exec's waiters and keeps no thread for it. Ours the
/// same, side by side in one containerd; `kill` of the never-started exec
/// is refused by both.
#[test]
fn a_failed_exec_returns_at_once_like_the_runc_shims() {
    let s = setup();
    s.run_detached(&[], "fx-tw", &["sleep", "1000"]);
    let o = s.ctd.ctr(&[
        "run",
        "-d",
        "--runtime",
        "io.containerd.runc.v2",
        throttlewatch_integration::containerd::IMAGE_NAME,
        "fx-runc",
        "sleep",
        "1000",
    ]);
    assert!(
        o.status.success(),
        "runc shim: {}\n{}",
        text(&o.stderr),
        s.ctd.log()
    );
    let ours = *s
        .ctd
        .shim_pids()
        .iter()
        .find(|p| {
            std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| c.contains("throttlewatch"))
        })
        .expect("our shim");
    let threads_before = throttlewatch_integration::containerd::threads(ours).unwrap();
    let mut said = Vec::new();
    for id in ["fx-runc", "fx-tw"] {
        for n in 0..3 {
            let t = std::time::Instant::now();
            let exec_id = format!("bad{n}");
            let o = s
                .ctd
                .ctr(&["task", "exec", "--exec-id", &exec_id, id, "/no/such/binary"]);
            let took = t.elapsed();
            assert!(
                !o.status.success(),
                "{id}: exec of a missing binary succeeded"
            );
            assert!(
                took < Duration::from_secs(10),
                "{id}: the failed exec took {took:?}"
            );
            said.push(text(&o.stderr).replace(id, "ID").replace(&exec_id, "EXEC"));
        }
    }
    eprintln!("runc shim: {}\nours: {}", said[0], said[3]);
    // The error containerd gets back (ctr's last line). Ours hands runc the
    // exec's fifos themselves, so runc's own stderr line also reaches the
    // exec's stderr before it (the runc shim copies through pipes only once
    // the exec started, and drops it): a difference that remains.
    let error = |s: &str| s.lines().last().unwrap_or_default().to_string();
    assert!(
        error(&said[0]).starts_with("ctr: OCI runtime exec failed: exec failed:"),
        "{}",
        said[0]
    );
    for n in 0..3 {
        assert_eq!(
            error(&said[n]),
            error(&said[3 + n]),
            "the same error as the runc shim"
        );
    }
    // Killing the never-started exec: refused, with the same words.
    let refused: Vec<String> = ["fx-runc", "fx-tw"]
        .iter()
        .map(|id| {
            let o = s.ctd.ctr(&["task", "kill", "--exec-id", "bad0", id]);
            assert!(
                !o.status.success(),
                "{id}: kill of a never-started exec succeeded"
            );
            text(&o.stderr).replace(id, "ID")
        })
        .collect();
    eprintln!("kill: {}", refused[0]);
    assert_eq!(
        refused[0], refused[1],
        "kill refused as the runc shim refuses it"
    );
    std::thread::sleep(Duration::from_millis(500));
    let threads_after = throttlewatch_integration::containerd::threads(ours).unwrap();
    assert!(
        threads_after <= threads_before,
        "the shim kept threads for failed execs: {threads_before} -> {threads_after}"
    );
    s.remove_task("fx-tw");
    let _ = s.ctd.ctr(&["task", "kill", "-s", "SIGKILL", "fx-runc"]);
    std::thread::sleep(Duration::from_millis(300));
    let _ = s.ctd.ctr(&["task", "delete", "fx-runc"]);
    let _ = s.ctd.ctr(&["containers", "rm", "fx-runc"]);
}

/// A container killed by the OOM killer: the runc shim publishes `TaskOOM`
/// (containerd's CRI then says `OOMKilled`, exit code 137); ours too, for
/// its own container, side by side in one containerd.
#[test]
fn an_oom_kill_is_published_as_task_oom_like_the_runc_shims() {
    let s = setup();
    let _agent = s.start_agent();
    let mut events = s
        .ctd
        .ctr_cmd(&["events"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // dd's 64 MiB buffer under a 16 MiB limit (no swap here).
    let hog = ["dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1"];
    let mut codes = Vec::new();
    for (id, runtime) in [
        ("oom-runc", "io.containerd.runc.v2"),
        ("oom-tw", SHIM_RUNTIME),
    ] {
        let mut a = vec![
            "run",
            "--rm",
            "--runtime",
            runtime,
            "--memory-limit",
            "16777216",
        ];
        a.push(throttlewatch_integration::containerd::IMAGE_NAME);
        a.push(id);
        a.extend_from_slice(&hog);
        let o = s.ctd.ctr(&a);
        codes.push(o.status.code());
        eprintln!("{id}: {:?} {}", o.status.code(), text(&o.stderr));
    }
    std::thread::sleep(Duration::from_millis(500));
    let _ = events.kill();
    let out = events.wait_with_output().unwrap();
    let seen = text(&out.stdout);
    let oom: Vec<&str> = seen.lines().filter(|l| l.contains("/tasks/oom")).collect();
    eprintln!("oom events: {oom:?}");
    assert_eq!(
        codes[0],
        Some(137),
        "the runc shim's container was OOM-killed"
    );
    assert_eq!(codes[1], codes[0], "the same exit status");
    assert!(
        oom.iter().any(|l| l.contains("oom-runc")),
        "the runc shim: {seen}"
    );
    assert!(
        oom.iter().any(|l| l.contains("oom-tw")),
        "ours: {seen}\n{}",
        s.ctd.log()
    );
    // Its log's `end` says so, from the kernel's own oom_kill count.
    let log = std::fs::read_dir(s.tw.0.join("logs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("oom-tw@")
        })
        .expect("the log of oom-tw");
    let v = throttlewatch_integration::read_log(&log);
    let end = throttlewatch_integration::of_type(&v, "end")[0];
    assert!(end["oom_kills"].as_u64() >= Some(1), "{end}");
    wait_until("the shims to exit", Duration::from_secs(5), || {
        s.ctd.shim_pids().is_empty()
    });
}
