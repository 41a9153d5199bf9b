//! The throttlewatch agent: holds the node-wide probe, keeps one session per
//! watched container, and writes each container's log.
//!
//! `throttlewatch run` and `throttlewatch watch` embed the same engine that
//! the node daemon (`throttlewatch agent`) runs.

pub mod budget;
pub mod burn;
pub mod cli;
pub mod clock;
pub mod coldstart;
pub mod configcheck;
pub mod control;
pub mod daemon;
pub mod demo;
pub mod engine;
pub mod freezes;
pub mod histograms;
pub mod install;
pub mod kernel_counters;
pub mod labels;
pub mod live;
pub mod logdir;
pub mod metrics;
pub mod output;
pub mod placement;
pub mod privileges;
pub mod procinfo;
pub mod reading;
pub mod run;
pub mod runq;
pub mod session;
pub mod signals;
pub mod socket;
pub mod spec;
pub mod state;
pub mod threadcpu;
pub mod timing;
pub mod topology;
pub mod watch;

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
