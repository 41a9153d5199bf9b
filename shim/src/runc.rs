//! Driving the runc binary. The shim reaps every child on SIGCHLD (it is a
//! subreaper), so exit codes of runc invocations come from the reaper's
//! monitor, never from `Child::wait`.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use containerd_shim::monitor::{monitor_subscribe, wait_pid, Topic};

use crate::stdio::Stdio3;

/// Where runc keeps its state for one containerd namespace (as the runc shim does).
pub fn runc_root(namespace: &str) -> PathBuf {
    Path::new("/run/containerd/throttlewatch").join(namespace)
}

/// The low-level runtime from the config, else runc from PATH.
pub fn runc_binary(cfg: &throttlewatch_core::config::Config) -> String {
    if cfg.runtime.is_empty() {
        "runc".to_string()
    } else {
        cfg.runtime.clone()
    }
}

pub use crate::runc_error::RuncError;

type Result<T> = std::result::Result<T, RuncError>;

#[derive(Debug, Clone)]
pub struct Runc {
    pub binary: String,
    pub root: PathBuf,
}

impl Runc {
    fn command(&self, log: Option<&Path>) -> Command {
        let mut c = Command::new(&self.binary);
        c.arg("--root").arg(&self.root);
        if let Some(log) = log {
            c.arg("--log").arg(log).args(["--log-format", "json"]);
        }
        c
    }

