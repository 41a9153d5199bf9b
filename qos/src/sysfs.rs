//! Reading sysfs and procfs files for the topology, and how it fails.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: cannot parse {what} from {value:?}")]
    Parse {
        path: PathBuf,
        what: &'static str,
        value: String,
    },
    #[error("{0}: no online CPUs found")]
    NoCpus(PathBuf),
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TopologyError + '_ {
    move |source| TopologyError::Io {
        path: path.into(),
        source,
    }
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
