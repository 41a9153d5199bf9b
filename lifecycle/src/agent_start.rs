//! Registering when no agent answers: start a detached one (if the
//! configuration allows it) and retry until it answers. One agent per node,
//! guarded by its lock in the state directory.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use throttlewatch_core::config::Config;
use throttlewatch_core::protocol::{Register, Response};
use throttlewatch_core::StateDir;

use crate::agent_client::{AgentClient, AgentError, EarlyConnection};
use crate::binaries::{beside_me_or_in_path, AGENT_BINARY};

/// How long the hook waits for an agent it started to answer (the agent's
/// own `--detach` waits as long; loading the probe takes most of it).
pub const START_WAIT: Duration = Duration::from_secs(10);

/// A register that did not happen: one line for hook.log, naming the
/// container and what was tried.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// The agent answered and refused the container.
    #[error("the agent refused to register container {id:?}: {reason}")]
    Refused { id: String, reason: String },
    /// An agent is there but the exchange failed.
    #[error("{source}; cannot register container {id:?}")]
    Agent { id: String, source: Box<AgentError> },
    /// No agent answers and the configuration does not start one: the
    /// front end keeps the register for the next agent (`lifecycle::pending::keep_for_agent`).
    #[error("{source}; start_agent = false, so container {id:?} starts unwatched until an agent starts and takes its register")]
    NotStarted { id: String, source: Box<AgentError> },
    /// No agent answers and there is none to start.
    #[error(transparent)]
    NoBinary(#[from] NoAgentBinary),
    /// Starting an agent failed and none answers.
    #[error("{why}; {source}; container {id:?} is not watched")]
    StartFailed {
        id: String,
        why: StartAgentError,
        source: Box<AgentError>,
    },
    /// An agent was started but did not answer in time.
    #[error(
        "started {} but no agent answered on {} within {START_WAIT:?}: {source}; container {id:?} is not watched",
        bin.display(),
        socket.display()
    )]
    NoAnswer {
        id: String,
        bin: PathBuf,
        socket: PathBuf,
        source: Box<AgentError>,
    },
}

