//! How a command ends when it fails: an exit status and a one-line message.

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
