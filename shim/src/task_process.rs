//! The halves of the Task service's `start` and `delete` (the container's
//! init process, or an exec process).

use std::sync::Arc;

use containerd_shim::api::{self, Status};
use containerd_shim::protos::events::task::{TaskDelete, TaskExecStarted, TaskStart};
use containerd_shim::protos::protobuf::MessageField;
use containerd_shim::protos::topics;
use log::warn;
use throttlewatch_lifecycle::agent_client::end_before_delete;
use throttlewatch_lifecycle::create_marks::CreateMarks;

use super::{TaskService, SHIM_NAME};
use crate::error::{Error, Result};
use crate::state::now;
use crate::stdio::ProcIo;

/// The halves of `start` and `delete`: the container's init, or an exec.
impl TaskService {
    pub(super) fn start_init(&self, id: &str) -> Result<u32> {
        if !self.lock().containers.contains_key(id) {
            return Err(Error::ContainerNotFound);
        }
        // A register sent at create and not yet taken: wait for the watch.
        let config_path = throttlewatch_core::config::Config::env_path();
        if let Some(msg) = CreateMarks::new(&self.cfg.state_dir, &self.key(id)).before_start(
            &self.cfg,
            config_path.as_deref(),
            SHIM_NAME,
        ) {
            warn!("{msg}");
        }
        self.runc.start(id)?;
        let mut st = self.lock();
        let c = st.containers.get_mut(id).ok_or(Error::ContainerNotFound)?;
        if c.init.status == Status::CREATED {
            c.init.status = Status::RUNNING;
        }
        let pid = c.init.pid;
        drop(st);
        let ev = TaskStart {
            container_id: id.to_string(),
            pid,
            ..Default::default()
        };
        self.publish(topics::TASK_START_EVENT_TOPIC, ev);
        Ok(pid)
    }

    pub(super) fn start_exec(&self, id: &str, exec_id: &str) -> Result<u32> {
        let (bundle, p) = {
            let st = self.lock();
            let c = st.containers.get(id).ok_or(Error::ContainerNotFound)?;
            let p = c
                .execs
                .get(exec_id)
                .ok_or_else(|| Error::ExecNotFound(exec_id.into()))?;
            (c.bundle.clone(), p.clone())
        };
        let launched = ProcIo::launch(
            &p.stdin,
            &p.stdout,
            &p.stderr,
            p.terminal,
            |stdio, console| {
                self.runc
                    .exec(id, &bundle, exec_id, &p.spec, stdio, console)
            },
        );
        let (pid, io) = match launched {
            Ok(l) => l,
            Err(e) => {
                // The runc shim closes the exec's waitBlock: waiters return
                // now, the exec stays created (pid 0) until its delete.
                if let Some(x) = self
                    .lock()
                    .containers
                    .get_mut(id)
                    .and_then(|c| c.execs.get_mut(exec_id))
                {
                    x.start_failed = true;
                }
                self.state.1.notify_all();
                return Err(Error::of_exec_start(e));
            }
        };
        if let Some(e) = self
            .lock()
            .containers
            .get_mut(id)
            .and_then(|c| c.execs.get_mut(exec_id))
        {
            e.pid = pid;
            e.status = Status::RUNNING;
            e.io = Some(Arc::new(io));
        }
        self.claim(id, exec_id, pid);
        let ev = TaskExecStarted {
            container_id: id.to_string(),
            exec_id: exec_id.to_string(),
            pid,
            ..Default::default()
        };
        self.publish(topics::TASK_EXEC_STARTED_EVENT_TOPIC, ev);
        Ok(pid)
    }

    pub(super) fn delete_exec(&self, id: &str, exec_id: &str) -> Result<api::DeleteResponse> {
        let mut st = self.lock();
        let c = st.containers.get_mut(id).ok_or(Error::ContainerNotFound)?;
        let p = c
            .execs
            .get(exec_id)
            .ok_or_else(|| Error::ExecNotFound(exec_id.into()))?;
        if p.status == Status::RUNNING {
            return Err(Error::FailedPrecondition(format!(
                "exec {exec_id} is still running"
            )));
        }
        let p = c.execs.remove(exec_id).unwrap_or_default();
        Ok(api::DeleteResponse {
            pid: p.pid,
            exit_status: p.exit_status,
            exited_at: p.exited_at.into(),
            ..Default::default()
        })
    }

    pub(super) fn delete_init(&self, id: String) -> Result<api::DeleteResponse> {
        let (bundle, mounted, exit_code) = {
            let st = self.lock();
            let c = st.containers.get(&id).ok_or(Error::ContainerNotFound)?;
            let code = (c.init.status == Status::STOPPED).then_some(c.init.exit_status as i32);
            (c.bundle.clone(), c.mounted_rootfs, code)
        };
        // Created and never started: its register is no longer awaited.
        let key = self.key(&id);
        CreateMarks::new(&self.cfg.state_dir, &key).taken();
        // The log's `end` record while cpu.stat still exists (runc delete
        // removes the cgroup before its poststop hook runs).
        if let Err(w) = end_before_delete(&self.cfg, &key, exit_code) {
            warn!("{id}: {w}");
        }
        self.runc.delete(&id)?;
        if mounted {
            let rootfs = bundle.join("rootfs");
            if let Err(e) = containerd_shim::mount::umount_recursive(rootfs.to_str(), 0) {
                warn!("{id}: unmount rootfs: {e}");
            }
        }
        let c = self
            .lock()
            .containers
            .remove(&id)
            .ok_or(Error::ContainerNotFound)?;
        let p = c.init;
        let at = p.exited_at.clone().unwrap_or_else(now);
        let ev = TaskDelete {
            container_id: id.clone(),
            id,
            pid: p.pid,
            exit_status: p.exit_status,
            exited_at: MessageField::some(at.clone()),
            ..Default::default()
        };
        self.publish(topics::TASK_DELETE_EVENT_TOPIC, ev);
        Ok(api::DeleteResponse {
            pid: p.pid,
            exit_status: p.exit_status,
            exited_at: MessageField::some(at),
            ..Default::default()
        })
    }
}
