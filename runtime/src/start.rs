//! `start`: the entrypoint runs only once the container is watched. The
//! wrapper's `create` sent the register without waiting for the answer
//! (`throttlewatch_lifecycle::pending`); here, before the low-level runtime
//! lets the entrypoint run, the wrapper waits for the agent to have taken
//! it — usually done already, then one `stat` (also when nothing was
//! pending: a register answered at create, or none). A register the agent
//! refused or did not take within `agent_timeout_ms` starts the container
//! unwatched (fail-open: `create` only sends without waiting under
//! fail-open) and says so in hook.log and runc's log.

use throttlewatch_core::config::Config;
use throttlewatch_lifecycle::pending;

use crate::args::RuncArgs;
use crate::runlog::{RuncLog, NAME};

pub fn wait_for_watch(args: &RuncArgs, cfg: &Config, log: &RuncLog) {
    let Some(key) = args.container_key() else {
        return;
    };
    if let Some(msg) = pending::before_start(cfg, &key, NAME) {
        log.warning(&msg);
    }
}
