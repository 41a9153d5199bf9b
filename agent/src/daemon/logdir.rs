//! The log directory as a whole: a cap on its size (`log_dir_max_bytes`),
//! met by removing closed container logs oldest first, and the rotation of
//! the agent's own `agent.log` (its stdout and stderr when detached).
//!
//! A container log is closed when its last line is the `end` record, or
//! when nothing wrote it for [`ABANDONED_AFTER`] (an agent that died
//! before the end). The logs the agent holds open are never removed, nor
//! anything that is not a container log (`hook.log`, `agent.log`: they are
//! rotated instead).

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsString;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use throttlewatch_core::logfmt::rotate::{open_append, rotate_parts};
use throttlewatch_core::logfmt::Rotation;

/// The agent's output when it runs detached (`agent --detach`, the hook).
pub(crate) const AGENT_LOG: &str = "agent.log";

/// A log without its `end` that nothing wrote for this long is closed.
pub(crate) const ABANDONED_AFTER: Duration = Duration::from_secs(24 * 3600);

/// Rotated parts with no current part (a rotation in progress) count as
/// closed only after this long.
const ORPHAN_PARTS_AFTER: Duration = Duration::from_secs(60);

/// One container log: `X.jsonl` and its parts `X.jsonl.N`.
#[derive(Debug, Default)]
struct LogSet {
    files: Vec<PathBuf>,
    bytes: u64,
    /// The newest modification time among its files.
    mtime: Option<SystemTime>,
    has_current: bool,
}

/// What one sweep did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Sweep {
    pub before: u64,
    pub after: u64,
    /// The logs removed (their current part's name), oldest first.
    pub removed: Vec<String>,
}

impl Sweep {
    /// One line for agent.log.
    pub(crate) fn describe(&self, dir: &Path, max: u64) -> String {
        let mut names = self.removed.iter().take(10).cloned().collect::<Vec<_>>();
        if self.removed.len() > 10 {
            names.push(format!("and {} more", self.removed.len() - 10));
        }
        let mut s = format!(
            "throttlewatch agent: {} held {} bytes, over log_dir_max_bytes = {max}: removed {} closed logs, oldest first ({} bytes){}{}",
            dir.display(),
            self.before,
            self.removed.len(),
            self.before - self.after,
            if names.is_empty() { "" } else { ": " },
            names.join(", ")
        );
        if self.after > max {
            s.push_str(&format!(
                "; still {} bytes: open logs, hook.log and agent.log are never removed",
                self.after
            ));
        }
        s
    }
}

/// The container log a file belongs to: `X.jsonl` for `X.jsonl` and `X.jsonl.N`.
fn log_name(name: &str) -> Option<(String, bool)> {
    if name.ends_with(".jsonl") {
        return Some((name.to_string(), true));
    }
    let (base, n) = name.rsplit_once('.')?;
    (base.ends_with(".jsonl") && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .then(|| (base.to_string(), false))
}

/// The last line of `path` (read from its last 16 KiB), if any.
pub(crate) fn last_line(path: &Path) -> Option<String> {
    let mut f = std::fs::File::open(path).ok()?;
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let from = len.saturating_sub(16 * 1024);
    let mut tail = Vec::new();
    f.seek(SeekFrom::Start(from)).ok()?;
    f.read_to_end(&mut tail).ok()?;
    let text = String::from_utf8_lossy(&tail);
    text.trim_end().rsplit('\n').next().map(str::to_string)
}

/// Whether the last line of `path` is an `end` record.
fn ends_with_end(path: &Path) -> bool {
    last_line(path).is_some_and(|l| l.contains("\"type\":\"end\""))
}

/// Remove closed logs, oldest first, while `dir` holds more than `max`
/// bytes. `open`: the file names of the logs being written. None when the
/// directory is within the cap.
pub(crate) fn sweep(
    dir: &Path,
    max: u64,
    open: &HashSet<OsString>,
    now: SystemTime,
) -> std::io::Result<Option<Sweep>> {
    let mut total = 0u64;
    let mut sets: BTreeMap<String, LogSet> = BTreeMap::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let Ok(m) = e.path().symlink_metadata() else {
            continue;
        };
        if !m.is_file() {
            continue;
        }
        total += m.len();
        let name = e.file_name().to_string_lossy().into_owned();
        let Some((log, current)) = log_name(&name) else {
            continue;
        };
        let s = sets.entry(log).or_default();
        s.files.push(e.path());
        s.bytes += m.len();
        s.has_current |= current;
        let t = m.modified().ok();
        s.mtime = s.mtime.max(t);
    }
    if max == 0 || total <= max {
        return Ok(None);
    }
    let age = |s: &LogSet| s.mtime.and_then(|t| now.duration_since(t).ok());
    let mut closed: Vec<(String, LogSet)> = sets
        .into_iter()
        .filter(|(name, _)| !open.contains(&OsString::from(name)))
        .filter(|(name, s)| match s.has_current {
            true => ends_with_end(&dir.join(name)) || age(s) >= Some(ABANDONED_AFTER),
            false => age(s) >= Some(ORPHAN_PARTS_AFTER),
        })
        .collect();
    closed.sort_by(|a, b| a.1.mtime.cmp(&b.1.mtime).then(a.0.cmp(&b.0)));
    let mut out = Sweep {
        before: total,
        after: total,
        removed: vec![],
    };
    for (name, s) in closed {
        if out.after <= max {
            break;
        }
        let mut freed = 0;
        for f in &s.files {
            if let Ok(m) = f.symlink_metadata() {
                if std::fs::remove_file(f).is_ok() {
                    freed += m.len();
                }
            }
        }
        out.after -= freed.min(out.after);
        out.removed.push(name);
    }
    Ok(Some(out))
}

