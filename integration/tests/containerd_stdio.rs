//! The shim under a real, private containerd 1.6: terminals (`ctr run -t`,
//! `ctr task exec -t`) and stdin (piped, and a writer that comes late).
//! Run `cargo build --workspace --bins` first.

use std::io::Write;
use std::process::Stdio;
use std::time::Duration;

use throttlewatch_integration::containerd::{IMAGE_NAME, SHIM_RUNTIME};
use throttlewatch_integration::shim::{run_args, setup, text, wait_until};

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
    s.remove_task("ttyx");
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
    s.remove_task("late1");
}
