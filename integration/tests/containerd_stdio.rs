//! The shim under a real, private containerd 1.6: terminals (`ctr run -t`,
//! `ctr task exec -t`) and stdin (piped, and a writer that comes late).
//! Run `cargo build --workspace --bins` first.

use std::io::Write;
use std::process::Stdio;
use std::time::Duration;

use throttlewatch_integration::containerd::{IMAGE_NAME, SHIM_RUNTIME};
use throttlewatch_integration::shim::{run_args, setup, text, wait_until, Setup};

/// `ctr run -t`: the container gets a terminal of the caller's size (ctr
/// sends ResizePty after start), output comes back, the exit code too.
#[test]
fn shim_runs_a_container_with_a_terminal() {
    let s = setup();
    // Until ctr's ResizePty arrives the window is 0×0 (busybox `stty size`
    // then prints nothing or fails).
    let script = "if [ -t 0 ] && [ -t 1 ]; then echo tty-yes; fi; i=0; s=; \
                  until [ -n \"$s\" ] && [ \"$s\" != '0 0' ] || [ $i -ge 50 ]; do \
                  sleep 0.1; i=$((i+1)); s=$(stty size 2>/dev/null); done; echo \"size=$s\"; exit 7";
    let args = run_args("tty1", &["-t"], &["sh", "-c", script]);
    let (out, code) = s
        .ctd
        .ctr_on_pty(&args, (33, 101), "", b"", Duration::from_secs(30));
    assert_eq!(code, Some(7), "ctr run -t: {out}\n{}", s.ctd.log());
    assert!(
        out.contains("tty-yes"),
        "stdin and stdout are a terminal: {out}"
    );
    assert!(
        out.contains("size=33 101"),
        "the window size came through: {out:?}"
    );
    wait_until("the shim to exit", Duration::from_secs(5), || {
        s.ctd.shim_pids().is_empty()
    });
}

/// `ctr task exec -t … sh`, typing into the terminal like a user.
#[test]
fn shim_exec_with_a_terminal_takes_typed_input() {
    let s = setup();
    s.run_detached(&[], "ttyx", &["sleep", "1000"]);
    let args = ["task", "exec", "-t", "--exec-id", "sh1", "ttyx", "sh"];
    let (out, code) = s.ctd.ctr_on_pty(
        &args,
        (24, 80),
        "# ",
        b"echo $((6*7)); exit 3\r",
        Duration::from_secs(30),
    );
    assert_eq!(code, Some(3), "ctr task exec -t: {out}\n{}", s.ctd.log());
    assert!(out.contains("42"), "the typed command ran: {out}");
    remove_task(&s, "ttyx");
}

/// `echo … | ctr run … cat`: piped stdin reaches the container, written late
/// and in bulk, and EOF follows (ctr's CloseIO).
#[test]
fn shim_passes_piped_stdin() {
    let s = setup();
    let mut child = s
        .ctd
        .ctr_cmd(&run_args(
            "stdin1",
            &[],
            &["sh", "-c", "read first; echo first=$first; wc -c"],
        ))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500)); // the container reads first
        stdin.write_all(b"hi\n").unwrap();
        stdin.write_all(&vec![b'x'; 200_000]).unwrap();
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stderr),
        s.ctd.log()
    );
    let got = text(&out.stdout);
    assert_eq!(
        got.lines().map(str::trim).collect::<Vec<_>>(),
        ["first=hi", "200000"],
        "{got}"
    );
}

