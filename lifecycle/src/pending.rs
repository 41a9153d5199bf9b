//! A register sent without waiting for the answer. The wrapper's `create`
//! (fail-open) writes the register on the agent's socket and returns: the
//! agent puts the cgroup in the watch map a few hundred microseconds later,
//! while the caller goes on to `start`. Nothing may run unwatched, so the
//! wrapper's `start` waits, before it lets the runtime start the entrypoint,
//! until the agent has the container: its state file
//! (`containers/<key>.json`, written once the cgroup is in the watch map)
//! names this init pid, or the agent marked it unwatched (it refused the
//! register), or `agent_timeout_ms` passed (then the container starts
//! unwatched and hook.log says so, as a failed register does).
//!
//! `<state_dir>/pending/<key>` ([`StateDir::pending_file`]) holds the init
//! pid from the `create` until the `start` (or `delete`) takes it.

use std::time::{Duration, Instant};

use throttlewatch_core::state_dir::{write_atomic, StateDir, WriteOptions};
use throttlewatch_core::ContainerKey;

/// Record that `key`'s register (init pid `pid`) awaits confirmation.
pub fn mark(state: &StateDir, key: &ContainerKey, pid: u32) -> std::io::Result<()> {
    StateDir::create_dir(&state.pending_dir())?;
    write_atomic(
        &state.pending_file(key),
        pid.to_string().as_bytes(),
        &WriteOptions::STATE,
    )
}

/// The pid of `key`'s pending register, if any; the record is removed.
pub fn take(state: &StateDir, key: &ContainerKey) -> Option<u32> {
    let p = state.pending_file(key);
    let text = std::fs::read_to_string(&p).ok()?;
    let _ = std::fs::remove_file(&p);
    text.trim().parse().ok()
}

/// How a wait for the watch ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confirmed {
    /// The agent watches the container (after this long).
    Watched(Duration),
    /// The agent refused it (it marked it unwatched).
    Refused,
    /// Nothing within the timeout.
    TimedOut(Duration),
}

/// Wait until the agent has `key` with init `pid` (its state file names
/// it), refused it, or `timeout` passed. Polls every 200 µs: the agent
/// has usually finished before `start` begins, and then this is one read.
pub fn wait_watched(
    state: &StateDir,
    key: &ContainerKey,
    pid: u32,
    timeout: Duration,
) -> Confirmed {
    let t0 = Instant::now();
    loop {
        if watched_with_pid(state, key, pid) {
            return Confirmed::Watched(t0.elapsed());
        }
        if state.unwatched_file(key).exists() {
            return Confirmed::Refused;
        }
        if t0.elapsed() >= timeout {
            return Confirmed::TimedOut(timeout);
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Whether the agent's state file for `key` is that of init `pid` (a file
/// left by an earlier container of the same id names another).
fn watched_with_pid(state: &StateDir, key: &ContainerKey, pid: u32) -> bool {
    let Ok(bytes) = std::fs::read(state.container_file(key)) else {
        return false;
    };
    serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v.get("register")?.get("pid")?.as_u64())
        == Some(u64::from(pid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mark_take_and_wait() {
        let d = tempfile::tempdir().unwrap();
        let st = StateDir::new(d.path());
        let k = ContainerKey::new("c1", None);
        assert_eq!(take(&st, &k), None);
        mark(&st, &k, 42).unwrap();
        assert_eq!(take(&st, &k), Some(42));
        assert_eq!(take(&st, &k), None, "taken once");
        let short = Duration::from_millis(5);
        assert_eq!(wait_watched(&st, &k, 42, short), Confirmed::TimedOut(short));
        // An earlier container's state file (another pid) is not this one's.
        StateDir::create_dir(&st.containers_dir()).unwrap();
        std::fs::write(st.container_file(&k), r#"{"register":{"pid":41}}"#).unwrap();
        assert_eq!(wait_watched(&st, &k, 42, short), Confirmed::TimedOut(short));
        std::fs::write(st.container_file(&k), r#"{"register":{"pid":42}}"#).unwrap();
        assert!(matches!(
            wait_watched(&st, &k, 42, short),
            Confirmed::Watched(_)
        ));
        std::fs::remove_file(st.container_file(&k)).unwrap();
        crate::unwatched::mark(&st, &k).unwrap();
        assert_eq!(wait_watched(&st, &k, 42, short), Confirmed::Refused);
    }
}
