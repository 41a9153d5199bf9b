//! Talking to the node agent: register and unregister, and starting a
//! detached agent when none answers (if the configuration allows it).

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use throttlewatch_core::config::Config;
use throttlewatch_core::protocol::{call, Register, Request, Response};

/// How long one request may take (the agent opens the cgroup and updates maps).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the hook waits for an agent it started to answer.
pub const START_WAIT: Duration = Duration::from_secs(2);
/// The agent binary's name, looked up next to the hook, then in PATH.
pub const AGENT_BINARY: &str = "throttlewatch";

/// Whether an error means "nobody listens there" (as opposed to a broken agent).
fn no_listener(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ConnectionRefused)
}

fn answer(resp: Response, what: &str) -> Result<Response, String> {
    if resp.ok {
        Ok(resp)
    } else {
        Err(format!("the agent refused to {what}: {}", resp.error.unwrap_or_else(|| "no reason given".into())))
    }
}

/// Register, starting an agent first when none answers and `start_agent` is set.
/// Returns the agent's answer (with the log path).
pub fn register(cfg: &Config, config_path: Option<&Path>, reg: Register) -> Result<Response, String> {
    let id = reg.container_id.clone();
    let req = Request::Register(reg);
    let what = format!("register container {id:?}");
    let sock = &cfg.socket;
    match call(sock, &req, CALL_TIMEOUT) {
        Ok(r) => return answer(r, &what),
        Err(e) if !no_listener(&e) => return Err(format!("agent on {}: {e}; cannot {what}", sock.display())),
        Err(e) if !cfg.start_agent => {
            return Err(format!(
                "no agent answers on {}: {e}; start_agent = false, so container {id:?} starts without being watched",
                sock.display()
            ))
        }
        Err(_) => {}
    }
    let bin = agent_binary(cfg)?;
    start_agent(&bin, config_path)?;
    let deadline = Instant::now() + START_WAIT;
    loop {
        match call(sock, &req, CALL_TIMEOUT) {
            Ok(r) => return answer(r, &what),
            Err(e) if no_listener(&e) && Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => {
                return Err(format!(
                    "started {} but no agent answered on {} within {:?}: {e}; container {id:?} is not watched",
                    bin.display(),
                    sock.display(),
                    START_WAIT
                ))
            }
        }
    }
}

/// Have the agent write the `end` record. Never starts an agent. A
/// container the agent no longer watches (the wrapper ended it before
/// `delete`, or it was never registered) is not an error.
pub fn unregister(cfg: &Config, id: &str, reason: &str) -> Result<Response, String> {
    let req = Request::Unregister { container_id: id.to_string(), reason: reason.to_string(), exit_code: None };
    match call(&cfg.socket, &req, CALL_TIMEOUT) {
        Ok(r) if !r.ok && r.error.as_deref().is_some_and(|e| e.contains("not watched")) => Ok(r),
        Ok(r) => answer(r, &format!("unregister container {id:?}")),
        Err(e) => Err(format!(
            "no agent answers on {}: {e}; the end record of container {id:?} is not written",
            cfg.socket.display()
        )),
    }
}

/// `agent_binary` when configured, else `throttlewatch` next to this
/// executable, else in PATH.
pub fn agent_binary(cfg: &Config) -> Result<PathBuf, String> {
    if !cfg.agent_binary.is_empty() {
        return Ok(PathBuf::from(&cfg.agent_binary));
    }
    let beside = std::env::current_exe().ok().and_then(|e| e.parent().map(|d| d.join(AGENT_BINARY)));
    if let Some(p) = beside.filter(|p| p.is_file()) {
        return Ok(p);
    }
    find_in_path(AGENT_BINARY).ok_or_else(|| {
        format!("no agent answers and no `{AGENT_BINARY}` binary was found next to the hook or in PATH (set agent_binary)")
    })
}

pub fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
}

/// `throttlewatch agent --detach [--config FILE]`: the agent daemonizes (one
/// per node, guarded by its lock) and its parent exits at once. Its stdio is
/// /dev/null: the runtime waits for the hook's pipes to close.
fn start_agent(bin: &Path, config_path: Option<&Path>) -> Result<(), String> {
    let mut cmd = Command::new(bin);
    cmd.arg("agent").arg("--detach");
    if let Some(c) = config_path {
        cmd.arg("--config").arg(c);
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    let mut child = cmd.spawn().map_err(|e| format!("cannot start the agent {}: {e}", bin.display()))?;
    let deadline = Instant::now() + START_WAIT;
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
        let cfg = Config { socket: d.path().join("a.sock"), start_agent: false, ..Config::default() };
        let t = fake_agent(&cfg.socket, "{\"ok\":true,\"log_path\":\"/l/c.jsonl\"}\n");
        let reg = Register { container_id: "c".into(), pid: Some(7), cgroup_path: "/tw/c".into(), ..Default::default() };
        let r = register(&cfg, None, reg).unwrap();
        assert_eq!(r.log_path.as_deref(), Some("/l/c.jsonl"));
        let sent: serde_json::Value = serde_json::from_str(&t.join().unwrap()).unwrap();
        assert_eq!((sent["op"].as_str(), sent["cgroup_path"].as_str()), (Some("register"), Some("/tw/c")));
    }

    #[test]
    fn missing_agent_without_start_is_a_clear_message() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config { socket: d.path().join("none.sock"), start_agent: false, ..Config::default() };
        let e = register(&cfg, None, Register { container_id: "c".into(), ..Default::default() }).unwrap_err();
        assert!(e.contains("no agent answers") && e.contains("none.sock") && e.contains("start_agent = false"), "{e}");
        let e = unregister(&cfg, "c", "poststop").unwrap_err();
        assert!(e.contains("end record"), "{e}");
    }

    #[test]
    fn agent_refusal_is_reported() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config { socket: d.path().join("a.sock"), ..Config::default() };
        let t = fake_agent(&cfg.socket, "{\"ok\":false,\"error\":\"unknown container\"}\n");
        let e = unregister(&cfg, "c", "poststop").unwrap_err();
        t.join().unwrap();
        assert!(e.contains("unknown container"), "{e}");
    }

    #[test]
    fn start_agent_that_fails_is_reported() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config { socket: d.path().join("a.sock"), agent_binary: "/bin/false".into(), ..Config::default() };
        let e = register(&cfg, None, Register { container_id: "c".into(), ..Default::default() }).unwrap_err();
        assert!(e.contains("/bin/false") && e.contains("failed"), "{e}");
    }
}
