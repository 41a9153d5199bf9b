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

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use throttlewatch_core::config::Config;
use throttlewatch_core::protocol::Register;
use throttlewatch_core::state_dir::{write_atomic, StateDir, WriteOptions};
use throttlewatch_core::ContainerKey;

use crate::report::Reporter;
use crate::{agent_start, unwatched, Stage};

/// What `pending/<key>` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingRegister {
    /// Which socket file the register was sent to ([`socket_id`]; None: none).
    pub socket: Option<String>,
    pub register: Register,
}

/// The socket file's identity: a restarted agent binds a new file. Its
/// inode and change time to the nanosecond (a file system may give a new
/// file the inode number of one just removed).
pub fn socket_id(socket: &Path) -> Option<String> {
    std::fs::metadata(socket)
        .ok()
        .map(|m| format!("{}:{}.{:09}", m.ino(), m.ctime(), m.ctime_nsec()))
}

/// Record that `key`'s register is about to be sent to the agent on the
/// socket [`socket_id`] names.
pub fn mark(state: &StateDir, key: &ContainerKey, p: &PendingRegister) -> std::io::Result<()> {
    StateDir::create_dir(&state.pending_dir())?;
    let bytes = serde_json::to_vec(p)?;
    write_atomic(&state.pending_file(key), &bytes, &WriteOptions::STATE)
}

/// `key`'s pending register, if there is one.
pub fn read(state: &StateDir, key: &ContainerKey) -> Option<PendingRegister> {
    let bytes = std::fs::read(state.pending_file(key)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The agent has taken the register (or the container is gone): the
/// record is removed.
pub fn clear(state: &StateDir, key: &ContainerKey) {
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
}

/// Wait until `key`'s register, sent to the socket file `sent_to` names
/// ([`socket_id`]), is no longer pending, the agent refused it, that agent
/// is gone from `socket`, or `timeout` passed. Polls every 100 µs. The
/// record is left in place (see [`before_start`]).
pub fn wait_watched(
    state: &StateDir,
    key: &ContainerKey,
    sent_to: Option<&str>,
    socket: &Path,
    timeout: Duration,
) -> Confirmed {
    let p = state.pending_file(key);
    let t0 = Instant::now();
    loop {
        if state.unwatched_file(key).exists() {
            return Confirmed::Refused;
        }
        if !p.exists() {
            return Confirmed::Watched(t0.elapsed());
        }
        if sent_to.is_some() && socket_id(socket).as_deref() != sent_to {
            return Confirmed::AgentGone;
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
pub fn before_start(
    cfg: &Config,
    config_path: Option<&Path>,
    key: &ContainerKey,
    name: &'static str,
) -> Option<String> {
    let state = StateDir::new(&cfg.state_dir);
    // Nothing pending (answered at create, or never sent): nothing to wait
    // for, whatever an `unwatched/` mark says.
    let p = read(&state, key)?;
    let waited = wait_watched(
        &state,
        key,
        p.socket.as_deref(),
        &cfg.socket,
        cfg.agent_timeout(),
    );
    clear(&state, key);
    let why = match waited {
        Confirmed::Watched(_) => return None,
        Confirmed::Refused => "the agent refused to watch it (see the agent's log)".to_string(),
        Confirmed::TimedOut(_) | Confirmed::AgentGone => {
            // Once more, waiting for the answer (registering twice is harmless).
            match agent_start::register(cfg, config_path, &p.register, None) {
                Ok(_) => {
                    unwatched::clear(&state, key);
                    return None;
                }
                Err(e) => {
                    let _ = unwatched::mark(&state, key);
                    match waited {
                        Confirmed::AgentGone => format!("its agent restarted before taking the register, and again: {e}"),
                        _ => format!("the agent did not take the register within {:?} (agent_timeout_ms), and again: {e}", cfg.agent_timeout()),
                    }
                }
            }
        }
    };
    let msg = format!("container {:?} starts unwatched: {why}", key.id);
    let mut rep = Reporter::new(cfg, Stage::CreateRuntime, name);
    rep.set_container(&key.id);
    rep.warn(&msg);
    Some(msg)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn pending_until_cleared_refused_or_its_agent_is_gone() {
        let d = tempfile::tempdir().unwrap();
        let st = StateDir::new(d.path());
        let sock = d.path().join("agent.sock");
        std::fs::write(&sock, "").unwrap();
        let id = socket_id(&sock);
        let k = ContainerKey::new("c1", None);
        let short = Duration::from_millis(5);
        let wait = || wait_watched(&st, &k, id.as_deref(), &sock, short);
        assert!(matches!(wait(), Confirmed::Watched(_)), "nothing pending");
        mark(&st, &k, &record(id.clone())).unwrap();
        let back: PendingRegister =
            serde_json::from_slice(&std::fs::read(st.pending_file(&k)).unwrap()).unwrap();
        assert_eq!(back, record(id.clone()));
        assert_eq!(wait(), Confirmed::TimedOut(short));
        let (st2, k2) = (st.clone(), k.clone());
        let agent = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            clear(&st2, &k2);
        });
        let long = Duration::from_secs(5);
        assert!(
            matches!(wait_watched(&st, &k, id.as_deref(), &sock, long), Confirmed::Watched(t) if t < long)
        );
        agent.join().unwrap();
        // A restarted agent binds a new socket file.
        mark(&st, &k, &record(id.clone())).unwrap();
        std::fs::remove_file(&sock).unwrap();
        std::fs::write(d.path().join("other"), "").unwrap();
        std::fs::rename(d.path().join("other"), &sock).unwrap();
        assert_eq!(
            wait_watched(&st, &k, id.as_deref(), &sock, long),
            Confirmed::AgentGone
        );
        crate::unwatched::mark(&st, &k).unwrap();
        assert_eq!(wait(), Confirmed::Refused);
    }
}
