//! The ttrpc Task service: containers and exec processes of this shim,
//! driven through runc; exits (from the SIGCHLD reaper) become TaskExit events.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};

use containerd_shim::api::{self, Status};
use containerd_shim::monitor::{monitor_subscribe, Subject, Topic};
use containerd_shim::protos::events::task::{TaskCreate, TaskExecAdded, TaskIO, TaskOOM};
use containerd_shim::protos::protobuf::well_known_types::any::Any;
use containerd_shim::protos::protobuf::{Message, MessageField};
use containerd_shim::protos::topics;
use containerd_shim::{ExitSignal, Task, TtrpcContext, TtrpcResult};
use log::{info, warn};
use throttlewatch_core::config::{BadConfig, Config, FailMode};
use throttlewatch_lifecycle::held_burst::{derive_for_bundle, HeldBurst};
use throttlewatch_lifecycle::{ContainerKey, Scope};

use crate::error::Error;
use crate::metrics::metrics_any;
use crate::runc::Runc;
use crate::state::{
    apply_exit, event, go_zero_time, lookup, on_exit, Event, Shared, ShimProcess, ShimState,
    TaskEntry,
};
use crate::stdio::ProcIo;

pub struct TaskService {
    state: Shared,
    runc: Runc,
    cfg: Config,
    /// Set when the configuration could not be used: no spec is modified.
    bad_config: Option<BadConfig>,
    events: Mutex<mpsc::Sender<Event>>,
    exit: Arc<ExitSignal>,
}

/// The name on the shim's lines in hook.log.
pub(crate) const SHIM_NAME: &str = "containerd-shim-throttlewatch-v2";

impl TaskService {
    /// A container of this shim keyed by (scope, id): the scope of the runc
    /// root it uses, which is that of its containerd namespace.
    pub(crate) fn key(&self, id: &str) -> ContainerKey {
        ContainerKey::new(id, Scope::of_runc_root(&self.runc.root, Path::new("/")))
    }
}

impl TaskService {
    pub fn new(
        runc: Runc,
        cfg: Config,
        events: mpsc::Sender<Event>,
        exit: Arc<ExitSignal>,
    ) -> TaskService {
        let state: Shared = Arc::default();
        let sub = monitor_subscribe(Topic::All).expect("monitor subscribe");
        let (st, tx, rc) = (state.clone(), events.clone(), runc.clone());
        std::thread::spawn(move || {
            for e in sub.rx.iter() {
                if let Subject::Pid(pid) = e.subject {
                    on_exit(&st, &tx, &rc, pid as u32, e.exit_code as u32);
                }
            }
        });
        TaskService {
            state,
            runc,
            cfg,
            bad_config: None,
            events: Mutex::new(events),
            exit,
        }
    }

    pub fn with_bad_config(mut self, bad: Option<BadConfig>) -> Self {
        self.bad_config = bad;
        self
    }

    fn lock(&self) -> MutexGuard<'_, ShimState> {
        self.state.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn publish<M: Message>(&self, topic: &'static str, ev: M) {
        let _ = self
            .events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send((topic, event(&ev)));
    }

    /// `TaskOOM` for each OOM kill in the container's memory cgroup, as the
    /// runc shim publishes it (containerd's CRI reports `OOMKilled`).
    fn watch_oom(&self, id: &str, pid: u32) {
        let tx = self
            .events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let cid = id.to_string();
        let sent = crate::oom::watch(pid, move || {
            let ev = TaskOOM {
                container_id: cid.clone(),
                ..Default::default()
            };
            let _ = tx.send((topics::TASK_OOM_EVENT_TOPIC, event(&ev)));
        });
        if let Err(e) = sent {
            warn!("{id}: OOM kills not watched: {e}");
        }
    }

    /// Apply an exit that arrived before the pid was known.
    fn claim(&self, cid: &str, exec_id: &str, pid: u32) {
        let mut st = self.lock();
        let Some(pos) = st.unclaimed.iter().rposition(|u| u.0 == pid) else {
            return;
        };
        let (_, code, at) = st.unclaimed.remove(pos).unwrap_or_default();
        drop(st);
        let tx = self
            .events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        apply_exit(&self.state, &tx, cid, exec_id, pid, code, at);
    }

