//! `delete`: when the container has stopped (or `--force` is given), the
//! agent writes the `end` record before the low-level delete removes the
//! cgroup (see `throttlewatch_lifecycle::agent_client::end_before_delete`).
//! The delete itself is exec'd with argv untouched afterwards.

use std::path::Path;

use throttlewatch_core::config::Config;
use throttlewatch_lifecycle::agent_client;
use throttlewatch_lifecycle::create_marks::CreateMarks;

use crate::args::RuncArgs;
use crate::lowlevel;
use crate::runlog::RuncLog;
use crate::ticket;

pub fn end_before_delete(
    runtime: &Path,
    args: &RuncArgs,
    cfg: &Config,
    config_path: Option<&Path>,
    log: &RuncLog,
) {
    let Some(key) = args.container_key() else {
        return;
    };
    // Created and never started: its register is no longer awaited.
    CreateMarks::new(&cfg.state_dir, &key).taken();
    if let Err(e) = ticket::remove(&key, config_path) {
        log.warning(&format!("cannot remove the start ticket of {key}: {e}"));
    }
    if !cfg.socket.exists() {
        return;
    }
    if !args.has_sub_flag(&["force", "f"])
        && status(runtime, args, &key.id).as_deref() != Some("stopped")
    {
        return; // a running container: runc refuses the delete, the log goes on
    }
    if let Err(w) = agent_client::end_before_delete(cfg, &key, None) {
        log.warning(&w.to_string());
    }
}

/// `<runtime> <global flags> state ID` → `status`.
fn status(runtime: &Path, args: &RuncArgs, id: &str) -> Option<String> {
    lowlevel::state(runtime, args.global_args(), id).map(|s| s.status)
}
