//! `--restart none|signal|systemd`: make the engine load what install or
//! uninstall wrote.
//!
//! - containerd loads runtimes only at start: `systemd` runs `systemctl
//!   restart containerd` (running containers keep running: their shims
//!   outlive containerd). `signal` is refused: containerd reloads nothing on
//!   SIGHUP and does not handle it, so the default action would kill it.
//! - dockerd reloads `runtimes` from daemon.json on SIGHUP: `signal` sends
//!   SIGHUP to the PID in `<root>/run/docker.pid` (or `/var/run/docker.pid`),
//!   `systemd` runs `systemctl reload docker` (the unit's ExecReload is that
//!   SIGHUP). Containers are not touched either way.
//! - Podman reads hooks.d at every container start: only `none`.
//! - CRI-O: `systemd` runs `systemctl restart crio`; `signal` is refused
//!   (its SIGHUP reload does not cover hooks_dir).
//!
//! With `--etc-root ROOT` other than `/` (the DaemonSet's installer, the host
//! mounted at ROOT), systemctl runs as `chroot ROOT systemctl …`: the host's
//! own systemctl, talking to the host's systemd through ROOT/run.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::engine::ContainerEngine;
use crate::CliError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restart {
    None,
    Signal,
    Systemd,
}

pub(crate) const ACCEPTED: &str = "none, signal or systemd";

impl Restart {
    pub fn parse(s: &str) -> Result<Restart, CliError> {
        match s {
            "none" => Ok(Restart::None),
            "signal" => Ok(Restart::Signal),
            "systemd" => Ok(Restart::Systemd),
            other => Err(CliError::usage(format!(
                "--restart {other:?}: accepted: {ACCEPTED}"
            ))),
        }
    }
}

/// What `mode` does for `engine`, or why it is refused (checked before anything is written).
pub(crate) fn action(engine: ContainerEngine, mode: Restart) -> Result<Option<Action>, CliError> {
    let refuse = |why: &str| {
        Err(CliError::usage(format!(
            "--restart {} for {}: {why}",
            match mode {
                Restart::None => "none",
                Restart::Signal => "signal",
                Restart::Systemd => "systemd",
            },
            engine.name()
        )))
    };
    match (engine, mode) {
        (_, Restart::None) => Ok(None),
        (ContainerEngine::Containerd, Restart::Systemd) => {
            Ok(Some(Action::Systemctl(&["restart", "containerd"])))
        }
        (ContainerEngine::Containerd, Restart::Signal) => refuse(
            "containerd loads runtimes only when it starts and does not handle SIGHUP (it would \
             exit); accepted for containerd: none or systemd (`systemctl restart containerd`)",
        ),
        (ContainerEngine::Docker, Restart::Systemd) => {
            Ok(Some(Action::Systemctl(&["reload", "docker"])))
        }
        (ContainerEngine::Docker, Restart::Signal) => Ok(Some(Action::Sighup {
            pidfiles: &["/run/docker.pid", "/var/run/docker.pid"],
            comm: "dockerd",
        })),
        (ContainerEngine::Podman, _) => refuse(
            "podman reads its hooks directory at every container start, there is nothing to \
             restart; accepted for podman: none",
        ),
        (ContainerEngine::Crio, Restart::Systemd) => {
            Ok(Some(Action::Systemctl(&["restart", "crio"])))
        }
        (ContainerEngine::Crio, Restart::Signal) => refuse(
            "CRI-O's SIGHUP reload does not cover hooks_dir; accepted for crio: none or systemd \
             (`systemctl restart crio`)",
        ),
    }
}

/// A way to make the engine load its configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// `systemctl ARGS` (in a chroot to the root when it is not `/`).
    Systemctl(&'static [&'static str]),
    /// SIGHUP to the PID in the first existing pidfile, if its command is `comm`.
    Sighup {
        pidfiles: &'static [&'static str],
        comm: &'static str,
    },
}

impl Action {
    /// The command line `Systemctl` runs under `root`.
    pub(crate) fn command(&self, root: &Path) -> Option<Vec<String>> {
        let Action::Systemctl(args) = self else {
            return None;
        };
        let mut c = Vec::new();
        if root != Path::new("/") {
            c.push("chroot".to_string());
            c.push(root.to_string_lossy().into_owned());
        }
        c.push("systemctl".into());
        c.extend(args.iter().map(|a| a.to_string()));
        Some(c)
    }