/// Rotate `<dir>/agent.log` when it is this process's stderr and has
/// passed the size: the file is cut into parts and stdout/stderr move to
/// a fresh `agent.log`. True when it rotated.
pub(crate) fn rotate_agent_log(dir: &Path, rot: Rotation) -> std::io::Result<bool> {
    let path = dir.join(AGENT_LOG);
    let Ok(on_disk) = path.symlink_metadata() else {
        return Ok(false);
    };
    let same = |fd: i32| {
        nix::sys::stat::fstat(fd)
            .is_ok_and(|st| st.st_ino == on_disk.ino() && st.st_dev == on_disk.dev())
    };
    if !same(2) || !rot.due(on_disk.len(), 1) {
        return Ok(false);
    }
    rotate_parts(&path, rot.keep)?;
    let f = open_append(&path)?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
    for target in [1, 2] {
        if target == 2 || same(target) {
            // SAFETY: dup2 onto the standard descriptors with a valid fd.
            if unsafe { libc::dup2(fd, target) } < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use throttlewatch_test_support::names;

    const END: &str = "{\"v\":1,\"ts\":1,\"type\":\"end\"}\n";
    const THR: &str = "{\"v\":1,\"ts\":1,\"type\":\"throttle\"}\n";

    fn write(dir: &Path, name: &str, text: &str, age_s: u64) {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        let t = SystemTime::now() - Duration::from_secs(age_s);
        std::fs::File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_modified(t)
            .unwrap();
    }

    #[test]
    fn oldest_closed_logs_go_first_and_open_ones_stay() {
        let d = tempfile::tempdir().unwrap();
        let big = THR.repeat(100); // 3200 bytes
        write(d.path(), "old.jsonl.1", &big, 500);
        write(d.path(), "old.jsonl", &(big.clone() + END), 400);
        write(d.path(), "mid.jsonl", &(big.clone() + END), 300);
        write(d.path(), "new.jsonl", &(big.clone() + END), 10);
        // Open (the agent writes it), oldest of all: never removed.
        write(d.path(), "open.jsonl", &(big.clone() + END), 9000);
        // No end, recent: another process (`run`) may be writing it.
        write(d.path(), "running.jsonl", &big, 600);
        // No end and untouched for more than a day: abandoned.
        write(d.path(), "dead.jsonl", &big, 2 * 86400);
        write(d.path(), "hook.log", &big, 99999);
        let open: HashSet<OsString> = [OsString::from("open.jsonl")].into();
        let total: u64 = 3200 * 9 + 3 * END.len() as u64 + END.len() as u64;
        // Room for all but about three logs' worth.
        let max = total - 3 * 3200;
        let s = sweep(d.path(), max, &open, SystemTime::now())
            .unwrap()
            .unwrap();
        assert_eq!(s.removed, ["dead.jsonl", "old.jsonl"], "{s:?}");
        assert!(s.after <= max, "{s:?}");
        assert_eq!(
            names(d.path()),
            [
                "hook.log",
                "mid.jsonl",
                "new.jsonl",
                "open.jsonl",
                "running.jsonl"
            ]
        );
        assert!(s.describe(d.path(), max).contains("removed 2 closed logs"));
        // Within the cap: nothing to do.
        assert_eq!(
            sweep(d.path(), total, &open, SystemTime::now()).unwrap(),
            None
        );
        // A cap nothing closed can meet: every closed log goes, open ones
        // stay, and the line says so.
        let s = sweep(d.path(), 1, &open, SystemTime::now())
            .unwrap()
            .unwrap();
        assert_eq!(s.removed, ["mid.jsonl", "new.jsonl"]);
        assert_eq!(names(d.path()), ["hook.log", "open.jsonl", "running.jsonl"]);
        assert!(s.describe(d.path(), 1).contains("never removed"));
    }

    #[test]
    fn parts_belong_to_their_log() {
        assert_eq!(log_name("a.jsonl"), Some(("a.jsonl".into(), true)));
        assert_eq!(log_name("a.jsonl.12"), Some(("a.jsonl".into(), false)));
        assert_eq!(log_name("a.jsonl.x"), None);
        assert_eq!(log_name("hook.log.1"), None);
        assert_eq!(log_name("agent.log"), None);
    }
}
