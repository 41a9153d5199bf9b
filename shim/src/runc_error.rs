//! How a runc invocation fails.

use std::path::PathBuf;

/// A runc invocation that failed, worded as go-runc and the runc shim word it.
#[derive(Debug, thiserror::Error)]
pub enum RuncError {
    #[error("{binary}: {source}")]
    Spawn {
        binary: String,
        source: std::io::Error,
    },
    /// runc's last logged error, else its exit status and stderr.
    #[error("{0}")]
    Failed(String),
    /// `runc create` or `runc exec` failed (process/init.go runtimeError).
    #[error("OCI runtime {op} failed: {source}")]
    Oci {
        op: &'static str,
        source: Box<RuncError>,
    },
    /// A file runc writes or reads for us (pid file, process spec).
    #[error("{}: {msg}", path.display())]
    File { path: PathBuf, msg: String },
    /// What runc printed could not be read.
    #[error("runc output: {0}")]
    Output(String),
}
