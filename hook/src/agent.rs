//! Talking to the node agent: register and unregister, and starting a
//! detached agent when none answers (if the configuration allows it).

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use throttlewatch_core::config::Config;
use throttlewatch_core::protocol::{call, connect, Register, Request, Response, MAX_REQUEST_BYTES};

/// How long the hook waits for an agent it started to answer (the agent's
/// own `--detach` waits as long; loading the probe takes most of it).
pub const START_WAIT: Duration = Duration::from_secs(10);
/// The agent binary's name, looked up next to the hook, then in PATH.
pub const AGENT_BINARY: &str = "throttlewatch";
/// The agent's single-instance lock, in its state directory.
pub const LOCK_FILE: &str = "agent.lock";

/// Whether an error means "nobody listens there" (as opposed to a broken agent).
fn no_listener(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ConnectionRefused)
}

fn timed_out(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// An I/O error as the reason in a message: a timeout names the bound.
fn why(e: &std::io::Error, timeout: Duration) -> String {
    match e.kind() {
        _ if timed_out(e) => format!(
            "no answer within {timeout:?} (agent_timeout_ms; the agent is stopped, wedged or overloaded)"
        ),
        _ => e.to_string(),
    }
}

fn answer(resp: Response, what: &str) -> Result<Response, String> {
    if resp.ok {
        Ok(resp)
    } else {
        Err(format!(
            "the agent refused to {what}: {}",
            resp.error.unwrap_or_else(|| "no reason given".into())
        ))
    }
}

/// A connection to the agent opened before the hook's QoS work: the agent
/// accepts it and starts the thread that reads it while the hook writes the
/// cgroup, so the register itself is one request and one answer.
pub struct EarlyConnection(std::io::Result<UnixStream>);

impl EarlyConnection {
    pub fn open(cfg: &Config) -> EarlyConnection {
        EarlyConnection(connect(&cfg.socket, cfg.agent_timeout()))
    }

    /// Send on the early connection; a connection that broke meanwhile (the
    /// agent restarted) is retried once on a fresh one. A timeout is not
    /// retried (registering twice is harmless, waiting twice is not).
    fn call(self, socket: &Path, req: &Request, timeout: Duration) -> std::io::Result<Response> {
        let broken = |e: &std::io::Error| {
            matches!(
                e.kind(),
                ErrorKind::BrokenPipe
                    | ErrorKind::ConnectionReset
                    | ErrorKind::UnexpectedEof
                    | ErrorKind::NotConnected
            )
        };
        match self.0 {
            Ok(s) => match call_on(s, req, timeout) {
                Err(e) if broken(&e) => call(socket, req, timeout),
                r => r,
            },
            // A connect that timed out (a full backlog) is not tried twice.
            Err(e) if no_listener(&e) || timed_out(&e) => Err(e),
            Err(_) => call(socket, req, timeout),
        }
    }
}

/// One request and its answer on a connected stream (`protocol::call` without the connect).
fn call_on(mut s: UnixStream, req: &Request, timeout: Duration) -> std::io::Result<Response> {
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let mut line = serde_json::to_vec(req)?;
    line.push(b'\n');
    s.write_all(&line)?;
    let mut resp = String::new();
    BufReader::new(s.take(MAX_REQUEST_BYTES)).read_line(&mut resp)?;
    if resp.is_empty() {
        return Err(std::io::Error::new(
            ErrorKind::UnexpectedEof,
            "the agent closed the connection",
        ));
    }
    serde_json::from_str(&resp).map_err(|e| std::io::Error::new(ErrorKind::InvalidData, e))
}

/// Register, starting an agent first when none answers and `start_agent` is set.
/// `early`: a connection opened before the QoS work (None: connect now).
/// Returns the agent's answer (with the log path).
pub fn register(
    cfg: &Config,
    config_path: Option<&Path>,
    reg: Register,
    early: Option<EarlyConnection>,
) -> Result<Response, String> {
    let id = reg.container_id.clone();
    let req = Request::Register(reg);
    let what = format!("register container {id:?}");
    let sock = &cfg.socket;
    let timeout = cfg.agent_timeout();
    let first = match early {
        Some(c) => c.call(sock, &req, timeout),
        None => call(sock, &req, timeout),
    };
    match first {
        Ok(r) => return answer(r, &what),
        Err(e) if !no_listener(&e) => {
            return Err(format!("agent on {}: {}; cannot {what}", sock.display(), why(&e, timeout)))
        }
        Err(e) if !cfg.start_agent => {
            return Err(format!(
                "no agent answers on {}: {e}; start_agent = false, so container {id:?} starts without being watched",
                sock.display()
            ))
        }
        Err(_) => {}
    }
    let bin = agent_binary(cfg)?;
    let deadline = Instant::now() + START_WAIT;
    // A failed `--detach` is not the end when another agent holds the lock:
    // a concurrent hook started it and it is still loading its probe.
    let started = start_agent(&bin, config_path, deadline);
    loop {
        match call(sock, &req, timeout) {
            Ok(r) => return answer(r, &what),
            Err(e) if no_listener(&e) && Instant::now() < deadline && (started.is_ok() || lock_holder(&cfg.state_dir).is_some()) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => {
                return Err(match started {
                    Err(why) => format!("{why}; no agent answers on {}: {e}; container {id:?} is not watched", sock.display()),
                    Ok(()) => format!(
                        "started {} but no agent answered on {} within {:?}: {e}; container {id:?} is not watched",
                        bin.display(),
                        sock.display(),
                        START_WAIT
                    ),
                })
            }
        }
    }
}

/// The pid holding the agent's lock (`<state_dir>/agent.lock`), from
/// /proc/locks: read-only, so it never races the agent taking the lock.
pub fn lock_holder(state_dir: &Path) -> Option<u32> {
    let m = std::fs::metadata(state_dir.join(LOCK_FILE)).ok()?;
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    flock_holder(&locks, m.dev(), m.ino())
}

/// In /proc/locks text, the pid of a FLOCK on (dev, inode); the device is
/// printed as `major:minor` in hex, then the inode in decimal.
pub fn flock_holder(locks: &str, dev: u64, ino: u64) -> Option<u32> {
    let want = format!("{:02x}:{:02x}:{ino}", libc::major(dev), libc::minor(dev));
    locks.lines().find_map(|l| {
        // "1: FLOCK  ADVISORY  WRITE 1234 fe:00:5391504 0 EOF" (blocked waiters have "->").
        let f: Vec<&str> = l.split_whitespace().filter(|x| *x != "->").collect();
        (f.get(1) == Some(&"FLOCK") && f.get(5) == Some(&want.as_str()))
            .then(|| f.get(4)?.parse().ok())
            .flatten()
    })
}

/// Have the agent write the `end` record. Never starts an agent. A
/// container the agent no longer watches (the wrapper ended it before
/// `delete`, or it was never registered) is not an error.
pub fn unregister(cfg: &Config, id: &str, reason: &str) -> Result<Response, String> {
    let req = Request::Unregister {
        container_id: id.to_string(),
        reason: reason.to_string(),
        exit_code: None,
    };
    let timeout = cfg.agent_timeout();
    match call(&cfg.socket, &req, timeout) {
        Ok(r)
            if !r.ok
                && r.error
                    .as_deref()
                    .is_some_and(|e| e.contains("not watched")) =>
        {
            Ok(r)
        }
        Ok(r) => answer(r, &format!("unregister container {id:?}")),
        Err(e) => Err(format!(
            "no agent answers on {}: {}; the end record of container {id:?} may not be written",
            cfg.socket.display(),
            why(&e, timeout)
        )),
    }
}

/// `agent_binary` when configured, else `throttlewatch` next to this
/// executable, else in PATH.
pub fn agent_binary(cfg: &Config) -> Result<PathBuf, String> {
    if !cfg.agent_binary.is_empty() {
        return Ok(PathBuf::from(&cfg.agent_binary));
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join(AGENT_BINARY)));
    if let Some(p) = beside.filter(|p| p.is_file()) {
        return Ok(p);
    }
    find_in_path(AGENT_BINARY).ok_or_else(|| {
        format!("no agent answers and no `{AGENT_BINARY}` binary was found next to the hook or in PATH (set agent_binary)")
    })
}

