//! The low-level OCI runtime: which binary, and handing over to it.

use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use throttlewatch_core::config::Config;
use throttlewatch_lifecycle::binaries::find_in_path;
use throttlewatch_lifecycle::OciState;

/// Searched in PATH, in order, when the configuration names none.
pub const DEFAULT_RUNTIMES: [&str; 2] = ["runc", "crun"];

/// Why no low-level runtime can be used; each names the `runtime` value
/// and what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error("runtime = {name:?} is this wrapper ({}); name the low-level runtime", path.display())]
    IsThisWrapper { name: String, path: PathBuf },
    #[error("runtime = {0:?}: no such executable (a path, or a name in PATH)")]
    NotFound(String),
    #[error(
        "no low-level runtime: neither runc nor crun is in PATH (set runtime in the configuration)"
    )]
    NoneInPath,
}

/// `runtime` from the configuration (a path, or a name looked up in PATH),
/// else the first of runc, crun in PATH. Never this wrapper itself.
pub fn resolve(cfg: &Config) -> Result<PathBuf, ResolveError> {
    // The same file: device and inode (through symlinks and hard links),
    // two stat calls where canonicalize costs a readlink per component.
    let id = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    let me = id(Path::new("/proc/self/exe"));
    let not_me = |p: &Path| id(p) != me;
    if !cfg.runtime.is_empty() {
        let p = if cfg.runtime.contains('/') {
            Some(PathBuf::from(&cfg.runtime)).filter(|p| p.is_file())
        } else {
            find_in_path(&cfg.runtime)
        };
        return match p {
            Some(p) if not_me(&p) => Ok(p),
            Some(path) => Err(ResolveError::IsThisWrapper {
                name: cfg.runtime.clone(),
                path,
            }),
            None => Err(ResolveError::NotFound(cfg.runtime.clone())),
        };
    }
    DEFAULT_RUNTIMES
        .iter()
        .filter_map(|n| find_in_path(n))
        .find(|p| not_me(p))
        .ok_or(ResolveError::NoneInPath)
}

/// Replace this process with the runtime; returns only on failure.
pub fn exec(runtime: &Path, argv: &[OsString]) -> std::io::Error {
    Command::new(runtime).args(argv).exec()
}

/// Run the runtime as a child (stdio inherited) and return its exit code
/// (128 + signal when it was killed).
pub fn run_child(runtime: &Path, argv: &[OsString]) -> std::io::Result<i32> {
    use std::os::unix::process::ExitStatusExt;
    let st = Command::new(runtime).args(argv).status()?;
    Ok(st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0)))
}

/// `<runtime> <global flags> state ID`: the container's OCI state (`status`,
/// `pid`, `bundle`, ...), or None when the runtime does not know it.
pub fn state(runtime: &Path, global: &[OsString], id: &str) -> Option<OciState> {
    let out = Command::new(runtime)
        .args(global)
        .arg("state")
        .arg(id)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    OciState::parse(&out.stdout).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configured_runtime_must_exist() {
        let cfg = Config {
            runtime: "/nonexistent/runc".into(),
            ..Config::default()
        };
        let e = resolve(&cfg).unwrap_err().to_string();
        assert!(
            e.contains("/nonexistent/runc") && e.contains("no such executable"),
            "{e}"
        );
        let cfg = Config {
            runtime: "/bin/true".into(),
            ..Config::default()
        };
        assert_eq!(resolve(&cfg).unwrap(), PathBuf::from("/bin/true"));
    }

    /// This executable, by its path or through a symlink, is refused.
    #[test]
    fn never_this_executable() {
        let me = std::env::current_exe().unwrap();
        let d = tempfile::tempdir().unwrap();
        let link = d.path().join("runc");
        std::os::unix::fs::symlink(&me, &link).unwrap();
        for p in [&me, &link] {
            let cfg = Config {
                runtime: p.to_string_lossy().into_owned(),
                ..Config::default()
            };
            let e = resolve(&cfg).unwrap_err().to_string();
            assert!(e.contains("is this wrapper"), "{e}");
        }
    }
}
