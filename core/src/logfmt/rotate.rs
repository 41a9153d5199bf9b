//! Size-based rotation of the files in the log directory: `X` becomes
//! `X.1`, `X.1` becomes `X.2`, … up to the kept count; the oldest part goes.
//! The report's reader reads `X.N` … `X.1`, then `X` as one log, so parts
//! are always numbered without a gap.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// When a log is cut, and how many cut parts are kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rotation {
    /// A part is cut before it would pass this many bytes; 0: never.
    pub max_bytes: u64,
    /// Rotated parts kept (`X.1` … `X.keep`); 0: the file starts over.
    pub keep: u32,
}

impl Rotation {
    pub const NONE: Rotation = Rotation {
        max_bytes: 0,
        keep: 0,
    };

    /// Whether `len` bytes on disk plus `more` would pass the limit.
    pub fn due(&self, len: u64, more: u64) -> bool {
        self.max_bytes > 0 && len > 0 && len + more > self.max_bytes
    }
}

/// `X.n`.
pub fn part(path: &Path, n: u32) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{n}"));
    PathBuf::from(s)
}

/// Shift the parts: `X.keep` (and any higher, left by a larger kept count)
/// is removed, `X.n` becomes `X.n+1`, `X` becomes `X.1`. With `keep` 0, `X`
/// is removed. The caller then creates a fresh `X`.
pub fn rotate_parts(path: &Path, keep: u32) -> std::io::Result<()> {
    remove_parts_from(path, keep.max(1))?;
    if keep == 0 {
        return ignore_missing(std::fs::remove_file(path));
    }
    for n in (1..keep).rev() {
        ignore_missing(std::fs::rename(part(path, n), part(path, n + 1)))?;
    }
    std::fs::rename(path, part(path, 1))
}

/// Remove `X.from`, `X.from+1`, … while they exist (a new log of the same
/// name must not inherit an older container's parts).
pub fn remove_parts_from(path: &Path, from: u32) -> std::io::Result<()> {
    let mut n = from;
    loop {
        match std::fs::remove_file(part(path, n)) {
            Ok(()) => n += 1,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        }
    }
}

