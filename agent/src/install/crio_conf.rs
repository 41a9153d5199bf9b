//! Where a node's CRI-O reads OCI hook files: `crio.runtime.hooks_dir` of
//! the configuration that CRI-O itself loads — the file `crio --config`
//! names (default /etc/crio/crio.conf), then every `*.conf` of the
//! directory `crio --config-dir` names (default /etc/crio/crio.conf.d) in
//! lexical order, a later file's value replacing an earlier one's (CRI-O's
//! `pkg/config` `UpdateFromDropInFile`) — else CRI-O's compiled-in default.
//!
//! CRI-O watches its hooks directories and loads a file written there
//! without a restart (measured with ../shared/bin's CRI-O 1.37); it skips
//! a directory that did not exist when it started, so the first directory
//! of the list that exists is the one written to.

use std::path::{Path, PathBuf};

use super::files::read_optional;
use super::under_root;
use crate::CliError;

/// CRI-O's compiled-in `hooks_dir` (containers/common `hooks.DefaultDir`),
/// used when its configuration sets none.
pub(crate) const CRIO_DEFAULT_HOOKS_DIR: &str = "/usr/share/containers/oci/hooks.d";
/// CRI-O's default configuration file and drop-in directory.
pub(crate) const CRIO_CONF: &str = "/etc/crio/crio.conf";
pub(crate) const CRIO_CONF_D: &str = "/etc/crio/crio.conf.d";

/// The paths install and uninstall are given, as the engine names them
/// (resolved under `--etc-root`).
#[derive(Debug, Clone, Default)]
pub struct HookPaths {
    /// `--hooks-dir`: write there, whatever the configuration says.
    pub hooks_dir: Option<PathBuf>,
    /// `--crio-config`: the file CRI-O is started with (`crio --config`).
    pub crio_config: Option<PathBuf>,
    /// `--crio-config-dir`: its drop-in directory (`crio --config-dir`).
    pub crio_config_dir: Option<PathBuf>,
}

/// The configuration files CRI-O reads, in its order.
fn config_files(root: &Path, p: &HookPaths) -> Vec<PathBuf> {
    let file = p.crio_config.as_deref().unwrap_or(Path::new(CRIO_CONF));
    let dir = p
        .crio_config_dir
        .as_deref()
        .unwrap_or(Path::new(CRIO_CONF_D));
    let mut files = vec![under_root(root, file)];
    let mut dropins: Vec<PathBuf> = std::fs::read_dir(under_root(root, dir))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "conf") && p.is_file())
        .collect();
    dropins.sort();
    files.extend(dropins);
    files
}

/// `crio.runtime.hooks_dir` of one file: None when the file does not set it.
fn hooks_dirs_of(f: &Path, text: &str) -> Result<Option<Vec<PathBuf>>, CliError> {
    let doc: toml::Table = toml::from_str(text).map_err(|e| {
        CliError::usage(format!(
            "{}: not TOML ({}); accepted: a CRI-O configuration file",
            f.display(),
            e.message()
        ))
    })?;
    let Some(v) = doc
        .get("crio")
        .and_then(|c| c.get("runtime"))
        .and_then(|r| r.get("hooks_dir"))
    else {
        return Ok(None);
    };
    let bad = || {
        CliError::usage(format!(
            "{}: crio.runtime.hooks_dir = {v} is not accepted; accepted: an array of absolute paths",
            f.display()
        ))
    };
    let dirs = v.as_array().ok_or_else(bad)?;
    dirs.iter()
        .map(|d| {
            d.as_str()
                .filter(|s| s.starts_with('/'))
                .map(PathBuf::from)
                .ok_or_else(bad)
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// The hooks directory to write to for CRI-O (as CRI-O sees it), and a note
/// when CRI-O will not see it without a restart.
pub(crate) fn crio_hooks_dir(
    root: &Path,
    p: &HookPaths,
) -> Result<(PathBuf, Option<String>), CliError> {
    if let Some(d) = &p.hooks_dir {
        return Ok((d.clone(), None));
    }
    let mut dirs = vec![PathBuf::from(CRIO_DEFAULT_HOOKS_DIR)];
    for f in config_files(root, p) {
        if let Some(text) = read_optional(&f)? {
            if let Some(d) = hooks_dirs_of(&f, &text)? {
                dirs = d;
            }
        }
    }
    if let Some(d) = dirs.iter().find(|d| under_root(root, d).is_dir()) {
        return Ok((d.clone(), None));
    }
    let Some(first) = dirs.first() else {
        return Err(CliError::usage(
            "CRI-O's configuration sets hooks_dir = [] (no hooks directory); accepted: pass \
             --hooks-dir DIR and add DIR to crio.runtime.hooks_dir",
        ));
    };
    let note = format!(
        "{}: created now; CRI-O skips a hooks directory that did not exist when it started \
         (and may not watch it): restart crio once",
        first.display()
    );
    Ok((first.clone(), Some(note)))
}
