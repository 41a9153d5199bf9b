//! The shim's errors, and the one place they become ttrpc status codes (as
//! rust-extensions' `crates/shim/src/error.rs` maps its error enum once).
//! The messages are the runc shim's, word for word where containerd or
//! critest reads them (`errdefs` matches on the code, people on the text).

use containerd_shim::protos::ttrpc::{self, Code};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A container this shim does not hold (service.go getContainer).
    #[error("container not created")]
    ContainerNotFound,
    /// An exec process the container does not hold (runc/container.go Process).
    #[error("process does not exist {0}")]
    ExecNotFound(String),
    /// Something else that is not there (a finished process, a cgroup);
    /// the message whole, as the runc shim words it.
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    /// The request does not fit the process's state.
    #[error("{0}")]
    FailedPrecondition(String),
    /// What runc or the system answered (an OCI runtime failure, a mount).
    #[error("{0}")]
    Internal(String),
    #[error("{0}")]
    Unknown(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// What runc answered, as the runc shim passes it on (an internal error).
impl From<crate::runc::RuncError> for Error {
    fn from(e: crate::runc::RuncError) -> Error {
        Error::Internal(e.to_string())
    }
}

/// A task's init that could not be started (`Create`): an internal error.
impl From<crate::stdio::LaunchError> for Error {
    fn from(e: crate::stdio::LaunchError) -> Error {
        Error::Internal(e.to_string())
    }
}

/// Metrics that could not be encoded (`Stats`): an internal error.
impl From<crate::metrics::MarshalError> for Error {
    fn from(e: crate::metrics::MarshalError) -> Error {
        Error::Internal(e.to_string())
    }
}

impl Error {
    pub fn code(&self) -> Code {
        match self {
            Error::ContainerNotFound | Error::ExecNotFound(_) | Error::NotFound(_) => {
                Code::NOT_FOUND
            }
            Error::AlreadyExists(_) => Code::ALREADY_EXISTS,
            Error::FailedPrecondition(_) => Code::FAILED_PRECONDITION,
            Error::Internal(_) => Code::INTERNAL,
            Error::Unknown(_) => Code::UNKNOWN,
        }
    }

    /// A failed `runc kill`, as the runc shim reports it (process/utils.go
    /// checkKillError).
    pub fn of_kill(e: crate::runc::RuncError) -> Error {
        let e = e.to_string();
        let lower = e.to_lowercase();
        if lower.contains("os: process already finished")
            || e.contains("container not running")
            || lower.contains("no such process")
        {
            Error::NotFound("process already finished: not found".into())
        } else if e.contains("does not exist") {
            Error::NotFound("no such container: not found".into())
        } else {
            Error::Unknown(format!("unknown error after kill: {e}"))
        }
    }

    /// An exec that could not be started (`Start` of an exec): an unknown
    /// error, as the runc shim's exec start answers.
    pub fn of_exec_start(e: crate::stdio::LaunchError) -> Error {
        Error::Unknown(e.to_string())
    }
}

impl From<Error> for ttrpc::Error {
    fn from(e: Error) -> ttrpc::Error {
        ttrpc::Error::RpcStatus(ttrpc::get_status(e.code(), e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(s: &str) -> crate::runc::RuncError {
        crate::runc::RuncError::Failed(s.into())
    }

    fn status(e: Error) -> (Code, String) {
        match ttrpc::Error::from(e) {
            ttrpc::Error::RpcStatus(s) => (s.code(), s.message().to_string()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn codes_and_words_are_the_runc_shims() {
        assert_eq!(
            status(Error::ContainerNotFound),
            (Code::NOT_FOUND, "container not created".into())
        );
        assert_eq!(
            status(Error::ExecNotFound("e1".into())),
            (Code::NOT_FOUND, "process does not exist e1".into())
        );
        assert_eq!(
            status(Error::of_kill(failed("container not running"))),
            (
                Code::NOT_FOUND,
                "process already finished: not found".into()
            )
        );
        assert_eq!(
            status(Error::of_kill(failed("container \"x\" does not exist"))),
            (Code::NOT_FOUND, "no such container: not found".into())
        );
        assert_eq!(
            status(Error::of_kill(failed("permission denied"))),
            (
                Code::UNKNOWN,
                "unknown error after kill: permission denied".into()
            )
        );
        assert_eq!(
            status(Error::FailedPrecondition(
                "process not created: failed precondition".into()
            )),
            (
                Code::FAILED_PRECONDITION,
                "process not created: failed precondition".into()
            )
        );
        let launch = || crate::stdio::LaunchError::Runc(failed("exec failed"));
        assert_eq!(
            status(Error::from(launch())),
            (Code::INTERNAL, "exec failed".into())
        );
        assert_eq!(
            status(Error::of_exec_start(launch())),
            (Code::UNKNOWN, "exec failed".into())
        );
        assert_eq!(status(Error::Internal("x".into())).0, Code::INTERNAL);
        assert_eq!(
            status(Error::AlreadyExists("x".into())).0,
            Code::ALREADY_EXISTS
        );
    }
}
