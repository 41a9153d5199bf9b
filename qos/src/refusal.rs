//! A request that was not applied, and why: the key, the value as written,
//! and what would have been accepted.

use std::fmt;

use serde::Serialize;

use crate::keys::{Key, MAX_VALUE_BYTES};

/// Values longer than this are shortened in refusals (the value is the
/// user's text, possibly huge; the message only needs to recognise it).
const SHOWN_VALUE_BYTES: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Refusal {
    /// The annotation key or environment variable the value came from,
    /// e.g. `throttlewatch.io/cpu-burst` or `THROTTLEWATCH_CPU_BURST`.
    pub key: String,
    pub value: String,
    pub reason: String,
    /// The setting refused, for code to match on (None: an unknown key).
    /// Not serialized: the log's `qos.refused` entries are key, value, reason.
    #[serde(skip)]
    pub setting: Option<Key>,
}

impl Refusal {
    /// `reason` is rendered once, here: a typed error or the text itself.
    pub fn new(key: impl Into<String>, value: &str, reason: impl fmt::Display) -> Refusal {
        Refusal {
            key: key.into(),
            value: shorten(value),
            reason: reason.to_string(),
            setting: None,
        }
    }

    /// The same refusal, saying which setting it is about.
    pub fn about(self, key: Key) -> Refusal {
        Refusal {
            setting: Some(key),
            ..self
        }
    }

    /// Whether it refuses `key`.
    pub fn is_about(&self, key: Key) -> bool {
        self.setting == Some(key)
    }

    /// A value over [`MAX_VALUE_BYTES`].
    pub fn too_long(key: impl Into<String>, value: &str) -> Refusal {
        Refusal::new(
            key,
            value,
            format!(
                "value is {} bytes long; at most {MAX_VALUE_BYTES} are accepted",
                value.len()
            ),
        )
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={:?}: {}", self.key, self.value, self.reason)
    }
}

fn shorten(v: &str) -> String {
    if v.len() <= SHOWN_VALUE_BYTES {
        return v.to_string();
    }
    let mut end = SHOWN_VALUE_BYTES;
    while !v.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &v[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_key_value_and_accepted() {
        let r = Refusal::new(
            "throttlewatch.io/cpu-burst",
            "abc",
            "expected a duration such as 20ms or a percentage of the quota such as 50%",
        );
        assert_eq!(
            r.to_string(),
            "throttlewatch.io/cpu-burst=\"abc\": expected a duration such as 20ms or a percentage of the quota such as 50%"
        );
    }

    #[test]
    fn long_values_are_shortened() {
        let v = "é".repeat(300);
        let r = Refusal::too_long("k", &v);
        assert!(r.value.len() < 80 && r.value.ends_with('…'));
        assert!(r.reason.contains("600 bytes"), "{}", r.reason);
    }
}
