//! The create protocol's marks for one container, in one place: how a
//! front end hands a new container over to the agent without waiting for
//! it (`pending.rs` has the protocol, `unwatched.rs` the refusal mark).
//!
//! | transition | the file | who |
//! |---|---|---|
//! | [`creating`](CreateMarks::creating) | `pending/<key>`, empty | the wrapper's `create`, before the runtime's |
//! | [`sent`](CreateMarks::sent) | `pending/<key>` = the register | whoever sends it fail-open (the wrapper's helper, the shim, the hook) |
//! | [`abandoned`](CreateMarks::abandoned) | `pending/<key>` removed if still empty | the wrapper's helper, when it will not send |
//! | [`taken`](CreateMarks::taken) | `pending/<key>` removed | the agent (`StateDir::clear_pending`), a front end whose send failed, `delete` |
//! | kept (`pending::keep_for_agent`) | `pending/<key>` = the register, no socket | a front end whose register found no agent with `start_agent = false`: the next agent takes it (the agent's `adopt.rs`), the container's end removes it |
//! | [`refused`](CreateMarks::refused) | `unwatched/<key>` | the agent refusing it, a front end whose register failed |
//! | [`watched`](CreateMarks::watched) | `unwatched/<key>` removed | a register answered, a new create of the id |
//! | [`take_refusal`](CreateMarks::take_refusal) | `unwatched/<key>` removed, said whether it was there | the poststop hook |
//!
//! [`before_start`](CreateMarks::before_start) is what every `start` does
//! with them. The wrapper's start ticket (`throttlewatch_runtime`'s
//! `ticket.rs`) stays with the wrapper: only its `create` and `start`
//! read and write it.

use std::path::Path;

use throttlewatch_core::config::Config;
use throttlewatch_core::state_dir::StateDir;
use throttlewatch_core::ContainerKey;

use crate::pending::{self, Pending, PendingRegister};
use crate::unwatched;

/// The marks of one container in one state directory.
pub struct CreateMarks<'a> {
    state: StateDir,
    key: &'a ContainerKey,
}

impl<'a> CreateMarks<'a> {
    pub fn new(state_dir: &Path, key: &'a ContainerKey) -> CreateMarks<'a> {
        CreateMarks {
            state: StateDir::new(state_dir),
            key,
        }
    }

    /// The state directory the marks are in.
    pub fn state(&self) -> &StateDir {
        &self.state
    }

    /// The register will be sent once the runtime has created the container.
    pub fn creating(&self) -> std::io::Result<()> {
        pending::mark_creating(&self.state, self.key)
    }

    /// The register is on its way to the agent.
    pub fn sent(&self, p: &PendingRegister) -> std::io::Result<()> {
        pending::mark(&self.state, self.key, p)
    }

    /// What is pending, if anything.
    pub fn pending(&self) -> Option<Pending> {
        pending::read(&self.state, self.key)
    }

    /// The register will not be sent: an empty mark goes (a sent one is
    /// left for `start`).
    pub fn abandoned(&self) {
        pending::clear_if_creating(&self.state, self.key)
    }

    /// The agent took the register, the send failed, or the container is gone.
    pub fn taken(&self) {
        self.state.clear_pending(self.key)
    }

    /// The agent was never told about the container (or refused it).
    pub fn refused(&self) -> std::io::Result<()> {
        unwatched::mark(&self.state, self.key)
    }

    /// A register was answered: a stale refusal of the id goes.
    pub fn watched(&self) {
        unwatched::clear(&self.state, self.key)
    }

    /// Whether the container was marked refused; the mark goes.
    pub fn take_refusal(&self) -> bool {
        unwatched::take(&self.state, self.key)
    }

    /// `start`: wait for a pending register (sending it again when its
    /// agent is gone or silent); the reason the container starts
    /// unwatched, when it does.
    pub fn before_start(
        &self,
        cfg: &Config,
        config_path: Option<&Path>,
        name: &'static str,
    ) -> Option<String> {
        pending::before_start(cfg, config_path, self.key, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_transitions_move_the_files() {
        let d = tempfile::tempdir().unwrap();
        let k = ContainerKey::new("c1", None);
        let m = CreateMarks::new(d.path(), &k);
        assert_eq!(m.pending(), None);
        m.creating().unwrap();
        assert_eq!(m.pending(), Some(Pending::Creating));
        m.abandoned();
        assert_eq!(m.pending(), None, "an empty mark is abandoned");
        let p = PendingRegister {
            socket: None,
            register: Default::default(),
        };
        m.sent(&p).unwrap();
        m.abandoned();
        assert!(
            matches!(m.pending(), Some(Pending::Sent(_))),
            "a sent one stays for start"
        );
        m.taken();
        assert_eq!(m.pending(), None);
        m.refused().unwrap();
        assert!(m.take_refusal());
        assert!(!m.take_refusal(), "taken once");
        m.refused().unwrap();
        m.watched();
        assert!(!m.take_refusal(), "a register answered clears it");
    }
}
