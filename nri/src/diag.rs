//! The plugin's diagnostic lines (never the containers' logs): one line
//! each on stderr, never a terminal escape or a forged second line.
//!
//! A plugin the runtime launched from its plugin directory has no useful
//! stderr: NRI's launcher (`pkg/adaptation/plugin.go`, `newLaunchedPlugin`)
//! starts it with no output set, so its stderr is `/dev/null`. Such a
//! plugin holds its lines ([`hold`]) until `Configure` has told it the
//! node's configuration, then appends them, and every later one, to a file
//! ([`log_to`]): the `log` key of its plugin configuration, or
//! [`LOG_FILE`] in the node's `log_dir`.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use crate::NAME;

/// The file a launched plugin writes its lines to, in the node's `log_dir`.
pub const LOG_FILE: &str = "throttlewatch-nri.log";
/// How many lines a launched plugin holds before it has its file (the
/// oldest go first).
pub const HELD_LINES: usize = 200;

enum Sink {
    /// stderr only.
    Stderr,
    /// Lines held until the file is known (and on stderr).
    Held(Vec<String>),
    /// Appended to this file (and on stderr).
    File { path: PathBuf, file: File },
}

static SINK: Mutex<Sink> = Mutex::new(Sink::Stderr);

fn line(msg: &str) -> String {
    format!("{NAME}: {}", throttlewatch_core::printable::printable(msg))
}

/// Say `msg`.
pub fn say(msg: &str) {
    let l = line(msg);
    eprintln!("{l}");
    let mut sink = SINK.lock().unwrap_or_else(PoisonError::into_inner);
    match &mut *sink {
        Sink::Stderr => {}
        Sink::Held(lines) => {
            if lines.len() == HELD_LINES {
                lines.remove(0);
            }
            lines.push(l);
        }
        Sink::File { file, .. } => {
            let _ = writeln!(file, "{l}");
        }
    }
}

/// Hold the lines from now on until [`log_to`] names their file (a
/// plugin the runtime launched).
pub fn hold() {
    let mut sink = SINK.lock().unwrap_or_else(PoisonError::into_inner);
    if matches!(*sink, Sink::Stderr) {
        *sink = Sink::Held(Vec::new());
    }
}

/// Whether lines go to a file or are held for one (a launched plugin).
pub fn to_file() -> bool {
    !matches!(
        *SINK.lock().unwrap_or_else(PoisonError::into_inner),
        Sink::Stderr
    )
}

/// Append the held lines and every later one to `path` (created 0640, its
/// directory 0750 if missing; a symbolic link is not followed). The same
/// file again changes nothing; on an error the lines stay where they went.
pub fn log_to(path: &Path) -> io::Result<()> {
    let mut sink = SINK.lock().unwrap_or_else(PoisonError::into_inner);
    if matches!(&*sink, Sink::File { path: p, .. } if p == path) {
        return Ok(());
    }
    let file = open(path)?;
    let held = match std::mem::replace(&mut *sink, Sink::Stderr) {
        Sink::Held(lines) => lines,
        _ => Vec::new(),
    };
    let mut file = file;
    for l in &held {
        let _ = writeln!(file, "{l}");
    }
    *sink = Sink::File {
        path: path.to_path_buf(),
        file,
    };
    Ok(())
}

fn open(path: &Path) -> io::Result<File> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o750)
                .create(dir)?;
        }
    }
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o640)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// One test for the process-wide sink: held lines reach the file with
    /// the later ones, escapes made printable, a link refused.
    #[test]
    fn held_lines_reach_the_file() {
        let d = tempfile::tempdir().unwrap();
        hold();
        assert!(to_file());
        say("before the file");
        say("a forged\nsecond line");
        let path = d.path().join("logs/throttlewatch-nri.log");
        log_to(&path).unwrap();
        say("after it");
        log_to(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            text.lines().collect::<Vec<_>>(),
            [
                "throttlewatch-nri: before the file",
                "throttlewatch-nri: a forged\\nsecond line",
                "throttlewatch-nri: after it",
            ]
        );
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o640);
        let link = d.path().join("link.log");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let e = log_to(&link).unwrap_err().to_string();
        assert!(e.starts_with(&link.display().to_string()), "{e}");
        say("still to the first file");
        assert!(std::fs::read_to_string(&path)
            .unwrap()
            .ends_with("throttlewatch-nri: still to the first file\n"));
    }
}
