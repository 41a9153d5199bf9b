//! The files containerd reads, in the order it reads them (`imports`
//! followed breadth first, globs sorted, each file once), and the config
//! version that decides which CRI plugin table holds the runtimes.

use std::collections::{HashSet, VecDeque};
use std::path::{Path, PathBuf};

use toml_edit::DocumentMut;

use super::names::{MAIN, PLUGIN_V2, PLUGIN_V3};
use crate::install::files::read_optional;
use crate::install::under_root;
use crate::CliError;

const ACCEPTED_VERSIONS: &str =
    "accepted: a TOML containerd configuration with version = 2 (containerd 1.5-1.7, plugin \
    \"io.containerd.grpc.v1.cri\"), version = 3 (containerd 2.0-2.2) or version = 4 (containerd \
    2.3+; both plugin \"io.containerd.cri.v1.runtime\")";

/// One file of containerd's configuration, in the order containerd loads it.
pub(super) struct ConfigFile {
    pub host: PathBuf,
    pub text: Option<String>,
    pub doc: DocumentMut,
}

pub(super) fn usage(path: &Path, problem: impl std::fmt::Display) -> CliError {
    CliError::usage(format!("{}: {problem}", path.display()))
}

fn parse(path: &Path, text: &str) -> Result<DocumentMut, CliError> {
    text.parse::<DocumentMut>().map_err(|e| {
        usage(
            path,
            format!("not TOML ({}); {ACCEPTED_VERSIONS}", one_line(text, &e)),
        )
    })
}

/// A TOML error on one line: "line L, column C: message".
pub(super) fn one_line(text: &str, e: &toml_edit::TomlError) -> String {
    let at = e.span().map_or(0, |s| s.start).min(text.len());
    let line = text[..at].matches('\n').count() + 1;
    let column = text[..at]
        .rsplit('\n')
        .next()
        .map_or(0, |l| l.chars().count())
        + 1;
    let message = e.message().split_whitespace().collect::<Vec<_>>().join(" ");
    format!("line {line}, column {column}: {message}")
}

/// The files containerd reads: the main file (which may be missing), then
/// its imports breadth first, each file once, globs sorted (containerd's `LoadConfig`).
pub(super) fn load_chain(root: &Path) -> Result<Vec<ConfigFile>, CliError> {
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
pub(crate) fn glob_match(pattern: &str, name: &str) -> bool {
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
pub(crate) struct CriTable {
    pub plugin: &'static str,
    /// No file sets `version` and none has plugins: we add `version = 2`.
    pub add_version: bool,
}

pub(super) fn target(chain: &[ConfigFile]) -> Result<CriTable, CliError> {
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
        2 => Ok(CriTable { plugin: PLUGIN_V2, add_version: false }),
        // Version 4 (containerd 2.3's `config default`) keeps version 3's
        // CRI runtime plugin and its runtimes table.
        3 | 4 => Ok(CriTable { plugin: PLUGIN_V3, add_version: false }),
        0 if !has_plugins => Ok(CriTable { plugin: PLUGIN_V2, add_version: true }),
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
