//! The containers whose log the agent ended on its own (at their exit,
//! exits.rs; or found gone by a restarted agent), until their front end's
//! own end comes: a poststop or a delete then closes what is already ended,
//! answered with its log, and writes nothing.
//!
//! Remembered in memory, bounded (the oldest forgotten first), and, for an
//! agent restarted in between, read back from the log itself: the key's
//! log whose last record is an `end` the agent wrote on its own
//! ([`AGENT_ENDS`]). Anything else is `not-watched`, as for any container
//! the agent does not know.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};

use throttlewatch_core::{ContainerKey, EndReason};

/// Containers remembered at most (a node's exited, not yet removed ones).
const AT_MOST: usize = 16_384;

/// The end reasons the agent writes without a front end's end.
const AGENT_ENDS: [EndReason; 3] = [
    EndReason::Exit,
    EndReason::CgroupRemoved,
    EndReason::EndedWhileAgentDown,
];

#[derive(Default)]
pub(crate) struct EndedAtExit {
    logs: HashMap<ContainerKey, PathBuf>,
    order: VecDeque<ContainerKey>,
}

impl EndedAtExit {
    pub(crate) fn remember(&mut self, key: ContainerKey, log: PathBuf) {
        if self.logs.insert(key.clone(), log).is_none() {
            self.order.push_back(key);
        }
        while self.order.len() > AT_MOST {
            if let Some(old) = self.order.pop_front() {
                self.logs.remove(&old);
            }
        }
    }

    /// The log of `key` if the agent ended it on its own: remembered
    /// (forgotten once asked), else `log_dir`'s log of `key` if its last
    /// record says so.
    pub(crate) fn take(&mut self, key: &ContainerKey, log_dir: &Path) -> Option<PathBuf> {
        if let Some(log) = self.logs.remove(key) {
            self.order.retain(|k| k != key);
            return Some(log);
        }
        let log = log_dir.join(key.log_file_name());
        ended_by_agent(&log).then_some(log)
    }
}

/// Whether the last record of `log` is an `end` the agent wrote on its own.
fn ended_by_agent(log: &Path) -> bool {
    let Some(line) = crate::logdir::last_line(log) else {
        return false;
    };
    let Ok(rec) = serde_json::from_str::<serde_json::Value>(&line) else {
        return false;
    };
    rec["type"] == "end"
        && AGENT_ENDS
            .iter()
            .any(|r| rec["reason"].as_str() == Some(r.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taken_once_and_bounded() {
        let none = Path::new("/nonexistent-tw-logs");
        let k = |i: usize| ContainerKey::new(format!("c{i}"), None);
        let mut e = EndedAtExit::default();
        e.remember(k(0), "/l/0.jsonl".into());
        assert_eq!(e.take(&k(0), none), Some(PathBuf::from("/l/0.jsonl")));
        assert_eq!(e.take(&k(0), none), None, "a second end finds nothing");
        for i in 0..AT_MOST + 2 {
            e.remember(k(i), format!("/l/{i}.jsonl").into());
        }
        assert_eq!(e.logs.len(), AT_MOST);
        assert_eq!(e.take(&k(0), none), None, "the oldest forgotten");
        assert_eq!(
            e.take(&k(AT_MOST + 1), none),
            Some(format!("/l/{}.jsonl", AT_MOST + 1).into())
        );
    }

    /// A restarted agent remembers nothing: the log's last record answers.
    #[test]
    fn a_restarted_agent_reads_the_end_from_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let mut e = EndedAtExit::default();
        let start = r#"{"type":"start","container_id":"x"}"#;
        for (id, last, want) in [
            (
                "exited",
                r#"{"type":"end","reason":"exit","exit_code":0}"#,
                true,
            ),
            (
                "gone",
                r#"{"type":"end","reason":"ended-while-agent-down"}"#,
                true,
            ),
            (
                "removed",
                r#"{"type":"end","reason":"cgroup-removed"}"#,
                true,
            ),
            // Its front end ended it already: a second end is not ours to answer.
            ("stopped", r#"{"type":"end","reason":"poststop"}"#, false),
            ("running", r#"{"type":"sample","running_ns":1}"#, false),
            ("torn", r#"{"type":"end","reason":"ex"#, false),
        ] {
            let key = ContainerKey::new(id, None);
            let log = dir.path().join(key.log_file_name());
            std::fs::write(&log, format!("{start}\n{last}\n")).unwrap();
            let got = e.take(&key, dir.path());
            assert_eq!(got, want.then_some(log), "{id}");
        }
        let unknown = ContainerKey::new("never-registered", None);
        assert_eq!(e.take(&unknown, dir.path()), None);
    }
}
