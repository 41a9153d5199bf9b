//! The TOML edits: our runtime added to (and taken out of) a file's CRI
//! runtimes table with `toml_edit`, so comments, order and layout stay.

use toml_edit::{value, Array, DocumentMut, Item, Table};

use super::chain::CriTable;
use super::names::{ANNOTATIONS, DEFAULT_RUNTIME, RUNC_TYPE, RUNTIME_TYPE};
use crate::install::RUNTIME_NAME;

/// Why a containerd configuration cannot take (or give back) our runtime:
/// each names the table or value and what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum EditError {
    #[error("not TOML: {0}")]
    NotToml(String),
    #[error("{path} is {found}, not a table; accepted: [{path}] as a table section")]
    NotATable { path: String, found: &'static str },
    #[error("{0} already has a runtime {RUNTIME_NAME}")]
    AlreadyThere(String),
    #[error("default_runtime_name = {default:?} names no runtime in {path} (it has {names:?}): containerd's CRI plugin does not load like this; accepted: a default_runtime_name that is one of the runtimes")]
    NoDefault {
        default: String,
        path: String,
        names: Vec<String>,
    },
    #[error("our runtime is missing after the edit")]
    MissingAfterEdit,
    #[error("internal error: the edit would change more than the runtime throttlewatch; nothing written")]
    ChangesMore,
}

fn not_toml(e: impl std::fmt::Display) -> EditError {
    EditError::NotToml(e.to_string())
}

pub(super) fn runtimes_path(plugin: &str) -> [&str; 4] {
    ["plugins", plugin, "containerd", "runtimes"]
}

/// The table at `keys` (`Ok(None)`: absent). Anything but a `[table]` on the way is an unexpected shape.
pub(super) fn lookup<'a>(
    doc: &'a DocumentMut,
    keys: &[&str],
) -> Result<Option<&'a Table>, EditError> {
    let mut t = doc.as_table();
    for (n, k) in keys.iter().enumerate() {
        match t.get(k) {
            None => return Ok(None),
            Some(Item::Table(next)) => t = next,
            Some(other) => {
                return Err(EditError::NotATable {
                    path: dotted(&keys[..=n]),
                    found: other.type_name(),
                })
            }
        }
    }
    Ok(Some(t))
}

