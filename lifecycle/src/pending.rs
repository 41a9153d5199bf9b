//! A register sent without waiting for the answer. The wrapper's and the
//! shim's fail-open `create` record `<state_dir>/pending/<key>`
//! ([`StateDir::pending_file`]: the register itself and which socket it went
//! to), write the register on the agent's socket and return: the agent puts
//! the cgroup in the watch map a few hundred microseconds later, while the
//! caller goes on to `start`, and removes the record once it has (before its
//! answer; a register it refuses is marked `unwatched/<key>` and its record left for `start`).
//!
//! Nothing may run unwatched, and nothing may be lost: `start` lets the
//! runtime start the entrypoint only when the record is gone — by then
//! usually so, one failed read — or the agent refused the container. When
//! the agent that got the register is gone (the socket is another one: it
//! restarted with the request unread) or has not taken it within
//! `agent_timeout_ms`, `start` sends it again and waits for the answer, as
//! the hook does (starting an agent when `start_agent` allows); only when
//! that fails too does the container start unwatched, said in hook.log.
//!
//! The wrapper's `create` does that work after the low-level runtime's
//! `create` has returned to the caller, in a helper process
//! (`throttlewatch_runtime::create`): before the runtime runs it marks the
//! container `pending` with an empty record ([`mark_creating`]), which the
//! helper replaces with the register it sends. `start` waits on an empty
//! record as on a full one; one still empty after `agent_timeout_ms` (the
//! helper died) cannot be sent again, and the container starts unwatched.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use throttlewatch_core::config::{Config, FailMode};
use throttlewatch_core::protocol::Register;
use throttlewatch_core::state_dir::{write_atomic, StateDir, WriteOptions};
use throttlewatch_core::ContainerKey;

use crate::report::Reporter;
use crate::{agent_start, unwatched, HookStage};

pub use throttlewatch_core::protocol::{socket_id, PendingRegister};

/// No agent listens and `start_agent = false`: the register waits in
/// `pending/<key>`, sent to no socket, for the next agent, which takes the
/// container if it still runs (the DaemonSet's agent restarting, the host
/// unit stopped). Said as a warning; under fail-closed,
/// or where it cannot be kept, an error and the `unwatched` mark as for any
/// failed register.
pub(crate) fn keep_for_agent(
    cfg: &Config,
    rep: &mut Reporter,
    key: &ContainerKey,
    reg: &Register,
    why: &agent_start::RegisterError,
) {
    let state = StateDir::new(&cfg.state_dir);
    let kept = if cfg.fail_mode == FailMode::Closed {
        // Fail-closed refuses a container that would start unwatched.
        rep.error(&why.to_string());
        false
    } else {
        let record = PendingRegister {
            socket: None,
            register: reg.clone(),
        };
        match mark(&state, key, &record) {
            Ok(()) => {
                rep.warn(&format!(
                    "{why}; its register waits in {}",
                    state.pending_file(key).display()
                ));
                true
            }
            Err(e) => {
                rep.error(&format!(
                    "{why}; cannot keep its register in {}: {e}",
                    state.pending_dir().display()
                ));
                false
            }
        }
    };
    if !kept {
        if let Err(e) = unwatched::mark(&state, key) {
            rep.warn(&format!(
                "cannot mark {key} unwatched in {}: {e} (poststop will ask the agent)",
                state.unwatched_dir().display()
            ));
        }
    }
}

/// Record that `key`'s register is about to be sent to the agent on the
/// socket [`socket_id`] names.
pub(crate) fn mark(
    state: &StateDir,
    key: &ContainerKey,
    p: &PendingRegister,
) -> std::io::Result<()> {
    StateDir::create_dir(&state.pending_dir())?;
    let bytes = serde_json::to_vec(p)?;
    write_atomic(&state.pending_file(key), &bytes, &WriteOptions::STATE)
}

/// Record that `key`'s register will be sent once the runtime has created
/// it: an empty record (0600, never through a symlink), for `start` to
/// wait on until [`mark`] replaces it with the register.
pub(crate) fn mark_creating(state: &StateDir, key: &ContainerKey) -> std::io::Result<()> {
    let open = || {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(state.pending_file(key))
            .map(drop)
    };
    // The directory is made once: on the caller's path, no mkdir for every create.
    match open() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            StateDir::create_dir(&state.pending_dir())?;
            open()
        }
        r => r,
    }
}

/// What `pending/<key>` holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Pending {
    /// Marked by [`mark_creating`]; the register is not sent yet.
    Creating,
    /// The register, sent.
    Sent(Box<PendingRegister>),
}

/// `key`'s pending register, if there is one. A record that does not
/// parse counts as [`Pending::Creating`] (records are written whole, by
/// rename; an empty one is the mark).
pub(crate) fn read(state: &StateDir, key: &ContainerKey) -> Option<Pending> {
    let bytes = std::fs::read(state.pending_file(key)).ok()?;
    Some(match serde_json::from_slice(&bytes) {
        Ok(p) => Pending::Sent(Box::new(p)),
        Err(_) => Pending::Creating,
    })
}

