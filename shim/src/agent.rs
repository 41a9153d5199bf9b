//! The agent's side of a delete. runc 1.1 removes the container's cgroup
//! *before* it runs the poststop hooks, so by poststop `cpu.stat` is gone;
//! the shim asks the agent to write the `end` record first (with the exit
//! status it reaped), while the cgroup still exists. The poststop hook then
//! finds the container already ended. Fail-open: a missing agent is logged.

use log::warn;
use throttlewatch_core::config::Config;
use throttlewatch_core::protocol::{call, Request};

/// The `end` record's reason (the same as the runtime wrapper's).
pub const REASON: &str = "delete";

pub fn end_before_delete(cfg: &Config, id: &str, exit_code: Option<i32>) {
    if !cfg.socket.exists() {
        return;
    }
    let req = Request::Unregister {
        container_id: id.to_string(),
        reason: REASON.into(),
        exit_code,
    };
    match call(&cfg.socket, &req, cfg.agent_timeout()) {
        Ok(r)
            if r.ok
                || r.error
                    .as_deref()
                    .is_some_and(|e| e.contains("not watched")) => {}
        Ok(r) => warn!(
            "{id}: the agent could not end the log: {}",
            r.error.unwrap_or_default()
        ),
        Err(e) => warn!(
            "{id}: agent on {}: {e}; the end record is left to the poststop hook",
            cfg.socket.display()
        ),
    }
}
