//! `delete`: runc 1.1 removes the container's cgroup *before* it runs the
//! poststop hooks, so by poststop the kernel's counters (`cpu.stat`) are
//! gone. When the container has stopped (or `--force` is given), the wrapper
//! asks the agent to write the `end` record first, while the cgroup still
//! exists; the poststop hook then finds the container already ended. The
//! delete itself is exec'd with argv untouched afterwards.

use std::path::Path;

use throttlewatch_core::config::Config;
use throttlewatch_core::protocol::{call, Request};

use crate::args::RuncArgs;
use crate::lowlevel;
use crate::runlog::RuncLog;

/// The `end` record's reason when the wrapper writes it.
pub const REASON: &str = "delete";

pub fn end_before_delete(runtime: &Path, args: &RuncArgs, cfg: &Config, log: &RuncLog) {
    let Some(id) = args
        .container_id()
        .map(|i| i.to_string_lossy().into_owned())
    else {
        return;
    };
    if !cfg.socket.exists() {
        return;
    }
    if !args.has_sub_flag(&["force", "f"])
        && status(runtime, args, &id).as_deref() != Some("stopped")
    {
        return; // a running container: runc refuses the delete, the log goes on
    }
    let req = Request::Unregister {
        container_id: id.clone(),
        reason: REASON.into(),
        exit_code: None,
    };
    match call(&cfg.socket, &req, cfg.agent_timeout()) {
        Ok(r)
            if r.ok
                || r.error
                    .as_deref()
                    .is_some_and(|e| e.contains("not watched")) => {}
        Ok(r) => log.warning(&format!(
            "the agent could not end the log of {id:?}: {}",
            r.error.unwrap_or_default()
        )),
        Err(e) => log.warning(&format!(
            "agent on {}: {e}; the end record of {id:?} is left to the poststop hook",
            cfg.socket.display()
        )),
    }
}

/// `<runtime> <global flags> state ID` → `status`.
fn status(runtime: &Path, args: &RuncArgs, id: &str) -> Option<String> {
    let v = lowlevel::state(runtime, args.global_args(), id)?;
    v["status"].as_str().map(str::to_string)
}
