//! The agent's unix socket: root-only binding, one persistent thread that
//! accepts and reads every connection (poll(2), up to [`MAX_CONNECTIONS`]
//! in service, each with a read deadline), bounded requests, and the answer
//! written back by the event loop itself ([`Answer`]). Requests reach the
//! event loop in `daemon.rs` as [`Job`]s.

use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use throttlewatch_core::protocol::{Request, Response, MAX_REQUEST_BYTES};

use crate::CliError;

pub type Job = (Request, Answer);

/// Where the event loop's answer to one request goes: written on the
/// connection by the event loop itself (the waiting client, a hook inside a
/// container start, wakes without a second thread hop). Dropped unanswered
/// (the agent stopping), the connection closes: the client sees EOF.
pub struct Answer {
    conn: UnixStream,
    _slot: Slot,
}

impl Answer {
    pub fn send(self, resp: Response) {
        // Read non-blocking by the socket thread; the answer is written
        // blocking, bounded by reply's write timeout.
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

pub fn bind(socket: &Path) -> Result<UnixListener, CliError> {
    let err = |e: std::io::Error| CliError::fail(format!("{}: {e}", socket.display()));
    if let Some(dir) = socket.parent() {
        crate::daemon::mkdir(dir, 0o700)?;
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
pub const MAX_CONNECTIONS: usize = 64;

/// How long a connection may take to send its request line.
const READ_TIMEOUT: Duration = Duration::from_secs(1);

/// A connection whose request line is not complete yet.
struct Reading {
    conn: UnixStream,
    raw: Vec<u8>,
    deadline: Instant,
    slot: Slot,
}

/// One persistent thread accepts and reads every connection (no thread per
/// connection on the create path): a client that connects and sends nothing
/// (a hook stopped mid-request) holds only its slot until its deadline,
/// never the others. The event loop handles requests one at a time.
pub fn serve_socket(l: UnixListener, jobs: Sender<Job>) {
    std::thread::Builder::new()
        .name("socket".into())
        .spawn(move || serve(l, jobs))
        .expect("socket thread");
}

fn serve(l: UnixListener, jobs: Sender<Job>) {
    if let Err(e) = l.set_nonblocking(true) {
        eprintln!("throttlewatch agent: agent socket: {e}");
        return;
    }
    let active = Arc::new(AtomicUsize::new(0));
    let mut reading: Vec<Reading> = Vec::new();
    let mut fds: Vec<libc::pollfd> = Vec::new();
    loop {
        let now = Instant::now();
        // Past their deadline: answered as a read that timed out.
        reading.retain(|r| {
            if r.deadline > now {
                return true;
            }
            reply(
                &r.conn,
                &Response::err("reading request: no complete request line within 1s"),
            );
            false
        });
        let timeout = reading
            .iter()
            .map(|r| r.deadline.saturating_duration_since(now))
            .min()
            .map(|d| (d.as_millis() as i32).saturating_add(1))
            .unwrap_or(-1);
        fds.clear();
        fds.push(pollfd(l.as_raw_fd()));
        fds.extend(reading.iter().map(|r| pollfd(r.conn.as_raw_fd())));
        // SAFETY: poll on a valid array of pollfd.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != ErrorKind::Interrupted {
                eprintln!("throttlewatch agent: agent socket: poll: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
            continue;
        }
        // The connections first (indexes shift as they leave), then accept.
        for i in (1..fds.len()).rev() {
            if fds[i].revents == 0 {
                continue;
            }
            match read_some(&mut reading[i - 1]) {
                Progress::More => {}
                Progress::Line => dispatch(reading.swap_remove(i - 1), &jobs),
                Progress::Failed(e) => {
                    let r = reading.swap_remove(i - 1);
                    reply(&r.conn, &Response::err(format!("reading request: {e}")));
                }
            }
        }
        if fds[0].revents != 0 {
            accept_all(&l, &active, &mut reading, &jobs);
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

fn accept_all(
    l: &UnixListener,
    active: &Arc<AtomicUsize>,
    reading: &mut Vec<Reading>,
    jobs: &Sender<Job>,
) {
    loop {
        let conn = match l.accept() {
            Ok((c, _)) => c,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => {
                let _ = accepted::<UnixStream>(Err(e), "agent socket");
                return;
            }
        };
        if active.fetch_add(1, SeqCst) >= MAX_CONNECTIONS {
            active.fetch_sub(1, SeqCst);
            reply(
                &conn,
                &Response::err(format!(
                    "agent busy: {MAX_CONNECTIONS} connections in service; retry"
                )),
            );
            continue;
        }
        let slot = Slot(active.clone());
        if conn.set_nonblocking(true).is_err() {
            continue;
        }
        let mut r = Reading {
            conn,
            raw: Vec::new(),
            deadline: Instant::now() + READ_TIMEOUT,
            slot,
        };
        // The hook connects early and writes later; a client that wrote
        // before connecting returned is read at once.
        match read_some(&mut r) {
            Progress::More => reading.push(r),
            Progress::Line => dispatch(r, jobs),
            Progress::Failed(e) => reply(&r.conn, &Response::err(format!("reading request: {e}"))),
        }
    }
}
/// The accepted connection, or None after a pause: at the descriptor limit
/// (EMFILE, ENFILE) `accept` fails at once for as long as the pending
/// connection waits, and retrying at once spins a CPU at 100 %.
pub fn accepted<S>(r: std::io::Result<S>, what: &str) -> Option<S> {
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
pub fn raise_nofile_limit() -> u64 {
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

pub fn reply(conn: &UnixStream, resp: &Response) {
    let _ = conn.set_write_timeout(Some(Duration::from_secs(1)));
    let mut w = conn;
    let mut out = serde_json::to_vec(resp).unwrap_or_default();
    out.push(b'\n');
    let _ = w.write_all(&out);
}

enum Progress {
    /// Nothing more to read now; the line is not complete.
    More,
    /// A newline, the end of the stream, or MAX_REQUEST_BYTES read.
    Line,
    Failed(std::io::Error),
}

/// Read what the connection has (non-blocking), up to MAX_REQUEST_BYTES.
fn read_some(r: &mut Reading) -> Progress {
    let mut buf = [0u8; 4096];
    loop {
        let room = (MAX_REQUEST_BYTES as usize).saturating_sub(r.raw.len());
        if room == 0 {
            return Progress::Line;
        }
        match (&r.conn).read(&mut buf[..room.min(4096)]) {
            Ok(0) => return Progress::Line,
            Ok(n) => {
                let had = r.raw.len();
                r.raw.extend_from_slice(&buf[..n]);
                if let Some(nl) = r.raw[had..].iter().position(|&b| b == b'\n') {
                    r.raw.truncate(had + nl + 1);
                    return Progress::Line;
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Progress::More,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Progress::Failed(e),
        }
    }
}

/// A complete request line to the event loop, or its error answered here.
fn dispatch(r: Reading, jobs: &Sender<Job>) {
    let _ = r.conn.set_nonblocking(false);
    // Bytes that are not UTF-8 (names from a runtime that passes them
    // through) become U+FFFD: the container is still watched, and no
    // invalid UTF-8 reaches the logs or the metrics exposition.
    match serde_json::from_str::<Request>(&String::from_utf8_lossy(&r.raw)) {
        Err(e) => reply(&r.conn, &Response::err(format!("bad request: {e}"))),
        Ok(req) => {
            let answer = Answer {
                conn: r.conn,
                _slot: r.slot,
            };
            if let Err(std::sync::mpsc::SendError((_, answer))) = jobs.send((req, answer)) {
                answer.send(Response::err("agent is stopping"));
            }
        }
    }
}
