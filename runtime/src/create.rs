//! `create` with no hook and no work of ours on the start path. The wrapper
//! edits the spec (our poststop hook, cpuset resources, the create stamp; no
//! createRuntime hook), marks the container pending
//! (`CreateMarks::creating`, lifecycle/src/create_marks.rs), starts a helper
//! (`crate::spawn`: a child sharing the wrapper's memory, which the exec
//! then leaves to it) and execs the low-level runtime's `create` in its own
//! place: the caller waits for the runtime it asked for and nothing else,
//! and a caller that kills "the runtime" on a timeout kills the real one.
//!
//! The helper, detached (its own session, stdio on /dev/null, no
//! descriptor of the caller's), parses the request and finds the cgroup
//! hierarchies while the runtime creates, waits for the runtime to exit
//! (a pidfd; not earlier, see `Helper::wait_created`), and if it created
//! the container — a pid file written during this create — does the
//! hook's createRuntime work: QoS into the cgroup, the register sent to the
//! agent, which replaces the mark, then the burst record. (First, while the
//! runtime creates, it writes the start ticket, `crate::ticket`, that lets
//! `start` skip the configuration.) All that runs
//! while the caller goes on to `start`, which lets
//! the entrypoint run only once the agent has the container (or it was
//! refused, or the helper failed and said why in hook.log). What runc's
//! hook machinery would cost on the start path is measured in
//! bench/README.md (container start).
//!
//! `run` keeps the hook: runc creates and starts in one process, and the
//! hook is the only point between the two. So does fail-closed (the
//! wrapper sends `create` here only under fail-open): there the hook makes
//! runc's own create fail unless the container's log is open, the
//! strongest form of the guarantee, and speed comes second.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use throttlewatch_core::config::Config;
use throttlewatch_core::ContainerKey;
use throttlewatch_lifecycle::create_marks::CreateMarks;
use throttlewatch_lifecycle::modifiers::{
    apply_modifiers, default_hook_path, is_pod_sandbox_spec, ModifyContext,
};
use throttlewatch_lifecycle::timing::Phases;
use throttlewatch_lifecycle::{SpecFile, StateDir};

use crate::args::RuncArgs;
use crate::create_helper::{file_id, Helper};
use crate::runlog::RuncLog;
use crate::spawn;

/// What the wrapper does next: exec the low-level runtime with these
/// arguments (the caller's, maybe with a `--pid-file` of ours).
pub struct Next(pub Vec<OsString>);

/// `create` under fail-open: edit the spec, mark the container pending,
/// start the helper (see the module) and exec the runtime's `create`; no
/// return then. A spec that cannot be edited goes to the runtime unchanged;
/// any later failure leaves the container created and unwatched, said in
/// runc's log (before the helper starts) or hook.log (the helper);
/// fail-closed keeps the hook.
pub fn create(
    args: &RuncArgs,
    cfg: &Config,
    config_path: Option<PathBuf>,
    runtime: &Path,
    log: &RuncLog,
    t: &mut Phases,
) -> Next {
    let created_ns = throttlewatch_core::logfmt::now_unix_ns();
    let unchanged = || Next(args.argv.clone());
    // No container id: runc refuses the create with its own usage text, and
    // so does the wrapper, adding nothing (no spec edited, no line of ours).
    let Some(key) = args.container_key() else {
        return unchanged();
    };
    let spec = match edit(args, cfg, config_path.clone(), t) {
        Ok(Some(spec)) => spec,
        Ok(None) => return unchanged(), // a pod sandbox: nothing to do
        Err(e) => {
            log.error(&format!(
                "{e:#} (fail-open: creating the container unchanged)"
            ));
            return unchanged();
        }
    };
    let state = StateDir::new(&cfg.state_dir);
    // The init pid: from the caller's --pid-file, else one of ours.
    let Some((argv, pid_file, ours)) = pid_file_of(args, &state, log) else {
        return unchanged();
    };
    // A pid file there before (a reused path) is not this create's.
    let stale = file_id(&pid_file);
    let Some(marks) = mark_pending(cfg, &key, config_path.as_deref(), log) else {
        return Next(argv);
    };
    t.mark("mark");
    let h = Helper {
        runtime_pid: std::process::id(),
        runtime,
        cfg,
        config_path: config_path.as_deref(),
        spec: &spec,
        key: &key,
        bundle: args.bundle().unwrap_or_default(),
        pid_file: &pid_file,
        stale,
        ours,
        created_ns,
    };
    let e = spawn::helper_then_exec(
        runtime,
        &argv,
        move || h.run(),
        t,
        // The helper sees the runtime (this pid) exit without a pid file
        // and clears the mark.
        |e| log.error(&format!("cannot exec {}: {e}", runtime.display())),
    );
    marks.taken();
    log.error(&format!(
        "cannot start the create helper: {e}; the container is created and not watched"
    ));
    Next(argv)
}

