//! The OCI state (runtime-spec `state.md`: `ociVersion`, `id`, `status`,
//! `pid`, `bundle`, `annotations`): what the runtime writes on a hook's stdin
//! and what `runc state` prints. Declared here rather than taken from
//! `oci-spec`, whose `State` has no `paused` status (which `runc state`
//! reports); unknown fields (`rootfs`, `created`, `owner`) are ignored.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;

use serde::Deserialize;

/// Largest state accepted on stdin (a state with many annotations is a few KiB).
pub const MAX_STATE_BYTES: u64 = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OciState {
    #[serde(default)]
    pub oci_version: String,
    pub id: String,
    #[serde(default)]
    pub status: String,
    /// The container's init process; absent or 0 once it has stopped.
    #[serde(default)]
    pub pid: Option<i64>,
    pub bundle: PathBuf,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

/// The state the runtime gave the hook on stdin, refused: what was wrong.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("stdin: cannot read the OCI state: {0}")]
    Read(std::io::Error),
    #[error("stdin: OCI state is over {MAX_STATE_BYTES} bytes")]
    TooLong,
    #[error("stdin: expected the OCI state JSON ({{\"ociVersion\",\"id\",\"pid\",\"bundle\",...}}) from the runtime, got {shown:?}: {source}")]
    Json {
        shown: String,
        source: serde_json::Error,
    },
    #[error("stdin: OCI state has an empty \"id\"")]
    EmptyId,
    #[error("stdin: OCI state \"bundle\" {0:?} is not an absolute path")]
    RelativeBundle(std::path::PathBuf),
}

impl OciState {
    /// Read and parse the state; the error says what was expected and shows
    /// the beginning of what came.
    pub fn read(mut input: impl Read) -> Result<OciState, StateError> {
        let mut buf = Vec::new();
        input
            .by_ref()
            .take(MAX_STATE_BYTES + 1)
            .read_to_end(&mut buf)
            .map_err(StateError::Read)?;
        if buf.len() as u64 > MAX_STATE_BYTES {
            return Err(StateError::TooLong);
        }
        Self::parse(&buf)
    }

    pub fn parse(buf: &[u8]) -> Result<OciState, StateError> {
        let st: OciState = serde_json::from_slice(buf).map_err(|e| StateError::Json {
            shown: String::from_utf8_lossy(buf).chars().take(60).collect(),
            source: e,
        })?;
        if st.id.is_empty() {
            return Err(StateError::EmptyId);
        }
        if !st.bundle.is_absolute() {
            return Err(StateError::RelativeBundle(st.bundle));
        }
        Ok(st)
    }

    /// The init pid, when the container has one.
    pub fn init_pid(&self) -> Option<u32> {
        self.pid
            .filter(|p| *p > 0 && *p <= u32::MAX as i64)
            .map(|p| p as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_runc_state() {
        let s = br#"{"ociVersion":"1.0.2-dev","id":"c1","pid":4242,"root":"/x","bundle":"/b/c1","annotations":{"a":"b"},"status":"creating"}"#;
        let st = OciState::read(&s[..]).unwrap();
        assert_eq!(st.id, "c1");
        assert_eq!(st.init_pid(), Some(4242));
        assert_eq!(st.bundle, PathBuf::from("/b/c1"));
        assert_eq!(st.annotations["a"], "b");
    }

    #[test]
    fn stopped_container_has_no_pid() {
        let st =
            OciState::parse(br#"{"id":"c","pid":0,"bundle":"/b","status":"stopped"}"#).unwrap();
        assert_eq!(st.init_pid(), None);
    }

    #[test]
    fn garbage_is_a_clear_error() {
        let e = OciState::parse(b"hello there").unwrap_err().to_string();
        assert!(
            e.starts_with("stdin: expected the OCI state JSON") && e.contains("hello there"),
            "{e}"
        );
        assert!(OciState::parse(b"")
            .unwrap_err()
            .to_string()
            .contains("OCI state"));
        let e = OciState::parse(br#"{"id":"c","bundle":"rel"}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"rel\"") && e.contains("absolute"), "{e}");
        let e = OciState::parse(br#"{"id":"","bundle":"/b"}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("empty"), "{e}");
    }
}
