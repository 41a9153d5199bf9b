//! The agent's unix socket: root-only binding, and a [`Server`] that the
//! event loop in `daemon.rs` waits on: it accepts and reads every connection
//! (poll(2), up to [`MAX_CONNECTIONS`] in service, each with a read
//! deadline), bounds requests, and returns the complete ones as [`Job`]s;
//! the event loop writes each answer on its connection ([`Responder`]). No
//! thread and no hand-over between threads on the create path.

use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use throttlewatch_core::protocol::{Request, Response, MAX_REQUEST_BYTES};

use crate::CliError;

pub(crate) type Job = (Request, Responder);

/// Where the event loop's answer to one request goes: written on the
/// connection by the event loop itself. Dropped unanswered (the agent
/// stopping), the connection closes: the client sees EOF.
pub(crate) struct Responder {
    conn: UnixStream,
    _slot: Slot,
}

impl Responder {
    pub(crate) fn send(self, resp: Response) {
        // Read non-blocking; the answer is written blocking, bounded by
        // reply's write timeout.
        let _ = self.conn.set_nonblocking(false);
        reply(&self.conn, &resp);
    }
}

/// One of the [`MAX_CONNECTIONS`] connections in service, from accept until
/// it is answered or dropped.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

pub(crate) fn bind(socket: &Path) -> Result<UnixListener, CliError> {
    let err = |e: std::io::Error| CliError::fail(format!("{}: {e}", socket.display()));
    if let Some(dir) = socket.parent() {
        crate::daemon::dirs::mkdir(dir, 0o700)?;
    }
    match std::fs::symlink_metadata(socket) {
        Ok(m) if std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) => {
            std::fs::remove_file(socket).map_err(err)?
        }
        Ok(_) => {
            return Err(CliError::fail(format!(
                "{}: exists and is not a socket; refusing to replace it",
                socket.display()
            )))
        }
        Err(_) => {}
    }
    // SAFETY: umask is process-wide; set around bind so the socket is born 0600.
    let old = unsafe { libc::umask(0o177) };
    let l = UnixListener::bind(socket);
    unsafe { libc::umask(old) };
    let l = l.map_err(err)?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    Ok(l)
}

/// Connections served at once (being read, or waiting for the event loop's
/// answer); past it a client is answered "busy" at once.
pub(crate) const MAX_CONNECTIONS: usize = 64;

/// How long a connection may take to send its request line.
const READ_TIMEOUT: Duration = Duration::from_secs(1);

/// A connection whose request line is not complete yet.
struct PartialRequest {
    conn: UnixStream,
    raw: Vec<u8>,
    deadline: Instant,
    slot: Slot,
}

/// The socket as the event loop serves it: a client that connects and
/// sends nothing (a hook stopped mid-request) holds only its slot until its
/// deadline, never the others. Requests are handled one at a time.
pub(crate) struct Server {
    l: UnixListener,
    active: Arc<AtomicUsize>,
    reading: Vec<PartialRequest>,
    fds: Vec<libc::pollfd>,
    /// One more descriptor the wait also wakes for (the exit watch's epoll,
    /// exits.rs), and whether it was readable at the last wait.
    extra: Option<RawFd>,
    extra_ready: bool,
}

impl Server {
    pub(crate) fn new(l: UnixListener) -> std::io::Result<Server> {
        l.set_nonblocking(true)?;
        Ok(Server {
            l,
            active: Arc::new(AtomicUsize::new(0)),
            reading: Vec::new(),
            fds: Vec::new(),
            extra: None,
            extra_ready: false,
        })
    }

    /// Also wake [`Server::wait`] when `fd` is readable.
    pub(crate) fn also_wait_for(&mut self, fd: Option<RawFd>) {
        self.extra = fd;
    }

    /// Whether the descriptor of [`Server::also_wait_for`] was readable at
    /// the last wait (once: reset by this call).
    pub(crate) fn take_extra_ready(&mut self) -> bool {
        std::mem::take(&mut self.extra_ready)
    }

