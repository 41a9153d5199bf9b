//! docker: our runtime merged into `/etc/docker/daemon.json`, every other key
//! and runtime kept, the user's layout kept (our entry is inserted as text and
//! the result checked to parse to exactly the old document plus our entry).

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::files::{backup_of, read_optional};
use super::{under_root, Edit, InstallPlan, RUNTIME_NAME};
use crate::CliError;

/// dockerd's configuration file (as dockerd sees it).
pub(crate) const DAEMON_JSON: &str = "/etc/docker/daemon.json";
/// The runc-compatible wrapper dockerd runs as our runtime.
pub(crate) const RUNTIME_BINARY: &str = "throttlewatch-runtime";

fn usage(path: &Path, problem: impl std::fmt::Display) -> CliError {
    CliError::usage(format!("{}: {problem}", path.display()))
}

const ACCEPTED: &str =
    "accepted: a JSON object whose \"runtimes\", if present, is an object of objects";

/// daemon.json parsed and checked for the shape we edit.
fn parse(path: &Path, text: &str) -> Result<Value, CliError> {
    if text.trim().is_empty() {
        return Ok(serde_json::json!({}));
    }
    let doc: Value = serde_json::from_str(text)
        .map_err(|e| usage(path, format!("not JSON ({e}); {ACCEPTED}")))?;
    let runtimes_ok = match doc.get("runtimes") {
        None => true,
        Some(Value::Object(m)) => m.values().all(Value::is_object),
        Some(_) => false,
    };
    if !doc.is_object() || !runtimes_ok {
        return Err(usage(path, format!("unexpected shape; {ACCEPTED}")));
    }
    Ok(doc)
}

fn ours(runtime_path: &str) -> Value {
    serde_json::json!({ "path": runtime_path })
}

/// `old` (daemon.json's text, "" when missing) with our runtime added.
/// Deterministic: uninstall recognises an unchanged file by recomputing it.
pub(crate) fn add_runtime(old: &str, runtime_path: &str) -> Option<String> {
    let mut doc: Value = if old.trim().is_empty() {
        serde_json::json!({})
    } else {
        serde_json::from_str(old).ok()?
    };
    doc.as_object_mut()?
        .entry("runtimes")
        .or_insert_with(|| serde_json::json!({}))
        .as_object_mut()?
        .insert(RUNTIME_NAME.into(), ours(runtime_path));
    let entry = format!(
        "\"{RUNTIME_NAME}\": {{ \"path\": {} }}",
        Value::String(runtime_path.into())
    );
    Some(
        insert_entry(old, &entry)
            .filter(|t| serde_json::from_str::<Value>(t).ok().as_ref() == Some(&doc))
            .unwrap_or_else(|| serde_json::to_string_pretty(&doc).expect("json") + "\n"),
    )
}

/// The indentation of the first line after byte `at` that has text on it.
fn indent_after(text: &str, at: usize) -> Option<&str> {
    let line = text[at..].lines().skip(1).find(|l| !l.trim().is_empty())?;
    Some(&line[..line.len() - line.trim_start().len()])
}

/// Add our runtime to daemon.json's text, keeping the user's layout and indentation.
fn insert_entry(old: &str, entry: &str) -> Option<String> {
    if old.trim().is_empty() {
        return Some(format!("{{\n  \"runtimes\": {{\n    {entry}\n  }}\n}}\n"));
    }
    let top = old.find('{')?;
    let empty_top = old[top + 1..].trim_start().starts_with('}');
    let key_indent = if empty_top {
        "  "
    } else {
        indent_after(old, top).unwrap_or("  ")
    };
    let (at, text) = match old.find("\"runtimes\"") {
        Some(k) => {
            let brace = k + old[k..].find('{')?;
            if old[brace + 1..].trim_start().starts_with('}') {
                let close = brace + 1 + old[brace + 1..].find('}')?;
                let ins = format!("\n{key_indent}{key_indent}{entry}\n{key_indent}");
                return Some(format!("{}{ins}{}", &old[..brace + 1], &old[close..]));
            }
            let indent = indent_after(old, brace).unwrap_or("    ");
            (brace + 1, format!("\n{indent}{entry},"))
        }
        None => (
            top + 1,
            format!(
                "\n{key_indent}\"runtimes\": {{\n{key_indent}{key_indent}{entry}\n{key_indent}}}{}",
                if empty_top { "\n" } else { "," }
            ),
        ),
    };
    Some(format!("{}{}{}", &old[..at], text, &old[at..]))
}

