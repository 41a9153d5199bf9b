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
    /// Keys the environment channel may set (see [`Policy::env_allows`]).
    pub env_keys: Vec<String>,
    /// The node's freeze threshold, µs: a container may raise its own, never
    /// lower it below this.
    #[serde(skip)]
    pub min_threshold_us: u64,
}

/// What the policy does not let a container ask for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// A key outside `allowed_keys`.
    #[error("not allowed by policy")]
    NotAllowed,
    /// A cpuset key from the environment ([`ANNOTATION_ONLY`]).
    #[error(
        "cpusets are honoured from annotations only (an image's ENV can set this variable); use the annotation {}",
        .0.annotation()
    )]
    AnnotationOnly(Key),
    /// A key outside `env_keys`, from the environment.
    #[error(
        "not honoured from the environment (an image's ENV can set it); use the annotation {}, or add {:?} to [qos] env_keys",
        .0.annotation(),
        .0.name()
    )]
    NotFromEnv(Key),
    /// A threshold below the node's (`min_us`, µs).
    #[error("below the node's threshold of {min_us}us: a container may raise its threshold, never lower it")]
    BelowNodeThreshold { min_us: u64 },
    #[error("exclusive cpusets are not allowed by policy")]
    ExclusiveNotAllowed,
}

/// Keys honoured from annotations only: a cpuset reaches CPUs that other
/// tenants may hold, and an image's `ENV` is written by whoever built it.
pub use throttlewatch_core::keys::ANNOTATION_ONLY;

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            allowed_keys: None,
            max_burst_percent: 100,
            allow_exclusive: true,
            env_keys: throttlewatch_core::config::DEFAULT_ENV_KEYS
                .iter()
                .map(|k| k.to_string())
                .collect(),
            min_threshold_us: 0,
        }
    }
}

impl Policy {
    /// The policy of a node configuration: its `[qos]` table and its
    /// `threshold` as the lowest a container may ask for.
    pub fn for_config(cfg: &throttlewatch_core::config::Config) -> Policy {
        Policy {
            min_threshold_us: cfg.threshold_ns() / 1000,
            ..Policy::from(&cfg.qos)
        }
    }

    /// Whether `key` may come from the environment; the reason when not.
    pub fn env_allows(&self, key: Key) -> Result<(), PolicyError> {
        if ANNOTATION_ONLY.contains(&key) {
            return Err(PolicyError::AnnotationOnly(key));
        }
        if self
            .env_keys
            .iter()
            .any(|k| k.strip_prefix(PREFIX).unwrap_or(k) == key.name())
        {
            return Ok(());
        }
        Err(PolicyError::NotFromEnv(key))
    }

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
    /// The `[qos]` table of throttlewatch.toml (no `allowed_keys`: all keys).
    fn from(c: &throttlewatch_core::config::QosPolicyConfig) -> Policy {
        Policy {
            allowed_keys: c.allowed_keys.clone(),
            max_burst_percent: c.max_burst_percent,
            allow_exclusive: c.allow_exclusive,
            env_keys: c.env_keys.clone(),
            min_threshold_us: 0,
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
    fn env_refusals_name_the_annotation() {
        let p = Policy {
            env_keys: vec!["throttlewatch.io/watch".into()],
            ..Policy::default()
        };
        assert_eq!(p.env_allows(Key::Watch), Ok(()));
        let e = p.env_allows(Key::Cpuset).unwrap_err();
        assert_eq!(e, PolicyError::AnnotationOnly(Key::Cpuset));
        assert!(
            e.to_string()
                .ends_with("use the annotation throttlewatch.io/cpuset"),
            "{e}"
        );
        let e = p.env_allows(Key::CpuBurst).unwrap_err();
        assert_eq!(e, PolicyError::NotFromEnv(Key::CpuBurst));
        assert!(
            e.to_string()
                .ends_with("add \"cpu-burst\" to [qos] env_keys"),
            "{e}"
        );
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let e = toml::from_str::<Policy>("allow_exclusiv = true").unwrap_err();
        assert!(e.to_string().contains("allow_exclusiv"), "{e}");
    }
}

#[cfg(test)]
mod config_tests {
    use std::path::Path;

    use throttlewatch_core::config::Config;

    use crate::Key;

    fn parse(text: &str) -> Config {
        let c = Config::parse(Path::new("t.toml"), text).unwrap();
        throttlewatch_core::config_check::check(&c).unwrap();
        c
    }

    #[test]
    fn allowed_keys_empty_means_none_and_old_name_is_read() {
        let c = parse("[qos]\nallowed_keys = []");
        let p = crate::Policy::from(&c.qos);
        assert!(Key::ALL.iter().all(|k| !p.allows(*k)), "[] allows nothing");
        let c = parse("[qos]\nallowed_annotations = [\"watch\"]");
        let p = crate::Policy::from(&c.qos);
        assert!(p.allows(Key::Watch) && !p.allows(Key::Cpuset));
        let p = crate::Policy::from(&parse("").qos);
        assert!(Key::ALL.iter().all(|k| p.allows(*k)), "omitted: all");
    }
}
