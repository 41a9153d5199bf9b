//! Bursts held off across an update, each with the time by which its
//! `PostUpdateContainer` must have come. An update the runtime fails (the
//! kernel refuses the new quota, runc fails) is answered to the kubelet
//! with an error and never gets its `PostUpdateContainer`: its burst is
//! written back once its time is up, clamped to the quota then, by a timer
//! of its own ([`Plugin::hold_burst`](super::Plugin)), or sooner by the
//! container's next update or the next `Synchronize`.
//!
//! The bookkeeping is here, apart from the cgroup work: a hold gets a
//! token, and a timer takes back only the hold it was started for (a later
//! update of the same container holds anew with another token).

use std::collections::HashMap;
use std::time::Instant;

/// The holds of every container, by container id.
#[derive(Debug)]
pub struct Holds<T> {
    entries: HashMap<String, Hold<T>>,
    next_token: u64,
}

#[derive(Debug)]
struct Hold<T> {
    value: T,
    token: u64,
    due: Instant,
}

/// Which hold a timer is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token(u64);

impl<T> Default for Holds<T> {
    fn default() -> Self {
        Holds {
            entries: HashMap::new(),
            next_token: 1,
        }
    }
}

impl<T> Holds<T> {
    /// Hold `value` for `id` until `due`; a hold `id` had already is
    /// returned (to be written back first).
    pub fn hold(&mut self, id: &str, value: T, due: Instant) -> (Token, Option<T>) {
        let token = self.next_token;
        self.next_token += 1;
        let old = self
            .entries
            .insert(id.to_string(), Hold { value, token, due });
        (Token(token), old.map(|h| h.value))
    }

    /// The post-update (or the end) of `id`: its hold, whatever its time.
    pub fn take(&mut self, id: &str) -> Option<T> {
        self.entries.remove(id).map(|h| h.value)
    }

    /// A timer's turn: the hold of `id` if it is still the one of `token`
    /// and its time is up at `now`.
    pub fn take_due(&mut self, id: &str, token: Token, now: Instant) -> Option<T> {
        match self.entries.get(id) {
            Some(h) if h.token == token.0 && now >= h.due => self.take(id),
            _ => None,
        }
    }

    /// Every hold (a new connection: no post-update of the old one comes).
    pub fn take_all(&mut self) -> Vec<(String, T)> {
        let mut all: Vec<(String, T)> = self.entries.drain().map(|(k, h)| (k, h.value)).collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_timer_takes_its_own_hold_once_it_is_due() {
        let t0 = Instant::now();
        let limit = Duration::from_secs(4);
        let mut h = Holds::default();
        let (tok, old) = h.hold("a", 20_000u64, t0 + limit);
        assert_eq!(old, None);
        assert_eq!(h.take_due("a", tok, t0), None, "not due yet");
        assert_eq!(h.take_due("a", tok, t0 + limit / 2), None, "not due yet");
        assert_eq!(h.take_due("b", tok, t0 + limit), None, "another container");
        assert_eq!(h.take_due("a", tok, t0 + limit), Some(20_000), "due");
        assert_eq!(h.take_due("a", tok, t0 + limit * 2), None, "taken once");
        assert!(h.is_empty());
    }

    #[test]
    fn a_later_hold_outlives_the_first_timer() {
        let t0 = Instant::now();
        let limit = Duration::from_secs(4);
        let mut h = Holds::default();
        let (first, _) = h.hold("a", 1u64, t0 + limit);
        // A second update before the first one's post-update: the first
        // hold comes back (to be written back), the second is held.
        let (second, old) = h.hold("a", 2, t0 + limit * 2);
        assert_eq!(old, Some(1));
        assert_ne!(first, second);
        assert_eq!(h.take_due("a", first, t0 + limit * 3), None, "not its hold");
        assert_eq!(h.take_due("a", second, t0 + limit), None, "not due");
        assert_eq!(h.take_due("a", second, t0 + limit * 2), Some(2));
    }

    #[test]
    fn the_post_update_or_a_synchronize_comes_first() {
        let t0 = Instant::now();
        let mut h = Holds::default();
        let (tok, _) = h.hold("a", 1u64, t0);
        assert_eq!(h.take("a"), Some(1), "post-update");
        assert_eq!(h.take_due("a", tok, t0), None, "the timer finds nothing");
        h.hold("b", 2, t0);
        h.hold("a", 3, t0);
        assert_eq!(h.len(), 2);
        assert_eq!(
            h.take_all(),
            vec![("a".to_string(), 3), ("b".to_string(), 2)]
        );
        assert_eq!(h.take("a"), None);
    }
}
