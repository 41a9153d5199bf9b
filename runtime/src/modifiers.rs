//! Idempotent edits of an OCI bundle's config.json, applied on `create` only.
//!
//! config.json is edited as a `serde_json::Value`, so fields this crate does
//! not know survive; it is read without following symlinks and written back
//! through a temporary file renamed over it, with the original mode and owner.
//! Each [`SpecModifier`] is a small function that changes nothing when its
//! edit is already there.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use serde_json::{json, Map, Value};
use throttlewatch_core::config::{Config, ENV_CONFIG};
use throttlewatch_core::protocol::ANNOTATION_CREATED_NS;
use throttlewatch_hook::cli::Stage;

use crate::spec_cpuset;

pub const CONFIG_JSON: &str = "config.json";
pub const HOOK_BINARY: &str = "throttlewatch-hook";

/// What a modification did, for logs and errors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Modified {
    pub changes: Vec<String>,
}

/// What the modifiers need beyond the configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ModifyContext {
    /// The hook executable written into the spec.
    pub hook_path: PathBuf,
    /// Passed to the hook as `--config`, when known.
    pub config_path: Option<PathBuf>,
    pub cfg: Config,
}

/// One edit: returns a description when it changed the spec.
pub type SpecModifier = fn(&mut Value, &ModifyContext) -> anyhow::Result<Option<String>>;

/// The modifiers, in order.
pub const MODIFIERS: [(&str, SpecModifier); 4] = [
    ("createRuntime hook", add_create_runtime_hook),
    ("poststop hook", add_poststop_hook),
    ("cpuset resources", spec_cpuset::cpuset_resources),
    ("create time", stamp_create_time),
];

/// Load `<bundle>/config.json`, apply the modifiers, write it back
/// atomically (temp file + rename, unknown fields preserved).
/// The hook is the `throttlewatch-hook` next to the current executable (else
/// in PATH); its `--config` is `$THROTTLEWATCH_CONFIG` when set.
pub fn modify_bundle(bundle: &Path, cfg: &Config) -> anyhow::Result<Modified> {
    let ctx = ModifyContext {
        hook_path: default_hook_path()?,
        config_path: std::env::var_os(ENV_CONFIG)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from),
        cfg: cfg.clone(),
    };
    modify_bundle_with(bundle, &ctx)
}

pub fn modify_bundle_with(bundle: &Path, ctx: &ModifyContext) -> anyhow::Result<Modified> {
    let path = bundle.join(CONFIG_JSON);
    let (mut spec, file) = read_spec(&path)?;
    let changes = apply_modifiers(&mut spec, ctx).with_context(|| path.display().to_string())?;
    if !changes.is_empty() {
        write_spec(&path, &spec, &file)?;
    }
    Ok(Modified { changes })
}

pub fn apply_modifiers(spec: &mut Value, ctx: &ModifyContext) -> anyhow::Result<Vec<String>> {
    if !spec.is_object() {
        bail!(
            "expected a JSON object (an OCI runtime spec), got {}",
            kind(spec)
        );
    }
    if is_pod_sandbox(spec) {
        return Ok(vec![]); // the pause container stays as the CRI made it
    }
    let mut changes = vec![];
    for (name, m) in MODIFIERS {
        if let Some(c) = m(spec, ctx).with_context(|| format!("modifier {name:?}"))? {
            changes.push(c);
        }
    }
    Ok(changes)
}

/// A pod's sandbox (pause) container, by its CRI annotations: it runs no
/// workload, so it gets no hooks (no QoS, no log).
pub fn is_pod_sandbox(spec: &Value) -> bool {
    let ann = spec.get("annotations");
    throttlewatch_hook::spec::is_pod_sandbox(|k| ann?.get(k)?.as_str())
}

/// `throttlewatch-hook` next to this executable, else in PATH.
pub fn default_hook_path() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("current_exe")?;
    let beside = exe.parent().map(|d| d.join(HOOK_BINARY));
    if let Some(p) = beside.as_ref().filter(|p| p.is_file()) {
        return Ok(p.clone());
    }
    throttlewatch_hook::agent::find_in_path(HOOK_BINARY).ok_or_else(|| {
        anyhow!(
            "{HOOK_BINARY} not found next to {} nor in PATH",
            exe.display()
        )
    })
}

pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `spec[key]` as an object, created when absent; an error naming the field otherwise.
pub fn object_at<'a>(
    parent: &'a mut Value,
    key: &str,
    field: &str,
) -> anyhow::Result<&'a mut Map<String, Value>> {
    let obj = parent
        .as_object_mut()
        .ok_or_else(|| anyhow!("\"{field}\" has a non-object parent"))?;
    let v = obj.entry(key).or_insert_with(|| json!({}));
    if v.is_null() {
        *v = json!({});
    }
    let k = kind(v);
    v.as_object_mut()
        .ok_or_else(|| anyhow!("\"{field}\" is {k}; expected an object"))
}

