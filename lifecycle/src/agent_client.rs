//! The one client of the agent's socket (one JSON line each way, see
//! `throttlewatch_core::protocol`): register, unregister. One timeout for
//! connect, send and answer (`agent_timeout_ms`, [`Config::agent_timeout`]);
//! answers are typed, never told apart by their error text.

use std::io::ErrorKind;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use throttlewatch_core::config::Config;
use throttlewatch_core::protocol::{
    call, call_on, connect, send_on, ErrorCode, Register, Request, Response,
};
use throttlewatch_core::{ContainerKey, EndReason};

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Nobody listens on the socket (no agent, or a stale socket file).
    #[error("no agent answers on {}: {source}", socket.display())]
    NoListener {
        socket: PathBuf,
        source: std::io::Error,
    },
    /// Connect, send or answer took longer than the timeout (the agent is
    /// stopped, wedged, or its listen backlog is full).
    #[error("agent on {}: no answer within {timeout:?} (agent_timeout_ms; the agent is stopped, wedged or overloaded)", socket.display())]
    TimedOut { socket: PathBuf, timeout: Duration },
    /// An agent is there but the exchange failed (a broken connection).
    #[error("agent on {}: {source}", socket.display())]
    Io {
        socket: PathBuf,
        source: std::io::Error,
    },
    /// The agent answered `ok: false`.
    #[error("{}", .0.error.as_deref().unwrap_or("no reason given"))]
    Refused(Response),
}

impl AgentError {
    pub fn is_no_listener(&self) -> bool {
        matches!(self, AgentError::NoListener { .. })
    }
}

/// How an unregister ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Unregistered {
    /// The agent wrote the `end` record.
    Ended(Response),
    /// The agent does not watch the container (ended before, or never
    /// registered): nothing to do.
    NotWatched,
}

/// Whether an error means "nobody listens there" (as opposed to a broken agent).
fn no_listener(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ConnectionRefused)
}

