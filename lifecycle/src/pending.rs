//! A register sent without waiting for the answer. The wrapper's `create`
//! (fail-open) records `<state_dir>/pending/<key>`
//! ([`StateDir::pending_file`]), writes the register on the agent's socket
//! and returns: the agent puts the cgroup in the watch map a few hundred
//! microseconds later, while the caller goes on to `start`, and removes the
//! record once it has (before its answer; a register it refuses is marked
//! `unwatched/<key>` first). Nothing may run unwatched, so the wrapper's
//! `start` lets the runtime start the entrypoint only when the record is
//! gone — by then usually so: one failed `stat` — or the agent refused the
//! container, or `agent_timeout_ms` passed (then it starts unwatched and
//! hook.log says so, as a failed register does).

use std::time::{Duration, Instant};

use throttlewatch_core::config::Config;
use throttlewatch_core::state_dir::{write_atomic, StateDir, WriteOptions};
use throttlewatch_core::ContainerKey;

use crate::report::Reporter;
use crate::Stage;

/// Record that `key`'s register (init pid `pid`) is about to be sent.
pub fn mark(state: &StateDir, key: &ContainerKey, pid: u32) -> std::io::Result<()> {
    StateDir::create_dir(&state.pending_dir())?;
    write_atomic(
        &state.pending_file(key),
        pid.to_string().as_bytes(),
        &WriteOptions::STATE,
    )
}

/// The agent has taken the register (or the container is gone): the
/// record is removed. Used by the agent, and by `start`/`delete` when they
/// stop waiting.
pub fn clear(state: &StateDir, key: &ContainerKey) {
    let _ = std::fs::remove_file(state.pending_file(key));
}

/// What the front ends' `start` does before the runtime's: wait for a
/// pending register of `key` (see the module). When the container starts
/// unwatched, the reason is said in hook.log (by `name`) and returned.
pub fn before_start(cfg: &Config, key: &ContainerKey, name: &'static str) -> Option<String> {
    let state = StateDir::new(&cfg.state_dir);
    let why = match wait_watched(&state, key, cfg.agent_timeout()) {
        Confirmed::Watched(_) => return None,
        Confirmed::Refused => "the agent refused to watch it (see the agent's log)".to_string(),
        Confirmed::TimedOut(t) => format!(
            "the agent on {} did not confirm the watch within {t:?} (agent_timeout_ms)",
            cfg.socket.display()
        ),
    };
    let msg = format!("container {:?} starts unwatched: {why}", key.id);
    let mut rep = Reporter::new(cfg, Stage::CreateRuntime, name);
    rep.set_container(&key.id);
    rep.warn(&msg);
    Some(msg)
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
}

/// Wait until `key`'s register is no longer pending, the agent refused it,
/// or `timeout` passed; the record is gone afterwards. Polls every 100 µs.
pub fn wait_watched(state: &StateDir, key: &ContainerKey, timeout: Duration) -> Confirmed {
    let p = state.pending_file(key);
    let t0 = Instant::now();
    let out = loop {
        if state.unwatched_file(key).exists() {
            break Confirmed::Refused;
        }
        if !p.exists() {
            break Confirmed::Watched(t0.elapsed());
        }
        if t0.elapsed() >= timeout {
            break Confirmed::TimedOut(timeout);
        }
        std::thread::sleep(Duration::from_micros(100));
    };
    clear(state, key);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_until_cleared_or_refused() {
        let d = tempfile::tempdir().unwrap();
        let st = StateDir::new(d.path());
        let k = ContainerKey::new("c1", None);
        let short = Duration::from_millis(5);
        assert!(matches!(
            wait_watched(&st, &k, short),
            Confirmed::Watched(_)
        ));
        mark(&st, &k, 42).unwrap();
        assert_eq!(std::fs::read_to_string(st.pending_file(&k)).unwrap(), "42");
        assert_eq!(wait_watched(&st, &k, short), Confirmed::TimedOut(short));
        assert!(
            !st.pending_file(&k).exists(),
            "a wait that gave up removes it"
        );
        mark(&st, &k, 42).unwrap();
        let (st2, k2) = (st.clone(), k.clone());
        let agent = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            clear(&st2, &k2);
        });
        let long = Duration::from_secs(5);
        assert!(matches!(wait_watched(&st, &k, long), Confirmed::Watched(t) if t < long));
        agent.join().unwrap();
        mark(&st, &k, 42).unwrap();
        crate::unwatched::mark(&st, &k).unwrap();
        assert_eq!(wait_watched(&st, &k, short), Confirmed::Refused);
    }
}
