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