/// The arguments with the pid file the helper reads (the caller's
/// `--pid-file`, else one of ours in the state directory, `true`); None
/// when ours cannot be made (said in runc's log).
fn pid_file_of(
    args: &RuncArgs,
    state: &StateDir,
    log: &RuncLog,
) -> Option<(Vec<OsString>, PathBuf, bool)> {
    if let Some(p) = args.sub_flag(&["pid-file"]) {
        return Some((args.argv.clone(), PathBuf::from(p), false));
    }
    let p = state.create_pid_file(std::process::id());
    let made = p.parent().map(StateDir::create_dir);
    if let Some(Err(e)) = made {
        log.error(&format!(
            "cannot create {}: {e}; the container is created and not watched",
            p.parent().unwrap_or(Path::new("")).display()
        ));
        return None;
    }
    let _ = std::fs::remove_file(&p);
    Some((with_pid_file(args, &p), p, true))
}

/// The container marked pending and an earlier start ticket of its id
/// removed; None when either fails (said in runc's log: created, not
/// watched).
fn mark_pending<'a>(
    cfg: &'a Config,
    key: &'a ContainerKey,
    config_path: Option<&Path>,
    log: &RuncLog,
) -> Option<CreateMarks<'a>> {
    // A mark left by an earlier container of this id (restarted) must not
    // make this one's `start` skip the wait.
    let marks = CreateMarks::new(&cfg.state_dir, key);
    marks.watched();
    if let Err(e) = marks.creating() {
        log.error(&format!(
            "cannot mark {key} pending in {}: {e}; the container is created and not watched",
            marks.state().pending_dir().display()
        ));
        return None;
    }
    // The helper writes the new start ticket (crate::ticket).
    if let Err(e) = crate::ticket::remove(key, config_path) {
        log.error(&format!(
            "cannot remove the start ticket of an earlier {key}: {e}; the container is created and not watched"
        ));
        marks.taken();
        return None;
    }
    Some(marks)
}

/// Read, edit (no createRuntime hook of ours) and write back config.json;
/// the document as written (the helper takes its typed reading, off the
/// caller's path), or None for a pod sandbox (left as it is).
fn edit(
    args: &RuncArgs,
    cfg: &Config,
    config_path: Option<PathBuf>,
    t: &mut Phases,
) -> anyhow::Result<Option<SpecFile>> {
    let bundle = args.bundle()?;
    let mut file = SpecFile::read(&bundle)?;
    t.mark("spec_read");
    if is_pod_sandbox_spec(&file.value) {
        return Ok(None);
    }
    let ctx = ModifyContext {
        hook_path: default_hook_path()?,
        config_path,
        cfg: cfg.clone(),
        create_runtime_hook: false,
        created_unix_ns: None, // no hook of ours in this spec: the helper has it
    };
    t.mark("hook_path");
    let changed = !apply_modifiers(&mut file, &ctx)?.is_empty();
    t.mark("modify");
    if changed {
        file.write()?;
    }
    t.mark("write");
    Ok(Some(file))
}

/// The arguments with `--pid-file P` right after the subcommand.
fn with_pid_file(args: &RuncArgs, p: &Path) -> Vec<OsString> {
    let mut argv = args.argv.clone();
    let at = args.subcommand_at.map_or(argv.len(), |i| i + 1);
    argv.splice(at..at, [OsString::from("--pid-file"), p.into()]);
    argv
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_file_goes_right_after_the_subcommand() {
        let a = RuncArgs::parse(
            &["--root", "/r", "create", "--bundle", "/b", "c1"].map(OsString::from),
        );
        let v = with_pid_file(&a, Path::new("/run/tw/pids/7"));
        assert_eq!(
            v,
            [
                "--root",
                "/r",
                "create",
                "--pid-file",
                "/run/tw/pids/7",
                "--bundle",
                "/b",
                "c1"
            ]
            .map(OsString::from)
        );
        let again = RuncArgs::parse(&v);
        assert_eq!(again.container_id(), Some(std::ffi::OsStr::new("c1")));
        assert_eq!(
            again.sub_flag(&["pid-file"]),
            Some(OsString::from("/run/tw/pids/7"))
        );
    }
}
