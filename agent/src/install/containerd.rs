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

use std::collections::{HashSet, VecDeque};
use std::path::{Path, PathBuf};

use toml_edit::{value, Array, DocumentMut, Item, Table};

use super::files::{backup_of, read_optional};
use super::{under_root, Edit, Plan, RUNTIME_NAME};
use crate::CliError;

/// containerd's main configuration file (as containerd sees it).
pub const MAIN: &str = "/etc/containerd/config.toml";
/// The CRI plugin of config version 2 (containerd 1.5–1.7).
pub const PLUGIN_V2: &str = "io.containerd.grpc.v1.cri";
/// The CRI runtime plugin of config version 3 (containerd 2.x).
pub const PLUGIN_V3: &str = "io.containerd.cri.v1.runtime";
/// Served by `containerd-shim-throttlewatch-v2` from containerd's PATH.
pub const RUNTIME_TYPE: &str = "io.containerd.throttlewatch.v2";
/// containerd's own runc shim: the `runc` we add when we create the runtimes table.
pub const RUNC_TYPE: &str = "io.containerd.runc.v2";
/// The annotations the CRI plugin passes from pods and containers to the OCI spec.
pub const ANNOTATIONS: &str = "throttlewatch.io/*";
/// containerd's `default_runtime_name` when the file does not set one.
pub const DEFAULT_RUNTIME: &str = "runc";

const ACCEPTED_VERSIONS: &str = "accepted: version = 2 (containerd 1.5-1.7, plugin \
    \"io.containerd.grpc.v1.cri\") or version = 3 (containerd 2.x, plugin \
    \"io.containerd.cri.v1.runtime\")";

/// One file of containerd's configuration, in the order containerd loads it.
struct ConfigFile {
    host: PathBuf,
    text: Option<String>,
    doc: DocumentMut,
}

fn usage(path: &Path, problem: impl std::fmt::Display) -> CliError {
    CliError::usage(format!("{}: {problem}", path.display()))
}

fn parse(path: &Path, text: &str) -> Result<DocumentMut, CliError> {
    text.parse::<DocumentMut>().map_err(|e| {
        usage(
            path,
            format!(
                "not TOML ({}); accepted: a containerd configuration file (TOML, {ACCEPTED_VERSIONS})",
                e.to_string().trim_end()
            ),
        )
    })
}

/// The files containerd reads: the main file (which may be missing), then
/// its imports breadth first, each file once, globs sorted (containerd's `LoadConfig`).
fn load_chain(root: &Path) -> Result<Vec<ConfigFile>, CliError> {
    let mut out: Vec<ConfigFile> = Vec::new();
    let mut pending = VecDeque::from([PathBuf::from(MAIN)]);
    let mut seen = HashSet::new();
    while let Some(abs) = pending.pop_front() {
        if !seen.insert(abs.clone()) {
            continue;
        }
        let host = under_root(root, &abs);
        let text = read_optional(&host)?;
        if text.is_none() && !out.is_empty() {
            return Err(usage(
                &host,
                "imported but missing (containerd would not start); accepted: imports of existing files or globs",
            ));
        }
        let doc = parse(&host, text.as_deref().unwrap_or(""))?;
        for import in imports_of(&host, &doc)? {
            pending.extend(resolve_import(root, &abs, &import));
        }
        out.push(ConfigFile { host, text, doc });
    }
    Ok(out)
}

fn imports_of(path: &Path, doc: &DocumentMut) -> Result<Vec<String>, CliError> {
    let Some(item) = doc.get("imports") else {
        return Ok(vec![]);
    };
    let bad = || {
        usage(
            path,
            format!(
                "imports = {} is not accepted; accepted: an array of paths (strings)",
                item.to_string().trim()
            ),
        )
    };
    let arr = item.as_array().ok_or_else(bad)?;
    arr.iter()
        .map(|v| v.as_str().map(str::to_string).ok_or_else(bad))
        .collect()
}