    /// Wait up to `timeout` for the socket; returns the requests completed
    /// meanwhile (none: the timeout, a signal, or only partial reads).
    pub(crate) fn wait(&mut self, timeout: Duration) -> Vec<Job> {
        let now = Instant::now();
        // Past their deadline: answered as a read that timed out.
        self.reading.retain(|r| {
            if r.deadline > now {
                return true;
            }
            reply(
                &r.conn,
                &Response::err("reading request: no complete request line within 1s"),
            );
            false
        });
        let wait = self
            .reading
            .iter()
            .map(|r| r.deadline.saturating_duration_since(now))
            .fold(timeout, Duration::min);
        // Rounded up: a deadline a few microseconds away is not a busy loop.
        let ms = wait.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        self.fds.clear();
        self.fds.push(pollfd(self.l.as_raw_fd()));
        self.fds
            .extend(self.reading.iter().map(|r| pollfd(r.conn.as_raw_fd())));
        self.fds.extend(self.extra.map(pollfd));
        // SAFETY: poll on a valid array of pollfd.
        let n = unsafe { libc::poll(self.fds.as_mut_ptr(), self.fds.len() as libc::nfds_t, ms) };
        if self.extra.is_some() {
            self.extra_ready |= self.fds.pop().is_some_and(|p| p.revents != 0);
        }
        let mut jobs = vec![];
        if n <= 0 {
            let e = std::io::Error::last_os_error();
            if n < 0 && e.kind() != ErrorKind::Interrupted {
                eprintln!("throttlewatch agent: agent socket: poll: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
            return jobs;
        }
        // The connections first (indexes shift as they leave), then accept.
        for i in (1..self.fds.len()).rev() {
            if self.fds[i].revents == 0 {
                continue;
            }
            match read_some(&mut self.reading[i - 1]) {
                ReadProgress::More => {}
                ReadProgress::Line => jobs.extend(dispatch(self.reading.swap_remove(i - 1))),
                ReadProgress::Failed(e) => {
                    let r = self.reading.swap_remove(i - 1);
                    reply(&r.conn, &Response::err(format!("reading request: {e}")));
                }
            }
        }
        if self.fds[0].revents != 0 {
            self.accept_all(&mut jobs);
        }
        jobs
    }

    fn accept_all(&mut self, jobs: &mut Vec<Job>) {
        loop {
            let conn = match self.l.accept() {
                Ok((c, _)) => c,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    let _ = accepted::<UnixStream>(Err(e), "agent socket");
                    return;
                }
            };
            if self.active.fetch_add(1, SeqCst) >= MAX_CONNECTIONS {
                self.active.fetch_sub(1, SeqCst);
                reply(
                    &conn,
                    &Response::err(format!(
                        "agent busy: {MAX_CONNECTIONS} connections in service; retry"
                    )),
                );
                continue;
            }
            let slot = Slot(self.active.clone());
            if conn.set_nonblocking(true).is_err() {
                continue;
            }
            let mut r = PartialRequest {
                conn,
                raw: Vec::new(),
                deadline: Instant::now() + READ_TIMEOUT,
                slot,
            };
            // The hook connects early and writes later; a request already
            // there is read at once.
            match read_some(&mut r) {
                ReadProgress::More => self.reading.push(r),
                ReadProgress::Line => jobs.extend(dispatch(r)),
                ReadProgress::Failed(e) => {
                    reply(&r.conn, &Response::err(format!("reading request: {e}")))
                }
            }
        }
    }
}

fn pollfd(fd: i32) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// The accepted connection, or None after a pause: at the descriptor limit
/// (EMFILE, ENFILE) `accept` fails at once for as long as the pending
/// connection waits, and retrying at once spins a CPU at 100 %.
pub(crate) fn accepted<S>(r: std::io::Result<S>, what: &str) -> Option<S> {
    match r {
        Ok(s) => Some(s),
        Err(e) => {
            static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
            if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                eprintln!(
                    "throttlewatch agent: {what}: accept: {e}; retrying every 100 ms (said once)"
                );
            }
            std::thread::sleep(Duration::from_millis(100));
            None
        }
    }
}

/// Raise the soft limit on open files to the hard limit: every watched
/// container holds its log open (systemd's LimitNOFILE sets the hard one).
/// Returns the limit in force.
pub(crate) fn raise_nofile_limit() -> u64 {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on a valid struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) != 0 {
            return 0;
        }
        if l.rlim_cur < l.rlim_max {
            let want = libc::rlimit {
                rlim_cur: l.rlim_max,
                rlim_max: l.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                return want.rlim_cur;
            }
        }
    }
    l.rlim_cur
}

pub(crate) fn reply(conn: &UnixStream, resp: &Response) {
    let _ = conn.set_write_timeout(Some(Duration::from_secs(1)));
    let mut w = conn;
    let mut out = serde_json::to_vec(resp).unwrap_or_default();
    out.push(b'\n');
    let _ = w.write_all(&out);
}

