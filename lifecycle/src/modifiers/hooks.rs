//! Our hook in `hooks.createRuntime` and `hooks.poststop`: exactly one entry
//! each, with the current path and arguments.

use std::path::Path;

use serde_json::{json, Value};

use super::context::ModifyContext;
use super::json::{object_at, FieldError};
use crate::binaries::HOOK_BINARY;
use crate::stage::HookStage;

/// The createRuntime hook's argument that carries the create time.
pub const CREATED_FLAG: &str = "--created-unix-ns";

fn hook_entry(stage: HookStage, ctx: &ModifyContext) -> Value {
    let mut args = vec![json!(HOOK_BINARY), json!(stage.as_str())];
    if let Some(c) = &ctx.config_path {
        args.push(json!("--config"));
        args.push(json!(c.to_string_lossy()));
    }
    if let (HookStage::CreateRuntime, Some(ns)) = (stage, ctx.created_unix_ns) {
        args.push(json!(CREATED_FLAG));
        args.push(json!(ns.to_string()));
    }
    // Without a `timeout` the runtime waits for ever on a hook that hangs.
    json!({
        "path": ctx.hook_path.to_string_lossy(),
        "args": args,
        "timeout": ctx.cfg.hook_timeout_s.max(1),
    })
}

fn is_our_hook(h: &Value, ctx: &ModifyContext) -> bool {
    let Some(p) = h.get("path").and_then(Value::as_str) else {
        return false;
    };
    Path::new(p) == ctx.hook_path || Path::new(p).file_name().is_some_and(|n| n == HOOK_BINARY)
}

/// Exactly one entry of ours in `hooks.<stage>`, with the current
/// arguments (`want`), or none (`!want`).
fn ensure_hook(
    spec: &mut Value,
    ctx: &ModifyContext,
    stage: HookStage,
    want: bool,
) -> Result<Option<String>, FieldError> {
    if !want && spec.pointer(&format!("/hooks/{stage}")).is_none() {
        return Ok(None);
    }
    let hooks = object_at(spec, "hooks", "hooks")?;
    let field = format!("hooks.{stage}");
    let list = hooks.entry(stage.as_str()).or_insert_with(|| json!([]));
    if list.is_null() {
        *list = json!([]);
    }
    if !list.is_array() {
        return Err(FieldError::kind(&field, list, "an array of hooks"));
    }
    let list = list.as_array_mut().expect("checked");
    let ours: Vec<usize> = (0..list.len())
        .filter(|i| is_our_hook(&list[*i], ctx))
        .collect();
    if !want {
        if ours.is_empty() {
            return Ok(None);
        }
        for i in ours.iter().rev() {
            list.remove(*i);
        }
        return Ok(Some(format!("{field}: ours removed (done by the caller)")));
    }
    let entry = hook_entry(stage, ctx);
    if ours.len() == 1 && list[ours[0]] == entry {
        return Ok(None);
    }
    for i in ours.iter().rev() {
        list.remove(*i);
    }
    list.push(entry);
    Ok(Some(format!(
        "{field}: {} {}",
        ctx.hook_path.display(),
        stage
    )))
}

pub fn add_create_runtime_hook(
    spec: &mut Value,
    ctx: &ModifyContext,
) -> Result<Option<String>, FieldError> {
    ensure_hook(spec, ctx, HookStage::CreateRuntime, ctx.create_runtime_hook)
}

pub fn add_poststop_hook(
    spec: &mut Value,
    ctx: &ModifyContext,
) -> Result<Option<String>, FieldError> {
    ensure_hook(spec, ctx, HookStage::Poststop, true)
}
