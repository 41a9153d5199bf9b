//! The agent's directories, made with their modes.

use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

use crate::CliError;

/// `p` and its parents, the last with `mode`.
pub(crate) fn mkdir(p: &Path, mode: u32) -> Result<(), CliError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(p)
        .map_err(|e| CliError::fail(format!("{}: {e}", p.display())))
}