pub fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// `throttlewatch agent --detach [--config FILE]`: the agent daemonizes (one
/// per node, guarded by its lock) and its parent exits once the agent
/// answers. Its stdio is /dev/null: the runtime waits for the hook's pipes
/// to close.
fn start_agent(bin: &Path, config_path: Option<&Path>, deadline: Instant) -> Result<(), String> {
    let mut cmd = Command::new(bin);
    cmd.arg("agent").arg("--detach");
    if let Some(c) = config_path {
        cmd.arg("--config").arg(c);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start the agent {}: {e}", bin.display()))?;
    loop {
        match child.try_wait() {
            Ok(Some(st)) if st.success() => return Ok(()),
            Ok(Some(st)) => return Err(format!("`{} agent --detach` failed: {st}", bin.display())),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => return Ok(()), // still starting; the retries decide
            Err(e) => return Err(format!("waiting for {}: {e}", bin.display())),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixListener;

    use super::*;

    /// A one-shot fake agent answering `resp` and returning the request line.
    fn fake_agent(sock: &Path, resp: &'static str) -> std::thread::JoinHandle<String> {
        let l = UnixListener::bind(sock).unwrap();
        std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut line = String::new();
            BufReader::new(&s).read_line(&mut line).unwrap();
            (&s).write_all(resp.as_bytes()).unwrap();
            line
        })
    }

    #[test]
    fn register_sends_the_protocol() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config {
            socket: d.path().join("a.sock"),
            start_agent: false,
            ..Config::default()
        };
        let t = fake_agent(&cfg.socket, "{\"ok\":true,\"log_path\":\"/l/c.jsonl\"}\n");
        let reg = Register {
            container_id: "c".into(),
            pid: Some(7),
            cgroup_path: "/tw/c".into(),
            ..Default::default()
        };
        let r = register(&cfg, None, reg, None).unwrap();
        assert_eq!(r.log_path.as_deref(), Some("/l/c.jsonl"));
        let sent: serde_json::Value = serde_json::from_str(&t.join().unwrap()).unwrap();
        assert_eq!(
            (sent["op"].as_str(), sent["cgroup_path"].as_str()),
            (Some("register"), Some("/tw/c"))
        );
    }

    #[test]
    fn missing_agent_without_start_is_a_clear_message() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config {
            socket: d.path().join("none.sock"),
            start_agent: false,
            ..Config::default()
        };
        let e = register(
            &cfg,
            None,
            Register {
                container_id: "c".into(),
                ..Default::default()
            },
            None,
        )
        .unwrap_err();
        assert!(
            e.contains("no agent answers")
                && e.contains("none.sock")
                && e.contains("start_agent = false"),
            "{e}"
        );
        let e = unregister(&cfg, "c", "poststop").unwrap_err();
        assert!(e.contains("end record"), "{e}");
    }

    #[test]
    fn agent_refusal_is_reported() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config {
            socket: d.path().join("a.sock"),
            ..Config::default()
        };
        let t = fake_agent(
            &cfg.socket,
            "{\"ok\":false,\"error\":\"unknown container\"}\n",
        );
        let e = unregister(&cfg, "c", "poststop").unwrap_err();
        t.join().unwrap();
        assert!(e.contains("unknown container"), "{e}");
    }

    #[test]
    fn register_on_an_early_connection() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config {
            socket: d.path().join("a.sock"),
            start_agent: false,
            ..Config::default()
        };
        let t = fake_agent(&cfg.socket, "{\"ok\":true,\"log_path\":\"/l/e.jsonl\"}\n");
        let early = EarlyConnection::open(&cfg);
        let reg = Register {
            container_id: "e".into(),
            cgroup_path: "/tw/e".into(),
            ..Default::default()
        };
        let r = register(&cfg, None, reg, Some(early)).unwrap();
        assert_eq!(r.log_path.as_deref(), Some("/l/e.jsonl"));
        assert!(t.join().unwrap().contains("\"container_id\":\"e\""));
        // No listener at the early connect: the usual clear message.
        let cfg = Config {
            socket: d.path().join("none.sock"),
            start_agent: false,
            ..Config::default()
        };
        let early = EarlyConnection::open(&cfg);
        let e = register(
            &cfg,
            None,
            Register {
                container_id: "c".into(),
                ..Default::default()
            },
            Some(early),
        )
        .unwrap_err();
        assert!(
            e.contains("no agent answers") && e.contains("start_agent = false"),
            "{e}"
        );
    }

    #[test]
    fn lock_holder_from_proc_locks() {
        let locks = "1: FLOCK  ADVISORY  WRITE 4242 fe:00:5391504 0 EOF\n2: POSIX  ADVISORY  WRITE 7 fe:00:77 0 EOF\n";
        let dev = libc::makedev(0xfe, 0);
        assert_eq!(flock_holder(locks, dev, 5_391_504), Some(4242));
        assert_eq!(
            flock_holder(locks, dev, 77),
            None,
            "POSIX locks are not the agent's"
        );
        assert_eq!(flock_holder(locks, libc::makedev(8, 1), 5_391_504), None);
        // A real flock in a temporary state dir.
        let d = tempfile::tempdir().unwrap();
        assert_eq!(lock_holder(d.path()), None);
        let f = std::fs::File::create(d.path().join(LOCK_FILE)).unwrap();
        assert_eq!(lock_holder(d.path()), None, "exists but not locked");
        // SAFETY: flock on an fd we own.
        assert_eq!(
            unsafe {
                libc::flock(
                    std::os::fd::AsRawFd::as_raw_fd(&f),
                    libc::LOCK_EX | libc::LOCK_NB,
                )
            },
            0
        );
        assert_eq!(lock_holder(d.path()), Some(std::process::id()));
    }

    #[test]
    fn start_agent_that_fails_is_reported() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config {
            socket: d.path().join("a.sock"),
            agent_binary: "/bin/false".into(),
            ..Config::default()
        };
        let e = register(
            &cfg,
            None,
            Register {
                container_id: "c".into(),
                ..Default::default()
            },
            None,
        )
        .unwrap_err();
        assert!(e.contains("/bin/false") && e.contains("failed"), "{e}");
    }
}