    fn publish_created(&self, req: api::CreateTaskRequest, pid: u32) {
        let io = TaskIO {
            stdin: req.stdin,
            stdout: req.stdout,
            stderr: req.stderr,
            ..Default::default()
        };
        let ev = TaskCreate {
            container_id: req.id,
            bundle: req.bundle,
            rootfs: req.rootfs,
            io: MessageField::some(io),
            pid,
            ..Default::default()
        };
        self.publish(topics::TASK_CREATE_EVENT_TOPIC, ev);
    }
}

#[path = "task_create.rs"]
mod create;
#[path = "task_paused.rs"]
mod paused;
#[path = "task_process.rs"]
mod process;

use crate::rootfs::{mount_rootfs, unmount_rootfs};

impl Task for TaskService {
    fn create(
        &self,
        _ctx: &TtrpcContext,
        req: api::CreateTaskRequest,
    ) -> TtrpcResult<api::CreateTaskResponse> {
        let bundle = PathBuf::from(&req.bundle);
        if self.lock().containers.contains_key(&req.id) {
            return Err(
                Error::AlreadyExists(format!("container {} already exists", req.id)).into(),
            );
        }
        let mounted = mount_rootfs(&bundle, &req.rootfs)?;
        let created_ns = throttlewatch_core::logfmt::now_unix_ns();
        let created = self.modify_spec(&req.id, &bundle).and_then(|spec| {
            let (pid, io) = ProcIo::launch(
                &req.stdin,
                &req.stdout,
                &req.stderr,
                req.terminal,
                |stdio, console| self.runc.create(&req.id, &bundle, stdio, console),
            )?;
            if let Some(spec) = spec {
                if let Err(e) = self.on_created(&req.id, &bundle, pid, &spec, created_ns) {
                    // Fail-closed: what runc made goes, as a failed hook's would.
                    let _ = self.runc.delete(&req.id);
                    return Err(e);
                }
            }
            Ok((pid, io))
        });
        let (pid, io) = created.inspect_err(|_| unmount_rootfs(&bundle, mounted))?;
        let init = ShimProcess {
            pid,
            status: Status::CREATED,
            stdin: req.stdin.clone(),
            stdout: req.stdout.clone(),
            stderr: req.stderr.clone(),
            terminal: req.terminal,
            io: Some(Arc::new(io)),
            ..Default::default()
        };
        let c = TaskEntry {
            bundle,
            mounted_rootfs: mounted,
            init,
            execs: HashMap::new(),
            cgroups: crate::metrics::CgroupDirs::of_pid(pid),
        };
        self.lock().containers.insert(req.id.clone(), c);
        self.claim(&req.id, "", pid);
        self.watch_oom(&req.id, pid);
        self.publish_created(req, pid);
        Ok(api::CreateTaskResponse {
            pid,
            ..Default::default()
        })
    }

    fn start(
        &self,
        _ctx: &TtrpcContext,
        req: api::StartRequest,
    ) -> TtrpcResult<api::StartResponse> {
        let pid = if req.exec_id.is_empty() {
            self.start_init(&req.id)?
        } else {
            self.start_exec(&req.id, &req.exec_id)?
        };
        Ok(api::StartResponse {
            pid,
            ..Default::default()
        })
    }

    fn exec(&self, _ctx: &TtrpcContext, req: api::ExecProcessRequest) -> TtrpcResult<api::Empty> {
        let mut st = self.lock();
        let c = st
            .containers
            .get_mut(&req.id)
            .ok_or(Error::ContainerNotFound)?;
        if c.execs.contains_key(&req.exec_id) {
            return Err(
                Error::AlreadyExists(format!("exec {} already exists", req.exec_id)).into(),
            );
        }
        let spec = req
            .spec
            .as_ref()
            .map(|a| a.value.clone())
            .unwrap_or_default();
        let p = ShimProcess {
            status: Status::CREATED,
            stdin: req.stdin,
            stdout: req.stdout,
            stderr: req.stderr,
            terminal: req.terminal,
            spec,
            ..Default::default()
        };
        c.execs.insert(req.exec_id.clone(), p);
        drop(st);
        let ev = TaskExecAdded {
            container_id: req.id,
            exec_id: req.exec_id,
            ..Default::default()
        };
        self.publish(topics::TASK_EXEC_ADDED_EVENT_TOPIC, ev);
        Ok(api::Empty::new())
    }

