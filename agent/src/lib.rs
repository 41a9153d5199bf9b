//! The throttlewatch agent: holds the node-wide probe, keeps one session per
//! watched container, and writes each container's log.
//!
//! `throttlewatch run` and `throttlewatch watch` embed the same engine that
//! the node daemon (`throttlewatch agent`) runs.

#![warn(unreachable_pub)]

pub mod cli;
mod cli_error;
mod commands;
mod control;
mod daemon;
mod install;
mod pipeline;
mod signals;

// What `main.rs` (and the tests' `tw-burn`) call; everything else is the
// crate's own (`pub(crate)`).
pub use commands::burn::burn;
pub use commands::configcheck::check as config_check;
pub use commands::demo::demo;
pub use commands::privileges::check as check_privileges;
pub use commands::run::run;
pub use commands::topology::topology;
pub use commands::watch::watch;
pub use daemon::{detach as detach_daemon, run as run_daemon};
pub use install::crio_conf::HookPaths;
pub use install::restart::Restart;
pub use install::{install, uninstall, Options as InstallOptions};

// The parts by their own names, as the rest of the crate uses them.
pub(crate) use commands::{burn, live, run};
pub(crate) use daemon::{logdir, metrics, socket, state};
pub(crate) use pipeline::{
    budget, clock, coldstart, engine, freezes, gpu, histograms, kernel_counters, labels, output,
    placement, probe_facts, procinfo, reading, records, runq, session, spec, threadcpu, wakeups,
};

pub use cli_error::{CliError, EXIT_USAGE};