/// Byte ranges of `text` whose removal may take out our entry as install wrote it.
fn cut_candidates(text: &str, entry: &str) -> Vec<(usize, usize)> {
    let Some(at) = text.find(entry) else {
        return vec![];
    };
    let end = at + entry.len();
    let line_start = text[..at].trim_end_matches([' ', '\t']).len();
    let line_start = text[..line_start]
        .strip_suffix('\n')
        .map_or(line_start, str::len);
    let mut out = Vec::new();
    if text[end..].starts_with(',') {
        out.push((line_start, end + 1));
    }
    // The only entry of `"runtimes": { … }`: back to `{}`.
    let open = text[..at].trim_end().len();
    let close = end + (text[end..].len() - text[end..].trim_start().len());
    if text[..open].ends_with('{') && text[close..].starts_with('}') {
        out.push((open, close));
        // … and a `"runtimes"` key install added: the key, its object and one comma.
        if let Some(k) = text[..open].rfind("\"runtimes\"") {
            let k_start = text[..k].trim_end_matches([' ', '\t']).len();
            let k_start = text[..k_start].strip_suffix('\n').map_or(k_start, str::len);
            let after = close + 1;
            if text[after..].starts_with(',') {
                out.push((k_start, after + 1));
            }
            let before_key = text[..k_start].trim_end();
            let rest = text[after..].trim_start();
            if before_key.ends_with('{') && rest.starts_with('}') {
                out.push((before_key.len(), after + (text[after..].len() - rest.len())));
            }
            if before_key.ends_with(',') && rest.starts_with('}') {
                out.push((before_key.len() - 1, after));
            }
        }
    }
    out.push((at, end));
    out
}

/// `text` without our runtime (and without a "runtimes" left empty that the
/// original lacked). The text install inserted is cut out when that parses
/// to the expected document; otherwise the document is written out again.
pub(crate) fn remove_runtime(text: &str, original: Option<&str>) -> Option<String> {
    let mut doc: Value = serde_json::from_str(text).ok()?;
    let obj = doc.as_object_mut()?;
    let runtimes = obj.get_mut("runtimes")?.as_object_mut()?;
    let removed = runtimes.remove(RUNTIME_NAME)?;
    let orig_has_runtimes = original
        .and_then(|o| serde_json::from_str::<Value>(o).ok())
        .is_some_and(|o| o.get("runtimes").is_some());
    if runtimes.is_empty() && original.is_some() && !orig_has_runtimes {
        obj.remove("runtimes");
    }
    let entry = removed
        .get("path")
        .and_then(Value::as_str)
        .map(|p| {
            format!(
                "\"{RUNTIME_NAME}\": {{ \"path\": {} }}",
                Value::String(p.into())
            )
        })
        .unwrap_or_default();
    let cut = cut_candidates(text, &entry)
        .into_iter()
        .filter(|_| !entry.is_empty())
        .map(|(from, to)| format!("{}{}", &text[..from], &text[to..]))
        .find(|t| serde_json::from_str::<Value>(t).ok().as_ref() == Some(&doc));
    Some(cut.unwrap_or_else(|| serde_json::to_string_pretty(&doc).expect("json") + "\n"))
}

fn runtime_path(bin_dir: &Path) -> String {
    bin_dir.join(RUNTIME_BINARY).to_string_lossy().into_owned()
}

