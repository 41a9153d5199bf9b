//! The create work of the shim's `create`: the spec modifiers (no
//! createRuntime hook of ours), then, once runc's create returns, what the
//! hook does under plain runc — QoS into the cgroup and the register
//! (`throttlewatch_lifecycle::created`), sent without waiting under
//! fail-open (`start` waits for the watch, `lifecycle::pending`).

use std::path::Path;

use log::{info, warn};
use throttlewatch_core::config::{Config, FailMode};
use throttlewatch_lifecycle::created::{on_prepared, prepare, Answer, Created};
use throttlewatch_lifecycle::modifiers::{
    apply_modifiers, is_pod_sandbox_spec, ModifyContext, NoHookBinary,
};
use throttlewatch_lifecycle::report::Reporter;
use throttlewatch_lifecycle::timing::Phases;
use throttlewatch_lifecycle::{BundleSpec, HookStage, SpecError, SpecFile};

use super::{TaskService, SHIM_NAME};
use crate::error::{Error, Result};

/// The spec modifiers on a container's bundle (none on a pod sandbox's):
/// what they changed, and the spec as it now is.
fn edit_spec(
    cfg: &Config,
    bundle: &Path,
) -> std::result::Result<(Vec<String>, Option<BundleSpec>), SpecEditError> {
    let ctx = ModifyContext {
        create_runtime_hook: false,
        ..ModifyContext::from_env(cfg)?
    };
    let mut file = SpecFile::read(bundle)?;
    if is_pod_sandbox_spec(&file.value) {
        return Ok((vec![], None));
    }
    let changes = apply_modifiers(&mut file, &ctx)?;
    if !changes.is_empty() {
        file.write()?;
    }
    Ok((changes, Some(file.typed()?)))
}

/// Why the spec modifiers did not run on a bundle.
#[derive(Debug, thiserror::Error)]
enum SpecEditError {
    #[error(transparent)]
    NoHook(#[from] NoHookBinary),
    #[error(transparent)]
    Spec(#[from] SpecError),
}

impl TaskService {
    /// The throttlewatch spec modifiers on the bundle (fail-open unless
    /// `fail_mode = "closed"`): our poststop hook, cpuset resources, and
    /// no createRuntime hook of ours — the shim does that
    /// work itself once runc's `create` returns ([`Self::on_created`]).
    /// Returns the typed spec for it, or None when nothing is to be done (a
    /// configuration that could not be used leaves the spec unchanged, or
    /// refuses the create when the file meant fail-closed; a pod sandbox).
    pub(super) fn modify_spec(&self, id: &str, bundle: &Path) -> Result<Option<BundleSpec>> {
        match &self.bad_config {
            Some(bad) if bad.fail_mode == FailMode::Closed => {
                return Err(Error::FailedPrecondition(format!(
                    "throttlewatch: {bad} (fail-closed: create refused)"
                )));
            }
            Some(_) => return Ok(None),
            None => {}
        }
        let res = edit_spec(&self.cfg, bundle);
        match res {
            Ok((changes, spec)) => {
                if !changes.is_empty() {
                    info!("{id}: spec modified: {}", changes.join(", "))
                }
                Ok(spec)
            }
            Err(e) if self.cfg.fail_mode == FailMode::Closed => Err(Error::FailedPrecondition(
                format!("throttlewatch spec modifiers: {e}"),
            )),
            Err(e) => {
                warn!("{id}: spec modifiers failed, continuing without them (fail_mode=open): {e}");
                Ok(None)
            }
        }
    }

    /// Between runc's `create` and the task's `start`: the QoS the
    /// annotations ask for into the cgroup, then the register with the agent
    /// (what our createRuntime hook does under plain runc). Errors go to
    /// hook.log and the shim's log; under fail-closed any refuses the create.
    pub(super) fn on_created(
        &self,
        id: &str,
        bundle: &Path,
        pid: u32,
        spec: &BundleSpec,
        created_ns: u64,
    ) -> Result<()> {
        let key = self.key(id);
        let mut rep = Reporter::new(&self.cfg, HookStage::CreateRuntime, SHIM_NAME);
        rep.set_container(id);
        let mut t = Phases::start("containerd-shim-throttlewatch-v2 create");
        let config_path = Config::env_path();
        let c = Created {
            key: &key,
            bundle,
            pid,
            spec,
            created_ns: Some(created_ns),
            exit_reported: true,
        };
        // Fail-open: the register is sent, not awaited; `start` waits for
        // the watch (lifecycle::pending). Fail-closed waits here.
        let done = match prepare(&self.cfg, spec) {
            Some(p) => on_prepared(
                &self.cfg,
                config_path.as_deref(),
                &mut rep,
                c,
                p,
                Answer::AtStart,
                &mut t,
            ),
            None => Ok(()),
        };
        if let Err(e) = done {
            rep.error(&format!("{e:#}"));
        }
        if rep.failed() && self.cfg.fail_mode == FailMode::Closed {
            return Err(Error::FailedPrecondition(format!(
                "throttlewatch: container {id}: {} (fail-closed: create refused)",
                rep.lines.join("; ")
            )));
        }
        Ok(())
    }
}
