//! The agent's side of a container's end at its exit (exits.rs watches
//! the inits): a hook or wrapper container's init armed at register, the
//! logs of those that exited ended, and remembered until their front end's
//! own end (ended_at_exit.rs).

use throttlewatch_core::EndReason;

use super::Agent;

impl Agent {
    /// Hook and wrapper containers: their init watched, to end the log at
    /// exit (exits.rs). One found gone at once ends at the next tick; on
    /// resume, as ended while no agent ran.
    pub(super) fn arm_exit(&mut self, id: u64) {
        let Some(s) = self.engine.session(id) else {
            return;
        };
        let Some(r) = s.spec.register.as_ref().filter(|r| !r.exit_reported) else {
            return;
        };
        let Some(pid) = r.pid else { return };
        let reason = match s.spec.resume {
            Some(_) => EndReason::EndedWhileAgentDown,
            None => EndReason::Exit,
        };
        self.exits.arm(id, pid, &s.cgroup, reason);
    }

    /// Containers whose init exited and whose cgroup is empty: ended (exits.rs).
    pub(super) fn end_exited(&mut self) {
        if !self.exits.lingering() {
            return;
        }
        let engine = &self.engine;
        for e in self.exits.ended(|id| engine.session(id).map(|s| &s.cgroup)) {
            let key = self.engine.session(e.id).map(|s| s.spec.key());
            if let (Some(k), Some(log)) = (key, self.end(e.id, e.reason, e.exit_code)) {
                self.ended_at_exit.remember(k, log);
            }
        }
    }
}
