//! Pausing and resuming a container, and a copy of one of its processes.

use containerd_shim::api::{self, Status};
use containerd_shim::protos::events::task::{TaskPaused, TaskResumed};
use containerd_shim::protos::topics;

use super::TaskService;
use crate::error::Error;
use crate::state::{lookup, ShimProcess};

impl TaskService {
    /// Freeze or thaw a running container (runc pause / resume), and say so.
    pub(super) fn set_paused(&self, id: String, pause: bool) -> crate::error::Result<api::Empty> {
        let (from, to) = if pause {
            (Status::RUNNING, Status::PAUSED)
        } else {
            (Status::PAUSED, Status::RUNNING)
        };
        let p = self.process(&id, "")?;
        if p.status != from {
            return Err(Error::FailedPrecondition(format!(
                "container {id} is {:?}, not {from:?}",
                p.status
            )));
        }
        self.runc.pause(&id, pause)?;
        if let Some(c) = self.lock().containers.get_mut(&id) {
            if c.init.status == from {
                c.init.status = to;
            }
        }
        if pause {
            let ev = TaskPaused {
                container_id: id,
                ..Default::default()
            };
            self.publish(topics::TASK_PAUSED_EVENT_TOPIC, ev);
        } else {
            let ev = TaskResumed {
                container_id: id,
                ..Default::default()
            };
            self.publish(topics::TASK_RESUMED_EVENT_TOPIC, ev);
        }
        Ok(api::Empty::new())
    }

    /// A copy of the container's init (`exec_id` empty) or exec process.
    pub(super) fn process(&self, id: &str, exec_id: &str) -> crate::error::Result<ShimProcess> {
        lookup(&self.lock(), id, exec_id).map(|(_, p)| p.clone())
    }
}
