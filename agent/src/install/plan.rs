//! What an installer does to an engine's files: an [`InstallPlan`] of
//! [`Edit`]s, shown as diffs and carried out atomically with backups.

use std::path::{Path, PathBuf};

use super::diff::unified_diff;
use super::files;
use crate::CliError;

/// The runtime (containerd handler, docker runtime) name we add.
pub(crate) const RUNTIME_NAME: &str = "throttlewatch";

/// One change to one file.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Edit {
    /// Write `after` to `path`; with `backup`, the old text (`before`) is
    /// first copied to the backup.
    Write {
        path: PathBuf,
        before: Option<String>,
        after: String,
        backup: bool,
    },
    /// Move `path` to its backup (a file of ours that must not stay active).
    MoveAside { path: PathBuf, before: String },
    /// Put the backup back in place of `path` (bytes and mode as they were).
    Restore {
        path: PathBuf,
        current: Option<String>,
        original: String,
    },
    /// Remove `path`, which install created.
    Delete { path: PathBuf, before: String },
}

impl Edit {
    fn path(&self) -> &Path {
        match self {
            Edit::Write { path, .. }
            | Edit::MoveAside { path, .. }
            | Edit::Restore { path, .. }
            | Edit::Delete { path, .. } => path,
        }
    }

    fn before_after(&self) -> (&str, &str) {
        match self {
            Edit::Write { before, after, .. } => (before.as_deref().unwrap_or(""), after),
            Edit::MoveAside { before, .. } | Edit::Delete { before, .. } => (before, ""),
            Edit::Restore {
                current, original, ..
            } => (current.as_deref().unwrap_or(""), original),
        }
    }

    fn describe(&self) -> String {
        let p = self.path().display();
        let b = files::backup_of(self.path());
        match self {
            Edit::Write { backup: true, .. } => format!("{p} (backup: {})", b.display()),
            Edit::Write { before: None, .. } => format!("{p} (new file)"),
            Edit::Write { .. } => p.to_string(),
            Edit::MoveAside { .. } => format!("{p} moved aside to {}", b.display()),
            Edit::Restore { .. } => format!("{p} restored from {}", b.display()),
            Edit::Delete { .. } => format!("{p} removed (install created it)"),
        }
    }

    fn apply(&self) -> Result<(), CliError> {
        match self {
            Edit::Write {
                path,
                before,
                after,
                backup,
            } => {
                if let (true, Some(before)) = (*backup, before) {
                    files::back_up(path, before)?;
                }
                files::replace(path, after)
            }
            Edit::MoveAside { path, .. } => files::rename(path, &files::backup_of(path)),
            Edit::Restore { path, .. } => files::rename(&files::backup_of(path), path),
            Edit::Delete { path, .. } => files::remove(path),
        }
    }
}

/// What install or uninstall will do.
#[derive(Debug, Default)]
pub(crate) struct InstallPlan {
    pub edits: Vec<Edit>,
    /// Said before the diffs (which file is edited and why, what is kept).
    pub notes: Vec<String>,
    /// Said when there is nothing to do ("already installed …").
    pub nothing_to_do: String,
    /// Said after the files are written (restart the engine …).
    pub then: String,
}

impl InstallPlan {
    /// Print the plan; write it unless `dry_run`. Exit status 0.
    pub(crate) fn carry_out(&self, dry_run: bool) -> Result<i32, CliError> {
        for n in &self.notes {
            println!("{n}");
        }
        if self.edits.is_empty() {
            println!("{}", self.nothing_to_do);
            return Ok(0);
        }
        for e in &self.edits {
            println!("{}:", e.describe());
            let (before, after) = e.before_after();
            print!(
                "{}",
                unified_diff(before, after, &e.path().to_string_lossy())
            );
        }
        if dry_run {
            println!("(dry run: nothing written)");
            return Ok(0);
        }
        for e in &self.edits {
            e.apply()?;
        }
        println!("{}", self.then);
        Ok(0)
    }
}

/// `abs` (a path as the engine sees it) under `root`.
pub(crate) fn under_root(root: &Path, abs: &Path) -> PathBuf {
    root.join(abs.strip_prefix("/").unwrap_or(abs))
}
