//! A kernel file (cgroupfs, sysfs, procfs) that could not be read, or did
//! not hold what it should: its path, and what was wrong. Shared by the
//! cgroup and the topology readers (`CgroupError`, qos's `TopologyError`).

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum FileError {
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
}

impl FileError {
    /// For `map_err`: the read of `path` failed.
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> FileError {
        let path = path.into();
        move |source| FileError::Io { path, source }
    }

    /// `path` held `value`, which is not `what`.
    pub fn parse(
        path: impl Into<PathBuf>,
        what: &'static str,
        value: impl Into<String>,
    ) -> FileError {
        FileError::Parse {
            path: path.into(),
            what,
            value: value.into(),
        }
    }
}
