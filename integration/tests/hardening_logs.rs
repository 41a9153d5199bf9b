//! Issue 11, what reaches the logs and the terminal: the `end` written after
//! the cgroup is gone, thread names with terminal escapes, and a full log
//! disk. Real agent, wrapper and runc.

use std::process::Command;
use std::time::Duration;

use throttlewatch_core::protocol::{call, Request};
use throttlewatch_integration::bundle::{text, Bundle, ContainerOpts, OciCli};
use throttlewatch_integration::daemons::{Agent, PrivateConfig};
use throttlewatch_integration::unique;

fn id(tag: &str) -> String {
    format!("tw-hard-{tag}-{}-{}", std::process::id(), unique())
}

/// Probe and kernel within 1 %, and nothing stale: the kernel's figure is
/// its counters at the group's last task exit (the probe keeps them).
fn assert_final_kernel_figure(end: &serde_json::Value, what: &str) {
    let k = end["kernel_throttled_ns"].as_u64().unwrap();
    let p = end["probe_throttled_ns"].as_u64().unwrap();
    eprintln!(
        "{what}: probe {p} ns, end.kernel {k} ns ({:.3} %)",
        (p as f64 - k as f64).abs() / k.max(1) as f64 * 100.0
    );
    assert!(
        k > 500_000_000,
        "{what}: a kernel figure that was read: {end}"
    );
    assert!(end["kernel_stale"].is_null(), "{what}: {end}");
    assert!(
        p.abs_diff(k) * 100 <= k,
        "{what}: probe {p} vs kernel {k}: {end}"
    );
}

/// Finding 9, issue 30: the `end` written at poststop after runc removed
/// the cgroup carries the kernel's final figure (it used to report 0, then
/// the last snapshot, up to a second old: 8.85 % off in a 256-process run).
#[test]
fn end_after_the_cgroup_is_gone_keeps_the_last_kernel_reading() {
    let _l = throttlewatch_integration::cpu_lock();
    let cfg = PrivateConfig::new("snapshot_interval_s = 1");
    let _agent = Agent::start(&cfg);
    let rt = OciCli::throttlewatch(&cfg);
    let b = Bundle::new(
        &id("gone"),
        &ContainerOpts::busy(1, 3).quota(20_000, 100_000),
    );
    let o = rt.run_detached(&b);
    assert!(o.status.success(), "{}", text(&o));
    rt.wait_stopped(&b.id, Duration::from_secs(30));
    // runc itself (not the wrapper, which would end the log first): the
    // cgroup is removed before the poststop hook runs.
    let o = Command::new("runc")
        .arg("--root")
        .arg(&rt.root.0)
        .args(["delete", &b.id])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let log = throttlewatch_integration::read_log(&cfg.log_of(&b.id));
    let end = throttlewatch_integration::of_type(&log, "end")[0].clone();
    assert_final_kernel_figure(&end, "runc delete after the wrapper's run -d");
}

/// `runc run` in the foreground through the wrapper: runc removes the
/// cgroup as soon as the container exits, before the poststop hook; the
/// `end` still has the kernel's final figure.
#[test]
fn foreground_runc_run_ends_with_the_kernels_final_figure() {
    let _l = throttlewatch_integration::cpu_lock();
    let cfg = PrivateConfig::new("snapshot_interval_s = 1");
    let _agent = Agent::start(&cfg);
    let rt = OciCli::throttlewatch(&cfg);
    let b = Bundle::new(&id("fg"), &ContainerOpts::busy(3, 3).quota(20_000, 100_000));
    let o = rt.run(&["run", "--bundle", b.dir().to_str().unwrap(), &b.id]);
    assert!(o.status.success(), "{}", text(&o));
    let path = cfg.log_of(&b.id);
    let t = std::time::Instant::now();
    while throttlewatch_integration::of_type(&throttlewatch_integration::read_log(&path), "end")
        .is_empty()
        && t.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = throttlewatch_integration::read_log(&path);
    let end = throttlewatch_integration::of_type(&log, "end")[0].clone();
    assert_final_kernel_figure(&end, "foreground runc run");
}

/// Finding 9: a thread name with terminal escapes is printed escaped by
/// `throttlewatch run` (it used to reach the terminal raw).
#[test]
fn thread_names_reach_the_terminal_escaped() {
    use throttlewatch_integration::bin;
    let _l = throttlewatch_integration::cpu_lock();
    let o = Command::new(bin("throttlewatch"))
        .args(["run", "--cpus", "0.2", "--", "sh", "-c"])
        .arg("printf '\\033[2Jx\\ry' > /proc/self/comm; i=0; while [ $i -lt 150000 ]; do i=$((i+1)); done")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("frozen"), "some freezes are printed: {err}");
    assert!(
        !err.contains('\u{1b}') && !err.contains('\r'),
        "raw control characters: {err:?}"
    );
    assert!(err.contains("\\u{1b}[2Jx\\ry"), "{err}");
}

/// A tmpfs of `size` mounted on `dir`, unmounted on drop.
struct SmallDisk(std::path::PathBuf);

impl SmallDisk {
    fn mount(dir: &std::path::Path, size: &str) -> SmallDisk {
        std::fs::create_dir_all(dir).unwrap();
        let o = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0750"),
                "tmpfs",
            ])
            .arg(dir)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        SmallDisk(dir.to_path_buf())
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Finding 2 (the ENOSPC part): with the log directory full, the agent keeps
/// serving, says so once per container (it used to warn for every record),
/// keeps whole lines, and counts what it could not write in `end`.
#[test]
fn full_log_disk_is_said_once_and_counted() {
    let _l = throttlewatch_integration::cpu_lock();
    let cfg = PrivateConfig::new("snapshot_interval_s = 1");
    let _disk = SmallDisk::mount(&cfg.log_dir, "256k");
    // Leave about 4 KiB: the start record and a few throttle records.
    std::fs::write(cfg.log_dir.join("filler"), vec![0u8; 252 * 1024]).unwrap();
    let agent = Agent::start(&cfg);
    let rt = OciCli::throttlewatch(&cfg);
    let b = Bundle::new(
        &id("enospc"),
        &ContainerOpts::busy(12, 4).quota(20_000, 100_000),
    );
    let o = rt.run_detached(&b);
    assert!(o.status.success(), "{}", text(&o));
    rt.wait_stopped(&b.id, Duration::from_secs(30));
    let st = call(&cfg.socket, &Request::Status, Duration::from_secs(5)).unwrap();
    assert!(st.ok, "the agent still serves: {st:?}");
    std::fs::remove_file(cfg.log_dir.join("filler")).unwrap();
    let o = rt.delete(&b.id);
    assert!(o.status.success(), "{}", text(&o));
    let said = agent.output();
    let n = said.matches("writing the log").count();
    assert_eq!(n, 1, "said once: {said}");
    let raw = std::fs::read_to_string(cfg.log_of(&b.id)).unwrap();
    for (i, l) in raw.lines().enumerate() {
        assert!(
            serde_json::from_str::<serde_json::Value>(l).is_ok(),
            "line {i} of {} is cut: {l:?}",
            raw.lines().count()
        );
    }
    let log = throttlewatch_integration::read_log(&cfg.log_of(&b.id));
    let end = throttlewatch_integration::of_type(&log, "end")[0].clone();
    let unwritten = end["unwritten_records"].as_u64().unwrap_or(0);
    let written = throttlewatch_integration::of_type(&log, "throttle").len();
    eprintln!("full disk: {written} throttle records written, {unwritten} counted unwritten");
    assert!(unwritten > 0, "{end}");
}
