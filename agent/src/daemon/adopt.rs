//! Registers no agent finished: taken by the next agent at its start.
//!
//! - `answered/<key>`: the agent's own journal. A register is answered
//!   once its cgroup is in the watch map; its log, `start` record and state
//!   file follow (register.rs). The register is written here before the
//!   answer and removed once the state file is: an agent killed in between
//!   (SIGKILL, OOM) leaves it, and the next agent watches the container
//!   instead of knowing nothing of it.
//! - `pending/<key>` (`throttlewatch_lifecycle::pending`): a register a
//!   front end sent to an agent that never took it, or could not send
//!   (`start_agent = false` and no agent listening: the DaemonSet's agent
//!   restarting under the NRI plugin, the host unit stopped). The record
//!   waits for the next agent; the front end removes it at the
//!   container's end.
//!
//! Each is registered when its cgroup still exists and its process still
//! runs in it (read from the kernel, never from the record); the record
//! goes either way. Said in agent.log, one line each.

use std::path::{Path, PathBuf};

use throttlewatch_core::protocol::{socket_id, PendingRegister, Register};
use throttlewatch_core::state_dir::{write_atomic, WriteOptions};
use throttlewatch_core::{ContainerKey, StateDir};

use super::Agent;

/// Write `answered/<key>` before the answer goes out.
pub(super) fn journal(state: &StateDir, key: &ContainerKey, bytes: &[u8]) {
    let write = || write_atomic(&state.answered_file(key), bytes, &WriteOptions::STATE);
    let done = write().or_else(|e| {
        if e.kind() != std::io::ErrorKind::NotFound {
            return Err(e);
        }
        StateDir::create_dir(&state.answered_dir())?;
        write()
    });
    if let Err(e) = done {
        eprintln!(
            "throttlewatch agent: {key}: cannot journal the register in {}: {e} (an agent killed before its log would not know it)",
            state.answered_dir().display()
        );
    }
}

/// The register's log and state file are written (or it failed): its
/// journal entry goes.
pub(super) fn journal_done(state: &StateDir, key: &ContainerKey) {
    let _ = std::fs::remove_file(state.answered_file(key));
}

