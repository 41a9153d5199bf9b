//! The shim's record of its containers and processes, and exits (from the
//! SIGCHLD reaper) turned into TaskExit events.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{mpsc, Arc, Condvar, Mutex};

use containerd_shim::api::Status;
use containerd_shim::protos::events::task::TaskExit;
use containerd_shim::protos::protobuf::well_known_types::{any::Any, timestamp::Timestamp};
use containerd_shim::protos::protobuf::{Message, MessageField};
use containerd_shim::protos::topics;
use log::{info, warn};

use crate::error::Error;
use crate::runc::Runc;

use crate::stdio::ProcIo;

/// (topic, event) for the publisher thread.
pub type Event = (&'static str, Any);
pub type Shared = Arc<(Mutex<ShimState>, Condvar)>;

/// An event as containerd's `Any` (type URL `containerd.events.<Name>`),
/// built without protobuf reflection: the reflection tables of the event
/// protos cost the shim ~0.4 MB of heap once built.
pub fn event<M: Message>(m: &M) -> Any {
    Any {
        type_url: format!("containerd.events.{}", M::NAME),
        value: m.write_to_bytes().unwrap_or_default(),
        ..Default::default()
    }
}

pub fn now() -> Timestamp {
    containerd_shim::util::timestamp().unwrap_or_default()
}

/// Go's zero `time.Time` as a protobuf timestamp (0001-01-01T00:00:00Z):
/// what the runc shim reports as the exit time of a process that never ran.
pub fn go_zero_time() -> Timestamp {
    Timestamp {
        seconds: -62_135_596_800,
        ..Default::default()
    }
}

/// One process of a task as the shim tracks it: the container's init or
/// one of its execs.
#[derive(Debug, Clone, Default)]
pub struct ShimProcess {
    pub pid: u32,
    pub status: Status,
    pub exit_status: u32,
    pub exited_at: Option<Timestamp>,
    pub stdin: String,
    pub stdout: String,
    pub stderr: String,
    pub terminal: bool,
    /// Exec processes: the OCI process JSON containerd sent.
    pub spec: Vec<u8>,
    /// Our stdin writer and the console, while the process is known.
    pub io: Option<Arc<ProcIo>>,
    /// An exec whose start failed: it stays CREATED with pid 0, its waiters
    /// return at once, and a kill is refused (as in the runc shim).
    pub start_failed: bool,
}

/// One container's task as the shim tracks it: its bundle, its init and
/// exec processes, its cgroup.
#[derive(Debug)]
pub struct TaskEntry {
    pub bundle: PathBuf,
    pub mounted_rootfs: bool,
    pub init: ShimProcess,
    pub execs: HashMap<String, ShimProcess>,
    /// Where its cgroup is (for `Stats` once init exited).
    pub cgroups: crate::metrics::CgroupDirs,
}

/// Everything the shim's Task service knows: its tasks by container id,
/// and exits not yet matched to one of their processes.
#[derive(Default)]
pub struct ShimState {
    pub containers: HashMap<String, TaskEntry>,
    /// Exits of pids not (yet) known: an exec can exit before its pid file is read.
    pub unclaimed: VecDeque<(u32, u32, Timestamp)>,
}

/// How long an exit waits for its terminal's last output (see
/// [`ProcIo::wait_output`](crate::stdio::ProcIo::wait_output)).
const OUTPUT_LIMIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Record an exit for whichever process had `pid` and publish TaskExit;
/// a process with a terminal once its last output is copied out (bounded
/// by [`OUTPUT_LIMIT`]): containerd's client stops reading at the exit.
///
/// When a container's init exits in a PID namespace it does not own (the
/// pod's or the host's), what it leaves behind is killed first, as the
/// runc shim does (`ShouldKillAllOnExit` → `KillAll`, task/service.go
/// handleProcessExit): an orphan would keep the stdio fifos open, and
/// containerd 2.x waits for them before it deletes the task.
pub fn on_exit(state: &Shared, tx: &mpsc::Sender<Event>, runc: &Runc, pid: u32, code: u32) {
    let at = now();
    let (cid, eid, io, bundle) = {
        let mut st = state.0.lock().unwrap_or_else(|e| e.into_inner());
        let found = st.containers.iter().find_map(|(cid, c)| {
            if c.init.pid == pid && c.init.status != Status::STOPPED {
                let bundle = Some(c.bundle.clone());
                return Some((cid.clone(), String::new(), c.init.io.clone(), bundle));
            }
            c.execs
                .iter()
                .find(|(_, p)| p.pid == pid && p.status != Status::STOPPED)
                .map(|(e, p)| (cid.clone(), e.clone(), p.io.clone(), None))
        });
        let Some(found) = found else {
            // Kept under the same lock as the search: a start that sets
            // this pid and then looks here (`TaskService::claim`) cannot
            // fall between the two and lose the exit (an exec whose `echo`
            // exited before its pid was set had a wait that never returned).
            // The runc shim holds `lifecycleMu` over the same hand-off
            // (`preStart`/`handleStarted`, cmd/containerd-shim-runc-v2/task/
            // service.go).
            st.unclaimed.push_back((pid, code, at));
            while st.unclaimed.len() > 128 {
                st.unclaimed.pop_front();
            }
            return;
        };
        found
    };
    if bundle.is_some_and(|b| should_kill_all_on_exit(&b)) {
        if let Err(e) = runc.kill(&cid, libc::SIGKILL as u32, true) {
            warn!("{cid}: failed to kill init's children: {e}");
        }
    }
    if let Some(io) = io {
        io.wait_output(OUTPUT_LIMIT);
    }
    apply_exit(state, tx, &cid, &eid, pid, code, at)
}

pub fn apply_exit(
    state: &Shared,
    tx: &mpsc::Sender<Event>,
    cid: &str,
    eid: &str,
    pid: u32,
    code: u32,
    at: Timestamp,
) {
    let mut st = state.0.lock().unwrap_or_else(|e| e.into_inner());
    let Some(c) = st.containers.get_mut(cid) else {
        return;
    };
    let p = if eid.is_empty() {
        Some(&mut c.init)
    } else {
        c.execs.get_mut(eid)
    };
    let Some(p) = p else { return };
    p.status = Status::STOPPED;
    p.exit_status = code;
    p.exited_at = Some(at.clone());
    info!(
        "{cid}{}{eid}: pid {pid} exited with {code}",
        if eid.is_empty() { "" } else { "/" }
    );
    let id = if eid.is_empty() {
        cid.to_string()
    } else {
        eid.to_string()
    };
    let ev = TaskExit {
        container_id: cid.into(),
        id,
        pid,
        exit_status: code,
        exited_at: MessageField::some(at),
        ..Default::default()
    };
    let _ = tx.send((topics::TASK_EXIT_EVENT_TOPIC, event(&ev)));
    state.1.notify_all();
}

/// The runc shim's `ShouldKillAllOnExit` (cmd/containerd-shim-runc-v2/runc/
/// util.go): false only when the spec gives the container a PID namespace
/// of its own (a `pid` namespace without a path); an unreadable spec or
/// none on Linux means true.
pub fn should_kill_all_on_exit(bundle: &std::path::Path) -> bool {
    let Ok(raw) = std::fs::read(bundle.join("config.json")) else {
        return true;
    };
    let Ok(spec) = serde_json::from_slice::<serde_json::Value>(&raw) else {
        return true;
    };
    let Some(ns) = spec["linux"]["namespaces"].as_array() else {
        return spec["linux"].is_null();
    };
    !ns.iter()
        .any(|n| n["type"] == "pid" && n["path"].as_str().is_none_or(str::is_empty))
}

/// The container `id` and its init (`exec_id` empty) or exec process.
pub(crate) fn lookup<'a>(
    st: &'a ShimState,
    id: &str,
    exec_id: &str,
) -> crate::error::Result<(&'a TaskEntry, &'a ShimProcess)> {
    let c = st.containers.get(id).ok_or(Error::ContainerNotFound)?;
    let p = if exec_id.is_empty() {
        Some(&c.init)
    } else {
        c.execs.get(exec_id)
    };
    let p = p.ok_or_else(|| Error::ExecNotFound(exec_id.into()))?;
    Ok((c, p))
}

#[cfg(test)]
mod kill_all_tests {
    use super::should_kill_all_on_exit;

    fn with(spec: &str) -> bool {
        let d = tempfile_dir();
        std::fs::write(d.join("config.json"), spec).unwrap();
        let r = should_kill_all_on_exit(&d);
        let _ = std::fs::remove_dir_all(&d);
        r
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!(
            "tw-killall-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn private_pid_namespace_only_is_left_alone() {
        assert!(!with(
            r#"{"linux":{"namespaces":[{"type":"pid"},{"type":"mount"}]}}"#
        ));
        assert!(!with(
            r#"{"linux":{"namespaces":[{"type":"pid","path":""}]}}"#
        ));
        assert!(with(
            r#"{"linux":{"namespaces":[{"type":"pid","path":"/proc/1/ns/pid"}]}}"#
        ));
        assert!(
            with(r#"{"linux":{"namespaces":[{"type":"mount"}]}}"#),
            "host PID namespace"
        );
        assert!(with("not json"));
    }
}
