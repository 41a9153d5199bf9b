//! Reading sysfs and procfs files for the topology, and how it fails.

use std::path::{Path, PathBuf};

use throttlewatch_cgroup::FileError;

#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// A sysfs or procfs file unread or not as the kernel writes it.
    #[error(transparent)]
    File(#[from] FileError),
    #[error("{0}: no online CPUs found")]
    NoCpus(PathBuf),
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TopologyError + '_ {
    move |source| FileError::io(path)(source).into()
}

pub(crate) fn read_trim(path: &Path) -> Result<String, TopologyError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(io_err(path))
}

/// Numbered entries `<prefix>N` of a directory, sorted by N.
pub(crate) fn numbered(dir: &Path, prefix: &str) -> Result<Vec<u32>, TopologyError> {
    let mut ids: Vec<u32> = std::fs::read_dir(dir)
        .map_err(io_err(dir))?
        .filter_map(|e| {
            e.ok()?
                .file_name()
                .to_str()?
                .strip_prefix(prefix)?
                .parse()
                .ok()
        })
        .collect();
    ids.sort_unstable();
    Ok(ids)
}
