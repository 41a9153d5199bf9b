//! Where the throttlewatch binaries are: next to the running executable,
//! else in PATH.

use std::path::{Path, PathBuf};

/// The OCI hook, written into specs by the modifiers.
pub const HOOK_BINARY: &str = "throttlewatch-hook";
/// The agent, started by the hook when none answers.
pub const AGENT_BINARY: &str = "throttlewatch";

/// The first executable file `name` in `$PATH`.
pub fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// `name` next to this executable, else in PATH.
pub fn beside_me_or_in_path(name: &str) -> Option<PathBuf> {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join(name)));
    beside
        .filter(|p| p.is_file())
        .or_else(|| find_in_path(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_executables_only() {
        assert!(find_in_path("sh").is_some_and(|p| p.is_absolute()));
        assert_eq!(find_in_path("no-such-binary-throttlewatch"), None);
    }
}