/// An import as containerd resolves it: a relative path is relative to the
/// importing file's directory; a path with `*` is a glob (sorted matches).
fn resolve_import(root: &Path, parent: &Path, import: &str) -> Vec<PathBuf> {
    let p = Path::new(import);
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        parent.parent().unwrap_or(Path::new("/")).join(p)
    };
    if !import.contains('*') {
        return vec![abs];
    }
    let mut found = vec![PathBuf::from("/")];
    for comp in abs.components().skip(1) {
        let c = comp.as_os_str().to_string_lossy();
        let mut next = Vec::new();
        for base in &found {
            if c.contains('*') || c.contains('?') {
                let mut names: Vec<String> = std::fs::read_dir(under_root(root, base))
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| glob_match(&c, n))
                    .collect();
                names.sort();
                next.extend(names.iter().map(|n| base.join(n)));
            } else {
                next.push(base.join(&*c));
            }
        }
        found = next;
    }
    found.retain(|p| under_root(root, p).is_file());
    found
}

/// filepath.Match's `*` and `?` within one path component.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    fn go(p: &[u8], s: &[u8]) -> bool {
        match p.split_first() {
            None => s.is_empty(),
            Some((b'*', rest)) => (0..=s.len()).any(|i| go(rest, &s[i..])),
            Some((b'?', rest)) => !s.is_empty() && go(rest, &s[1..]),
            Some((c, rest)) => s.first() == Some(c) && go(rest, &s[1..]),
        }
    }
    go(pattern.as_bytes(), name.as_bytes())
}

/// Which CRI plugin table to edit, from the configuration's version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    pub plugin: &'static str,
    /// No file sets `version` and none has plugins: we add `version = 2`.
    pub add_version: bool,
}

fn target(chain: &[ConfigFile]) -> Result<Target, CliError> {
    let mut version = (0, &chain[0].host);
    for f in chain {
        if let Some(item) = f.doc.get("version") {
            match item.as_integer() {
                Some(v) if v != 0 => version = (v, &f.host),
                Some(_) => {}
                None => {
                    return Err(usage(
                        &f.host,
                        format!(
                            "version = {} is not accepted; {ACCEPTED_VERSIONS}",
                            item.to_string().trim()
                        ),
                    ))
                }
            }
        }
    }
    let has_plugins = chain.iter().any(|f| {
        f.doc
            .get("plugins")
            .is_some_and(|p| !p.as_table_like().is_some_and(|t| t.is_empty()))
    });
    match version.0 {
        2 => Ok(Target { plugin: PLUGIN_V2, add_version: false }),
        3 => Ok(Target { plugin: PLUGIN_V3, add_version: false }),
        0 if !has_plugins => Ok(Target { plugin: PLUGIN_V2, add_version: true }),
        0 | 1 => Err(usage(
            version.1,
            format!(
                "containerd configuration version 1 (no `version` key, plugins named like \"cri\") is not accepted; \
                 {ACCEPTED_VERSIONS}; convert it first (containerd 1.x reads version 2 since 1.3)"
            ),
        )),
        n => Err(usage(version.1, format!("version = {n} is not accepted; {ACCEPTED_VERSIONS}"))),
    }
}

fn runtimes_path(plugin: &str) -> [&str; 4] {
    ["plugins", plugin, "containerd", "runtimes"]
}

