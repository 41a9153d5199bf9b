//! The agent's unix socket: root-only binding, a thread per connection (up
//! to [`MAX_CONNECTIONS`]), bounded requests, and the answer written back by
//! the event loop itself ([`Answer`]). Requests reach the event loop in
//! `daemon.rs` as [`Job`]s.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::time::Duration;

use throttlewatch_core::protocol::{Request, Response, MAX_REQUEST_BYTES};

use crate::CliError;

pub type Job = (Request, Answer);

/// Where the event loop's answer to one request goes: written on the
/// connection by the event loop itself (the waiting client, a hook inside a
/// container start, wakes without a second thread hop), then the
/// connection's thread is told (`None`); without a connection, handed to it.
pub struct Answer {
    done: Sender<Option<Response>>,
    conn: Option<UnixStream>,
}

impl Answer {
    pub fn send(self, resp: Response) {
        match self.conn {
            Some(c) => {
                reply(&c, &resp);
                let _ = self.done.send(None);
            }
            None => {
                let _ = self.done.send(Some(resp));
            }
        }
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

/// Connections served at once; past it a client is answered "busy" at once.
pub const MAX_CONNECTIONS: usize = 64;

pub fn serve_socket(l: UnixListener, jobs: Sender<Job>) {
    std::thread::Builder::new()
        .name("socket".into())
        .spawn(move || {
            // A thread per connection (up to MAX_CONNECTIONS): a client that
            // connects and sends nothing (a hook stopped mid-request) holds
            // only its own thread for the read timeout, never the others.
            // The event loop still handles requests one at a time.
            let active = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            for conn in l.incoming() {
                let Some(conn) = accepted(conn, "agent socket") else {
                    continue;
                };
                use std::sync::atomic::Ordering::SeqCst;
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
                let (jobs, active2) = (jobs.clone(), active.clone());
                let spawned = std::thread::Builder::new()
                    .name("conn".into())
                    .stack_size(256 * 1024)
                    .spawn(move || {
                        handle_conn(conn, jobs);
                        active2.fetch_sub(1, SeqCst);
                    });
                if spawned.is_err() {
                    active.fetch_sub(1, SeqCst);
                }
            }
        })
        .expect("socket thread");
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

fn handle_conn(conn: UnixStream, jobs: Sender<Job>) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(1)));
    let _ = conn.set_write_timeout(Some(Duration::from_secs(1)));
    let mut raw = Vec::new();
    let resp = match BufReader::new((&conn).take(MAX_REQUEST_BYTES)).read_until(b'\n', &mut raw) {
        Err(e) => Response::err(format!("reading request: {e}")),
        // Bytes that are not UTF-8 (names from a runtime that passes them
        // through) become U+FFFD: the container is still watched, and no
        // invalid UTF-8 reaches the logs or the metrics exposition.
        Ok(_) => match serde_json::from_str::<Request>(&String::from_utf8_lossy(&raw)) {
            Err(e) => Response::err(format!("bad request: {e}")),
            Ok(req) => {
                let (done, rx) = mpsc::channel();
                let conn = conn.try_clone().ok();
                if jobs.send((req, Answer { done, conn })).is_err() {
                    Response::err("agent is stopping")
                } else {
                    match rx.recv_timeout(Duration::from_secs(5)) {
                        Ok(Some(resp)) => resp,
                        Ok(None) => return, // written by the event loop
                        Err(_) => Response::err("agent did not answer"),
                    }
                }
            }
        },
    };
    reply(&conn, &resp);
}
