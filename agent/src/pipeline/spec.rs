//! What the agent knows about a container when watching starts, and what a
//! session persists so that a restarted agent resumes its log.

use std::path::PathBuf;
use std::sync::Arc;

use throttlewatch_cgroup::CpuStat;
use throttlewatch_core::logfmt::End;
use throttlewatch_core::protocol::Register;
use throttlewatch_core::{ContainerKey, EndReason};

use crate::coldstart::ColdStartSpec;
use crate::labels::ContainerLabels;

/// What is known about a container when watching starts.
#[derive(Debug, Clone, Default)]
pub(crate) struct SessionSpec {
    /// Its id and names: the log's `start` record, the metrics' labels.
    pub labels: Arc<ContainerLabels>,
    pub pid: Option<u32>,
    pub qos: Option<serde_json::Value>,
    pub threshold_ns: u64,
    pub log_path: PathBuf,
    /// Continue an existing log (agent restart): write `resume`, not `start`,
    /// and keep counting from the original baseline.
    pub resume: Option<Baseline>,
    /// Record the cold-start timeline (containers registered at create).
    pub cold_start: Option<ColdStartSpec>,
    /// The registration that asked for it (the agent persists it with the
    /// baseline); None for `run` and `watch`.
    pub register: Option<Register>,
    /// The log's byte budget and rotation (the agent's; none for `run` and `watch`).
    pub log: crate::budget::LogLimits,
}

impl SessionSpec {
    pub(crate) fn container_id(&self) -> &str {
        self.labels.container_id.as_str()
    }

    /// (scope, id): the scope is the registration's (None for `run`/`watch`).
    pub(crate) fn key(&self) -> ContainerKey {
        ContainerKey::new(
            self.container_id(),
            self.register.as_ref().and_then(|r| r.scope.clone()),
        )
    }
}

/// What a session needs to survive an agent restart (persisted by the agent).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Baseline {
    pub stat: CpuStat,
    pub local: Option<CpuStat>,
    pub started_unix_ns: u64,
    /// Probe totals written before the restart.
    pub probe_ns: u64,
    pub probe_episodes: u64,
    pub freezes: u64,
    pub frozen_ns: u64,
    /// Kernel throttled time that passed while no agent watched.
    pub unwatched_ns: u64,
}

impl Baseline {
    /// The `end` of a container that went away while no agent ran: what
    /// was counted up to the last persist; its cgroup is gone, so no kernel view.
    pub(crate) fn ended_while_agent_down(&self) -> End {
        End {
            reason: EndReason::EndedWhileAgentDown.as_str().into(),
            probe_throttled_ns: self.probe_ns,
            probe_episodes: self.probe_episodes,
            freezes: self.freezes,
            frozen_ns: self.frozen_ns,
            unwatched_throttled_ns: self.unwatched_ns,
            kernel_source: "unavailable (cgroup removed)".into(),
            kernel_stale: Some(
                "the cgroup was removed while no agent ran: the kernel figures were not read (0)"
                    .into(),
            ),
            ..Default::default()
        }
    }
}
