//! Why a container's log ended: the `end` record's `reason` (log format v1,
//! `docs/log-format.md`). Written as the kebab-case strings below.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EndReason {
    /// `throttlewatch run`: the command exited.
    Exit,
    /// SIGINT/SIGTERM to `run`/`watch` (or a command killed by a signal).
    Signal,
    /// The OCI poststop hook.
    Poststop,
    /// The runtime wrapper or the shim, before the low-level `delete`.
    Delete,
    /// `throttlewatch watch --duration` ran out.
    Duration,
    /// The watched cgroup went away.
    CgroupRemoved,
    /// A restarted agent found the container gone.
    EndedWhileAgentDown,
    /// `throttlewatch run` could not start the command.
    SpawnFailed,
}

impl EndReason {
    pub const ALL: [EndReason; 8] = [
        EndReason::Exit,
        EndReason::Signal,
        EndReason::Poststop,
        EndReason::Delete,
        EndReason::Duration,
        EndReason::CgroupRemoved,
        EndReason::EndedWhileAgentDown,
        EndReason::SpawnFailed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::Exit => "exit",
            EndReason::Signal => "signal",
            EndReason::Poststop => "poststop",
            EndReason::Delete => "delete",
            EndReason::Duration => "duration",
            EndReason::CgroupRemoved => "cgroup-removed",
            EndReason::EndedWhileAgentDown => "ended-while-agent-down",
            EndReason::SpawnFailed => "spawn-failed",
        }
    }
}

impl fmt::Display for EndReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that names no end reason; the message lists the accepted ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("end reason {0:?}: expected one of {known}", known = EndReason::ALL.map(|r| r.as_str()).join(", "))]
pub struct UnknownEndReason(pub String);

impl FromStr for EndReason {
    type Err = UnknownEndReason;
    fn from_str(s: &str) -> Result<EndReason, UnknownEndReason> {
        EndReason::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| UnknownEndReason(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_round_trip_through_serde_and_from_str() {
        for r in EndReason::ALL {
            let json = serde_json::to_string(&r).unwrap();
            assert_eq!(json, format!("\"{}\"", r.as_str()));
            assert_eq!(serde_json::from_str::<EndReason>(&json).unwrap(), r);
            assert_eq!(r.as_str().parse::<EndReason>().unwrap(), r);
        }
        let e = "stopped".parse::<EndReason>().unwrap_err().to_string();
        assert!(
            e.contains("\"stopped\"") && e.contains("cgroup-removed"),
            "{e}"
        );
    }

    /// The `end` table of docs/log-format.md lists every reason.
    #[test]
    fn every_reason_is_documented() {
        let doc = include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/log-format.md"
        ));
        let row = doc
            .lines()
            .find(|l| l.starts_with("| `reason` |"))
            .expect("the end table has a reason row");
        for r in EndReason::ALL {
            assert!(
                row.contains(&format!("`{}`", r.as_str())),
                "{r} not in {row}"
            );
        }
    }
}
