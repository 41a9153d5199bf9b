//! The containers whose log ended at their exit (exits.rs), until their
//! front end's own end comes: a poststop or a delete then closes what is
//! already ended, answered with its log, and writes nothing. Bounded: the
//! oldest are forgotten first (their late end is then `not-watched`, as
//! for any container the agent does not know).

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;

use throttlewatch_core::ContainerKey;

/// Containers remembered at most (a node's exited, not yet removed ones).
const AT_MOST: usize = 16_384;

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

    /// The log of `key` if it ended at its exit; forgotten once asked.
    pub(crate) fn take(&mut self, key: &ContainerKey) -> Option<PathBuf> {
        let log = self.logs.remove(key)?;
        self.order.retain(|k| k != key);
        Some(log)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taken_once_and_bounded() {
        let k = |i: usize| ContainerKey::new(format!("c{i}"), None);
        let mut e = EndedAtExit::default();
        e.remember(k(0), "/l/0.jsonl".into());
        assert_eq!(e.take(&k(0)), Some(PathBuf::from("/l/0.jsonl")));
        assert_eq!(e.take(&k(0)), None, "a second end finds nothing");
        for i in 0..AT_MOST + 2 {
            e.remember(k(i), format!("/l/{i}.jsonl").into());
        }
        assert_eq!(e.logs.len(), AT_MOST);
        assert_eq!(e.take(&k(0)), None, "the oldest forgotten");
        assert_eq!(
            e.take(&k(AT_MOST + 1)),
            Some(format!("/l/{}.jsonl", AT_MOST + 1).into())
        );
    }
}