    fn kill(&self, _ctx: &TtrpcContext, req: api::KillRequest) -> TtrpcResult<api::Empty> {
        let p = self.process(&req.id, &req.exec_id)?;
        // After init exited only `Kill(all)` still reaches runc (`runc kill
        // --all` signals what is left in the cgroup), as with the runc shim.
        if p.status == Status::STOPPED && !(req.all && req.exec_id.is_empty()) {
            return Err(Error::NotFound("process already finished: not found".into()).into());
        }
        if req.exec_id.is_empty() {
            self.runc
                .kill(&req.id, req.signal, req.all)
                .map_err(Error::of_kill)?;
        } else if p.pid == 0 {
            // Never started (or its start failed): the runc shim's exec kill.
            return Err(Error::FailedPrecondition(
                "process not created: failed precondition".into(),
            )
            .into());
        } else {
            // SAFETY: plain kill(2) of a pid this shim reaps.
            if unsafe { libc::kill(p.pid as i32, req.signal as i32) } != 0 {
                return Err(Error::NotFound(std::io::Error::last_os_error().to_string()).into());
            }
        }
        Ok(api::Empty::new())
    }

    fn delete(
        &self,
        _ctx: &TtrpcContext,
        req: api::DeleteRequest,
    ) -> TtrpcResult<api::DeleteResponse> {
        if req.exec_id.is_empty() {
            Ok(self.delete_init(req.id)?)
        } else {
            Ok(self.delete_exec(&req.id, &req.exec_id)?)
        }
    }