    /// Carry it out; returns what was done, for the user.
    pub(crate) fn run(&self, root: &Path) -> Result<String, CliError> {
        match self {
            Action::Systemctl(_) => {
                let c = self.command(root).expect("systemctl");
                let shown = c.join(" ");
                let out = Command::new(&c[0])
                    .args(&c[1..])
                    .output()
                    .map_err(|e| CliError::fail(format!("{shown}: {e}")))?;
                if !out.status.success() {
                    return Err(CliError::fail(format!(
                        "{shown}: {} ({}); the configuration is written, load it by hand",
                        out.status,
                        String::from_utf8_lossy(&out.stderr).trim()
                    )));
                }
                Ok(format!("ran `{shown}`"))
            }
            Action::Sighup { pidfiles, comm } => {
                let found: Vec<PathBuf> = pidfiles
                    .iter()
                    .map(|p| super::under_root(root, Path::new(p)))
                    .collect();
                let Some((file, text)) = found
                    .iter()
                    .find_map(|f| std::fs::read_to_string(f).ok().map(|t| (f, t)))
                else {
                    return Err(CliError::fail(format!(
                        "--restart signal: no pidfile ({}); is {comm} running? the configuration is \
                         written, send it SIGHUP by hand",
                        found
                            .iter()
                            .map(|p| p.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                };
                let pid: i32 = text.trim().parse().map_err(|_| {
                    CliError::fail(format!(
                        "{}: {:?} is not a PID; accepted: a process id",
                        file.display(),
                        text.trim()
                    ))
                })?;
                let actual = std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .map(|s| s.trim().to_string())
                    .unwrap_or_default();
                if actual != *comm {
                    return Err(CliError::fail(format!(
                        "{}: PID {pid} is {:?}, not {comm} (a stale pidfile, or another PID \
                         namespace: run the installer with hostPID); nothing signalled",
                        file.display(),
                        actual
                    )));
                }
                nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGHUP,
                )
                .map_err(|e| CliError::fail(format!("SIGHUP to {comm} (PID {pid}): {e}")))?;
                Ok(format!(
                    "sent SIGHUP to {comm} (PID {pid} from {})",
                    file.display()
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_per_engine() {
        assert!(action(ContainerEngine::Containerd, Restart::None)
            .unwrap()
            .is_none());
        let e = action(ContainerEngine::Containerd, Restart::Signal).unwrap_err();
        assert!(
            e.message.contains("SIGHUP") && e.message.contains("none or systemd"),
            "{}",
            e.message
        );
        assert_eq!(
            action(ContainerEngine::Containerd, Restart::Systemd)
                .unwrap()
                .unwrap()
                .command(Path::new("/host"))
                .unwrap(),
            ["chroot", "/host", "systemctl", "restart", "containerd"]
        );
        assert_eq!(
            action(ContainerEngine::Docker, Restart::Systemd)
                .unwrap()
                .unwrap()
                .command(Path::new("/"))
                .unwrap(),
            ["systemctl", "reload", "docker"]
        );
        assert!(action(ContainerEngine::Podman, Restart::Systemd)
            .unwrap_err()
            .message
            .contains("accepted for podman: none"));
        assert!(action(ContainerEngine::Crio, Restart::Signal).is_err());
        assert!(Restart::parse("reload")
            .unwrap_err()
            .message
            .contains("none, signal or systemd"));
    }

    #[test]
    fn signal_refuses_a_pid_that_is_not_the_engine() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("run")).unwrap();
        // Our own PID: alive, but not dockerd.
        std::fs::write(
            d.path().join("run/docker.pid"),
            std::process::id().to_string(),
        )
        .unwrap();
        let a = action(ContainerEngine::Docker, Restart::Signal)
            .unwrap()
            .unwrap();
        let e = a.run(d.path()).unwrap_err();
        assert!(e.message.contains("not dockerd"), "{}", e.message);
        let e = a.run(&d.path().join("nothing")).unwrap_err();
        assert!(e.message.contains("no pidfile"), "{}", e.message);
    }
}
