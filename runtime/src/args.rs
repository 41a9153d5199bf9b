//! runc's command line, parsed just enough to find the subcommand, the
//! bundle of `create`/`run`, the container id and the `--log` settings.
//! Everything is kept as given: the low-level runtime gets the same argv.

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;

/// Our own global flag (e.g. from dockerd's `runtimeArgs`); removed before
/// the low-level runtime sees the arguments.
pub const CONFIG_FLAG: &str = "--throttlewatch-config";

use throttlewatch_lifecycle::scope::{flag_name, RUNC_GLOBAL_VALUE_FLAGS as GLOBAL_VALUE_FLAGS};
use throttlewatch_lifecycle::{ContainerKey, Scope};

/// Subcommand flags that take a value, for `create`, `run` and `update`
/// (so that a value is never mistaken for the container id).
const SUB_VALUE_FLAGS: [&str; 21] = [
    "bundle",
    "b",
    "console-socket",
    "pid-file",
    "preserve-fds",
    "resources",
    "r",
    "blkio-weight",
    "cpu-period",
    "cpu-quota",
    "cpu-rt-period",
    "cpu-rt-runtime",
    "cpu-share",
    "cpuset-cpus",
    "cpuset-mems",
    "kernel-memory",
    "kernel-memory-tcp",
    "memory",
    "memory-reservation",
    "memory-swap",
    "pids-limit",
];

/// The runc subcommands the wrapper does work for; every other one is
/// passed through as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subcommand {
    Create,
    Run,
    Start,
    Update,
    Delete,
    /// Anything else (state, kill, exec, ...), or none: passed through.
    Other,
}

impl Subcommand {
    pub fn of(name: Option<&str>) -> Subcommand {
        match name {
            Some("create") => Subcommand::Create,
            Some("run") => Subcommand::Run,
            Some("start") => Subcommand::Start,
            Some("update") => Subcommand::Update,
            Some("delete") => Subcommand::Delete,
            _ => Subcommand::Other,
        }
    }

