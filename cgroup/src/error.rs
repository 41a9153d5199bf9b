use std::path::PathBuf;

pub use crate::file_error::FileError;

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// A cgroupfs or procfs file unread or not as the kernel writes it.
    #[error(transparent)]
    File(#[from] FileError),
    #[error("no cgroup hierarchy holds the {0} controller (is cgroupfs mounted?)")]
    NoController(&'static str),
    #[error("cgroup {0} does not exist")]
    Missing(PathBuf),
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, CgroupError>;

pub(crate) fn io_err(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> CgroupError {
    let io = FileError::io(path);
    move |source| CgroupError::File(io(source))
}
