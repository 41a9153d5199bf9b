//! A container's end: its `end` record, burst record, exclusive cores and
//! registration, at `StopContainer` / `RemoveContainer` or at a
//! `Synchronize` that no longer lists it.
//!
//! The reasons follow when containerd 2.3.4 sends the events (measured in
//! `integration/tests/nri.rs`): `StopContainer` comes once the process has
//! exited and before the runtime's low-level delete removes the cgroup —
//! where the wrapper and the shim write `delete`; `RemoveContainer`, and a
//! `Synchronize` that finds the container gone, come after that delete —
//! where runc runs the OCI poststop hook: `poststop`.

use std::sync::PoisonError;

use protobuf::MessageField;
use throttlewatch_core::{ContainerKey, EndReason};
use throttlewatch_lifecycle::create_marks::CreateMarks;
use throttlewatch_lifecycle::{AgentClient, AgentError, Unregistered};

use super::Plugin;
use crate::api;
use crate::container::release;
use crate::diag::say;
use crate::locked::lock;
use crate::registered::Registered;

/// What an end did with the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The agent wrote the `end` record now.
    Now,
    /// It had been written before (or the container was never watched).
    Before,
    /// The agent could not be asked or refused.
    Failed,
}

impl Plugin {
    /// The container stopped or was removed: the `end` record (a second
    /// call finds it ended), the burst record and exclusive cores released.
    pub(super) fn finish(
        &self,
        pod: &MessageField<api::PodSandbox>,
        c: &MessageField<api::Container>,
        why: EndReason,
    ) {
        let (pod, c) = (pod.get_or_default(), c.get_or_default());
        // Not while a `Synchronize` registers it, and not registered by
        // one after this.
        let _gate = self
            .sync_gate
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        self.note_ended(&c.id);
        // A burst held for an update: the container is gone, nothing to
        // write back.
        let held = lock(&self.held).take(&c.id);
        drop(held);
        let key = self.key(&c.id);
        let cfg = &self.settings().cfg;
        // Registered by this plugin under another watch mode: ended too.
        if !self.wanted(pod, c) && !Registered::new(&cfg.state_dir).contains(&key) {
            return;
        }
        let exit_code = (c.state.enum_value_or_default() == api::ContainerState::CONTAINER_STOPPED)
            .then_some(c.exit_code);
        self.end(&key, why, exit_code);
    }

    /// End `key`'s log with `why`, release what it held, forget its
    /// registration.
    pub(super) fn end(&self, key: &ContainerKey, why: EndReason, exit_code: Option<i32>) -> Ended {
        let s = self.settings();
        let cfg = &s.cfg;
        let ended = if CreateMarks::new(&cfg.state_dir, key).take_refusal() {
            Ended::Before
        } else {
            match AgentClient::of(cfg).unregister(key, why, exit_code) {
                Ok(Unregistered::Ended(_)) => Ended::Now,
                Ok(Unregistered::NotWatched) => Ended::Before,
                Err(AgentError::Refused(r)) => {
                    say(&format!(
                        "the agent refused to end the log of {key}: {}",
                        r.error.unwrap_or_else(|| "no reason given".into())
                    ));
                    Ended::Failed
                }
                Err(e) => {
                    say(&format!("{e}; the end record of {key} may not be written"));
                    Ended::Failed
                }
            }
        };
        release(cfg, key);
        // A register kept for an agent that never came: the container is gone.
        CreateMarks::new(&cfg.state_dir, key).taken();
        Registered::new(&cfg.state_dir).remove(key);
        ended
    }
}
