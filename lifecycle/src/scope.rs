//! Which id space a container lives in ([`Scope`]), as each front end
//! learns it: the wrapper from its own `--root`, the shim from its
//! containerd namespace (the runc root it gives runc), the hook from the
//! command line of the runtime that runs it (runc runs the createRuntime
//! hook from `runc create` and poststop from `runc delete`, both with the
//! container's `--root`). Never from the spec: annotations are the tenant's.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use throttlewatch_core::{ContainerKey, Scope};

/// runc 1.1 global flags that take a value (`--root X`, `--root=X`, `-root X`).
pub const RUNC_GLOBAL_VALUE_FLAGS: [&str; 5] = ["root", "log", "log-format", "criu", "rootless"];

/// `--name`, `-name`, `--name=value`, `-name=value` → (name, inline value).
pub fn flag_name(a: &str) -> Option<(&str, Option<&str>)> {
    let body = a.strip_prefix("--").or_else(|| a.strip_prefix('-'))?;
    if body.is_empty() {
        return None;
    }
    Some(match body.split_once('=') {
        Some((n, v)) => (n, Some(v)),
        None => (body, None),
    })
}

/// The `--root` among runc's global flags (`args` without argv[0]; the
/// global flags end at the subcommand).
pub fn runc_root_in_args(args: &[OsString]) -> Option<PathBuf> {
    let mut i = 0;
    while i < args.len() {
        let a = args[i].to_string_lossy();
        let (name, inline) = flag_name(&a)?;
        if RUNC_GLOBAL_VALUE_FLAGS.contains(&name) {
            let v = match inline {
                Some(v) => Some(OsString::from(v)),
                None => {
                    i += 1;
                    args.get(i).cloned()
                }
            };
            if name == "root" {
                return v.map(PathBuf::from);
            }
        }
        i += 1;
    }
    None
}

/// The scope of a runc invocation: its `--root` (relative to `cwd`), or
/// runc's default root (no scope).
pub fn of_runc(root: Option<&Path>, cwd: &Path) -> Option<Scope> {
    root.and_then(|r| Scope::of_runc_root(r, cwd))
}

/// The scope of the runtime process `pid` (the hook's parent): its
/// `--root` from `/proc/<pid>/cmdline`, relative to its working directory.
/// None (runc's default root) when it gave none or cannot be read.
pub fn of_runtime_process(procfs: &Path, pid: u32) -> Option<Scope> {
    let dir = procfs.join(pid.to_string());
    let cmdline = std::fs::read(dir.join("cmdline")).ok()?;
    let cwd = std::fs::read_link(dir.join("cwd")).unwrap_or_else(|_| PathBuf::from("/"));
    of_cmdline(&cmdline, &cwd)
}

/// The scope of a runtime's NUL-separated command line (argv[0] first).
pub fn of_cmdline(cmdline: &[u8], cwd: &Path) -> Option<Scope> {
    use std::os::unix::ffi::OsStrExt;
    let args: Vec<OsString> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .skip(1)
        .map(|a| std::ffi::OsStr::from_bytes(a).to_owned())
        .collect();
    Scope::of_runc_root(&runc_root_in_args(&args)?, cwd)
}

/// The hook's container: `id` in the scope of the runtime that runs the hook.
pub fn hook_key(id: &str) -> ContainerKey {
    // SAFETY: getppid cannot fail.
    let ppid = unsafe { libc::getppid() } as u32;
    ContainerKey::new(id, of_runtime_process(Path::new("/proc"), ppid))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn root_among_the_global_flags_only() {
        let r = |a: &[&str]| runc_root_in_args(&args(a));
        assert_eq!(r(&["--root", "/a", "create", "x"]), Some("/a".into()));
        assert_eq!(
            r(&["--log", "/l", "-root=/b", "delete", "x"]),
            Some("/b".into())
        );
        assert_eq!(r(&["--debug", "create", "--root", "/c"]), None);
        assert_eq!(r(&["create", "x"]), None);
    }

    #[test]
    fn scope_of_a_command_line() {
        let cwd = Path::new("/srv");
        let of = |c: &str| of_cmdline(c.replace(' ', "\0").as_bytes(), cwd);
        assert_eq!(
            of("runc --root /tmp/A create x"),
            Scope::of_runc_root(Path::new("/tmp/A"), cwd)
        );
        assert_eq!(
            of("runc --root rel delete x"),
            Scope::of_runc_root(Path::new("/srv/rel"), cwd)
        );
        assert_ne!(
            of("runc --root /tmp/A create x"),
            of("runc --root /tmp/B create x")
        );
        assert_eq!(of("runc --root /run/runc create x"), None);
        assert_eq!(of("runc create x"), None);
        assert_eq!(of(""), None);
        // This test's own process has no --root: the default scope.
        assert_eq!(
            of_runtime_process(Path::new("/proc"), std::process::id()),
            None
        );
    }
}
