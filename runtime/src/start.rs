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
//!
//! Before any of that, [`ready`]: with the start ticket of the wrapper's
//! `create` ([`crate::ticket`]) and no register pending, `start` execs the
//! runtime without loading the configuration.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use throttlewatch_core::config::Config;
use throttlewatch_lifecycle::create_marks::CreateMarks;

use crate::args::RuncArgs;
use crate::runlog::{RuncLog, NAME};
use crate::ticket;

/// How long [`ready`] waits for a register the agent is taking. Its work
/// takes 0.2-0.3 ms; `start` found it under way in about one round of five
/// of the bench.
const TAKING: Duration = Duration::from_millis(2);

/// The runtime to exec at once: the container has a start ticket written
/// for this configuration file and no pending register (the agent has
/// it, or nothing was sent), or the register is taken within [`TAKING`].
/// None: go the whole way (configuration, then [`wait_for_watch`], which
/// tells a refused register, an agent gone and one silent for
/// `agent_timeout_ms` apart).
pub fn ready(args: &RuncArgs, config_path: Option<&Path>) -> Option<PathBuf> {
    let key = args.container_key()?;
    let t = ticket::read(&key, config_path)?;
    if t.config.as_deref() != config_path {
        return None;
    }
    let t0 = Instant::now();
    loop {
        // Any entry there, even one that cannot be read, is waited on.
        match std::fs::symlink_metadata(&t.pending) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Some(t.runtime),
            _ if t0.elapsed() >= TAKING => return None,
            _ => std::thread::sleep(Duration::from_micros(50)),
        }
    }
}

pub fn wait_for_watch(args: &RuncArgs, cfg: &Config, config_path: Option<&Path>, log: &RuncLog) {
    let Some(key) = args.container_key() else {
        return;
    };
    if let Some(msg) = CreateMarks::new(&cfg.state_dir, &key).before_start(cfg, config_path, NAME) {
        log.warning(&msg);
    }
}