    /// `create` and `run` make a container.
    pub fn creates(self) -> bool {
        matches!(self, Subcommand::Create | Subcommand::Run)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuncArgs {
    /// The arguments for the low-level runtime (without argv[0]; our own flag removed).
    pub argv: Vec<OsString>,
    /// Index in `argv` of the subcommand.
    pub subcommand_at: Option<usize>,
    pub root: Option<PathBuf>,
    pub log: Option<PathBuf>,
    pub log_format: Option<String>,
    /// `--throttlewatch-config FILE`.
    pub config: Option<PathBuf>,
}

impl RuncArgs {
    pub fn parse(args: &[OsString]) -> RuncArgs {
        let mut r = RuncArgs::default();
        let mut i = 0;
        while i < args.len() {
            let a = args[i].to_string_lossy();
            if r.subcommand_at.is_none() {
                if a == CONFIG_FLAG {
                    r.config = args.get(i + 1).map(PathBuf::from);
                    i += 2;
                    continue;
                }
                if let Some(v) = a.strip_prefix(&format!("{CONFIG_FLAG}=")) {
                    r.config = Some(PathBuf::from(v));
                    i += 1;
                    continue;
                }
                if let Some((name, inline)) = flag_name(&a) {
                    r.argv.push(args[i].clone());
                    if GLOBAL_VALUE_FLAGS.contains(&name) {
                        let v = match inline {
                            Some(v) => Some(v.to_string()),
                            None => {
                                i += 1;
                                args.get(i)
                                    .inspect(|v| r.argv.push((*v).clone()))
                                    .map(|v| v.to_string_lossy().into_owned())
                            }
                        };
                        match name {
                            "root" => r.root = v.map(PathBuf::from),
                            "log" => r.log = v.map(PathBuf::from),
                            "log-format" => r.log_format = v,
                            _ => {}
                        }
                    }
                    i += 1;
                    continue;
                }
                r.subcommand_at = Some(r.argv.len());
            }
            r.argv.push(args[i].clone());
            i += 1;
        }
        r
    }

    /// The id space of the containers this runc works on: its `--root`.
    pub fn scope(&self) -> Option<Scope> {
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        throttlewatch_lifecycle::scope::of_runc(self.root.as_deref(), &cwd)
    }

    /// The container of `update`/`delete`, keyed by (scope, id).
    pub fn container_key(&self) -> Option<ContainerKey> {
        let id = self.container_id()?.to_string_lossy().into_owned();
        Some(ContainerKey::new(id, self.scope()))
    }

    pub fn subcommand(&self) -> Option<&str> {
        self.subcommand_at.and_then(|i| self.argv[i].to_str())
    }

    /// The subcommand as the wrapper acts on it, parsed once.
    pub fn command(&self) -> Subcommand {
        Subcommand::of(self.subcommand())
    }

    /// The global flags, as given (everything before the subcommand).
    pub fn global_args(&self) -> &[OsString] {
        &self.argv[..self.subcommand_at.unwrap_or(self.argv.len())]
    }

    /// Whether a boolean subcommand flag (`--force`, `-f`) is present.
    pub fn has_sub_flag(&self, names: &[&str]) -> bool {
        self.sub_args()
            .iter()
            .map(|a| a.to_string_lossy())
            .take_while(|a| a != "--")
            .any(|a| {
                flag_name(&a)
                    .is_some_and(|(n, v)| names.contains(&n) && v.is_none_or(|v| v == "true"))
            })
    }

    fn sub_args(&self) -> &[OsString] {
        self.subcommand_at
            .map(|i| &self.argv[i + 1..])
            .unwrap_or_default()
    }

    /// The value of a subcommand flag (`--bundle X`, `-b=X`, ...).
    pub fn sub_flag(&self, names: &[&str]) -> Option<OsString> {
        let a = self.sub_args();
        let mut i = 0;
        while i < a.len() {
            let s = a[i].to_string_lossy();
            if s == "--" {
                return None;
            }
            if let Some((n, inline)) = flag_name(&s) {
                if names.contains(&n) {
                    return match inline {
                        Some(v) => Some(OsString::from(v)),
                        None => a.get(i + 1).cloned(),
                    };
                }
                if SUB_VALUE_FLAGS.contains(&n) && inline.is_none() {
                    i += 1;
                }
            }
            i += 1;
        }
        None
    }

    /// The bundle of `create`/`run`: `--bundle`/`-b`, default the current directory.
    pub fn bundle(&self) -> std::io::Result<PathBuf> {
        let b = match self.sub_flag(&["bundle", "b"]) {
            Some(b) => PathBuf::from(b),
            None => PathBuf::from("."),
        };
        if b.is_absolute() {
            Ok(b)
        } else {
            Ok(std::env::current_dir()?.join(b))
        }
    }

    /// The first positional argument of the subcommand: the container id.
    pub fn container_id(&self) -> Option<&OsStr> {
        let a = self.sub_args();
        let mut i = 0;
        while i < a.len() {
            let s = a[i].to_string_lossy();
            if s == "--" {
                return a.get(i + 1).map(OsString::as_os_str);
            }
            match flag_name(&s) {
                Some((n, inline)) => {
                    if SUB_VALUE_FLAGS.contains(&n) && inline.is_none() {
                        i += 1;
                    }
                }
                None => return Some(a[i].as_os_str()),
            }
            i += 1;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(a: &[&str]) -> RuncArgs {
        RuncArgs::parse(&a.iter().map(OsString::from).collect::<Vec<_>>())
    }

    #[test]
    fn containerd_create_line() {
        let r = p(&[
            "--root",
            "/run/containerd/runc/moby",
            "--log",
            "/b/log.json",
            "--log-format",
            "json",
            "--systemd-cgroup",
            "create",
            "--bundle",
            "/b",
            "--pid-file",
            "/b/init.pid",
            "abc",
        ]);
        assert_eq!(r.subcommand(), Some("create"));
        assert_eq!(r.root, Some(PathBuf::from("/run/containerd/runc/moby")));
        assert_eq!(r.log, Some(PathBuf::from("/b/log.json")));
        assert_eq!(r.log_format.as_deref(), Some("json"));
        assert_eq!(r.bundle().unwrap(), PathBuf::from("/b"));
        assert_eq!(r.container_id(), Some(OsStr::new("abc")));
        assert_eq!(r.argv.len(), 13);
    }

    #[test]
    fn equals_and_single_dash_forms() {
        let r = p(&["-root=/r", "--log=/l", "run", "-d", "-b=/x", "id"]);
        assert_eq!(
            (r.root.clone().unwrap(), r.log.clone().unwrap()),
            (PathBuf::from("/r"), PathBuf::from("/l"))
        );
        assert_eq!(r.subcommand(), Some("run"));
        assert_eq!(r.bundle().unwrap(), PathBuf::from("/x"));
        assert_eq!(r.container_id(), Some(OsStr::new("id")));
    }

    #[test]
    fn our_flag_is_removed_and_the_rest_untouched() {
        let r = p(&[
            "--throttlewatch-config",
            "/etc/tw.toml",
            "--root",
            "/r",
            "update",
            "--resources",
            "-",
            "c1",
        ]);
        assert_eq!(r.config, Some(PathBuf::from("/etc/tw.toml")));
        let want: Vec<OsString> = ["--root", "/r", "update", "--resources", "-", "c1"]
            .iter()
            .map(OsString::from)
            .collect();
        assert_eq!(r.argv, want);
        assert_eq!(r.container_id(), Some(OsStr::new("c1")));
        let r = p(&["--throttlewatch-config=/x", "state", "c"]);
        assert_eq!(
            (r.config.clone().unwrap(), r.subcommand()),
            (PathBuf::from("/x"), Some("state"))
        );
    }

    #[test]
    fn no_subcommand_and_default_bundle() {
        assert_eq!(p(&["--version"]).subcommand(), None);
        assert_eq!(p(&["--version"]).command(), Subcommand::Other);
        assert_eq!(
            p(&["--root", "/r", "create", "x"]).command(),
            Subcommand::Create
        );
        assert!(p(&["run", "x"]).command().creates());
        assert!(!p(&["state", "x"]).command().creates());
        let r = p(&["create", "c"]);
        assert_eq!(r.bundle().unwrap(), std::env::current_dir().unwrap());
        let r = p(&["--root", "/r", "delete", "-f", "c"]);
        assert!(r.has_sub_flag(&["force", "f"]));
        assert_eq!(
            r.global_args(),
            [OsString::from("--root"), OsString::from("/r")]
        );
        assert!(!p(&["delete", "c"]).has_sub_flag(&["force", "f"]));
        let r = p(&["update", "--cpu-quota", "30000", "c"]);
        assert_eq!(r.container_id(), Some(OsStr::new("c")));
    }
}