const THEN: &str = "reload dockerd (SIGHUP or `systemctl reload docker`), then `docker run --runtime throttlewatch …`";

/// What `throttlewatch install docker` does under `root`.
pub(crate) fn install_plan(root: &Path, bin_dir: &Path) -> Result<InstallPlan, CliError> {
    let target: PathBuf = under_root(root, Path::new(DAEMON_JSON));
    let old = read_optional(&target)?;
    let doc = parse(&target, old.as_deref().unwrap_or(""))?;
    let path = runtime_path(bin_dir);
    let mut plan = InstallPlan {
        then: THEN.into(),
        ..InstallPlan::default()
    };
    if let Some(existing) = doc.get("runtimes").and_then(|r| r.get(RUNTIME_NAME)) {
        if *existing != ours(&path) {
            return Err(usage(
                &target,
                format!(
                    "runtimes.{RUNTIME_NAME} is already {existing}, not {}; refusing to change it; \
                     accepted: no runtime {RUNTIME_NAME}, or this one (see --bin-dir)",
                    ours(&path)
                ),
            ));
        }
        plan.nothing_to_do = format!(
            "already installed: {} has the runtime {RUNTIME_NAME}",
            target.display()
        );
        return Ok(plan);
    }
    let after = add_runtime(old.as_deref().unwrap_or(""), &path)
        .ok_or_else(|| usage(&target, format!("unexpected shape; {ACCEPTED}")))?;
    plan.edits.push(Edit::Write {
        path: target,
        backup: old.is_some(),
        before: old,
        after,
    });
    Ok(plan)
}

/// What `throttlewatch uninstall docker` does under `root`.
pub(crate) fn uninstall_plan(root: &Path) -> Result<InstallPlan, CliError> {
    let target: PathBuf = under_root(root, Path::new(DAEMON_JSON));
    let mut plan = InstallPlan {
        then: "reload dockerd (SIGHUP or `systemctl reload docker`); when daemon.json is left without \
               a \"runtimes\" key, dockerd keeps listing the runtime until it restarts (a reload only \
               replaces the keys the file has), but nothing uses it unless asked for by name"
            .into(),
        nothing_to_do: format!(
            "not installed: {} has no runtime {RUNTIME_NAME}",
            target.display()
        ),
        ..InstallPlan::default()
    };
    let Some(text) = read_optional(&target)? else {
        return Ok(plan);
    };
    let doc = parse(&target, &text)?;
    let backup = backup_of(&target);
    let original = read_optional(&backup)?;
    let Some(ours_now) = doc.get("runtimes").and_then(|r| r.get(RUNTIME_NAME)) else {
        if original.is_some() {
            plan.notes.push(format!(
                "{}: its backup {} is left alone",
                target.display(),
                backup.display()
            ));
        }
        return Ok(plan);
    };
    let installed_path = ours_now.get("path").and_then(Value::as_str).unwrap_or("");
    let from = |orig: &str| add_runtime(orig, installed_path).as_deref() == Some(text.as_str());
    match &original {
        Some(orig) if from(orig) => plan.edits.push(Edit::Restore {
            path: target,
            current: Some(text),
            original: orig.clone(),
        }),
        None if from("") => plan.edits.push(Edit::Delete {
            path: target,
            before: text,
        }),
        orig => {
            let after = remove_runtime(&text, orig.as_deref())
                .ok_or_else(|| usage(&target, format!("unexpected shape; {ACCEPTED}")))?;
            plan.notes.push(format!(
                "{}: changed since install{}; removing only the runtime {RUNTIME_NAME}",
                target.display(),
                if orig.is_some() {
                    format!(" (the pre-install copy stays at {})", backup.display())
                } else {
                    String::new()
                }
            ));
            plan.edits.push(Edit::Write {
                path: target,
                before: Some(text),
                after,
                backup: false,
            });
        }
    }
    Ok(plan)
}

#[cfg(test)]
#[path = "docker_tests.rs"]
mod tests;
