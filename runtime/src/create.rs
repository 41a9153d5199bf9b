//! `create` with no hook on the start path: the wrapper edits the spec (our
//! poststop hook, cpuset resources, the create stamp; no createRuntime
//! hook), runs the low-level runtime's `create` as its child, and once it
//! returns — the cgroup made, the init process waiting for `start`, the
//! entrypoint not yet run — does the hook's createRuntime work itself:
//! QoS into the cgroup, then the register with the agent. runc's hook
//! machinery (state JSON, a fork of the Go process, a second process's
//! start-up) is what a createRuntime hook cost on the start path: 2.3 ms
//! for `/bin/true` as the hook (bench/README.md, container start).
//!
//! `run` keeps the hook: runc creates and starts in one process, and the
//! hook is the only point between the two. So does fail-closed (the
//! wrapper sends `create` here only under fail-open): there the hook makes
//! runc's own create fail unless the container's log is open, the
//! strongest form of the guarantee, and speed comes second. (In the VM
//! lane the create path under fail-closed twice came out 1.3 % and 3.2 %
//! short of the kernel's count in about twenty runs: not understood yet,
//! see the issue 16 note.)

use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use throttlewatch_core::config::Config;
use throttlewatch_lifecycle::created::{on_prepared, prepare, read_pid_file, Answer, Created};
use throttlewatch_lifecycle::modifiers::{
    apply_modifiers, default_hook_path, is_pod_sandbox_spec, ModifyContext,
};
use throttlewatch_lifecycle::report::Reporter;
use throttlewatch_lifecycle::timing::Phases;
use throttlewatch_lifecycle::{BundleSpec, SpecFile, Stage, StateDir};

use crate::args::RuncArgs;
use crate::runlog::{RuncLog, NAME};

/// What the wrapper does next.
pub enum Next {
    /// Hand the (maybe edited) bundle to the low-level runtime by exec.
    Exec,
    /// Done: exit with this code.
    Exit(i32),
}

/// `create` under fail-open: edit the spec, run the runtime's `create`,
/// then QoS and the register sent. A spec that cannot be edited goes to
/// the runtime unchanged; any later failure leaves the container created
/// and unwatched, said in hook.log (fail-closed keeps the hook: see the module).
pub fn create(
    runtime: &Path,
    args: &RuncArgs,
    cfg: &Config,
    config_path: Option<PathBuf>,
    log: &RuncLog,
    t: &mut Phases,
) -> Next {
    let spec = match edit(args, cfg, config_path.clone(), t) {
        Ok(Some(spec)) => spec,
        Ok(None) => return Next::Exec, // a pod sandbox: nothing to do
        Err(e) => {
            log.error(&format!(
                "{e:#} (fail-open: creating the container unchanged)"
            ));
            return Next::Exec;
        }
    };
    // The init pid: from the caller's --pid-file, else one of ours.
    let (argv, pid_file, ours) = match args.sub_flag(&["pid-file"]) {
        Some(p) => (args.argv.clone(), PathBuf::from(p), false),
        None => {
            let state = StateDir::new(&cfg.state_dir);
            let p = state.create_pid_file(std::process::id());
            let made = p.parent().map(StateDir::create_dir);
            if let Some(Err(e)) = made {
                log.error(&format!(
                    "cannot create {}: {e}; the container is created and not watched",
                    p.parent().unwrap_or(Path::new("")).display()
                ));
                return Next::Exec;
            }
            let _ = std::fs::remove_file(&p);
            (with_pid_file(args, &p), p, true)
        }
    };
    let child = match spawn_child(runtime, &argv) {
        Ok(c) => c,
        Err(e) => {
            log.error(&format!("cannot run {}: {e}", runtime.display()));
            return Next::Exit(127);
        }
    };
    t.mark("spawn");
    // While the runtime creates: what needs no cgroup yet.
    let prepared = prepare(cfg, &spec);
    t.mark("prepare");
    let code = wait_child(child);
    t.mark("runtime_create");
    let pid = read_pid_file(&pid_file);
    if ours {
        let _ = std::fs::remove_file(&pid_file);
    }
    if code != 0 {
        return Next::Exit(code); // the runtime said why
    }
    let bundle = args.bundle().unwrap_or_default();
    let Some(key) = args.container_key() else {
        log.error("create: no container id in the arguments; not watched");
        return Next::Exit(0);
    };
    let mut rep = Reporter::new(cfg, Stage::CreateRuntime, NAME);
    rep.set_container(&key.id);
    let Some(prepared) = prepared else {
        return Next::Exit(0); // a pod sandbox (the edit let it through)
    };
    let done = pid.map_err(anyhow::Error::msg).and_then(|pid| {
        let c = Created {
            key: &key,
            bundle: &bundle,
            pid,
            spec: &spec,
        };
        on_prepared(
            cfg,
            config_path.as_deref(),
            &mut rep,
            c,
            prepared,
            Answer::AtStart,
            t,
        )
    });
    if let Err(e) = done {
        rep.error(&format!("{e:#}"));
    }
    Next::Exit(0)
}

/// Read, edit (no createRuntime hook of ours) and write back config.json;
/// the typed spec, or None for a pod sandbox (left as it is).
fn edit(
    args: &RuncArgs,
    cfg: &Config,
    config_path: Option<PathBuf>,
    t: &mut Phases,
) -> anyhow::Result<Option<BundleSpec>> {
    let bundle = args.bundle()?;
    let mut file = SpecFile::read(&bundle)?;
    if is_pod_sandbox_spec(&file.value) {
        return Ok(None);
    }
    let ctx = ModifyContext {
        hook_path: default_hook_path().map_err(anyhow::Error::msg)?,
        config_path,
        cfg: cfg.clone(),
        create_runtime_hook: false,
    };
    t.mark("hook_path");
    if !apply_modifiers(&mut file, &ctx)?.is_empty() {
        file.write()?;
    }
    t.mark("modify");
    Ok(Some(file.typed()?))
}

/// The arguments with `--pid-file P` right after the subcommand.
fn with_pid_file(args: &RuncArgs, p: &Path) -> Vec<OsString> {
    let mut argv = args.argv.clone();
    let at = args.subcommand_at.map_or(argv.len(), |i| i + 1);
    argv.splice(at..at, [OsString::from("--pid-file"), p.into()]);
    argv
}

/// The child's exit code, 128 + signal if it was killed.
fn wait_child(mut child: Child) -> i32 {
    match child.wait() {
        Ok(st) => st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0)),
        Err(_) => 1, // not ours to wait for: cannot happen (our own child)
    }
}

/// Start the runtime as a child (stdio and preserved descriptors
/// inherited) that dies with this process: a caller that kills the
/// "runtime" on a timeout kills the real one too.
fn spawn_child(runtime: &Path, argv: &[OsString]) -> std::io::Result<Child> {
    let mut cmd = Command::new(runtime);
    cmd.args(argv);
    // SAFETY: prctl is async-signal-safe; nothing else runs in the child.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn()
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
