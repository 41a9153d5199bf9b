//! Podman and CRI-O: OCI hook files (oci-hooks(5), schema 1.0.0) in a
//! `hooks.d` directory, one per stage.
//!
//! One file per stage because a hook file has one `hook` (one argument
//! list) for all its `stages`, and our hook is told its stage by its
//! arguments: `throttlewatch-hook createRuntime` and `throttlewatch-hook
//! poststop`, as the runtime wrapper and the shim write them into config.json.
//!
//! `when` is an annotation match (`^throttlewatch\.io/` keys, any value),
//! not `always`: a hooks directory applies to every container the engine
//! starts, so the match makes throttlewatch opt-in per container — the same
//! contract as `runtimeClassName: throttlewatch` and `--runtime
//! throttlewatch` — and containers that did not ask pay no hook run and get
//! no log. `throttlewatch.io/watch=true` asks for a log without any QoS.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::crio_conf::{crio_hooks_dir, HookPaths};
use super::files::read_optional;
use super::{under_root, Edit, InstallPlan};
use crate::CliError;

/// The hook binary the files run.
pub(crate) const HOOK_BINARY: &str = "throttlewatch-hook";
/// Where Podman (as root) reads hook files with the highest precedence
/// (after /usr/share/containers/oci/hooks.d, which a same-named file here masks).
pub(crate) const PODMAN_HOOKS_DIR: &str = "/etc/containers/oci/hooks.d";
/// The annotation match of `when`: any key under our prefix, any value.
pub(crate) const WHEN_KEY: &str = r"^throttlewatch\.io/";
pub(crate) const WHEN_VALUE: &str = ".*";
/// The stages we hook, each with its own file.
pub(crate) const STAGES: [&str; 2] = ["createRuntime", "poststop"];

/// The engines that read OCI hook files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HookEngine {
    Podman,
    Crio,
}

impl HookEngine {
    pub(crate) fn name(self) -> &'static str {
        match self {
            HookEngine::Podman => "podman",
            HookEngine::Crio => "crio",
        }
    }
}

/// What the hook files say beyond the fixed parts.
#[derive(Debug, Clone)]
pub(crate) struct HookSettings {
    /// Directory of `throttlewatch-hook` on the host.
    pub bin_dir: PathBuf,
    /// `--config FILE` for the hook (the `--config` install was given).
    pub config: Option<PathBuf>,
    /// Seconds the runtime lets the hook run (`hook_timeout_s`).
    pub timeout_s: u64,
}

/// The file name for `stage`: `throttlewatch-createRuntime.json`.
pub(crate) fn file_name(stage: &str) -> String {
    format!("throttlewatch-{stage}.json")
}

/// A hook file, its keys in the order oci-hooks(5) lists them.
#[derive(serde::Serialize)]
struct HookFile<'a> {
    version: &'a str,
    hook: HookEntry,
    when: When<'a>,
    stages: [&'a str; 1],
}

#[derive(serde::Serialize)]
struct HookEntry {
    path: String,
    args: Vec<String>,
    timeout: u64,
}

#[derive(serde::Serialize)]
struct When<'a> {
    annotations: std::collections::BTreeMap<&'a str, &'a str>,
}

/// The JSON text of the hook file for `stage`.
pub(crate) fn hook_file(stage: &str, s: &HookSettings) -> String {
    let mut args = vec![HOOK_BINARY.to_string(), stage.to_string()];
    if let Some(c) = &s.config {
        args.push("--config".into());
        args.push(c.to_string_lossy().into_owned());
    }
    let doc = HookFile {
        version: "1.0.0",
        hook: HookEntry {
            path: s.bin_dir.join(HOOK_BINARY).to_string_lossy().into_owned(),
            args,
            timeout: s.timeout_s.max(1),
        },
        when: When {
            annotations: [(WHEN_KEY, WHEN_VALUE)].into(),
        },
        stages: [stage],
    };
    serde_json::to_string_pretty(&doc).expect("json") + "\n"
}

/// A hook file of ours: its `hook.path` names `throttlewatch-hook`.
fn is_ours(text: &str) -> bool {
    serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|v| v["hook"]["path"].as_str().map(str::to_string))
        .is_some_and(|p| Path::new(&p).file_name().is_some_and(|n| n == HOOK_BINARY))
}

