//! The agent's socket protocol: one JSON request line, one JSON response line.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::container_key::{ContainerKey, Scope};
use crate::end_reason::EndReason;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Register(Register),
    Unregister {
        container_id: String,
        /// The id space of `container_id` (see [`Scope`]); None: runc's default root.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scope: Option<Scope>,
        reason: EndReason,
        exit_code: Option<i32>,
    },
    Status,
}

/// What `<state_dir>/pending/<key>` holds: a register a front end sent
/// (or could not send: no agent answered) and no agent has taken yet
/// (`throttlewatch_lifecycle::pending`); an agent that starts takes every
/// one whose container still runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingRegister {
    /// Which socket file the register was sent to
    /// ([`socket_id`]); None: no agent
    /// listened, the record waits for the next one.
    pub socket: Option<String>,
    pub register: Register,
}

/// The socket file's identity: a restarted agent binds a new file. Its
/// inode and change time to the nanosecond (a file system may give a new
/// file the inode number of one just removed).
pub fn socket_id(socket: &Path) -> Option<String> {
    std::fs::metadata(socket)
        .ok()
        .map(|m| format!("{}:{}.{:09}", m.ino(), m.ctime(), m.ctime_nsec()))
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Register {
    pub container_id: String,
    /// The id space of `container_id`: the runc root or containerd namespace
    /// (see [`Scope`]); None: runc's default root. Sessions, logs and state
    /// files are keyed by (scope, id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Scope>,
    pub container_name: String,
    pub pid: Option<u32>,
    /// cpu-controller cgroup path relative to the hierarchy root.
    pub cgroup_path: String,
    pub annotations: BTreeMap<String, String>,
    pub bundle: String,
    /// Unix ns of the runtime's create, where known (the wrapper stamps it
    /// into the spec as the `throttlewatch.io/created-unix-ns` annotation).
    pub created_ns: Option<u64>,
    /// Unix ns when the hook ran (the cold start's `hook` stage).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook_ns: Option<u64>,
    /// Freeze threshold for this container's log, ns (None: agent default).
    pub threshold_ns: Option<u64>,
    /// What the hook applied and refused (written into the `start` record).
    pub qos: Option<serde_json::Value>,
    /// Answer only once the log is open and its `start` record written
    /// (the hook asks for it under fail-closed, where a log that cannot be
    /// opened refuses the container). By default the agent answers as soon
    /// as the cgroup is in the kernel's watch map and writes the log after.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub wait_for_log: bool,
    /// The front end tells the agent of the container's exit itself, with
    /// its exit code (NRI's `StopContainer`, the shim's `delete` with the status it
    /// waited for). When
    /// false (the OCI hook, the runtime wrapper) the agent ends the log
    /// when the container's init has exited and its cgroup is empty.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exit_reported: bool,
}

impl Register {
    /// The container as the agent keys it.
    pub fn key(&self) -> ContainerKey {
        ContainerKey::new(self.container_id.clone(), self.scope.clone())
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watched: Option<Vec<String>>,
    /// Entries in the kernel's watch map (leak checks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watch_map_entries: Option<usize>,
    /// Why a request was refused, for clients to act on (`error` is for people).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<ErrorCode>,
}

/// A refusal clients tell apart without reading the error text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorCode {
    /// Unregister of a container the agent does not watch (already ended,
    /// or never registered): not an error for the front ends.
    NotWatched,
}

impl Response {
    pub fn ok() -> Response {
        Response {
            ok: true,
            ..Default::default()
        }
    }
    pub fn err(e: impl ToString) -> Response {
        Response {
            ok: false,
            error: Some(e.to_string()),
            ..Default::default()
        }
    }

    /// The answer to an unregister of a container the agent does not watch.
    pub fn not_watched(key: &ContainerKey) -> Response {
        Response {
            code: Some(ErrorCode::NotWatched),
            ..Response::err(format!("container {key} is not watched"))
        }
    }
}

/// Longest request line the agent reads (a register with many annotations).
pub const MAX_REQUEST_BYTES: u64 = 1 << 20;

/// Connect to a unix socket, giving up after `timeout`. A stopped or wedged
/// listener whose backlog is full makes `connect(2)` block for ever; the
/// kernel bounds it by the socket's send timeout (`SO_SNDTIMEO`, honoured by
/// `unix_stream_connect`), which is set before connecting. A timeout is
/// `ErrorKind::WouldBlock` ("Resource temporarily unavailable").
pub fn connect(socket: &Path, timeout: Duration) -> std::io::Result<UnixStream> {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    let path = socket.as_os_str().as_bytes();
    // SAFETY: a zeroed sockaddr_un is valid; the path is bounds-checked below.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if path.len() >= addr.sun_path.len() || path.contains(&0) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{}: not a usable unix socket path", socket.display()),
        ));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(path) {
        *d = *s as libc::c_char;
    }
    // SAFETY: plain syscalls on a descriptor owned by `fd` from here on.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let s = UnixStream::from(fd);
    // Zero would mean "no timeout": the shortest bound is one microsecond.
    s.set_write_timeout(Some(timeout.max(Duration::from_micros(1))))?;
    let len = std::mem::size_of::<libc::sa_family_t>() + path.len();
    let rc = unsafe {
        libc::connect(
            std::os::fd::AsRawFd::as_raw_fd(&s),
            &addr as *const libc::sockaddr_un as *const libc::sockaddr,
            len as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(s)
}

/// Connect, send one request and wait for the answer; connect, write and
/// read are each bounded by `timeout`.
pub fn call(socket: &Path, req: &Request, timeout: Duration) -> std::io::Result<Response> {
    call_on(connect(socket, timeout)?, req, timeout)
}

/// One request on a connected stream, its answer not awaited: the line is
/// written whole (bounded by `timeout`) and the connection closed. The
/// agent still acts on it; its answer finds the connection closed.
pub fn send_on(mut s: UnixStream, req: &Request, timeout: Duration) -> std::io::Result<()> {
    s.set_write_timeout(Some(timeout))?;
    let mut line = serde_json::to_vec(req)?;
    line.push(b'\n');
    s.write_all(&line)
}

/// One request and its answer on a connected stream; `timeout` bounds each
/// read and write. A connection closed without an answer is `UnexpectedEof`.
pub fn call_on(mut s: UnixStream, req: &Request, timeout: Duration) -> std::io::Result<Response> {
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let mut line = serde_json::to_vec(req)?;
    line.push(b'\n');
    s.write_all(&line)?;
    let mut resp = String::new();
    BufReader::new(s.take(MAX_REQUEST_BYTES)).read_line(&mut resp)?;
    if resp.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the agent closed the connection",
        ));
    }
    serde_json::from_str(&resp).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trip() {
        let r = Request::Register(Register {
            container_id: "a/b".into(),
            pid: Some(3),
            ..Default::default()
        });
        let s = serde_json::to_string(&r).unwrap();
        assert!(s.contains("\"op\":\"register\""));
        assert_eq!(serde_json::from_str::<Request>(&s).unwrap(), r);
        let u = Request::Unregister {
            container_id: "x".into(),
            scope: Some(Scope::of_namespace("k8s.io")),
            reason: EndReason::Poststop,
            exit_code: None,
        };
        let text = serde_json::to_string(&u).unwrap();
        assert!(text.contains("\"reason\":\"poststop\""), "{text}");
        assert_eq!(serde_json::from_str::<Request>(&text).unwrap(), u);
    }

    #[test]
    fn not_watched_is_a_code_and_absent_otherwise() {
        let r = Response::not_watched(&ContainerKey::new("c1", None));
        let text = serde_json::to_string(&r).unwrap();
        assert!(text.contains("\"code\":\"not-watched\""), "{text}");
        assert_eq!(
            serde_json::from_str::<Response>(&text).unwrap().code,
            Some(ErrorCode::NotWatched)
        );
        assert!(!serde_json::to_string(&Response::ok())
            .unwrap()
            .contains("code"));
    }
}