/// The table at `keys` (`Ok(None)`: absent). Anything but a `[table]` on the way is an unexpected shape.
fn lookup<'a>(doc: &'a DocumentMut, keys: &[&str]) -> Result<Option<&'a Table>, String> {
    let mut t = doc.as_table();
    for (n, k) in keys.iter().enumerate() {
        match t.get(k) {
            None => return Ok(None),
            Some(Item::Table(next)) => t = next,
            Some(other) => {
                return Err(format!(
                    "{} is {}, not a table; accepted: [{}] as a table section",
                    dotted(&keys[..=n]),
                    other.type_name(),
                    dotted(&keys[..=n])
                ))
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
fn lookup_or_create<'a>(doc: &'a mut DocumentMut, keys: &[&str]) -> Result<&'a mut Table, String> {
    let mut t = doc.as_table_mut();
    for (n, k) in keys.iter().enumerate() {
        let item = t.entry(k).or_insert_with(|| {
            let mut new = Table::new();
            new.set_implicit(true);
            Item::Table(new)
        });
        let type_name = item.type_name();
        t = item.as_table_mut().ok_or_else(|| {
            format!(
                "{} is {type_name}, not a table; accepted: [{}] as a table section",
                dotted(&keys[..=n]),
                dotted(&keys[..=n])
            )
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

fn is_ours(item: &Item) -> bool {
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
fn is_legacy_dropin(doc: &DocumentMut, plugin: &str) -> bool {
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
pub fn add_runtime(text: &str, target: Target) -> Result<String, String> {
    let plugin = target.plugin;
    let mut doc: DocumentMut = text.parse().map_err(|e| format!("not TOML: {e}"))?;
    if target.add_version {
        doc.insert("version", value(2));
    }
    let had_runtimes = lookup(&doc, &runtimes_path(plugin))?.is_some();
    let runtimes = lookup_or_create(&mut doc, &runtimes_path(plugin))?;
    if runtimes.contains_key(RUNTIME_NAME) {
        return Err(format!(
            "{} already has a runtime {RUNTIME_NAME}",
            dotted(&runtimes_path(plugin))
        ));
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
        return Err(format!(
            "default_runtime_name = {default:?} names no runtime in {} (it has {names:?}): containerd's CRI \
             plugin does not load like this; accepted: a default_runtime_name that is one of the runtimes",
            dotted(&runtimes_path(plugin))
        ));
    }
    let out = doc.to_string();
    verify(text, &out, plugin)?;
    Ok(out)
}

/// The edit added our runtime and nothing else (parsed, our entries taken out again, equal to the original).
fn verify(old: &str, new: &str, plugin: &str) -> Result<(), String> {
    let back =
        remove_runtime(new, plugin, Some(old))?.ok_or("our runtime is missing after the edit")?;
    let a: toml::Table = toml::from_str(old).map_err(|e| e.to_string())?;
    let b: toml::Table = toml::from_str(&back).map_err(|e| e.to_string())?;
    if a != b {
        return Err("internal error: the edit would change more than the runtime throttlewatch; nothing written".into());
    }
    Ok(())
}

/// `text` without our runtime (`None`: it has none). With the pre-install
/// `original`, also what install added around it and the original lacks:
/// the default `runc` it wrote (if unchanged), tables left empty, `version`.
pub fn remove_runtime(
    text: &str,
    plugin: &str,
    original: Option<&str>,
) -> Result<Option<String>, String> {
    let mut doc: DocumentMut = text.parse().map_err(|e| format!("not TOML: {e}"))?;
    let orig = original
        .map(|o| o.parse::<DocumentMut>())
        .transpose()
        .map_err(|e| format!("not TOML: {e}"))?;
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

const THEN: &str = "restart containerd (`systemctl restart containerd`) to load the change; \
                    pods select the runtime with `runtimeClassName: throttlewatch` (configs/runtimeclass.yaml)";

/// What `throttlewatch install containerd` does under `root`.
pub fn install_plan(root: &Path) -> Result<Plan, CliError> {
    let chain = load_chain(root)?;
    let target = target(&chain)?;
    let plugin = target.plugin;
    let mut plan = Plan {
        then: THEN.into(),
        ..Plan::default()
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
    let mut owner = None;
    for &i in &active {
        if lookup(&chain[i].doc, &["plugins", plugin])
            .map_err(|e| usage(&chain[i].host, e))?
            .is_some()
        {
            owner = Some(i);
        }
    }
    let file = &chain[owner.unwrap_or(0)];
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
pub fn uninstall_plan(root: &Path) -> Result<Plan, CliError> {
    let chain = load_chain(root)?;
    let target = target(&chain)?;
    let plugin = target.plugin;
    let mut plan = Plan {
        then: "restart containerd (`systemctl restart containerd`) to load the change".into(),
        nothing_to_do: format!(
            "not installed: no runtime {RUNTIME_NAME} in the containerd configuration"
        ),
        ..Plan::default()
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
                    Target {
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
                plan.notes.push(format!(
                    "{}: changed since install{}; removing only the {RUNTIME_NAME} entries",
                    f.host.display(),
                    if orig.is_some() {
                        format!(" (the pre-install copy stays at {})", backup.display())
                    } else {
                        String::new()
                    }
                ));
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
#[path = "containerd_tests.rs"]
mod tests;
