//! Helpers for the end-to-end tests: where the built binaries are, a lock
//! that keeps CPU-measuring tests apart, and RAII guards for what tests start.

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

pub mod bundle;
pub mod containerd;
pub mod cri;
pub mod crio;
pub mod daemons;
pub mod fixtures;
pub mod kubelet;
pub mod modern_node;
pub mod nri_plugin;
pub mod podman;
pub mod private_dockerd;
pub mod prometheus;
pub mod shim;
pub mod trees;

/// A binary of this workspace, built by `cargo build --workspace` (the test
/// command does that first); next to the test executable's `deps/` folder,
/// or in `$TW_TEST_BIN_DIR` when set (benchmarks run release builds).
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = match std::env::var_os("TW_TEST_BIN_DIR").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => exe
            .parent()
            .and_then(|d| d.parent())
            .expect("target dir")
            .to_path_buf(),
    };
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} is not built: run `cargo build --workspace --bins` first",
        p.display()
    );
    p
}

static CPU_LOCK: Mutex<()> = Mutex::new(());

/// The interpreter behind `python3` (its `sys.executable`), resolved once.
/// A version manager's `python3` on PATH may be a shell script (pyenv's
/// shim: ~0.3 s of CPU in bash and its helpers before Python starts), which
/// a workload under a small quota would spend frozen before its first
/// wake-up, and whose helper processes add wake-ups of their own.
pub fn python3() -> &'static std::path::Path {
    static PY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PY.get_or_init(|| {
        let out = std::process::Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .expect("python3 on PATH");
        assert!(out.status.success(), "python3: {out:?}");
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
}

/// Tests that measure CPU time against the kernel take this lock, so no two
/// run at once inside one test binary.
pub fn cpu_lock() -> MutexGuard<'static, ()> {
    CPU_LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fresh scratch directory under /tmp, removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("tw-{tag}-{}-{}", std::process::id(), unique()));
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::SeqCst)
}

/// Parse the JSONL log into JSON values. A last line without its newline
/// is one the agent is writing (tests read live logs): left out, as a
/// reader of a growing log does; every complete line must parse.
pub fn read_log(path: &std::path::Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let complete = match text.rfind('\n') {
        Some(i) => &text[..=i],
        None => "",
    };
    complete
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad log line {l}: {e}")))
        .collect()
}

/// Terminal text with its rows joined and every run of blanks one space:
/// what a phrase is matched in when the report wraps rows to the
/// terminal's width (80 columns in a pipe).
pub fn squash(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The exact p99 of a log's freezes (its `throttle` records' `frozen_ns`,
/// every freeze where the threshold is 0), in seconds.
pub fn log_p99_freeze(path: &std::path::Path) -> f64 {
    let mut f: Vec<u64> = read_log(path)
        .iter()
        .filter(|r| r["type"] == "throttle")
        .filter_map(|r| r["frozen_ns"].as_u64())
        .collect();
    assert!(!f.is_empty(), "no throttle records in {}", path.display());
    f.sort_unstable();
    f[((f.len() as f64 * 0.99).ceil() as usize).clamp(1, f.len()) - 1] as f64 / 1e9
}

/// Panics with the process's stderr unless it exited 0.
#[track_caller]
pub fn assert_ok(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `throttlewatch report --json LOG EXTRA..` (LOG: a log file or a folder
/// of them), parsed; panics with its stderr when it fails.
pub fn report_json(log: &std::path::Path, extra: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new(bin("throttlewatch"))
        .args(["report", "--json", log.to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap();
    assert_ok(&out);
    serde_json::from_slice(&out.stdout).unwrap()
}

pub fn of_type<'a>(log: &'a [serde_json::Value], t: &str) -> Vec<&'a serde_json::Value> {
    log.iter().filter(|v| v["type"] == t).collect()
}

/// One whole lifetime's log: `start` first, `end` last, one `start`.
/// Waits up to 10 s for the `end` (written once the runtime's delete or
/// poststop reached the agent). Returns the records.
pub fn assert_whole_log(p: &std::path::Path) -> Vec<serde_json::Value> {
    let t = std::time::Instant::now();
    while of_type(&read_log(p), "end").is_empty()
        && t.elapsed() < std::time::Duration::from_secs(10)
    {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let log = read_log(p);
    let ty = |r: Option<&serde_json::Value>| r.map(|r| r["type"].clone());
    assert_eq!(ty(log.first()), Some("start".into()), "{}", p.display());
    assert_eq!(ty(log.last()), Some("end".into()), "{}", p.display());
    assert_eq!(of_type(&log, "start").len(), 1, "{}", p.display());
    log
}

/// Start `tw-burn ARGS` and move it (every thread: on v1 threads created
/// before the move would stay behind) into `cg`.
pub fn burn_in(cg: &throttlewatch_cgroup::TransientCgroup, args: &[&str]) -> std::process::Child {
    let c = std::process::Command::new(bin("tw-burn"))
        .args(args)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("tw-burn");
    cg.group
        .add_pid(c.id())
        .expect("move tw-burn into its cgroup");
    for t in std::fs::read_dir(format!("/proc/{}/task", c.id()))
        .into_iter()
        .flatten()
        .flatten()
    {
        let _ = std::fs::write(
            cg.group.cpu_dir.join("tasks"),
            t.file_name().to_string_lossy().as_bytes(),
        );
    }
    c
}

/// The most CPU weight for the group at `cpu_dir` (`cpu.shares` on v1,
/// `cpu.weight` on v2), so it reaches its quota on a loaded machine.
pub fn max_cpu_weight(cpu_dir: &std::path::Path) {
    let (file, weight) = match cpu_dir.join("cpu.shares").exists() {
        true => ("cpu.shares", "262144"),
        false => ("cpu.weight", "10000"),
    };
    std::fs::write(cpu_dir.join(file), weight)
        .unwrap_or_else(|e| panic!("{}/{file}: {e}", cpu_dir.display()));
}

/// A binary of `../shared/bin` (containerd 2.x, its ctr and runc shim,
/// critest, crictl; static, built from source): `$TW_SHARED_BIN`, else
/// `../shared/bin` beside the checkout, else /work/shared/bin. Panics when
/// none has it: the tests that need containerd 2.x must not pass without it.
pub fn shared_bin(name: &str) -> PathBuf {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dirs: Vec<PathBuf> = std::env::var_os("TW_SHARED_BIN")
        .map(PathBuf::from)
        .into_iter()
        .chain([repo.join("../shared/bin"), "/work/shared/bin".into()])
        .collect();
    dirs.iter()
        .map(|d| d.join(name))
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!("{name}: not in $TW_SHARED_BIN, ../shared/bin or /work/shared/bin ({dirs:?})")
        })
}
