//! `update`: the wrapper holds the container's CFS burst across the
//! low-level update (`throttlewatch_lifecycle::held_burst`), running the
//! update as a child, and exits with the runtime's status. Without a burst
//! record, the bundle comes from the runtime's `state`.

use std::path::Path;

use throttlewatch_core::config::{Config, FailMode};
use throttlewatch_lifecycle::burst_record::BurstRecord;
use throttlewatch_lifecycle::held_burst::{derive_for_bundle, HeldBurst, Warn};
use throttlewatch_lifecycle::ContainerKey;

use crate::args::RuncArgs;
use crate::lowlevel;
use crate::runlog::RuncLog;

pub fn update(runtime: &Path, args: &RuncArgs, cfg: &Config, log: &RuncLog) -> i32 {
    let mut warn = |m: &str| log.warning(m);
    let held = args.container_key().and_then(|key| {
        HeldBurst::take(
            cfg,
            &key,
            |w| derive_record(runtime, args, cfg, &key, w),
            &mut warn,
        )
    });
    let code = match lowlevel::run_child(runtime, &args.argv) {
        Ok(c) => c,
        Err(e) => {
            log.error(&format!("cannot run {}: {e}", runtime.display()));
            127
        }
    };
    if let Some(h) = held {
        if let Err(e) = h.restore(cfg, &mut warn) {
            log.error(&e.to_string());
            if code == 0 && cfg.fail_mode == FailMode::Closed {
                return 1;
            }
        }
    }
    code
}

/// The burst record of a container that has none: its bundle (from the
/// runtime's `state`) asks for a burst in its annotations or environment,
/// and its init process gives the cgroup. None when it asks for none.
fn derive_record(
    runtime: &Path,
    args: &RuncArgs,
    cfg: &Config,
    key: &ContainerKey,
    warn: Warn,
) -> Option<BurstRecord> {
    let state = lowlevel::state(runtime, args.global_args(), &key.id)?;
    derive_for_bundle(cfg, key, &state.bundle, state.init_pid()?, warn)
}
