//! Containers the agent was never told about: `<state_dir>/unwatched/<escaped id>`,
//! an empty file written at create when the register failed (or was not
//! sent: `watch=false`), removed at poststop. With it the poststop hook
//! skips the unregister: a stopped agent then costs a refused (fail-closed)
//! or unwatched container one `agent_timeout_ms`, not two.

use std::fs::{DirBuilder, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use throttlewatch_core::logfmt::log_file_name;

pub const UNWATCHED_DIR: &str = "unwatched";

fn path(state_dir: &Path, id: &str) -> PathBuf {
    state_dir.join(UNWATCHED_DIR).join(log_file_name(id))
}

/// Mark `id` as never registered (0600 in a 0700 directory).
pub fn mark(state_dir: &Path, id: &str) -> std::io::Result<()> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(state_dir.join(UNWATCHED_DIR))?;
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path(state_dir, id))
        .map(drop)
}

/// Whether `id` was marked; the mark is removed.
pub fn take(state_dir: &Path, id: &str) -> bool {
    std::fs::remove_file(path(state_dir, id)).is_ok()
}

/// A successful register clears a stale mark (an id reused after a crash).
pub fn clear(state_dir: &Path, id: &str) {
    let _ = std::fs::remove_file(path(state_dir, id));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mark_take_once() {
        let d = tempfile::tempdir().unwrap();
        assert!(!take(d.path(), "a/b"));
        mark(d.path(), "a/b").unwrap();
        assert!(take(d.path(), "a/b"));
        assert!(!take(d.path(), "a/b"), "taken once");
        let m = std::fs::metadata(d.path().join(UNWATCHED_DIR)).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777,
            0o700
        );
    }
}
