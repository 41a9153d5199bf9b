//! containerd: the runtime `throttlewatch` added, in place, to the CRI table
//! that containerd actually uses.
//!
//! containerd 1.x merges imported files by replacing each table directly
//! below `plugins` as a whole (containerd issue 5837): a drop-in that defines
//! `plugins."io.containerd.grpc.v1.cri".containerd.runtimes.throttlewatch`
//! replaces the main file's whole CRI table — runc, `SystemdCgroup`, the
//! sandbox image — and the CRI plugin then fails to load
//! (`default_runtime_name = "runc"` resolves to nothing). So we never add a
//! CRI table of our own: we follow `imports` as containerd does, find the
//! last file that defines the CRI table (the one containerd uses), and add
//! our runtime to it with a format-preserving editor (`toml_edit`), after a
//! backup. Later edits of that file keep working; nothing goes stale.
//! docs/containerd.md has the comparison with a drop-in that copies runtimes.

mod chain;
mod edit;
mod names;

use std::path::Path;

use super::files::{backup_of, read_optional};
use super::{Edit, InstallPlan, RUNTIME_NAME};
use crate::CliError;
#[cfg(test)]
use chain::glob_match;
pub(crate) use chain::CriTable;
use chain::{load_chain, target, usage};
pub(crate) use edit::{add_runtime, remove_runtime};
use edit::{is_legacy_dropin, is_ours, lookup, runtimes_path};
use names::{ANNOTATIONS, RUNTIME_TYPE};

const THEN: &str = "restart containerd (`systemctl restart containerd`) to load the change; \
                    pods select the runtime with `runtimeClassName: throttlewatch` (configs/runtimeclass.yaml)";

/// What `throttlewatch install containerd` does under `root`.
pub(crate) fn install_plan(root: &Path) -> Result<InstallPlan, CliError> {
    let chain = load_chain(root)?;
    let target = target(&chain)?;
    let plugin = target.plugin;
    let mut plan = InstallPlan {
        then: THEN.into(),
        ..InstallPlan::default()
    };
    let mut active = Vec::new();
    for (i, f) in chain.iter().enumerate() {
        if i > 0 && is_legacy_dropin(&f.doc, plugin) {
            plan.notes.push(format!(
                "{}: the drop-in of an older throttlewatch install; it replaces containerd's whole CRI table \
                 (runc included), so it is moved aside",
                f.host.display()
            ));
            plan.edits.push(Edit::MoveAside {
                path: f.host.clone(),
                before: f.text.clone().unwrap_or_default(),
            });
        } else {
            active.push(i);
        }
    }
    let mut with_cri = Vec::new();
    for &i in &active {
        if lookup(&chain[i].doc, &["plugins", plugin])
            .map_err(|e| usage(&chain[i].host, e))?
            .is_some()
        {
            with_cri.push(i);
        }
    }
    let owner = with_cri.last().copied();
    let file = &chain[owner.unwrap_or(0)];
    for &i in &with_cri[..with_cri.len().saturating_sub(1)] {
        plan.notes.push(format!(
            "{}: its [plugins.\"{plugin}\"] table is not the one containerd uses ({} replaces it); left as it is",
            chain[i].host.display(),
            file.host.display()
        ));
    }
    match owner {
        Some(0) => {}
        Some(_) => plan.notes.push(format!(
            "{}: holds the CRI table containerd uses (an imported file's [plugins.\"{plugin}\"] replaces the \
             whole table of the files before it), so the runtime goes there",
            file.host.display()
        )),
        None => plan.notes.push(format!(
            "{}: no [plugins.\"{plugin}\"] table in the configuration; adding one with containerd's default runc \
             and {RUNTIME_NAME}",
            file.host.display()
        )),
    }
    let existing = lookup(&file.doc, &runtimes_path(plugin))
        .map_err(|e| usage(&file.host, e))?
        .and_then(|t| t.get(RUNTIME_NAME));
    if let Some(item) = existing {
        if !is_ours(item) {
            return Err(usage(
                &file.host,
                format!(
                    "a runtime {RUNTIME_NAME} is already configured and differs from ours; refusing to change it; \
                     accepted: runtime_type = \"{RUNTIME_TYPE}\" with pod_annotations and container_annotations \
                     [\"{ANNOTATIONS}\"], or no runtime {RUNTIME_NAME}"
                ),
            ));
        }
        plan.nothing_to_do = format!(
            "already installed: {} has the runtime {RUNTIME_NAME} in the CRI table containerd uses",
            file.host.display()
        );
        plan.then = "restart containerd to stop using the moved-aside drop-in".into();
        return Ok(plan);
    }
    let before = file.text.clone();
    let after =
        add_runtime(before.as_deref().unwrap_or(""), target).map_err(|e| usage(&file.host, e))?;
    plan.edits.push(Edit::Write {
        path: file.host.clone(),
        before,
        after,
        backup: file.text.is_some(),
    });
    Ok(plan)
}

/// What `throttlewatch uninstall containerd` does under `root`.
pub(crate) fn uninstall_plan(root: &Path) -> Result<InstallPlan, CliError> {
    let chain = load_chain(root)?;
    let target = target(&chain)?;
    let plugin = target.plugin;
    let mut plan = InstallPlan {
        then: "restart containerd (`systemctl restart containerd`) to load the change".into(),
        nothing_to_do: format!(
            "not installed: no runtime {RUNTIME_NAME} in the containerd configuration"
        ),
        ..InstallPlan::default()
    };
    for f in &chain {
        let text = f.text.as_deref().unwrap_or("");
        let has_ours = lookup(&f.doc, &runtimes_path(plugin))
            .map_err(|e| usage(&f.host, e))?
            .is_some_and(|t| t.contains_key(RUNTIME_NAME));
        let backup = backup_of(&f.host);
        let original = read_optional(&backup)?;
        let installed_from = |orig: &str| {
            [false, true].iter().any(|&add_version| {
                add_runtime(
                    orig,
                    CriTable {
                        plugin,
                        add_version,
                    },
                )
                .is_ok_and(|t| t == text)
            })
        };
        match (&original, has_ours) {
            (Some(orig), true) if installed_from(orig) => plan.edits.push(Edit::Restore {
                path: f.host.clone(),
                current: f.text.clone(),
                original: orig.clone(),
            }),
            (orig, true) if orig.is_none() && f.text.is_some() && installed_from("") => {
                plan.edits.push(Edit::Delete {
                    path: f.host.clone(),
                    before: text.to_string(),
                })
            }
            (orig, true) => {
                let after = remove_runtime(text, plugin, orig.as_deref())
                    .map_err(|e| usage(&f.host, e))?
                    .expect("has our runtime");
                plan.notes.push(match orig {
                    Some(_) => format!(
                        "{}: changed since install; removing only the {RUNTIME_NAME} entries \
                         (the pre-install copy stays at {})",
                        f.host.display(),
                        backup.display()
                    ),
                    None => format!(
                        "{}: no pre-install backup (added by hand, or the backup was removed); \
                         removing only the {RUNTIME_NAME} entries",
                        f.host.display()
                    ),
                });
                plan.edits.push(Edit::Write {
                    path: f.host.clone(),
                    before: f.text.clone(),
                    after,
                    backup: false,
                });
            }
            (Some(_), false) => plan.notes.push(format!(
                "{}: has no runtime {RUNTIME_NAME}; its backup {} is left alone",
                f.host.display(),
                backup.display()
            )),
            (None, false) => {}
        }
    }
    Ok(plan)
}

#[cfg(test)]
mod tests;
