//! What the node administrator lets containers ask for. Embedded in the
//! TOML configuration, e.g.
//!
//! ```toml
//! [qos]
//! allowed_keys = ["watch", "threshold", "cpu-burst"]
//! max_burst_percent = 50
//! allow_exclusive = false
//! ```

use serde::Deserialize;

use crate::keys::{Key, PREFIX};

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Policy {
    /// Keys containers may use, by name (`cpu-burst`) or full annotation key
    /// (`throttlewatch.io/cpu-burst`). None: all keys.
    pub allowed_keys: Option<Vec<String>>,
    /// Largest burst as a percentage of the quota. Values above 100 act as
    /// 100: the kernel refuses a burst above the quota.
    pub max_burst_percent: u32,
    /// Whether containers may hold CPUs exclusively.
    pub allow_exclusive: bool,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            allowed_keys: None,
            max_burst_percent: 100,
            allow_exclusive: true,
        }
    }
}

impl Policy {
    pub fn allows(&self, key: Key) -> bool {
        match &self.allowed_keys {
            None => true,
            Some(list) => list
                .iter()
                .any(|k| k.strip_prefix(PREFIX).unwrap_or(k) == key.name()),
        }
    }

    /// The burst cap in percent, at most 100.
    pub fn burst_cap_percent(&self) -> u32 {
        self.max_burst_percent.min(100)
    }

    /// Entries of `allowed_keys` that name no key (for the configuration loader to report).
    pub fn unknown_allowed_keys(&self) -> Vec<String> {
        let list = self.allowed_keys.as_deref().unwrap_or_default();
        list.iter()
            .filter(|k| {
                !Key::from_name(k.strip_prefix(PREFIX).unwrap_or(k)).is_some_and(Key::is_qos)
            })
            .cloned()
            .collect()
    }
}

impl From<&throttlewatch_core::config::QosPolicyConfig> for Policy {
    /// The `[qos]` table of throttlewatch.toml (empty allowed list: all keys).
    fn from(c: &throttlewatch_core::config::QosPolicyConfig) -> Policy {
        Policy {
            allowed_keys: (!c.allowed_annotations.is_empty())
                .then(|| c.allowed_annotations.clone()),
            max_burst_percent: c.max_burst_percent,
            allow_exclusive: c.allow_exclusive,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_toml() {
        let p: Policy = toml::from_str("").unwrap();
        assert_eq!(p, Policy::default());
        assert!(p.allows(Key::Cpuset));
        let p: Policy =
            toml::from_str("allowed_keys = [\"watch\", \"throttlewatch.io/cpu-burst\", \"bogus\"]\nmax_burst_percent = 300")
                .unwrap();
        assert!(p.allows(Key::Watch) && p.allows(Key::CpuBurst) && !p.allows(Key::Cpuset));
        assert_eq!(p.burst_cap_percent(), 100);
        assert_eq!(p.unknown_allowed_keys(), vec!["bogus".to_string()]);
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let e = toml::from_str::<Policy>("allow_exclusiv = true").unwrap_err();
        assert!(e.to_string().contains("allow_exclusiv"), "{e}");
    }
}