/// The hooks directory `engine` reads (as the engine sees it), and a note
/// to say before writing there.
pub(crate) fn hooks_dir(
    engine: HookEngine,
    root: &Path,
    paths: &HookPaths,
) -> Result<(PathBuf, Option<String>), CliError> {
    match (engine, &paths.hooks_dir) {
        (HookEngine::Podman, Some(d)) => Ok((d.clone(), None)),
        (HookEngine::Podman, None) => Ok((PathBuf::from(PODMAN_HOOKS_DIR), None)),
        (HookEngine::Crio, _) => crio_hooks_dir(root, paths),
    }
}

fn then(engine: HookEngine, dir: &Path) -> String {
    match engine {
        HookEngine::Podman => format!(
            "podman reads {} at every container start (no restart): `podman run --annotation \
             throttlewatch.io/cpu-burst=20ms --cpus 1 …` (any throttlewatch.io/ annotation, e.g. \
             throttlewatch.io/watch=true) is watched",
            dir.display()
        ),
        HookEngine::Crio => format!(
            "CRI-O loads the files in {} (its hooks_dir) by itself, no restart needed, and runs \
             the hook for containers whose pod or container has a throttlewatch.io/ annotation \
             (e.g. throttlewatch.io/watch=true); the pod sandbox gets no hook",
            dir.display()
        ),
    }
}

/// What `throttlewatch install podman|crio` does under `root`.
pub(crate) fn install_plan(
    engine: HookEngine,
    root: &Path,
    s: &HookSettings,
    paths: &HookPaths,
) -> Result<InstallPlan, CliError> {
    let (dir, note) = hooks_dir(engine, root, paths)?;
    let host_dir = under_root(root, &dir);
    let mut plan = InstallPlan {
        then: then(engine, &dir),
        nothing_to_do: format!(
            "already installed: {} has the throttlewatch hook files",
            host_dir.display()
        ),
        ..InstallPlan::default()
    };
    plan.notes.extend(note);
    let hook = under_root(root, &s.bin_dir.join(HOOK_BINARY));
    if !hook.exists() {
        plan.notes.push(format!(
            "{}: not there yet; {} skips a hook file whose hook.path is missing: install the binary \
             there (or pass --bin-dir)",
            hook.display(),
            engine.name()
        ));
    }
    for stage in STAGES {
        let path = host_dir.join(file_name(stage));
        let want = hook_file(stage, s);
        let have = read_optional(&path)?;
        match &have {
            Some(t) if *t == want => continue,
            Some(t) if !is_ours(t) => {
                return Err(CliError::usage(format!(
                    "{}: exists and is not a throttlewatch hook file; refusing to replace it; accepted: \
                     no file of that name, or one whose hook.path is {HOOK_BINARY}",
                    path.display()
                )))
            }
            _ => {}
        }
        plan.edits.push(Edit::Write {
            path,
            before: have,
            after: want,
            backup: false,
        });
    }
    Ok(plan)
}

/// What `throttlewatch uninstall podman|crio` does under `root`: our two
/// files removed, nothing else.
pub(crate) fn uninstall_plan(
    engine: HookEngine,
    root: &Path,
    paths: &HookPaths,
) -> Result<InstallPlan, CliError> {
    let (dir, _) = hooks_dir(engine, root, paths)?;
    let host_dir = under_root(root, &dir);
    let mut plan = InstallPlan {
        then: format!("{} runs no throttlewatch hook from now on", engine.name()),
        nothing_to_do: format!(
            "not installed: no throttlewatch hook files in {}",
            host_dir.display()
        ),
        ..InstallPlan::default()
    };
    for stage in STAGES {
        let path = host_dir.join(file_name(stage));
        let Some(text) = read_optional(&path)? else {
            continue;
        };
        if is_ours(&text) {
            plan.edits.push(Edit::Delete { path, before: text });
        } else {
            plan.notes.push(format!(
                "{}: not a throttlewatch hook file (hook.path is not {HOOK_BINARY}); left alone",
                path.display()
            ));
        }
    }
    Ok(plan)
}

#[cfg(test)]
#[path = "hooks_tests.rs"]
mod tests;