/// The records of `dir`, each with its file (regular files only, never
/// through a symlink); one that does not parse is removed and said.
fn records<T: serde::de::DeserializeOwned>(dir: &Path) -> Vec<(PathBuf, T)> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return vec![];
    };
    let mut out = vec![];
    for e in rd.flatten() {
        let path = e.path();
        if !e.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        // An empty pending record is a wrapper's `create` in progress
        // (`mark_creating`): its helper sends the register itself.
        if bytes.is_empty() {
            continue;
        }
        match serde_json::from_slice(&bytes) {
            Ok(r) => out.push((path, r)),
            Err(e) => {
                eprintln!("throttlewatch agent: {}: {e}; removed", path.display());
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Whether the register's process still runs in its cgroup: the kernel's
/// `/proc/PID/cgroup` names the cgroup the register does (a register
/// without a pid: its cgroup exists).
fn still_runs(h: &throttlewatch_cgroup::Hierarchies, r: &Register) -> bool {
    if throttlewatch_cgroup::CpuCgroup::open(h, &r.cgroup_path).is_err() {
        return false;
    }
    let Some(pid) = r.pid else { return true };
    throttlewatch_cgroup::proc::cpu_cgroup_of_pid(Path::new("/proc"), pid, h.mode)
        .is_ok_and(|rel| rel == r.cgroup_path)
}

/// A log holding only the `start` record of the register being taken
/// again (an agent killed after writing it and before its state file):
/// removed, so the lifetime keeps one log and one `start`.
fn drop_lone_start(log: &Path, r: &Register) {
    let Ok(text) = std::fs::read_to_string(log) else {
        return;
    };
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let (Some(first), None) = (lines.next(), lines.next()) else {
        return;
    };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(first) else {
        return;
    };
    // The same lifetime: its container, cgroup and process.
    let same = v["type"] == "start"
        && v["container_id"] == r.container_id.as_str()
        && v["cgroup_path"] == r.cgroup_path.as_str()
        && r.pid.is_some_and(|p| v["pid"] == p);
    if same {
        let _ = std::fs::remove_file(log);
    }
}

impl Agent {
    /// At start, after the state files: the journal's registers, then the
    /// pending ones (see the module).
    pub(super) fn adopt(&mut self) {
        let state = StateDir::new(&self.cfg.state_dir);
        let answered: Vec<(PathBuf, Register)> = records(&state.answered_dir());
        for (file, r) in answered {
            let key = r.key();
            if self.engine.find(&key).is_none() {
                drop_lone_start(&self.cfg.log_dir.join(key.log_file_name()), &r);
                self.take(r, "answered by an agent that stopped before its log");
            }
            let _ = std::fs::remove_file(file);
        }
        self.take_pending(None);
    }

    /// At each snapshot: pending registers sent to no agent or to another
    /// one (a front end that found no listener just before this agent
    /// bound its socket; a record its `start` or end never removed).
    /// Those sent to this agent's socket are its requests in flight.
    pub(super) fn adopt_unsent(&mut self) {
        let mine = socket_id(&self.cfg.socket);
        if mine.is_some() {
            self.take_pending(mine);
        }
    }

    /// Take the pending registers not sent to `mine` (None: every one).
    fn take_pending(&mut self, mine: Option<String>) {
        let state = StateDir::new(&self.cfg.state_dir);
        let pending: Vec<(PathBuf, PendingRegister)> = records(&state.pending_dir());
        for (file, p) in pending {
            if mine.is_some() && p.socket == mine {
                continue;
            }
            let key = p.register.key();
            // Refused by an agent: the record is left for `start`, which
            // reads the refusal.
            if state.unwatched_file(&key).exists() {
                continue;
            }
            if self.engine.find(&key).is_none() {
                self.take(p.register, "sent while no agent took it");
            }
            let _ = std::fs::remove_file(file);
        }
    }

    fn take(&mut self, r: Register, why: &str) {
        let key = r.key();
        if !still_runs(&self.h, &r) {
            eprintln!(
                "throttlewatch agent: {key}: a register {why}; its container no longer runs in {:?}: not watched",
                r.cgroup_path
            );
            return;
        }
        match self.register(r, None) {
            Ok(_) => eprintln!("throttlewatch agent: {key}: a register {why}: watched from now"),
            Err(e) => eprintln!("throttlewatch agent: {key}: a register {why}: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lone_start_of_the_same_register_is_dropped_and_nothing_else() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("c1.jsonl");
        let r = Register {
            container_id: "c1".into(),
            pid: Some(42),
            cgroup_path: "/pod/c1".into(),
            ..Default::default()
        };
        let start =
            r#"{"v":1,"ts":1,"type":"start","container_id":"c1","pid":42,"cgroup_path":"/pod/c1"}"#;
        std::fs::write(&log, format!("{start}\n")).unwrap();
        drop_lone_start(&log, &r);
        assert!(!log.exists(), "the lone start of this register goes");
        // Another lifetime's start, or more than the start: kept.
        let other = start.replace("\"pid\":42", "\"pid\":41");
        std::fs::write(&log, format!("{other}\n")).unwrap();
        drop_lone_start(&log, &r);
        assert!(log.exists(), "another register's start stays");
        std::fs::write(&log, format!("{start}\n{{\"type\":\"freeze\"}}\n")).unwrap();
        drop_lone_start(&log, &r);
        assert!(log.exists(), "a log with more than its start stays");
    }

    #[test]
    fn records_skip_empty_marks_and_remove_what_does_not_parse() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("creating"), "").unwrap();
        std::fs::write(d.path().join("bad"), "{").unwrap();
        let r = Register {
            container_id: "c2".into(),
            ..Default::default()
        };
        std::fs::write(d.path().join("good"), serde_json::to_vec(&r).unwrap()).unwrap();
        let got: Vec<(PathBuf, Register)> = records(d.path());
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].1, r);
        assert!(
            d.path().join("creating").exists(),
            "a create in progress is left alone"
        );
        assert!(
            !d.path().join("bad").exists(),
            "a record that does not parse is removed"
        );
    }
}
