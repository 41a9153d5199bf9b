use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use super::*;
use throttlewatch_cgroup::Hierarchies;

/// A cgroup tree laid out as cgroupfs (v1 `cpu` at `root`): `cgroup.procs` of
/// `/c` lists `pids`.
fn fake_cgroup(root: &Path, pids: &[u32]) -> CpuCgroup {
    let mi = format!(
        "30 25 0:26 / {} rw shared:9 - cgroup cgroup rw,cpu,cpuacct\n",
        root.display()
    );
    let h = Hierarchies::from_mountinfo(&mi, |_| Some(0x27e0eb)).unwrap();
    set_procs(root, pids);
    CpuCgroup::at(&h, "/c")
}

fn set_procs(root: &Path, pids: &[u32]) {
    std::fs::create_dir_all(root.join("c")).unwrap();
    let text: String = pids.iter().map(|p| format!("{p}\n")).collect();
    std::fs::write(root.join("c/cgroup.procs"), text).unwrap();
}

/// Wait (bounded) until the watch's descriptor is readable, as the socket
/// wait does.
fn wait_readable(w: &ExitWatch) -> bool {
    let mut p = libc::pollfd {
        fd: w.fd().unwrap(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, 5000) == 1 }
}

#[test]
fn stat_field_52_is_the_wait_status() {
    // comm with a space and a ')' in it; 52 fields in all.
    let mut f: Vec<String> = (3..=52).map(|i| i.to_string()).collect();
    f[52 - 3] = "768".into(); // exited with 3
    let stat = format!("42 (a b) c) {}", f.join(" "));
    assert_eq!(wait_status_of_stat(&stat), Some(768));
    assert_eq!(exit_code_of_wait_status(768), 3);
    assert_eq!(exit_code_of_wait_status(9), 137); // SIGKILL
    assert_eq!(wait_status_of_stat("42 (short) S 1"), None);
}

/// An init that exits while a second process stays in the cgroup: not ended
/// until the cgroup empties; then ended with reason `exit` and, the zombie
/// not reaped yet when looked at, its exit code.
#[test]
fn ends_when_the_init_has_exited_and_the_cgroup_is_empty() {
    let d = tempfile::tempdir().unwrap();
    let mut child = Command::new("sh")
        .args(["-c", "read x; exit 7"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let g = fake_cgroup(d.path(), &[pid, 1]);
    let mut w = ExitWatch::new();
    w.arm(5, pid, &g, EndReason::Exit);
    assert!(!w.lingering(), "a running init is not exited");
    drop(child.stdin.take()); // EOF: the shell exits 7
    assert!(wait_readable(&w), "the pidfd did not become readable");
    w.collect();
    assert!(w.lingering());
    assert_eq!(
        w.ended(|_| Some(&g)),
        vec![],
        "pid 1 is still in the cgroup"
    );
    set_procs(d.path(), &[]);
    // Emptied: left two periods (no bandwidth files here: 2 x 100 ms) for
    // the kernel's last throttled time.
    assert_eq!(w.ended(|_| Some(&g)), vec![], "ended before it settled");
    std::thread::sleep(Duration::from_millis(250));
    let got = w.ended(|_| Some(&g));
    assert_eq!(
        got.iter()
            .map(|e| (e.id, e.reason, e.exit_code))
            .collect::<Vec<_>>(),
        vec![(5, EndReason::Exit, Some(7))]
    );
    assert!(!w.lingering());
    child.wait().unwrap();
}

/// A pid that is gone, or not in the container's cgroup (a reused number),
/// counts as exited at once, with no exit code; a disarmed one is forgotten.
#[test]
fn a_gone_or_foreign_pid_is_exited_and_disarm_forgets() {
    let d = tempfile::tempdir().unwrap();
    let mut gone = Command::new("true").spawn().unwrap();
    let gone_pid = gone.id();
    gone.wait().unwrap();
    let g = fake_cgroup(d.path(), &[]);
    let mut w = ExitWatch::new();
    w.arm(1, gone_pid, &g, EndReason::EndedWhileAgentDown);
    w.arm(2, std::process::id(), &g, EndReason::Exit); // alive, not a member
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    set_procs(d.path(), &[child.id()]);
    w.arm(3, child.id(), &g, EndReason::Exit);
    w.disarm(3);
    set_procs(d.path(), &[]);
    assert!(w.ended(|_| Some(&g)).is_empty(), "ended before it settled");
    std::thread::sleep(Duration::from_millis(250));
    let got = w.ended(|_| Some(&g));
    assert_eq!(
        got.iter()
            .map(|e| (e.id, e.reason, e.exit_code))
            .collect::<Vec<_>>(),
        vec![
            (1, EndReason::EndedWhileAgentDown, None),
            (2, EndReason::Exit, None)
        ]
    );
    child.kill().unwrap();
    child.wait().unwrap();
    // The disarmed pidfd was closed: nothing becomes readable.
    let t = Instant::now();
    w.collect();
    assert!(w.ended(|_| Some(&g)).is_empty());
    assert!(t.elapsed() < Duration::from_secs(1));
}
