//! The node configuration as the hook, the wrapper and the shim load it: the
//! file must parse (core) and its `[qos]` key lists must name keys (here,
//! the keys are in `keys`). What fails is a [`BadConfig`]: callers then
//! change nothing (never the permissive defaults) and honour the fail mode
//! the file meant.

use std::path::Path;

use crate::config::{BadConfig, Config};
use crate::keys::{Key, ANNOTATION_ONLY, PREFIX};

/// `Config::load_checked`, then [`check`].
pub fn load(explicit: Option<&Path>) -> Result<Config, BadConfig> {
    checked(explicit, Config::load_checked(explicit)?)
}

/// [`load`] through the parsed-configuration cache
/// (`throttlewatch_core::config_cache`): the wrapper and the hook.
pub fn load_cached(explicit: Option<&Path>) -> Result<Config, BadConfig> {
    checked(explicit, Config::load_checked_cached(explicit)?)
}

fn checked(explicit: Option<&Path>, cfg: Config) -> Result<Config, BadConfig> {
    check(&cfg).map_err(|e| BadConfig {
        error: format!("config {}: {e}", describe_path(explicit)),
        fail_mode: cfg.fail_mode,
    })?;
    Ok(cfg)
}

fn describe_path(explicit: Option<&Path>) -> String {
    explicit
        .map(|p| p.display().to_string())
        .or_else(|| std::env::var(crate::config::ENV_CONFIG).ok())
        .unwrap_or_else(|| crate::config::DEFAULT_PATH.to_string())
}

/// A `[qos]` key list that names something other than a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyListError {
    #[error("[qos] {field}: {name:?} is not a key; known: {known}", known = known_keys())]
    NotAKey { field: &'static str, name: String },
    #[error("[qos] env_keys: {0:?} cannot come from the environment (cpusets are honoured from annotations only)")]
    AnnotationOnly(String),
}

fn known_keys() -> String {
    Key::ALL
        .iter()
        .map(|k| k.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every name in `[qos] allowed_keys` and `env_keys` is a key; `env_keys`
/// names no cpuset key (those are honoured from annotations only).
pub fn check(cfg: &Config) -> Result<(), KeyListError> {
    let key = |field: &'static str, name: &str| {
        Key::from_name(name.strip_prefix(PREFIX).unwrap_or(name)).ok_or_else(|| {
            KeyListError::NotAKey {
                field,
                name: name.to_string(),
            }
        })
    };
    for n in cfg.qos.allowed_keys.iter().flatten() {
        key("allowed_keys", n)?;
    }
    for n in &cfg.qos.env_keys {
        let k = key("env_keys", n)?;
        if ANNOTATION_ONLY.contains(&k) {
            return Err(KeyListError::AnnotationOnly(n.clone()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, String> {
        let c = Config::parse(Path::new("t.toml"), text).map_err(|e| e.to_string())?;
        check(&c).map_err(|e| e.to_string())?;
        Ok(c)
    }

    #[test]
    fn key_lists_name_keys() {
        assert!(parse("[qos]\nallowed_keys = [\"watch\", \"throttlewatch.io/cpuset\"]").is_ok());
        let e = parse("[qos]\nallowed_keys = [\"cpu-brust\"]").unwrap_err();
        assert!(
            e.contains("allowed_keys") && e.contains("cpu-brust") && e.contains("cpu-burst"),
            "{e}"
        );
        let e = parse("[qos]\nenv_keys = [\"cpuset\"]").unwrap_err();
        assert!(e.contains("annotations only"), "{e}");
        assert!(parse("[qos]\nenv_keys = [\"qos-class\", \"gpus\"]").is_ok());
    }
}
