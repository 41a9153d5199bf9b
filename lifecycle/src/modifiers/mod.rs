//! Idempotent edits of an OCI bundle's config.json, applied on `create` only
//! (by the runtime wrapper and by the shim).
//!
//! The spec is edited as the JSON document [`SpecFile`] read, so fields this
//! crate does not know survive, and written back atomically with its mode
//! and owner. Each [`SpecModifier`] is a small function that changes nothing
//! when its edit is already there; they compose into [`MODIFIERS`]
//! (NVIDIA container toolkit's `internal/modifier/list.go` is the model).

mod context;
mod cpuset;
mod hooks;
pub mod json;

use std::path::Path;

use serde_json::Value;

use crate::bundle_spec::is_pod_sandbox;
use crate::spec_file::{SpecError, SpecFile};
pub use context::{default_hook_path, ModifyContext, NoHookBinary};
pub use json::FieldError;

pub use cpuset::cpuset_resources;
pub use hooks::{add_create_runtime_hook, add_poststop_hook, CREATED_FLAG};

/// What a modification did, for logs and errors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Modified {
    pub changes: Vec<String>,
}

/// One edit: returns a description when it changed the spec; the error
/// names the field and what was expected.
pub type SpecModifier = fn(&mut Value, &ModifyContext) -> Result<Option<String>, FieldError>;

/// The modifiers, in order.
pub const MODIFIERS: [(&str, SpecModifier); 3] = [
    ("createRuntime hook", add_create_runtime_hook),
    ("poststop hook", add_poststop_hook),
    ("cpuset resources", cpuset_resources),
];

/// Read `<bundle>/config.json`, apply the modifiers, write it back when
/// they changed it.
pub fn modify_bundle(bundle: &Path, ctx: &ModifyContext) -> Result<Modified, SpecError> {
    let mut file = SpecFile::read(bundle)?;
    let changes = apply_modifiers(&mut file, ctx)?;
    if !changes.is_empty() {
        file.write()?;
    }
    Ok(Modified { changes })
}

/// Apply [`MODIFIERS`] in order to the document; a pod sandbox is left as it is.
pub fn apply_modifiers(file: &mut SpecFile, ctx: &ModifyContext) -> Result<Vec<String>, SpecError> {
    if !file.value.is_object() {
        return Err(SpecError::NotAnObject {
            path: file.path.clone(),
            kind: json::kind(&file.value),
        });
    }
    apply_to_value(&mut file.value, ctx).map_err(|(modifier, why)| SpecError::Modifier {
        path: file.path.clone(),
        modifier,
        why,
    })
}

/// [`apply_modifiers`] on a bare document (no file): the changes made, or
/// the modifier that refused and why.
pub fn apply_to_value(
    spec: &mut Value,
    ctx: &ModifyContext,
) -> Result<Vec<String>, (&'static str, FieldError)> {
    if is_pod_sandbox_spec(spec) {
        return Ok(vec![]); // the pause container stays as the CRI made it
    }
    let mut changes = vec![];
    for (name, m) in MODIFIERS {
        if let Some(c) = m(spec, ctx).map_err(|why| (name, why))? {
            changes.push(c);
        }
    }
    Ok(changes)
}

/// A pod's sandbox (pause) container, by its CRI annotations: it runs no
/// workload, so it gets no hooks (no QoS, no log).
pub fn is_pod_sandbox_spec(spec: &Value) -> bool {
    let ann = spec.get("annotations");
    is_pod_sandbox(|k| ann?.get(k)?.as_str())
}

#[cfg(test)]
mod tests;
