//! Idempotent edits of an OCI bundle's config.json, applied on `create` only.
//! (Stub: the API the shim and the wrapper share; implemented with issue #3.)

use std::path::Path;

use throttlewatch_core::config::Config;

/// What a modification did, for logs and errors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Modified {
    pub changes: Vec<String>,
}

/// Load `<bundle>/config.json`, apply the modifiers, write it back
/// atomically (temp file + rename, unknown fields preserved).
pub fn modify_bundle(bundle: &Path, cfg: &Config) -> anyhow::Result<Modified> {
    let _ = (bundle, cfg);
    Ok(Modified::default())
}
