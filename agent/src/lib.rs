//! The throttlewatch agent: holds the node-wide probe, keeps one session per
//! watched container, and writes each container's log.
//!
//! `throttlewatch run` and `throttlewatch watch` embed the same engine that
//! the node daemon (`throttlewatch agent`) runs.

pub mod cli;
pub mod commands;
pub mod control;
pub mod daemon;
pub mod install;
pub mod pipeline;
pub mod signals;

// The parts by their own names, as the rest of the crate and `main.rs` use them.
pub use commands::{burn, configcheck, demo, live, privileges, run, topology, watch};
pub use daemon::{logdir, metrics, socket, state};
pub use pipeline::{
    budget, clock, coldstart, engine, freezes, histograms, kernel_counters, labels, output,
    placement, procinfo, reading, records, runq, session, spec, threadcpu,
};

/// Exit status for bad input: the one-line error names the value and what is accepted.
pub const EXIT_USAGE: i32 = 2;

/// An error that ends the command with a given exit status.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct CliError {
    pub code: i32,
    pub message: String,
}

impl CliError {
    pub fn usage(message: impl Into<String>) -> CliError {
        CliError {
            code: EXIT_USAGE,
            message: message.into(),
        }
    }
    pub fn fail(message: impl Into<String>) -> CliError {
        CliError {
            code: 1,
            message: message.into(),
        }
    }
}