/// A container reading stdin before anyone writes waits for the writer
/// (`ctr run -d` leaves without closing stdin; `ctr task attach` writes later).
#[test]
fn stdin_waits_for_a_late_writer() {
    let s = setup();
    let mut run = s
        .ctd
        .ctr_cmd(&[
            "run",
            "-d",
            "--runtime",
            SHIM_RUNTIME,
            IMAGE_NAME,
            "late1",
            "sh",
            "-c",
            // The pause before the exit: `ctr task attach` opens the stdout
            // FIFO in a goroutine of its own, and once it sees the exit its
            // deferred `task.Delete` cancels an open still pending; a line
            // written and the FIFO closed by the exit before that open is
            // lost to ctr, whatever the shim (one loaded CI run lost
            // "got=hi" and got the exit code).
            "read x; echo got=$x; sleep 0.5; exit 4",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let held = run.stdin.take(); // open, never written: ctr sees no EOF
    let out = run.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stderr),
        s.ctd.log()
    );
    std::thread::sleep(Duration::from_secs(1));
    let ls = text(&s.ctd.ctr(&["task", "ls"]).stdout);
    assert!(
        ls.lines()
            .any(|l| l.starts_with("late1") && l.contains("RUNNING")),
        "still waiting for input: {ls}"
    );
    let mut attach = s
        .ctd
        .ctr_cmd(&["task", "attach", "late1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // The input only once ctr has had time to open the stdout FIFO (in a
    // goroutine of its own, cancelled if the task exits first): written at
    // once, the answer and the exit could beat that open on a loaded
    // machine (a CI run got no output at all despite the pause below).
    std::thread::sleep(Duration::from_secs(1));
    attach.stdin.take().unwrap().write_all(b"hi\n").unwrap();
    let out = attach.wait_with_output().unwrap();
    assert!(
        text(&out.stdout).contains("got=hi"),
        "attach: {}",
        text(&out.stdout)
    );
    assert_eq!(out.status.code(), Some(4));
    drop(held);
    remove_task(&s, "late1");
}

fn remove_task(s: &Setup, id: &str) {
    let _ = s.ctd.ctr(&["task", "kill", "-s", "SIGKILL", id]);
    wait_until("the task to stop", Duration::from_secs(5), || {
        !text(&s.ctd.ctr(&["task", "ls"]).stdout)
            .lines()
            .any(|l| l.starts_with(id) && l.contains("RUNNING"))
    });
    let out = s.ctd.ctr(&["task", "delete", id]);
    // `ctr task attach` deletes the task it saw exit.
    assert!(
        out.status.success() || text(&out.stderr).contains("not found"),
        "task delete {id}: {}",
        text(&out.stderr)
    );
    let out = s.ctd.ctr(&["containers", "rm", id]);
    assert!(
        out.status.success(),
        "containers rm {id}: {}",
        text(&out.stderr)
    );
    wait_until("the shim to exit", Duration::from_secs(5), || {
        s.ctd.shim_pids().is_empty()
    });
}

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
    remove_task(&s, "fx-tw");
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

/// containerd re-creating one id (`ctr run --rm` twice, what a client that
/// deletes and re-creates a container does): each lifetime keeps its own
/// whole log through the shim, the latest as `<id>@<scope>.jsonl`.
#[test]
fn a_recreated_container_keeps_each_lifetimes_log_through_the_shim() {
    let s = setup();
    let _agent = s.start_agent();
    for round in 0..2 {
        let o = s.ctd.ctr(&run_args("again", &[], &["true"]));
        assert!(
            o.status.success(),
            "round {round}: {}\n{}",
            text(&o.stderr),
            s.ctd.log()
        );
    }
    let logs: Vec<std::path::PathBuf> = std::fs::read_dir(s.tw.0.join("logs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy().into_owned();
            n.starts_with("again@") && n.ends_with(".jsonl")
        })
        .collect();
    assert_eq!(logs.len(), 2, "two lifetimes: {logs:?}");
    for p in &logs {
        let v = throttlewatch_integration::read_log(p);
        assert_eq!(
            v.first().map(|r| r["type"].clone()),
            Some("start".into()),
            "{}",
            p.display()
        );
        assert_eq!(
            v.last().map(|r| r["type"].clone()),
            Some("end".into()),
            "{}",
            p.display()
        );
    }
    wait_until("the shim to exit", Duration::from_secs(5), || {
        s.ctd.shim_pids().is_empty()
    });
}