/// Register, starting an agent first when none answers and `start_agent` is
/// set. `early`: a connection opened before the QoS work (None: connect now).
/// Returns the agent's answer (with the log path); the error is one line
/// for hook.log.
pub fn register(
    cfg: &Config,
    config_path: Option<&Path>,
    reg: &Register,
    early: Option<EarlyConnection>,
) -> Result<Response, RegisterError> {
    let client = AgentClient::of(cfg);
    let id = || reg.container_id.clone();
    match client.register(reg, early) {
        Ok(r) => return Ok(r),
        Err(AgentError::Refused(r)) => return Err(refused(id(), r)),
        Err(source) if !source.is_no_listener() => {
            return Err(RegisterError::Agent {
                id: id(),
                source: source.into(),
            })
        }
        Err(source) if !cfg.start_agent => {
            return Err(RegisterError::NotStarted {
                id: id(),
                source: source.into(),
            })
        }
        Err(_) => {}
    }
    let bin = agent_binary(cfg)?;
    let deadline = Instant::now() + START_WAIT;
    // A failed `--detach` is not the end when another agent holds the lock:
    // a concurrent hook started it and it is still loading its probe.
    let started = start_agent(&bin, config_path, deadline);
    loop {
        let e = match client.register(reg, None) {
            Ok(r) => return Ok(r),
            Err(AgentError::Refused(r)) => return Err(refused(id(), r)),
            Err(e) => e,
        };
        let waiting = started.is_ok() || lock_holder(&StateDir::new(&cfg.state_dir)).is_some();
        if e.is_no_listener() && Instant::now() < deadline && waiting {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        return Err(match started {
            Err(why) => RegisterError::StartFailed {
                id: id(),
                why,
                source: e.into(),
            },
            Ok(()) => RegisterError::NoAnswer {
                id: id(),
                bin,
                socket: client.socket().to_path_buf(),
                source: e.into(),
            },
        });
    }
}

impl RegisterError {
    /// No agent listens and `start_agent = false`: the register can wait
    /// for the next agent.
    pub fn is_not_started(&self) -> bool {
        matches!(self, RegisterError::NotStarted { .. })
    }
}

fn refused(id: String, r: Response) -> RegisterError {
    RegisterError::Refused {
        id,
        reason: r.error.unwrap_or_else(|| "no reason given".into()),
    }
}

/// The pid holding the agent's lock, from /proc/locks: read-only, so it
/// never races the agent taking the lock.
pub fn lock_holder(state: &StateDir) -> Option<u32> {
    let m = std::fs::metadata(state.agent_lock()).ok()?;
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    flock_holder(&locks, m.dev(), m.ino())
}

/// In /proc/locks text, the pid of a FLOCK on (dev, inode); the device is
/// printed as `major:minor` in hex, then the inode in decimal.
pub fn flock_holder(locks: &str, dev: u64, ino: u64) -> Option<u32> {
    let want = format!("{:02x}:{:02x}:{ino}", libc::major(dev), libc::minor(dev));
    locks.lines().find_map(|l| {
        // "1: FLOCK  ADVISORY  WRITE 1234 fe:00:5391504 0 EOF" (blocked waiters have "->").
        let f: Vec<&str> = l.split_whitespace().filter(|x| *x != "->").collect();
        (f.get(1) == Some(&"FLOCK") && f.get(5) == Some(&want.as_str()))
            .then(|| f.get(4)?.parse().ok())
            .flatten()
    })
}

/// No `agent_binary` configured and no agent executable found.
#[derive(Debug, thiserror::Error)]
#[error("no agent answers and no `{AGENT_BINARY}` binary was found next to the hook or in PATH (set agent_binary)")]
pub struct NoAgentBinary;

/// `agent_binary` when configured, else `throttlewatch` next to this
/// executable, else in PATH.
pub fn agent_binary(cfg: &Config) -> Result<PathBuf, NoAgentBinary> {
    if !cfg.agent_binary.is_empty() {
        return Ok(PathBuf::from(&cfg.agent_binary));
    }
    beside_me_or_in_path(AGENT_BINARY).ok_or(NoAgentBinary)
}

/// `<bin> agent --detach` that could not be run or did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum StartAgentError {
    #[error("cannot start the agent {}: {source}", bin.display())]
    Spawn {
        bin: PathBuf,
        source: std::io::Error,
    },
    #[error("`{} agent --detach` failed: {status}", bin.display())]
    Failed {
        bin: PathBuf,
        status: std::process::ExitStatus,
    },
    #[error("waiting for {}: {source}", bin.display())]
    Wait {
        bin: PathBuf,
        source: std::io::Error,
    },
}