fn ignore_missing(r: std::io::Result<()>) -> std::io::Result<()> {
    match r {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// Open `path` to append (0640, never through a symlink).
pub fn open_append(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o640)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Append `bytes` to a text log that several processes write (`hook.log`):
/// under an exclusive `flock` of the file, rotated first when the append
/// would pass `rot.max_bytes`. A writer that finds the name moved on to a
/// new file (another process rotated it) reopens.
pub fn append_capped(path: &Path, bytes: &[u8], rot: Rotation) -> std::io::Result<()> {
    for _ in 0..4 {
        let mut f = open_append(path)?;
        let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
        // SAFETY: flock on a descriptor we own; released when `f` closes.
        if unsafe { libc::flock(fd, libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let held = f.metadata()?;
        match std::fs::symlink_metadata(path) {
            Ok(now) if now.ino() == held.ino() && now.dev() == held.dev() => {}
            _ => continue,
        }
        if rot.due(held.len(), bytes.len() as u64) {
            rotate_parts(path, rot.keep)?;
            continue;
        }
        return f.write_all(bytes);
    }
    Err(std::io::Error::other(format!(
        "{}: rotated by others while appending",
        path.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use throttlewatch_test_support::names;

    #[test]
    fn parts_shift_and_the_kept_count_holds() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.jsonl");
        for i in 0..5 {
            std::fs::write(&p, format!("{i}")).unwrap();
            rotate_parts(&p, 2).unwrap();
        }
        assert_eq!(names(d.path()), ["a.jsonl.1", "a.jsonl.2"]);
        assert_eq!(std::fs::read_to_string(part(&p, 1)).unwrap(), "4");
        assert_eq!(std::fs::read_to_string(part(&p, 2)).unwrap(), "3");
        // A smaller kept count later removes the parts beyond it.
        std::fs::write(&p, "5").unwrap();
        rotate_parts(&p, 1).unwrap();
        assert_eq!(names(d.path()), ["a.jsonl.1"]);
        std::fs::write(&p, "6").unwrap();
        rotate_parts(&p, 0).unwrap();
        assert_eq!(names(d.path()), Vec::<String>::new());
    }

    #[test]
    fn append_capped_rotates_at_the_size() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("hook.log");
        let rot = Rotation {
            max_bytes: 100,
            keep: 2,
        };
        for i in 0..30 {
            append_capped(&p, format!("line {i:02} .........\n").as_bytes(), rot).unwrap();
        }
        assert_eq!(names(d.path()), ["hook.log", "hook.log.1", "hook.log.2"]);
        for f in names(d.path()) {
            let len = std::fs::metadata(d.path().join(&f)).unwrap().len();
            assert!(len <= 100 && len > 0, "{f}: {len}");
        }
        let newest = std::fs::read_to_string(&p).unwrap();
        assert!(newest.ends_with("line 29 .........\n"), "{newest}");
    }

    #[test]
    fn no_rotation_when_unlimited() {
        assert!(!Rotation::NONE.due(1 << 40, 1));
        assert!(!Rotation {
            max_bytes: 10,
            keep: 1
        }
        .due(0, 100));
    }
}

/// Separates a log's name from its lifetime in an earlier lifetime's name:
/// `X.jsonl` becomes `X+<start ts>.jsonl`. Neither [`crate::logfmt::escape_id`]
/// nor a scope ever emits it.
pub const LIFETIME_SEPARATOR: char = '+';

/// Before a new lifetime of a container opens `X.jsonl`: keep the earlier
/// lifetime's log (and its parts) as `X+<ts>.jsonl[.N]`, `ts` its first
/// record's (its `start`), else the file's modification time. Nothing when
/// `X.jsonl` is missing, empty or not a regular file (a symlink is left
/// alone; the open then refuses it). Returns the new name of the earlier log.
pub fn keep_earlier_lifetime(path: &Path) -> std::io::Result<Option<PathBuf>> {
    let m = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    if !m.is_file() || m.len() == 0 {
        return Ok(None);
    }
    let Some(stem) = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_suffix(".jsonl"))
    else {
        return Ok(None);
    };
    let ts = first_ts(path).unwrap_or_else(|| {
        m.modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut to = dir.join(format!("{stem}{LIFETIME_SEPARATOR}{ts}.jsonl"));
    let mut n = 1;
    while std::fs::symlink_metadata(&to).is_ok() {
        to = dir.join(format!("{stem}{LIFETIME_SEPARATOR}{ts}-{n}.jsonl"));
        n += 1;
    }
    // The parts first: a crash in between leaves the current part named as
    // it was, which the next lifetime then keeps the same way.
    let mut k = 1;
    while std::fs::symlink_metadata(part(path, k)).is_ok_and(|m| m.is_file()) {
        std::fs::rename(part(path, k), part(&to, k))?;
        k += 1;
    }
    std::fs::rename(path, &to)?;
    Ok(Some(to))
}

/// The `ts` of a log's first line.
fn first_ts(path: &Path) -> Option<u64> {
    use std::io::{BufRead, BufReader, Read};
    let f = File::open(path).ok()?;
    let mut line = String::new();
    BufReader::new(f.take(64 * 1024))
        .read_line(&mut line)
        .ok()?;
    #[derive(serde::Deserialize)]
    struct Ts {
        ts: u64,
    }
    serde_json::from_str::<Ts>(&line).ok().map(|t| t.ts)
}

#[cfg(test)]
mod lifetime_tests {
    use super::*;

    #[test]
    fn an_earlier_lifetime_is_kept_whole_under_its_start_time() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("web@ns-k8s.io.jsonl");
        assert_eq!(keep_earlier_lifetime(&log).unwrap(), None, "nothing yet");
        std::fs::write(
            &log,
            "{\"v\":1,\"ts\":17,\"type\":\"start\"}\n{\"type\":\"end\"}\n",
        )
        .unwrap();
        std::fs::write(part(&log, 1), "older part\n").unwrap();
        std::fs::write(part(&log, 2), "oldest part\n").unwrap();
        let kept = keep_earlier_lifetime(&log).unwrap().unwrap();
        assert_eq!(kept, d.path().join("web@ns-k8s.io+17.jsonl"));
        assert!(!log.exists() && !part(&log, 1).exists() && !part(&log, 2).exists());
        assert!(std::fs::read_to_string(&kept).unwrap().contains("\"end\""));
        assert_eq!(
            std::fs::read_to_string(part(&kept, 1)).unwrap(),
            "older part\n"
        );
        assert_eq!(
            std::fs::read_to_string(part(&kept, 2)).unwrap(),
            "oldest part\n"
        );
        // A second lifetime that began in the same nanosecond: a suffix, nothing replaced.
        std::fs::write(&log, "{\"v\":1,\"ts\":17,\"type\":\"start\"}\n").unwrap();
        let again = keep_earlier_lifetime(&log).unwrap().unwrap();
        assert_eq!(again, d.path().join("web@ns-k8s.io+17-1.jsonl"));
        assert!(kept.exists());
    }

    #[test]
    fn unreadable_first_lines_use_the_file_time_and_symlinks_are_left_alone() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("c1.jsonl");
        std::fs::write(&log, "not json\n").unwrap();
        let kept = keep_earlier_lifetime(&log).unwrap().unwrap();
        let name = kept.file_name().unwrap().to_string_lossy().into_owned();
        let ts: u64 = name["c1+".len()..name.len() - ".jsonl".len()]
            .parse()
            .unwrap();
        assert!(ts > 1_700_000_000_000_000_000, "{name}");
        std::fs::write(d.path().join("target"), "x").unwrap();
        std::os::unix::fs::symlink(d.path().join("target"), &log).unwrap();
        assert_eq!(keep_earlier_lifetime(&log).unwrap(), None);
        assert!(log.symlink_metadata().unwrap().file_type().is_symlink());
        std::fs::remove_file(&log).unwrap();
        std::fs::write(&log, "").unwrap();
        assert_eq!(
            keep_earlier_lifetime(&log).unwrap(),
            None,
            "an empty log is no lifetime"
        );
    }
}