enum ReadProgress {
    /// Nothing more to read now; the line is not complete.
    More,
    /// A newline, the end of the stream, or MAX_REQUEST_BYTES read.
    Line,
    Failed(std::io::Error),
}

/// Read what the connection has (non-blocking), up to MAX_REQUEST_BYTES.
fn read_some(r: &mut PartialRequest) -> ReadProgress {
    let mut buf = [0u8; 4096];
    loop {
        let room = (MAX_REQUEST_BYTES as usize).saturating_sub(r.raw.len());
        if room == 0 {
            return ReadProgress::Line;
        }
        match (&r.conn).read(&mut buf[..room.min(4096)]) {
            Ok(0) => return ReadProgress::Line,
            Ok(n) => {
                let had = r.raw.len();
                r.raw.extend_from_slice(&buf[..n]);
                if let Some(nl) = r.raw[had..].iter().position(|&b| b == b'\n') {
                    r.raw.truncate(had + nl + 1);
                    return ReadProgress::Line;
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return ReadProgress::More,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return ReadProgress::Failed(e),
        }
    }
}

/// A complete request line for the event loop, or its error answered here.
fn dispatch(r: PartialRequest) -> Option<Job> {
    let _ = r.conn.set_nonblocking(false);
    // Bytes that are not UTF-8 (names from a runtime that passes them
    // through) become U+FFFD: the container is still watched, and no
    // invalid UTF-8 reaches the logs or the metrics exposition.
    match serde_json::from_str::<Request>(&String::from_utf8_lossy(&r.raw)) {
        Err(e) => {
            reply(&r.conn, &Response::err(format!("bad request: {e}")));
            None
        }
        Ok(req) => Some((
            req,
            Responder {
                conn: r.conn,
                _slot: r.slot,
            },
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;

    fn answer_of(c: &UnixStream) -> String {
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut line = String::new();
        std::io::BufReader::new(c).read_line(&mut line).unwrap();
        line
    }

    /// Wait until `n` jobs came (or `within` passed), serving the socket.
    fn jobs(s: &mut Server, n: usize, within: Duration) -> Vec<Job> {
        let t = Instant::now();
        let mut got = vec![];
        while got.len() < n && t.elapsed() < within {
            got.extend(s.wait(Duration::from_millis(20)));
        }
        got
    }

    #[test]
    fn requests_bad_lines_slow_clients_and_the_connection_limit() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("agent.sock");
        let mut s = Server::new(bind(&path).unwrap()).unwrap();

        // A request: a job, answered on its connection by whoever holds it.
        let mut c = UnixStream::connect(&path).unwrap();
        c.write_all(b"{\"op\":\"status\"}\n").unwrap();
        let mut got = jobs(&mut s, 1, Duration::from_secs(5));
        assert_eq!(got.len(), 1);
        let (req, answer) = got.pop().unwrap();
        assert!(matches!(req, Request::Status), "{req:?}");
        answer.send(Response::ok());
        assert!(answer_of(&c).contains("\"ok\":true"));

        // Not JSON: answered by the server, no job.
        let mut bad = UnixStream::connect(&path).unwrap();
        bad.write_all(b"hello\n").unwrap();
        let none = jobs(&mut s, 1, Duration::from_millis(300));
        assert!(none.is_empty());
        assert!(answer_of(&bad).contains("bad request"), "bad request");

        // MAX_CONNECTIONS clients that send nothing: the next one is told
        // busy at once; once theirs expire (1 s), slots are free again.
        let idle: Vec<UnixStream> = (0..MAX_CONNECTIONS)
            .map(|_| UnixStream::connect(&path).unwrap())
            .collect();
        let one_more = UnixStream::connect(&path).unwrap();
        let _ = jobs(&mut s, 1, Duration::from_millis(300));
        assert!(answer_of(&one_more).contains("agent busy"));
        let t = Instant::now();
        while t.elapsed() < READ_TIMEOUT + Duration::from_millis(300) {
            s.wait(Duration::from_millis(50));
        }
        assert!(answer_of(&idle[0]).contains("no complete request line"));
        let mut c = UnixStream::connect(&path).unwrap();
        c.write_all(b"{\"op\":\"status\"}\n").unwrap();
        assert_eq!(
            jobs(&mut s, 1, Duration::from_secs(5)).len(),
            1,
            "slots freed after the deadline"
        );
    }
}
