//! `throttlewatch install|uninstall containerd|docker|podman|crio [--dry-run]
//! [--etc-root DIR] [--restart none|signal|systemd]`: give an engine the
//! runtime `throttlewatch` (containerd, docker) or our OCI hook files
//! (podman, CRI-O), or take them away again.
//!
//! Each engine module turns the files it finds into an [`InstallPlan`]: a list of
//! [`Edit`]s and notes. The plan is printed (a unified diff per file) and,
//! unless `--dry-run`, carried out: every file written atomically with the
//! mode of the file it replaces, every file changed backed up beside it
//! (`NAME.throttlewatch-backup`, same mode). Bad input (not TOML/JSON, an
//! unexpected shape, an unknown engine) is refused before anything is
//! written: exit 2 with the file, the problem and what is accepted.

pub(crate) mod containerd;
pub(crate) mod crio_conf;
pub(crate) mod diff;
pub(crate) mod docker;
pub(crate) mod files;
pub(crate) mod hooks;
pub(crate) mod restart;

use std::path::{Path, PathBuf};

use crate::CliError;

pub(crate) use diff::unified_diff;

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

/// The engines we configure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ContainerEngine {
    Containerd,
    Docker,
    Podman,
    Crio,
}

impl ContainerEngine {
    pub(crate) const ACCEPTED: &'static str = "containerd, docker, podman, crio";

    pub(crate) fn parse(s: &str, command: &str) -> Result<ContainerEngine, CliError> {
        match s {
            "containerd" => Ok(ContainerEngine::Containerd),
            "docker" => Ok(ContainerEngine::Docker),
            "podman" => Ok(ContainerEngine::Podman),
            "crio" | "cri-o" => Ok(ContainerEngine::Crio),
            other => Err(CliError::usage(format!(
                "{command}: unknown engine {other:?}; accepted: {}",
                ContainerEngine::ACCEPTED
            ))),
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            ContainerEngine::Containerd => "containerd",
            ContainerEngine::Docker => "docker",
            ContainerEngine::Podman => "podman",
            ContainerEngine::Crio => "crio",
        }
    }
}

/// What install and uninstall are told.
#[derive(Debug, Clone)]
pub struct Options {
    pub dry_run: bool,
    /// The filesystem root the configuration lives under (`/`; the host's
    /// root mounted in a pod; a temporary tree in tests).
    pub root: PathBuf,
    /// Where the throttlewatch binaries are on the host (docker's runtime
    /// path, the hook files' hook.path).
    pub bin_dir: PathBuf,
    /// `--restart`: how the engine is made to load the change.
    pub restart: restart::Restart,
    /// The configuration the hook files pass to the hook (`--config`).
    pub hook_config: Option<PathBuf>,
    /// The hook files' `timeout` (the configuration's `hook_timeout_s`).
    pub hook_timeout_s: u64,
    /// Where the hook files go (`--hooks-dir`), or CRI-O's configuration
    /// to read it from (`--crio-config`, `--crio-config-dir`).
    pub hook_paths: crio_conf::HookPaths,
}

impl Options {
    pub fn new(root: &Path, bin_dir: &Path) -> Options {
        Options {
            dry_run: false,
            root: root.to_path_buf(),
            bin_dir: bin_dir.to_path_buf(),
            restart: restart::Restart::None,
            hook_config: None,
            hook_timeout_s: 15,
            hook_paths: crio_conf::HookPaths::default(),
        }
    }

    fn hook_settings(&self) -> hooks::HookSettings {
        hooks::HookSettings {
            bin_dir: self.bin_dir.clone(),
            config: self.hook_config.clone(),
            timeout_s: self.hook_timeout_s,
        }
    }
}

/// Carry out `plan`, then restart as asked (only when something was written).
fn finish(plan: InstallPlan, engine: ContainerEngine, o: &Options) -> Result<i32, CliError> {
    let action = restart::action(engine, o.restart)?;
    let code = plan.carry_out(o.dry_run)?;
    match action {
        Some(a) if o.dry_run => {
            if let Some(c) = a.command(&o.root) {
                println!("(dry run: would run `{}`)", c.join(" "));
            } else {
                println!("(dry run: would send SIGHUP to {}'s daemon)", engine.name());
            }
        }
        Some(a) if !plan.edits.is_empty() => println!("{}", a.run(&o.root)?),
        _ => {}
    }
    Ok(code)
}

/// `throttlewatch install ENGINE`.
pub fn install(engine: &str, o: &Options) -> Result<i32, CliError> {
    let e = ContainerEngine::parse(engine, "install")?;
    let plan = match e {
        ContainerEngine::Containerd => containerd::install_plan(&o.root)?,
        ContainerEngine::Docker => docker::install_plan(&o.root, &o.bin_dir)?,
        ContainerEngine::Podman => hooks::install_plan(
            hooks::HookEngine::Podman,
            &o.root,
            &o.hook_settings(),
            &o.hook_paths,
        )?,
        ContainerEngine::Crio => hooks::install_plan(
            hooks::HookEngine::Crio,
            &o.root,
            &o.hook_settings(),
            &o.hook_paths,
        )?,
    };
    finish(plan, e, o)
}

/// `throttlewatch uninstall ENGINE`: the files back as they were before install
/// (byte for byte when they were not changed since; otherwise only our entries removed).
pub fn uninstall(engine: &str, o: &Options) -> Result<i32, CliError> {
    let e = ContainerEngine::parse(engine, "uninstall")?;
    let plan = match e {
        ContainerEngine::Containerd => containerd::uninstall_plan(&o.root)?,
        ContainerEngine::Docker => docker::uninstall_plan(&o.root)?,
        ContainerEngine::Podman => {
            hooks::uninstall_plan(hooks::HookEngine::Podman, &o.root, &o.hook_paths)?
        }
        ContainerEngine::Crio => {
            hooks::uninstall_plan(hooks::HookEngine::Crio, &o.root, &o.hook_paths)?
        }
    };
    finish(plan, e, o)
}

/// `abs` (a path as the engine sees it) under `root`.
pub(crate) fn under_root(root: &Path, abs: &Path) -> PathBuf {
    root.join(abs.strip_prefix("/").unwrap_or(abs))
}

/// The old positional calls, for the unit tests.
#[cfg(test)]
pub(crate) mod test_support {
    use super::*;

    pub(crate) fn install(
        engine: &str,
        dry_run: bool,
        root: &Path,
        bin_dir: &Path,
    ) -> Result<i32, CliError> {
        let mut o = Options::new(root, bin_dir);
        o.dry_run = dry_run;
        super::install(engine, &o)
    }

    pub(crate) fn uninstall(engine: &str, dry_run: bool, root: &Path) -> Result<i32, CliError> {
        let mut o = Options::new(root, Path::new("/usr/local/bin"));
        o.dry_run = dry_run;
        super::uninstall(engine, &o)
    }
}
