//! How reading a log fails: the file, and for a line its number and what
//! is wrong with it.

use std::path::PathBuf;

use throttlewatch_core::logfmt::SCHEMA_VERSION;

/// The record types schema version 1 defines.
pub(crate) const RECORD_TYPES: &str =
    "start, resume, throttle, process, throttle_summary, cpu_stat, runq, cold_start, control, end";

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {problem}")]
    Malformed {
        path: PathBuf,
        line: u64,
        problem: LineError,
    },
    #[error("{0}")]
    NotFound(String),
}

/// Why one line of a log cannot be read; each names the field, the value
/// and what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    /// serde_json's message with the field and column (`describe`).
    #[error("not JSON: {0}")]
    NotJson(String),
    #[error("a `{ty}` record that schema version {SCHEMA_VERSION} cannot read: {detail}")]
    Unreadable { ty: String, detail: String },
    #[error("no `v` (schema version) field")]
    NoVersion,
    #[error("`v` is 0: schema versions start at 1")]
    ZeroVersion,
    #[error("schema version {0} is newer than this reader's ({SCHEMA_VERSION}); use a newer throttlewatch")]
    NewerVersion(u64),
    #[error("no `type` field (accepted: {RECORD_TYPES})")]
    NoType,
    #[error("unknown record type `{0}` (accepted: {RECORD_TYPES})")]
    UnknownType(String),
}
