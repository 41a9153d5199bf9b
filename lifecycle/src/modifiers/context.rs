//! What the modifiers need beyond the configuration, and where the hook
//! they write into the spec is found.

use std::path::PathBuf;

use throttlewatch_core::config::Config;

use crate::binaries::{beside_me_or_in_path, HOOK_BINARY};

/// What the modifiers need beyond the configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ModifyContext {
    /// The hook executable written into the spec.
    pub hook_path: PathBuf,
    /// Passed to the hook as `--config`, when known.
    pub config_path: Option<PathBuf>,
    pub cfg: Config,
    /// Whether the createRuntime hook does the create work (QoS, register).
    /// False when the caller does it itself once the runtime's `create`
    /// returns (the wrapper's `create`): then the spec holds none of ours.
    pub create_runtime_hook: bool,
    /// When the runtime was asked to create the container: passed to the
    /// createRuntime hook as `--created-unix-ns` (the cold-start timeline);
    /// nothing of it goes into the spec's own fields.
    pub created_unix_ns: Option<u64>,
}

impl ModifyContext {
    /// The hook next to this executable (else in PATH); its `--config` is
    /// `$THROTTLEWATCH_CONFIG` when set; no create time (the caller that
    /// writes our createRuntime hook gives it).
    pub fn from_env(cfg: &Config) -> Result<ModifyContext, NoHookBinary> {
        Ok(ModifyContext {
            hook_path: default_hook_path()?,
            config_path: Config::env_path(),
            cfg: cfg.clone(),
            create_runtime_hook: true,
            created_unix_ns: None,
        })
    }
}

/// No hook executable next to this one (`exe`) nor in PATH.
#[derive(Debug, thiserror::Error)]
#[error("{HOOK_BINARY} not found next to {} nor in PATH", exe.display())]
pub struct NoHookBinary {
    pub exe: PathBuf,
}

/// `throttlewatch-hook` next to this executable, else in PATH.
pub fn default_hook_path() -> Result<PathBuf, NoHookBinary> {
    beside_me_or_in_path(HOOK_BINARY).ok_or_else(|| NoHookBinary {
        exe: std::env::current_exe().unwrap_or_default(),
    })
}