/// The object at a path of keys (`["linux", "resources", "cpu"]`), created
/// level by level when absent.
pub fn object_path<'a>(
    spec: &'a mut Value,
    keys: &[&str],
) -> anyhow::Result<&'a mut Map<String, Value>> {
    let mut cur = spec;
    for (i, k) in keys.iter().enumerate() {
        let field = keys[..=i].join(".");
        object_at(cur, k, &field)?;
        cur = cur
            .get_mut(*k)
            .ok_or_else(|| anyhow!("\"{field}\" vanished"))?;
    }
    cur.as_object_mut()
        .ok_or_else(|| anyhow!("\"{}\" is not an object", keys.join(".")))
}

fn hook_entry(stage: Stage, ctx: &ModifyContext) -> Value {
    let mut args = vec![json!(HOOK_BINARY), json!(stage.as_str())];
    if let Some(c) = &ctx.config_path {
        args.push(json!("--config"));
        args.push(json!(c.to_string_lossy()));
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

/// Exactly one entry of ours in `hooks.<stage>`, with the current arguments.
fn ensure_hook(
    spec: &mut Value,
    ctx: &ModifyContext,
    stage: Stage,
) -> anyhow::Result<Option<String>> {
    let hooks = object_at(spec, "hooks", "hooks")?;
    let field = format!("hooks.{stage}");
    let list = hooks.entry(stage.as_str()).or_insert_with(|| json!([]));
    if list.is_null() {
        *list = json!([]);
    }
    let k = kind(list);
    let list = list
        .as_array_mut()
        .ok_or_else(|| anyhow!("\"{field}\" is {k}; expected an array of hooks"))?;
    let want = hook_entry(stage, ctx);
    let ours: Vec<usize> = (0..list.len())
        .filter(|i| is_our_hook(&list[*i], ctx))
        .collect();
    if ours.len() == 1 && list[ours[0]] == want {
        return Ok(None);
    }
    for i in ours.iter().rev() {
        list.remove(*i);
    }
    list.push(want);
    Ok(Some(format!(
        "{field}: {} {}",
        ctx.hook_path.display(),
        stage
    )))
}

pub fn add_create_runtime_hook(
    spec: &mut Value,
    ctx: &ModifyContext,
) -> anyhow::Result<Option<String>> {
    ensure_hook(spec, ctx, Stage::CreateRuntime)
}

pub fn add_poststop_hook(spec: &mut Value, ctx: &ModifyContext) -> anyhow::Result<Option<String>> {
    ensure_hook(spec, ctx, Stage::Poststop)
}

/// The runtime's create time for the cold-start timeline, as the
/// `throttlewatch.io/created-unix-ns` annotation. A value already there
/// (an earlier pass over the same bundle) is kept.
pub fn stamp_create_time(spec: &mut Value, _ctx: &ModifyContext) -> anyhow::Result<Option<String>> {
    let ann = object_at(spec, "annotations", "annotations")?;
    if ann
        .get(ANNOTATION_CREATED_NS)
        .and_then(Value::as_str)
        .is_some_and(|v| v.parse::<u64>().is_ok())
    {
        return Ok(None);
    }
    let now = throttlewatch_core::logfmt::now_unix_ns().to_string();
    ann.insert(ANNOTATION_CREATED_NS.into(), json!(now));
    Ok(Some(format!("annotations.{ANNOTATION_CREATED_NS}: {now}")))
}

/// Read without following a symlink; keep the open file for its mode and owner.
fn read_spec(path: &Path) -> anyhow::Result<(Value, File)> {
    let mut f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => anyhow!("{}: is a symlink; refused", path.display()),
            _ => anyhow!("{}: {e}", path.display()),
        })?;
    let mut buf = Vec::new();
    f.read_to_end(&mut buf)
        .with_context(|| path.display().to_string())?;
    let v = serde_json::from_slice(&buf)
        .map_err(|e| anyhow!("{}: not valid JSON: {e}", path.display()))?;
    Ok((v, f))
}

fn write_spec(path: &Path, spec: &Value, orig: &File) -> anyhow::Result<()> {
    let meta = orig
        .metadata()
        .with_context(|| path.display().to_string())?;
    let dir = path
        .parent()
        .ok_or_else(|| anyhow!("{} has no directory", path.display()))?;
    let tmp = dir.join(format!(
        ".{CONFIG_JSON}.throttlewatch-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&tmp);
    let res = (|| -> std::io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(meta.mode() & 0o7777)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        f.write_all(&serde_json::to_vec(spec)?)?;
        f.set_permissions(std::fs::Permissions::from_mode(meta.mode() & 0o7777))?;
        std::os::unix::fs::fchown(&f, Some(meta.uid()), Some(meta.gid()))?;
        // No fsync: the bundle lives as long as the container and the
        // runtime that made it writes it without one; rename is atomic.
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = res {
        let _ = std::fs::remove_file(&tmp);
        bail!("cannot write {}: {e}", path.display());
    }
    Ok(())
}

#[cfg(test)]
#[path = "modifiers_tests.rs"]
mod tests;