/// `throttlewatch agent --detach [--config FILE]`: the agent daemonizes (one
/// per node, guarded by its lock) and its parent exits once the agent
/// answers. Its stdio is /dev/null: the runtime waits for the hook's pipes
/// to close.
fn start_agent(
    bin: &Path,
    config_path: Option<&Path>,
    deadline: Instant,
) -> Result<(), StartAgentError> {
    let mut cmd = Command::new(bin);
    cmd.arg("agent").arg("--detach");
    if let Some(c) = config_path {
        cmd.arg("--config").arg(c);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().map_err(|source| StartAgentError::Spawn {
        bin: bin.to_path_buf(),
        source,
    })?;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => {
                return Err(StartAgentError::Failed {
                    bin: bin.to_path_buf(),
                    status,
                })
            }
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => return Ok(()), // still starting; the retries decide
            Err(source) => {
                return Err(StartAgentError::Wait {
                    bin: bin.to_path_buf(),
                    source,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(id: &str) -> Register {
        Register {
            container_id: id.into(),
            ..Default::default()
        }
    }

    #[test]
    fn missing_agent_without_start_is_a_clear_message() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config {
            socket: d.path().join("none.sock"),
            start_agent: false,
            ..Config::default()
        };
        let e = register(&cfg, None, &reg("c"), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no agent answers")
                && e.contains("none.sock")
                && e.contains("start_agent = false"),
            "{e}"
        );
        let early = AgentClient::of(&cfg).connect_early();
        let e = register(&cfg, None, &reg("c"), Some(early))
            .unwrap_err()
            .to_string();
        assert!(e.contains("start_agent = false"), "{e}");
    }

    #[test]
    fn start_agent_that_fails_is_reported() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config {
            socket: d.path().join("a.sock"),
            state_dir: d.path().join("state"),
            agent_binary: "/bin/false".into(),
            ..Config::default()
        };
        let e = register(&cfg, None, &reg("c"), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("/bin/false") && e.contains("failed"), "{e}");
    }

    #[test]
    fn register_errors_read_as_one_line() {
        let io = || std::io::Error::from(std::io::ErrorKind::NotFound);
        let none = || AgentError::NoListener {
            socket: "/run/tw.sock".into(),
            source: io(),
        };
        let e = none().to_string();
        let id = || "c".to_string();
        let cases = [
            (
                RegisterError::Refused {
                    id: id(),
                    reason: "no reason given".into(),
                },
                "the agent refused to register container \"c\": no reason given".to_string(),
            ),
            (
                RegisterError::Agent {
                    id: id(),
                    source: none().into(),
                },
                format!("{e}; cannot register container \"c\""),
            ),
            (
                RegisterError::NotStarted {
                    id: id(),
                    source: none().into(),
                },
                format!("{e}; start_agent = false, so container \"c\" starts unwatched until an agent starts and takes its register"),
            ),
            (
                RegisterError::from(NoAgentBinary),
                "no agent answers and no `throttlewatch` binary was found next to the hook or in PATH (set agent_binary)".to_string(),
            ),
            (
                RegisterError::StartFailed {
                    id: id(),
                    why: StartAgentError::Spawn {
                        bin: "/x/throttlewatch".into(),
                        source: io(),
                    },
                    source: none().into(),
                },
                format!(
                    "cannot start the agent /x/throttlewatch: {}; {e}; container \"c\" is not watched",
                    io()
                ),
            ),
            (
                RegisterError::NoAnswer {
                    id: id(),
                    bin: "/x/throttlewatch".into(),
                    socket: "/run/tw.sock".into(),
                    source: none().into(),
                },
                format!("started /x/throttlewatch but no agent answered on /run/tw.sock within 10s: {e}; container \"c\" is not watched"),
            ),
        ];
        for (err, words) in cases {
            assert_eq!(err.to_string(), words);
        }
        let wait = StartAgentError::Wait {
            bin: "/x/throttlewatch".into(),
            source: io(),
        };
        assert_eq!(
            wait.to_string(),
            format!("waiting for /x/throttlewatch: {}", io())
        );
    }

    #[test]
    fn lock_holder_from_proc_locks() {
        let locks = "1: FLOCK  ADVISORY  WRITE 4242 fe:00:5391504 0 EOF\n2: POSIX  ADVISORY  WRITE 7 fe:00:77 0 EOF\n";
        let dev = libc::makedev(0xfe, 0);
        assert_eq!(flock_holder(locks, dev, 5_391_504), Some(4242));
        assert_eq!(
            flock_holder(locks, dev, 77),
            None,
            "POSIX locks are not the agent's"
        );
        assert_eq!(flock_holder(locks, libc::makedev(8, 1), 5_391_504), None);
        // A real flock in a temporary state dir.
        let d = tempfile::tempdir().unwrap();
        let st = StateDir::new(d.path());
        assert_eq!(lock_holder(&st), None);
        let f = std::fs::File::create(st.agent_lock()).unwrap();
        assert_eq!(lock_holder(&st), None, "exists but not locked");
        // SAFETY: flock on an fd we own.
        assert_eq!(
            unsafe {
                libc::flock(
                    std::os::fd::AsRawFd::as_raw_fd(&f),
                    libc::LOCK_EX | libc::LOCK_NB,
                )
            },
            0
        );
        assert_eq!(lock_holder(&st), Some(std::process::id()));
    }
}