/// Remove `key`'s record if it is still the mark of [`mark_creating`]
/// (the register was never sent); a sent one is left for `start`.
pub(crate) fn clear_if_creating(state: &StateDir, key: &ContainerKey) {
    let p = state.pending_file(key);
    if std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_file() && m.len() == 0) {
        let _ = std::fs::remove_file(&p);
    }
}

/// The agent has taken the register (or the container is gone): the
/// record is removed.
pub(crate) fn clear(state: &StateDir, key: &ContainerKey) {
    let _ = std::fs::remove_file(state.pending_file(key));
}

/// How a wait for the watch ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confirmed {
    /// Nothing was pending, or the agent took it (after this long).
    Watched(Duration),
    /// The agent refused it (it marked it unwatched).
    Refused,
    /// Still pending after the timeout.
    TimedOut(Duration),
    /// The socket is not the one the register went to: that agent is gone.
    AgentGone,
    /// It went to no agent: none listened (`start_agent = false`; kept
    /// for the next agent, `pending::keep_for_agent`).
    NoAgent,
}

/// Wait until `key`'s register is no longer pending, the agent refused it,
/// the agent it was sent to (the socket file its record names, see
/// [`socket_id`]) is gone from `socket`, or `timeout` passed. Polls every
/// 100 µs; a record still [`Pending::Creating`] is read again each time.
/// The record is left in place (see [`before_start`]).
pub fn wait_watched(
    state: &StateDir,
    key: &ContainerKey,
    socket: &Path,
    timeout: Duration,
) -> Confirmed {
    let t0 = Instant::now();
    let mut sent_to: Option<Option<String>> = None;
    loop {
        if state.unwatched_file(key).exists() {
            return Confirmed::Refused;
        }
        if sent_to.is_none() {
            match read(state, key) {
                None => return Confirmed::Watched(t0.elapsed()),
                Some(Pending::Sent(p)) if p.socket.is_none() => return Confirmed::NoAgent,
                Some(Pending::Sent(p)) => sent_to = Some(p.socket),
                Some(Pending::Creating) => {}
            }
        } else if !state.pending_file(key).exists() {
            return Confirmed::Watched(t0.elapsed());
        }
        if let Some(Some(to)) = &sent_to {
            if socket_id(socket).as_deref() != Some(to.as_str()) {
                return Confirmed::AgentGone;
            }
        }
        if t0.elapsed() >= timeout {
            return Confirmed::TimedOut(timeout);
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// What the front ends' `start` does before the runtime's: wait for a
/// pending register of `key` (see the module), sending it again when its
/// agent is gone or silent. When the container starts unwatched, the
/// reason is said in hook.log (by `name`) and returned.
pub(crate) fn before_start(
    cfg: &Config,
    config_path: Option<&Path>,
    key: &ContainerKey,
    name: &'static str,
) -> Option<String> {
    let state = StateDir::new(&cfg.state_dir);
    // Nothing pending (answered at create, or never sent): nothing to wait
    // for, whatever an `unwatched/` mark says.
    read(&state, key)?;
    let waited = wait_watched(&state, key, &cfg.socket, cfg.agent_timeout());
    let last = read(&state, key);
    clear(&state, key);
    let why = match (waited, last) {
        (Confirmed::Watched(_), _) => return None,
        (Confirmed::Refused, _) => {
            "the agent refused to watch it (see the agent's log)".to_string()
        }
        (Confirmed::TimedOut(_) | Confirmed::AgentGone | Confirmed::NoAgent, None) => return None, // taken meanwhile
        (Confirmed::TimedOut(_) | Confirmed::AgentGone | Confirmed::NoAgent, Some(Pending::Creating)) => format!(
            "its register was not sent within {:?} (agent_timeout_ms) of the start: the wrapper's create did not finish (see hook.log)",
            cfg.agent_timeout()
        ),
        (waited, Some(Pending::Sent(p))) => {
            // Once more, waiting for the answer (registering twice is harmless).
            match agent_start::register(cfg, config_path, &p.register, None) {
                Ok(_) => {
                    unwatched::clear(&state, key);
                    return None;
                }
                Err(e) if e.is_not_started() => {
                    // Still no agent: the register waits for the next one.
                    let mut rep = Reporter::new(cfg, HookStage::CreateRuntime, name);
                    rep.set_container(&key.id);
                    keep_for_agent(cfg, &mut rep, key, &p.register, &e);
                    return Some(e.to_string());
                }
                Err(e) => {
                    let _ = unwatched::mark(&state, key);
                    match waited {
                        Confirmed::AgentGone => format!("its agent restarted before taking the register, and again: {e}"),
                        Confirmed::NoAgent => format!("no agent listened at its create, and now: {e}"),
                        _ => format!("the agent did not take the register within {:?} (agent_timeout_ms), and again: {e}", cfg.agent_timeout()),
                    }
                }
            }
        }
    };
    let msg = format!("container {:?} starts unwatched: {why}", key.id);
    let mut rep = Reporter::new(cfg, HookStage::CreateRuntime, name);
    rep.set_container(&key.id);
    rep.warn(&msg);
    Some(msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;
    use throttlewatch_core::protocol::Register;

    fn record(socket: Option<String>) -> PendingRegister {
        PendingRegister {
            socket,
            register: Register {
                container_id: "c1".into(),
                pid: Some(42),
                ..Default::default()
            },
        }
    }

    /// A state directory and an agent's socket file in a temporary directory.
    fn fixture() -> (tempfile::TempDir, StateDir, std::path::PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let st = StateDir::new(d.path());
        let sock = d.path().join("agent.sock");
        std::fs::write(&sock, "").unwrap();
        (d, st, sock)
    }

    #[test]
    fn a_register_kept_for_no_agent_is_not_waited_for() {
        let (_d, st, sock) = fixture();
        let k = ContainerKey::new("c1", None);
        mark(&st, &k, &record(None)).unwrap();
        let t = Instant::now();
        assert_eq!(
            wait_watched(&st, &k, &sock, Duration::from_secs(5)),
            Confirmed::NoAgent
        );
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        assert!(st.pending_file(&k).exists(), "left for the next agent");
    }

    #[test]
    fn pending_until_cleared_refused_or_its_agent_is_gone() {
        let (d, st, sock) = fixture();
        let id = socket_id(&sock);
        let k = ContainerKey::new("c1", None);
        let short = Duration::from_millis(5);
        let wait = |t| wait_watched(&st, &k, &sock, t);
        assert!(
            matches!(wait(short), Confirmed::Watched(_)),
            "nothing pending"
        );
        mark(&st, &k, &record(id.clone())).unwrap();
        let back: PendingRegister =
            serde_json::from_slice(&std::fs::read(st.pending_file(&k)).unwrap()).unwrap();
        assert_eq!(back, record(id.clone()));
        assert_eq!(
            read(&st, &k),
            Some(Pending::Sent(Box::new(record(id.clone()))))
        );
        assert_eq!(wait(short), Confirmed::TimedOut(short));
        let (st2, k2) = (st.clone(), k.clone());
        let agent = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            clear(&st2, &k2);
        });
        let long = Duration::from_secs(5);
        assert!(matches!(wait(long), Confirmed::Watched(t) if t < long));
        agent.join().unwrap();
        // A restarted agent binds a new socket file.
        mark(&st, &k, &record(id.clone())).unwrap();
        std::fs::remove_file(&sock).unwrap();
        std::fs::write(d.path().join("other"), "").unwrap();
        std::fs::rename(d.path().join("other"), &sock).unwrap();
        assert_eq!(wait(long), Confirmed::AgentGone);
        crate::unwatched::mark(&st, &k).unwrap();
        assert_eq!(wait(short), Confirmed::Refused);
    }

    /// The wrapper's mark before the runtime's create: waited on like a
    /// register; followed once the helper writes the register (here sent to
    /// an agent since gone); removed by `clear_if_creating` only while empty.
    #[test]
    fn an_empty_mark_is_waited_on_and_followed_once_sent() {
        let (_d, st, sock) = fixture();
        let k = ContainerKey::new("c1", None);
        let short = Duration::from_millis(5);
        assert!(!st.pending_dir().exists());
        mark_creating(&st, &k).unwrap(); // makes the directory the first time
        let dir = std::fs::metadata(st.pending_dir()).unwrap();
        assert_eq!(dir.mode() & 0o777, throttlewatch_core::state_dir::DIR_MODE);
        let f = st.pending_file(&k);
        assert_eq!(std::fs::metadata(&f).unwrap().mode() & 0o777, 0o600);
        assert_eq!(read(&st, &k), Some(Pending::Creating));
        assert_eq!(
            wait_watched(&st, &k, &sock, short),
            Confirmed::TimedOut(short)
        );
        clear_if_creating(&st, &k);
        assert_eq!(read(&st, &k), None, "an unsent mark is cleared");
        mark_creating(&st, &k).unwrap();
        let (st2, k2, sock2) = (st.clone(), k.clone(), sock.clone());
        let helper = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            mark(&st2, &k2, &record(socket_id(&sock2))).unwrap();
            clear_if_creating(&st2, &k2); // sent: left in place
            std::fs::remove_file(&sock2).unwrap();
            std::fs::write(&sock2, "x").unwrap(); // another agent's socket
        });
        assert_eq!(
            wait_watched(&st, &k, &sock, Duration::from_secs(5)),
            Confirmed::AgentGone
        );
        helper.join().unwrap();
        assert!(matches!(read(&st, &k), Some(Pending::Sent(_))));
    }
}
