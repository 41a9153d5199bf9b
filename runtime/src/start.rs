//! `start`: the entrypoint runs only once the container is watched. The
//! wrapper's `create` sent the register without waiting for the answer
//! (`throttlewatch_lifecycle::pending`); here, before the low-level runtime
//! lets the entrypoint run, the wrapper waits for the agent to have taken
//! it — usually done already, then one failed read (also when nothing was
//! pending: a register answered at create, or none). A register whose agent
//! restarted before reading it, or that was not taken within
//! `agent_timeout_ms`, is sent again and its answer awaited; one the agent
//! refused, or that fails again, starts the container unwatched (fail-open:
//! `create` only sends without waiting under fail-open), said in hook.log
//! and runc's log.

use std::path::Path;

use throttlewatch_core::config::Config;
use throttlewatch_lifecycle::pending;

use crate::args::RuncArgs;
use crate::runlog::{RuncLog, NAME};

pub fn wait_for_watch(args: &RuncArgs, cfg: &Config, config_path: Option<&Path>, log: &RuncLog) {
    let Some(key) = args.container_key() else {
        return;
    };
    if let Some(msg) = pending::before_start(cfg, config_path, &key, NAME) {
        log.warning(&msg);
    }
}