fn dotted(keys: &[&str]) -> String {
    keys.iter()
        .map(|k| {
            if k.contains('.') {
                format!("\"{k}\"")
            } else {
                k.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// The table at `keys`, created (implicit: no empty headers) where missing.
fn lookup_or_create<'a>(
    doc: &'a mut DocumentMut,
    keys: &[&str],
) -> Result<&'a mut Table, EditError> {
    let mut t = doc.as_table_mut();
    for (n, k) in keys.iter().enumerate() {
        let item = t.entry(k).or_insert_with(|| {
            let mut new = Table::new();
            new.set_implicit(true);
            Item::Table(new)
        });
        let type_name = item.type_name();
        t = item.as_table_mut().ok_or_else(|| EditError::NotATable {
            path: dotted(&keys[..=n]),
            found: type_name,
        })?;
    }
    Ok(t)
}

/// Our runtime entry, as `[…runtimes.throttlewatch]` in the file.
fn our_runtime(indent: &str) -> Table {
    let mut t = Table::new();
    t.decor_mut().set_prefix(format!(
        "\n{indent}# Added by `throttlewatch install containerd`; `throttlewatch uninstall containerd` removes it.\n{indent}"
    ));
    t.insert("runtime_type", value(RUNTIME_TYPE));
    t.insert("pod_annotations", value(Array::from_iter([ANNOTATIONS])));
    t.insert(
        "container_annotations",
        value(Array::from_iter([ANNOTATIONS])),
    );
    indent_keys(&mut t, indent);
    t
}

/// containerd's default `runc`, written out because a runtimes table of our
/// own replaces containerd's default map.
fn default_runc(indent: &str) -> Table {
    let mut t = Table::new();
    t.decor_mut().set_prefix(format!(
        "\n{indent}# containerd's default runtime, kept: a runtimes table replaces containerd's default one.\n{indent}"
    ));
    t.insert("runtime_type", value(RUNC_TYPE));
    indent_keys(&mut t, indent);
    t
}

fn indent_keys(t: &mut Table, indent: &str) {
    let keys: Vec<String> = t.iter().map(|(k, _)| k.to_string()).collect();
    for k in keys {
        if let Some(mut key) = t.key_mut(&k) {
            key.leaf_decor_mut().set_prefix(format!("{indent}  "));
        }
    }
}

/// The indentation of the runtimes' headers already in the file ("" when none).
fn sibling_indent(runtimes: &Table) -> String {
    runtimes
        .iter()
        .find_map(|(_, item)| item.as_table())
        .and_then(|t| {
            t.decor()
                .prefix()
                .and_then(|p| p.as_str())
                .map(str::to_string)
        })
        .map(|p| p.rsplit('\n').next().unwrap_or("").to_string())
        .filter(|s| s.chars().all(|c| c == ' ' || c == '\t'))
        .unwrap_or_default()
}

pub(super) fn is_ours(item: &Item) -> bool {
    let has = |k: &str| {
        item.get(k)
            .and_then(Item::as_array)
            .is_some_and(|a| a.iter().any(|v| v.as_str() == Some(ANNOTATIONS)))
    };
    item.get("runtime_type").and_then(Item::as_str) == Some(RUNTIME_TYPE)
        && has("pod_annotations")
        && has("container_annotations")
}

/// A drop-in of an older throttlewatch install: a CRI table with nothing but our runtime.
pub(super) fn is_legacy_dropin(doc: &DocumentMut, plugin: &str) -> bool {
    let only = |t: &Table, k: &str| t.len() == 1 && t.contains_key(k);
    let top_ok = doc.iter().all(|(k, _)| k == "version" || k == "plugins");
    top_ok
        && doc
            .get("plugins")
            .and_then(Item::as_table)
            .is_some_and(|p| only(p, plugin))
        && lookup(doc, &["plugins", plugin])
            .ok()
            .flatten()
            .is_some_and(|t| only(t, "containerd"))
        && lookup(doc, &["plugins", plugin, "containerd"])
            .ok()
            .flatten()
            .is_some_and(|t| only(t, "runtimes"))
        && lookup(doc, &runtimes_path(plugin))
            .ok()
            .flatten()
            .is_some_and(|t| only(t, RUNTIME_NAME))
}

/// `text` with our runtime added to its CRI table (and `runc`, when the file
/// had no runtimes table). Deterministic: uninstall recognises an unchanged
/// file by recomputing this from the backup.
pub(crate) fn add_runtime(text: &str, target: CriTable) -> Result<String, EditError> {
    let plugin = target.plugin;
    let mut doc: DocumentMut = text.parse().map_err(not_toml)?;
    if target.add_version {
        doc.insert("version", value(2));
    }
    let had_runtimes = lookup(&doc, &runtimes_path(plugin))?.is_some();
    let runtimes = lookup_or_create(&mut doc, &runtimes_path(plugin))?;
    if runtimes.contains_key(RUNTIME_NAME) {
        return Err(EditError::AlreadyThere(dotted(&runtimes_path(plugin))));
    }
    let indent = sibling_indent(runtimes);
    if !had_runtimes {
        runtimes.insert(DEFAULT_RUNTIME, Item::Table(default_runc(&indent)));
    }
    runtimes.insert(RUNTIME_NAME, Item::Table(our_runtime(&indent)));
    let names: Vec<String> = runtimes.iter().map(|(k, _)| k.to_string()).collect();
    let ctd = lookup(&doc, &["plugins", plugin, "containerd"])?.expect("created above");
    let default = ctd
        .get("default_runtime_name")
        .and_then(Item::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or(DEFAULT_RUNTIME);
    if !names.iter().any(|n| n == default) {
        return Err(EditError::NoDefault {
            default: default.to_string(),
            path: dotted(&runtimes_path(plugin)),
            names,
        });
    }
    let out = doc.to_string();
    verify(text, &out, plugin)?;
    Ok(out)
}

/// The edit added our runtime and nothing else (parsed, our entries taken out again, equal to the original).
fn verify(old: &str, new: &str, plugin: &str) -> Result<(), EditError> {
    let back = remove_runtime(new, plugin, Some(old))?.ok_or(EditError::MissingAfterEdit)?;
    let a: toml::Table = toml::from_str(old).map_err(not_toml)?;
    let b: toml::Table = toml::from_str(&back).map_err(not_toml)?;
    if a != b {
        return Err(EditError::ChangesMore);
    }
    Ok(())
}

/// `text` without our runtime (`None`: it has none). With the pre-install
/// `original`, also what install added around it and the original lacks:
/// the default `runc` it wrote (if unchanged), tables left empty, `version`.
pub(crate) fn remove_runtime(
    text: &str,
    plugin: &str,
    original: Option<&str>,
) -> Result<Option<String>, EditError> {
    let mut doc: DocumentMut = text.parse().map_err(not_toml)?;
    let orig = original
        .map(|o| o.parse::<DocumentMut>())
        .transpose()
        .map_err(not_toml)?;
    let path = runtimes_path(plugin);
    let Some(runtimes) = lookup(&doc, &path)?
        .is_some()
        .then(|| lookup_or_create(&mut doc, &path))
        .transpose()?
    else {
        return Ok(None);
    };
    if runtimes.remove(RUNTIME_NAME).is_none() {
        return Ok(None);
    }
    let Some(orig) = orig else {
        return Ok(Some(doc.to_string()));
    };
    let orig_has = |n: usize| lookup(&orig, &path[..n]).ok().flatten().is_some();
    if !orig_has(4) {
        let runc_is_ours = runtimes
            .get(DEFAULT_RUNTIME)
            .and_then(Item::as_table)
            .is_some_and(|t| {
                t.len() == 1 && t.get("runtime_type").and_then(Item::as_str) == Some(RUNC_TYPE)
            });
        if runc_is_ours {
            runtimes.remove(DEFAULT_RUNTIME);
        }
    }
    for n in (1..=4).rev() {
        if orig_has(n) {
            break;
        }
        let empty = lookup(&doc, &path[..n])?.is_some_and(Table::is_empty);
        if !empty {
            break;
        }
        let parent = lookup_or_create(&mut doc, &path[..n - 1])?;
        parent.remove(path[n - 1]);
    }
    if orig.get("version").is_none() && doc.get("version").and_then(Item::as_integer) == Some(2) {
        doc.remove("version");
    }
    Ok(Some(doc.to_string()))
}
