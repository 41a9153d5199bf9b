//! Containers the agent was never told about: `<state_dir>/unwatched/<key>`
//! ([`StateDir::unwatched_file`]), an empty file written at create when the
//! register failed (or was not sent: `watch=false`), removed at poststop.
//! With it the poststop hook skips the unregister: a stopped agent then
//! costs a refused (fail-closed) or unwatched container one
//! `agent_timeout_ms`, not two.

use throttlewatch_core::state_dir::StateDir;
use throttlewatch_core::ContainerKey;

/// Mark `id` as never registered (0600 in a 0700 directory).
pub(crate) fn mark(state: &StateDir, key: &ContainerKey) -> std::io::Result<()> {
    state.mark_unwatched(key)
}

/// Whether `id` was marked; the mark is removed.
pub(crate) fn take(state: &StateDir, key: &ContainerKey) -> bool {
    std::fs::remove_file(state.unwatched_file(key)).is_ok()
}

/// A successful register clears a stale mark (an id reused after a crash).
pub(crate) fn clear(state: &StateDir, key: &ContainerKey) {
    let _ = std::fs::remove_file(state.unwatched_file(key));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mark_take_once() {
        let d = tempfile::tempdir().unwrap();
        let st = StateDir::new(d.path());
        let k = ContainerKey::new("a/b", None);
        let other = ContainerKey::new("a/b", Some(throttlewatch_core::Scope::of_namespace("x")));
        assert!(!take(&st, &k));
        mark(&st, &k).unwrap();
        assert!(!take(&st, &other), "another scope's mark");
        assert!(take(&st, &k));
        assert!(!take(&st, &k), "taken once");
        let m = std::fs::metadata(st.unwatched_dir()).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777,
            0o700
        );
    }
}
