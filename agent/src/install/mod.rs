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
mod engine;
pub(crate) mod files;
pub(crate) mod hooks;
mod plan;
pub(crate) mod restart;

use std::path::{Path, PathBuf};

use crate::CliError;

#[cfg(test)]
pub(crate) use diff::unified_diff;
pub(crate) use engine::ContainerEngine;
pub(crate) use plan::{under_root, Edit, InstallPlan, RUNTIME_NAME};

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
