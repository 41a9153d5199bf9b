//! A register between its two halves: answered, its log and state not yet
//! written (see `Agent::register_answering`).

use std::path::PathBuf;

use throttlewatch_cgroup::CpuCgroup;
use throttlewatch_core::ContainerKey;

/// A register past its kernel half (see `Agent::register_answering`).
pub(super) struct RegisterInFlight {
    pub(super) draft: crate::session::draft::SessionDraft,
    pub(super) key: ContainerKey,
    pub(super) log_path: PathBuf,
    pub(super) control_cgroup: CpuCgroup,
    pub(super) wants_control: bool,
}