    /// Run to completion; stdout is returned, a failure carries stderr (or runc's log).
    /// `stdio`: create/exec hand the container's files to runc, which passes
    /// them on to the container process; errors then come from runc's log.
    fn run(
        &self,
        mut cmd: Command,
        input: Option<&[u8]>,
        stdio: Option<Stdio3>,
        log: Option<&Path>,
    ) -> Result<Vec<u8>> {
        let sub = monitor_subscribe(Topic::Pid).map_err(|e| RuncError::Failed(e.to_string()))?;
        match stdio {
            Some(s) => cmd.stdin(s.stdin).stdout(s.stdout).stderr(s.stderr),
            None => cmd
                .stdin(if input.is_some() {
                    Stdio::piped()
                } else {
                    Stdio::null()
                })
                .stdout(Stdio::piped())
                .stderr(Stdio::piped()),
        };
        let mut child = cmd.spawn().map_err(|source| RuncError::Spawn {
            binary: self.binary.clone(),
            source,
        })?;
        if let (Some(input), Some(mut w)) = (input, child.stdin.take()) {
            let _ = w.write_all(input);
        }
        let mut out = Vec::new();
        let mut err = Vec::new();
        if let Some(mut o) = child.stdout.take() {
            let _ = o.read_to_end(&mut out);
        }
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_end(&mut err);
        }
        let code = wait_pid(child.id() as i32, sub);
        if code == 0 {
            return Ok(out);
        }
        // As the runc shim words it (process/init.go runtimeError): runc's
        // last logged error when there is one, else what failed.
        Err(RuncError::Failed(
            log.and_then(last_log_error).unwrap_or_else(|| {
                let msg = String::from_utf8_lossy(&err);
                format!("{} exited with {code}: {}", self.binary, msg.trim())
            }),
        ))
    }

    /// `console`: the console socket of a process with a terminal.
    pub fn create(
        &self,
        id: &str,
        bundle: &Path,
        stdio: Stdio3,
        console: Option<&Path>,
    ) -> Result<u32> {
        let log = bundle.join("log.json");
        let pid_file = bundle.join("init.pid");
        let mut cmd = self.command(Some(&log));
        cmd.arg("create")
            .arg("--bundle")
            .arg(bundle)
            .arg("--pid-file")
            .arg(&pid_file);
        if let Some(socket) = console {
            cmd.arg("--console-socket").arg(socket);
        }
        cmd.arg(id);
        self.run(cmd, None, Some(stdio), Some(&log))
            .map_err(|e| RuncError::Oci {
                op: "create",
                source: Box::new(e),
            })?;
        read_pid(&pid_file)
    }

    pub fn start(&self, id: &str) -> Result<()> {
        let mut cmd = self.command(None);
        cmd.args(["start", id]);
        self.run(cmd, None, None, None).map(drop)
    }

    /// `runc exec --detach`: the process is reparented to the shim, which reaps it.
    pub fn exec(
        &self,
        id: &str,
        bundle: &Path,
        exec_id: &str,
        process_json: &[u8],
        stdio: Stdio3,
        console: Option<&Path>,
    ) -> Result<u32> {
        let spec = bundle.join(format!("{exec_id}.json"));
        let pid_file = bundle.join(format!("{exec_id}.pid"));
        std::fs::write(&spec, process_json).map_err(|e| RuncError::File {
            path: spec.clone(),
            msg: e.to_string(),
        })?;
        let log = bundle.join("log.json");
        let mut cmd = self.command(Some(&log));
        cmd.args(["exec", "--detach", "--process"])
            .arg(&spec)
            .arg("--pid-file")
            .arg(&pid_file);
        if let Some(socket) = console {
            cmd.arg("--console-socket").arg(socket);
        }
        cmd.arg(id);
        let r = self
            .run(cmd, None, Some(stdio), Some(&log))
            .map_err(|e| RuncError::Oci {
                op: "exec",
                source: Box::new(e),
            })
            .and_then(|_| read_pid(&pid_file));
        let _ = std::fs::remove_file(&spec);
        let _ = std::fs::remove_file(&pid_file);
        r
    }

    pub fn kill(&self, id: &str, signal: u32, all: bool) -> Result<()> {
        let mut cmd = self.command(None);
        cmd.arg("kill");
        if all {
            cmd.arg("--all");
        }
        cmd.arg(id).arg(signal.to_string());
        self.run(cmd, None, None, None).map(drop)
    }

    /// `runc delete --force`; a container runc no longer knows is not an error.
    pub fn delete(&self, id: &str) -> Result<()> {
        let mut cmd = self.command(None);
        cmd.args(["delete", "--force", id]);
        match self.run(cmd, None, None, None) {
            Err(RuncError::Failed(e))
                if e.contains("does not exist") || e.contains("not exist") =>
            {
                Ok(())
            }
            r => r.map(drop),
        }
    }

    pub fn ps(&self, id: &str) -> Result<Vec<u32>> {
        let mut cmd = self.command(None);
        cmd.args(["ps", "--format", "json", id]);
        let out = self.run(cmd, None, None, None)?;
        serde_json::from_slice::<Option<Vec<u32>>>(&out)
            .map(|v| v.unwrap_or_default())
            .map_err(|e| RuncError::Output(e.to_string()))
    }

    /// `runc pause` / `runc resume` (the cgroup freezer).
    pub fn pause(&self, id: &str, pause: bool) -> Result<()> {
        let mut cmd = self.command(None);
        cmd.args([if pause { "pause" } else { "resume" }, id]);
        self.run(cmd, None, None, None).map(drop)
    }

    /// `runc update --resources -` with the LinuxResources JSON containerd sent.
    pub fn update(&self, id: &str, resources_json: &[u8]) -> Result<()> {
        let mut cmd = self.command(None);
        cmd.args(["update", "--resources", "-", id]);
        self.run(cmd, Some(resources_json), None, None).map(drop)
    }

    /// One `runc events --stats` sample (the `data` object).
    pub fn stats(&self, id: &str) -> Result<serde_json::Value> {
        let mut cmd = self.command(None);
        cmd.args(["events", "--stats", id]);
        let out = self.run(cmd, None, None, None)?;
        let v: serde_json::Value =
            serde_json::from_slice(&out).map_err(|e| RuncError::Output(e.to_string()))?;
        Ok(v["data"].clone())
    }
}

fn read_pid(path: &Path) -> Result<u32> {
    let file = |msg: String| RuncError::File {
        path: path.to_path_buf(),
        msg,
    };
    let s = std::fs::read_to_string(path).map_err(|e| file(e.to_string()))?;
    s.trim()
        .parse()
        .map_err(|e: std::num::ParseIntError| file(e.to_string()))
}

/// The last `error` message in runc's JSON log, as " (msg)".
/// runc's last `error` line in its JSON log (go-runc's getLastRuntimeError).
fn last_log_error(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["level"] == "error")
        .and_then(|v| v["msg"].as_str().map(str::to_string))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_error_is_extracted() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("log.json");
        std::fs::write(
            &p,
            "{\"level\":\"info\",\"msg\":\"x\"}\n{\"level\":\"error\",\"msg\":\"no such file\"}\n",
        )
        .unwrap();
        assert_eq!(last_log_error(&p).as_deref(), Some("no such file"));
        std::fs::write(&p, "{\"level\":\"info\",\"msg\":\"x\"}\n").unwrap();
        assert_eq!(last_log_error(&p), None);
    }
}