    fn wait(&self, _ctx: &TtrpcContext, req: api::WaitRequest) -> TtrpcResult<api::WaitResponse> {
        let mut st = self.lock();
        loop {
            let (_, p) = lookup(&st, &req.id, &req.exec_id)?;
            if p.status == Status::STOPPED {
                return Ok(api::WaitResponse {
                    exit_status: p.exit_status,
                    exited_at: p.exited_at.clone().into(),
                    ..Default::default()
                });
            }
            if p.start_failed {
                // What the runc shim answers for it: status 0 at Go's zero time.
                return Ok(api::WaitResponse {
                    exit_status: 0,
                    exited_at: Some(go_zero_time()).into(),
                    ..Default::default()
                });
            }
            st = self.state.1.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn state(
        &self,
        _ctx: &TtrpcContext,
        req: api::StateRequest,
    ) -> TtrpcResult<api::StateResponse> {
        let st = self.lock();
        let (c, p) = lookup(&st, &req.id, &req.exec_id)?;
        Ok(api::StateResponse {
            id: if req.exec_id.is_empty() {
                req.id.clone()
            } else {
                req.exec_id.clone()
            },
            exec_id: req.exec_id.clone(),
            bundle: c.bundle.to_string_lossy().into_owned(),
            pid: p.pid,
            status: p.status.into(),
            stdin: p.stdin.clone(),
            stdout: p.stdout.clone(),
            stderr: p.stderr.clone(),
            exit_status: p.exit_status,
            exited_at: p.exited_at.clone().into(),
            ..Default::default()
        })
    }

    fn pids(&self, _ctx: &TtrpcContext, req: api::PidsRequest) -> TtrpcResult<api::PidsResponse> {
        self.process(&req.id, "")?;
        let pids = self.runc.ps(&req.id).map_err(Error::from)?;
        let processes = pids
            .into_iter()
            .map(|pid| containerd_shim::protos::types::task::ProcessInfo {
                pid,
                ..Default::default()
            })
            .collect();
        Ok(api::PidsResponse {
            processes,
            ..Default::default()
        })
    }

    fn update(&self, _ctx: &TtrpcContext, req: api::UpdateTaskRequest) -> TtrpcResult<api::Empty> {
        let init = self.process(&req.id, "")?;
        let bundle = self
            .lock()
            .containers
            .get(&req.id)
            .map(|c| c.bundle.clone());
        let json = req
            .resources
            .as_ref()
            .map(|a| a.value.clone())
            .unwrap_or_default();
        // runc clears a CFS burst it does not know: hold it across the update.
        let mut warn = |m: &str| warn!("{m}");
        let key = self.key(&req.id);
        let held = HeldBurst::take(
            &self.cfg,
            &key,
            |w| bundle.and_then(|b| derive_for_bundle(&self.cfg, &key, &b, init.pid, w)),
            &mut warn,
        );
        let res = self.runc.update(&req.id, &json);
        if let Some(h) = held {
            if let Err(e) = h.restore(&self.cfg, &mut |w: &str| warn!("{w}")) {
                warn!("{e}");
                if res.is_ok() && self.cfg.fail_mode == FailMode::Closed {
                    return Err(Error::Internal(e.to_string()).into());
                }
            }
        }
        res.map_err(Error::from)?;
        Ok(api::Empty::new())
    }

    fn pause(&self, _ctx: &TtrpcContext, req: api::PauseRequest) -> TtrpcResult<api::Empty> {
        Ok(self.set_paused(req.id, true)?)
    }

    fn resume(&self, _ctx: &TtrpcContext, req: api::ResumeRequest) -> TtrpcResult<api::Empty> {
        Ok(self.set_paused(req.id, false)?)
    }

    fn stats(
        &self,
        _ctx: &TtrpcContext,
        req: api::StatsRequest,
    ) -> TtrpcResult<api::StatsResponse> {
        let (status, dirs) = {
            let st = self.lock();
            let c = st.containers.get(&req.id).ok_or(Error::ContainerNotFound)?;
            (c.init.status, c.cgroups.clone())
        };
        // From the cgroup, as the runc shim does (runc events has neither
        // memory.oom_control nor, once init exited, an answer), in the
        // type of its cgroup version (v1 or v2 Metrics).
        let stats: Any = match dirs.metrics_any() {
            Some(any) => any,
            None if status == Status::STOPPED => {
                return Err(Error::NotFound("cgroup does not exist: not found".into()).into())
            }
            None => {
                let data = self.runc.stats(&req.id).map_err(Error::from)?;
                metrics_any(&data, dirs.v2)
            }
        }
        .map_err(Error::from)?;
        Ok(api::StatsResponse {
            stats: MessageField::some(stats),
            ..Default::default()
        })
    }

    fn connect(
        &self,
        _ctx: &TtrpcContext,
        req: api::ConnectRequest,
    ) -> TtrpcResult<api::ConnectResponse> {
        let task_pid = self
            .lock()
            .containers
            .get(&req.id)
            .map(|c| c.init.pid)
            .unwrap_or(0);
        Ok(api::ConnectResponse {
            shim_pid: std::process::id(),
            task_pid,
            version: env!("CARGO_PKG_VERSION").into(),
            ..Default::default()
        })
    }

    fn shutdown(&self, _ctx: &TtrpcContext, req: api::ShutdownRequest) -> TtrpcResult<api::Empty> {
        // Containers of the same sandbox share this shim: stay while any is left.
        if !req.now && !self.lock().containers.is_empty() {
            return Ok(api::Empty::new());
        }
        info!("shutdown");
        self.exit.signal();
        Ok(api::Empty::new())
    }

    fn close_io(&self, _ctx: &TtrpcContext, req: api::CloseIORequest) -> TtrpcResult<api::Empty> {
        // Drop our writer on the stdin fifo: the process sees EOF once
        // containerd's writer is closed too.
        let p = self.process(&req.id, &req.exec_id)?;
        if let (true, Some(io)) = (req.stdin, p.io) {
            io.close_stdin();
        }
        Ok(api::Empty::new())
    }

    fn resize_pty(
        &self,
        _ctx: &TtrpcContext,
        req: api::ResizePtyRequest,
    ) -> TtrpcResult<api::Empty> {
        let p = self.process(&req.id, &req.exec_id)?;
        if let Some(io) = p.io {
            io.resize(req.width, req.height)
                .map_err(|e| Error::Internal(format!("resize pty: {e}")))?;
        }
        Ok(api::Empty::new())
    }
}
