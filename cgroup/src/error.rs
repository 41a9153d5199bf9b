use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
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
    #[error("no cgroup hierarchy holds the {0} controller (is cgroupfs mounted?)")]
    NoController(&'static str),
    #[error("cgroup {0} does not exist")]
    Missing(PathBuf),
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, CgroupError>;

pub(crate) fn io_err(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> CgroupError {
    let path = path.into();
    move |source| CgroupError::Io { path, source }
}
