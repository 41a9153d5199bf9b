//! `start`: the entrypoint runs only once the container is watched. The
//! wrapper's `create` sent the register without waiting for the answer
//! (`throttlewatch_lifecycle::pending`); here, before the low-level runtime
//! lets the entrypoint run, the wrapper waits for the agent to have taken
//! it — usually done already, then one `stat` (also when nothing was
//! pending: a register answered at create, or none). A register the agent
//! refused or did not confirm within `agent_timeout_ms` starts the
//! container unwatched (fail-open: `create` only sends without waiting
//! under fail-open) and says so in hook.log and runc's log.

use throttlewatch_core::config::Config;
use throttlewatch_lifecycle::pending::{self, Confirmed};
use throttlewatch_lifecycle::report::Reporter;
use throttlewatch_lifecycle::{Stage, StateDir};

use crate::args::RuncArgs;
use crate::runlog::{RuncLog, NAME};

pub fn wait_for_watch(args: &RuncArgs, cfg: &Config, log: &RuncLog) {
    let Some(key) = args.container_key() else {
        return;
    };
    let state = StateDir::new(&cfg.state_dir);
    let why = match pending::wait_watched(&state, &key, cfg.agent_timeout()) {
        Confirmed::Watched(_) => return,
        Confirmed::Refused => "the agent refused to watch it (see the agent's log)".to_string(),
        Confirmed::TimedOut(t) => format!(
            "the agent on {} did not confirm the watch within {t:?} (agent_timeout_ms)",
            cfg.socket.display()
        ),
    };
    let msg = format!("container {:?} starts unwatched: {why}", key.id);
    let mut rep = Reporter::new(cfg, Stage::CreateRuntime, NAME);
    rep.set_container(&key.id);
    rep.warn(&msg);
    log.warning(&msg);
}