/// A connect bounded by `SO_SNDTIMEO` times out as `WouldBlock`.
fn timed_out(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// A connection to the agent opened before the hook's QoS work: the agent
/// accepts it and starts the thread that reads it while the hook writes the
/// cgroup, so the register itself is one request and one answer.
pub struct EarlyConnection(std::io::Result<UnixStream>);

#[derive(Debug, Clone)]
pub struct AgentClient {
    socket: PathBuf,
    timeout: Duration,
}

impl AgentClient {
    pub fn new(socket: impl Into<PathBuf>, timeout: Duration) -> AgentClient {
        AgentClient {
            socket: socket.into(),
            timeout,
        }
    }

    /// The configured socket and `agent_timeout_ms`.
    pub fn of(cfg: &Config) -> AgentClient {
        AgentClient::new(&cfg.socket, cfg.agent_timeout())
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn connect_early(&self) -> EarlyConnection {
        EarlyConnection(connect(&self.socket, self.timeout))
    }

    fn error(&self, e: std::io::Error) -> AgentError {
        let socket = self.socket.clone();
        if no_listener(&e) {
            AgentError::NoListener { socket, source: e }
        } else if timed_out(&e) {
            let timeout = self.timeout;
            AgentError::TimedOut { socket, timeout }
        } else {
            AgentError::Io { socket, source: e }
        }
    }

    /// One request on a fresh connection; `ok: false` is [`AgentError::Refused`].
    pub fn call(&self, req: &Request) -> Result<Response, AgentError> {
        let r = call(&self.socket, req, self.timeout).map_err(|e| self.error(e))?;
        match r.ok {
            true => Ok(r),
            false => Err(AgentError::Refused(r)),
        }
    }

    /// Register; `early`: a connection opened before the QoS work. A
    /// connection that broke meanwhile (the agent restarted) is retried once
    /// on a fresh one; a timeout is not (registering twice is harmless,
    /// waiting twice is not).
    pub fn register(
        &self,
        reg: &Register,
        early: Option<EarlyConnection>,
    ) -> Result<Response, AgentError> {
        let req = Request::Register(reg.clone());
        let broken = |e: &std::io::Error| {
            matches!(
                e.kind(),
                ErrorKind::BrokenPipe
                    | ErrorKind::ConnectionReset
                    | ErrorKind::UnexpectedEof
                    | ErrorKind::NotConnected
            )
        };
        match early.map(|c| c.0) {
            Some(Ok(s)) => match call_on(s, &req, self.timeout) {
                Ok(r) if r.ok => Ok(r),
                Ok(r) => Err(AgentError::Refused(r)),
                Err(e) if broken(&e) => self.call(&req),
                Err(e) => Err(self.error(e)),
            },
            // A connect that timed out (a full backlog) is not tried twice.
            Some(Err(e)) if no_listener(&e) || timed_out(&e) => Err(self.error(e)),
            Some(Err(_)) | None => self.call(&req),
        }
    }

    /// Send the register without waiting for the answer (see
    /// [`crate::pending`]): on the early connection, else (or when that
    /// broke) on a fresh one. Ok once the whole request is written.
    pub fn register_unanswered(
        &self,
        reg: &Register,
        early: Option<EarlyConnection>,
    ) -> Result<(), AgentError> {
        let req = Request::Register(reg.clone());
        let fresh = || {
            connect(&self.socket, self.timeout)
                .and_then(|s| send_on(s, &req, self.timeout))
                .map_err(|e| self.error(e))
        };
        match early.map(|c| c.0) {
            Some(Ok(s)) => match send_on(s, &req, self.timeout) {
                Ok(()) => Ok(()),
                Err(e) if timed_out(&e) => Err(self.error(e)),
                Err(_) => fresh(),
            },
            Some(Err(e)) if no_listener(&e) || timed_out(&e) => Err(self.error(e)),
            Some(Err(_)) | None => fresh(),
        }
    }

    /// Have the agent write the `end` record. Never starts an agent.
    pub fn unregister(
        &self,
        key: &ContainerKey,
        reason: EndReason,
        exit_code: Option<i32>,
    ) -> Result<Unregistered, AgentError> {
        let req = Request::Unregister {
            container_id: key.id.clone(),
            scope: key.scope.clone(),
            reason,
            exit_code,
        };
        match self.call(&req) {
            Ok(r) => Ok(Unregistered::Ended(r)),
            Err(AgentError::Refused(r)) if r.code == Some(ErrorCode::NotWatched) => {
                Ok(Unregistered::NotWatched)
            }
            Err(e) => Err(e),
        }
    }
}

/// An `end` record the agent did not write at `delete`: a warning to log.
#[derive(Debug, thiserror::Error)]
pub enum EndBeforeDeleteError {
    /// The agent answered and could not write it.
    #[error("the agent could not end the log of {key}: {reason}")]
    Refused { key: ContainerKey, reason: String },
    /// No answer from the agent; poststop will ask again.
    #[error("{source}; the end record of {key} is left to the poststop hook")]
    Agent {
        key: ContainerKey,
        source: Box<AgentError>,
    },
}

/// The front ends' `delete` (wrapper and shim). runc 1.1 removes the
/// container's cgroup *before* it runs the poststop hooks, so by poststop
/// `cpu.stat` is gone: the agent writes the `end` record first, while the
/// cgroup still exists, and the poststop hook then finds the container
/// already ended. Fail-open: returns a warning to log, never fails the delete.
pub fn end_before_delete(
    cfg: &Config,
    key: &ContainerKey,
    exit_code: Option<i32>,
) -> Result<(), EndBeforeDeleteError> {
    // A register kept for an agent that never came: the container is gone.
    throttlewatch_core::StateDir::new(&cfg.state_dir).clear_pending(key);
    if !cfg.socket.exists() {
        return Ok(());
    }
    match AgentClient::of(cfg).unregister(key, EndReason::Delete, exit_code) {
        Ok(_) => Ok(()),
        Err(AgentError::Refused(r)) => Err(EndBeforeDeleteError::Refused {
            key: key.clone(),
            reason: r.error.unwrap_or_default(),
        }),
        Err(source) => Err(EndBeforeDeleteError::Agent {
            key: key.clone(),
            source: source.into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixListener;

    use super::*;

    const T: Duration = Duration::from_secs(3);

    /// A one-shot fake agent answering `resp` and returning the request line.
    pub fn fake_agent(sock: &Path, resp: &'static str) -> std::thread::JoinHandle<String> {
        let l = UnixListener::bind(sock).unwrap();
        std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut line = String::new();
            BufReader::new(&s).read_line(&mut line).unwrap();
            (&s).write_all(resp.as_bytes()).unwrap();
            line
        })
    }

    #[test]
    fn register_sends_the_protocol() {
        let d = tempfile::tempdir().unwrap();
        let c = AgentClient::new(d.path().join("a.sock"), T);
        let t = fake_agent(c.socket(), "{\"ok\":true,\"log_path\":\"/l/c.jsonl\"}\n");
        let reg = Register {
            container_id: "c".into(),
            pid: Some(7),
            cgroup_path: "/tw/c".into(),
            ..Default::default()
        };
        let r = c.register(&reg, None).unwrap();
        assert_eq!(r.log_path.as_deref(), Some("/l/c.jsonl"));
        let sent: serde_json::Value = serde_json::from_str(&t.join().unwrap()).unwrap();
        assert_eq!(
            (sent["op"].as_str(), sent["cgroup_path"].as_str()),
            (Some("register"), Some("/tw/c"))
        );
    }

    #[test]
    fn register_on_an_early_connection() {
        let d = tempfile::tempdir().unwrap();
        let c = AgentClient::new(d.path().join("a.sock"), T);
        let t = fake_agent(c.socket(), "{\"ok\":true,\"log_path\":\"/l/e.jsonl\"}\n");
        let early = c.connect_early();
        let reg = Register {
            container_id: "e".into(),
            ..Default::default()
        };
        let r = c.register(&reg, Some(early)).unwrap();
        assert_eq!(r.log_path.as_deref(), Some("/l/e.jsonl"));
        assert!(t.join().unwrap().contains("\"container_id\":\"e\""));
        // No listener at the early connect: NoListener, no second try.
        let none = AgentClient::new(d.path().join("none.sock"), T);
        let e = none.register(&reg, Some(none.connect_early())).unwrap_err();
        assert!(
            e.is_no_listener() && e.to_string().contains("none.sock"),
            "{e}"
        );
    }

    #[test]
    fn unregister_answers_are_typed() {
        let d = tempfile::tempdir().unwrap();
        let c = AgentClient::new(d.path().join("a.sock"), T);
        // The code decides, not the text.
        let t = fake_agent(
            c.socket(),
            "{\"ok\":false,\"error\":\"whatever words\",\"code\":\"not-watched\"}\n",
        );
        let r = c
            .unregister(&ContainerKey::new("c", None), EndReason::Poststop, None)
            .unwrap();
        assert_eq!(r, Unregistered::NotWatched);
        assert!(t.join().unwrap().contains("\"reason\":\"poststop\""));
        std::fs::remove_file(c.socket()).unwrap();
        let t = fake_agent(
            c.socket(),
            "{\"ok\":false,\"error\":\"container \\\"c\\\" is not watched\"}\n",
        );
        let e = c
            .unregister(&ContainerKey::new("c", None), EndReason::Delete, Some(0))
            .unwrap_err();
        t.join().unwrap();
        assert!(matches!(e, AgentError::Refused(_)), "{e:?}");
        let e = AgentClient::new(d.path().join("none.sock"), T)
            .unregister(&ContainerKey::new("c", None), EndReason::Delete, None)
            .unwrap_err();
        assert!(e.is_no_listener(), "{e:?}");
    }

    /// The agent's own answer to an unknown container is NotWatched.
    #[test]
    fn the_daemons_answer_is_not_watched() {
        let d = tempfile::tempdir().unwrap();
        let c = AgentClient::new(d.path().join("a.sock"), T);
        let line = serde_json::to_string(&Response::not_watched(&ContainerKey::new("c", None)))
            .unwrap()
            + "\n";
        let t = fake_agent(c.socket(), Box::leak(line.into_boxed_str()));
        assert_eq!(
            c.unregister(&ContainerKey::new("c", None), EndReason::Poststop, None)
                .unwrap(),
            Unregistered::NotWatched
        );
        t.join().unwrap();
    }

    #[test]
    fn end_before_delete_is_quiet_without_an_agent_and_says_a_refusal() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config {
            socket: d.path().join("a.sock"),
            ..Config::default()
        };
        assert!(end_before_delete(&cfg, &ContainerKey::new("c", None), None).is_ok());
        let t = fake_agent(&cfg.socket, "{\"ok\":false,\"error\":\"disk full\"}\n");
        let w = end_before_delete(&cfg, &ContainerKey::new("c", None), Some(1))
            .unwrap_err()
            .to_string();
        assert!(t.join().unwrap().contains("\"reason\":\"delete\""));
        assert_eq!(w, "the agent could not end the log of \"c\": disk full");
    }
}
