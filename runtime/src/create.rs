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
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use throttlewatch_core::config::Config;
use throttlewatch_core::ContainerKey;
use throttlewatch_lifecycle::create_marks::CreateMarks;
use throttlewatch_lifecycle::created::{
    on_prepared, prepare, read_pid_file, Answer, Created, PidFileError,
};
use throttlewatch_lifecycle::modifiers::{
    apply_modifiers, default_hook_path, is_pod_sandbox_spec, ModifyContext,
};
use throttlewatch_lifecycle::report::Reporter;
use throttlewatch_lifecycle::timing::Phases;
use throttlewatch_lifecycle::{HookStage, SpecFile, StateDir};

use crate::args::RuncArgs;
use crate::runlog::{RuncLog, NAME};
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
    let (argv, pid_file, ours) = match args.sub_flag(&["pid-file"]) {
        Some(p) => (args.argv.clone(), PathBuf::from(p), false),
        None => {
            let p = state.create_pid_file(std::process::id());
            let made = p.parent().map(StateDir::create_dir);
            if let Some(Err(e)) = made {
                log.error(&format!(
                    "cannot create {}: {e}; the container is created and not watched",
                    p.parent().unwrap_or(Path::new("")).display()
                ));
                return unchanged();
            }
            let _ = std::fs::remove_file(&p);
            (with_pid_file(args, &p), p, true)
        }
    };
    // A pid file there before (a reused path) is not this create's.
    let stale = file_id(&pid_file);
    // A mark left by an earlier container of this id (restarted) must not
    // make this one's `start` skip the wait.
    let marks = CreateMarks::new(&cfg.state_dir, &key);
    marks.watched();
    if let Err(e) = marks.creating() {
        log.error(&format!(
            "cannot mark {key} pending in {}: {e}; the container is created and not watched",
            marks.state().pending_dir().display()
        ));
        return Next(argv);
    }
    // The helper writes the new start ticket (crate::ticket).
    if let Err(e) = crate::ticket::remove(&key, config_path.as_deref()) {
        log.error(&format!(
            "cannot remove the start ticket of an earlier {key}: {e}; the container is created and not watched"
        ));
        marks.taken();
        return Next(argv);
    }
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

/// A file's identity: runc writes the pid file by rename, so a new one is
/// another inode or at least another change time.
type FileId = (u64, u64, i64, i64);

fn file_id(p: &Path) -> Option<FileId> {
    std::fs::symlink_metadata(p)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}

/// How long the helper stays once its work is done (see `Helper::run`):
/// a caller's `start` follows its `create` within milliseconds.
const EXIT_AFTER: Duration = Duration::from_millis(100);

/// The helper's share of `create` (see the module).
struct Helper<'a> {
    /// The wrapper's pid, which the runtime's `create` keeps across exec.
    runtime_pid: u32,
    /// The runtime it execs (for the start ticket).
    runtime: &'a Path,
    cfg: &'a Config,
    config_path: Option<&'a Path>,
    /// config.json as written (typed by the helper).
    spec: &'a SpecFile,
    key: &'a ContainerKey,
    bundle: PathBuf,
    pid_file: &'a Path,
    stale: Option<FileId>,
    /// The pid file is ours (`<state_dir>/pids/`): removed once read.
    ours: bool,
    /// When the wrapper was asked to create (the register's create time).
    created_ns: u64,
}

impl Helper<'_> {
    fn run(self) {
        // While the runtime creates: the CPUs only when idle (see Background).
        let background = Background::enter();
        detach();
        let mut t = Phases::start(NAME);
        t.name(&format!("{NAME} created"));
        let marks = CreateMarks::new(&self.cfg.state_dir, self.key);
        let mut rep = Reporter::new(self.cfg, HookStage::CreateRuntime, NAME);
        rep.set_container(&self.key.id);
        // What `start` needs: it then loads no configuration.
        let ticket = crate::ticket::Ticket {
            config: self.config_path.map(Path::to_path_buf),
            runtime: self.runtime.to_path_buf(),
            pending: marks.state().pending_file(self.key),
        };
        let ticketed = crate::ticket::write(self.key, &ticket)
            .map_err(|e| {
                rep.warn(&format!(
                    "no start ticket ({e}): its start loads the configuration"
                ))
            })
            .is_ok();
        t.mark("ticket");
        // While the runtime creates: what needs no cgroup yet.
        let spec = match self.spec.typed() {
            Ok(spec) => spec,
            Err(e) => {
                rep.error(&format!("{e}; the container is not watched"));
                marks.abandoned();
                return;
            }
        };
        let prepared = prepare(self.cfg, &spec);
        t.mark("prepare");
        let pid = self.wait_created();
        if let Err(e) = background.leave() {
            rep.warn(&format!(
                "cannot take back the scheduling policy it had ({e}): it works on at SCHED_IDLE"
            ));
        }
        t.mark("runtime_create");
        if self.ours {
            let _ = std::fs::remove_file(self.pid_file);
        }
        if pid.is_none() && ticketed {
            // Not created: nothing will start. (Removing a later create's
            // ticket instead would only send its start the whole way.)
            let _ = crate::ticket::remove(self.key, self.config_path);
        }
        let (Some(pid), Some(prepared)) = (pid, prepared) else {
            // Not created (the runtime said why), or a pod sandbox.
            marks.abandoned();
            t.finish();
            return;
        };
        // As a message: its words already name the cause, which `{:#}` would repeat.
        let done = pid.map_err(anyhow::Error::msg).and_then(|pid| {
            let c = Created {
                key: self.key,
                bundle: &self.bundle,
                pid,
                spec: &spec,
                created_ns: Some(self.created_ns),
                exit_reported: false,
            };
            on_prepared(
                self.cfg,
                self.config_path,
                &mut rep,
                c,
                prepared,
                Answer::AtStart,
                &mut t,
            )
            .map_err(|e| match Path::new(&format!("/proc/{pid}")).exists() {
                true => e,
                false => e.context(format!(
                    "init process {pid} gone (deleted before its start)"
                )),
            })
        });
        if let Err(e) = done {
            rep.error(&format!("{e:#}; the container is not watched"));
        }
        // Never sent: `start` need not wait for it.
        marks.abandoned();
        t.finish();
        // The caller is starting the container now: the exit, which frees
        // the address space the wrapper left here, waits until that is
        // done rather than share the CPUs with it, and takes only CPU time
        // nothing else wants.
        let _ = Background::enter();
        std::thread::sleep(EXIT_AFTER);
    }

    /// The container's init pid from the pid file once the runtime has
    /// exited (runc writes it when the create has succeeded, then exits);
    /// None when it exited without writing it (the create failed).
    ///
    /// Not as soon as the file is written: the helper's work and the
    /// agent's (about 1 ms of CPU together) would then run beside the
    /// runtime's own exit, which the caller waits for; on two CPUs that
    /// made `create` 0.5–1.5 ms slower than the exit wait does, which
    /// moves the work beside the caller's `start` (no slower within the
    /// noise): bench/README.md, runs 27–32.
    fn wait_created(&self) -> Option<Result<u32, PidFileError>> {
        RuntimeExit::watch(self.runtime_pid).wait();
        file_id(self.pid_file)
            .filter(|id| Some(*id) != self.stale)
            .map(|_| read_pid_file(self.pid_file))
    }
}

/// The helper's scheduling while the runtime creates: `SCHED_IDLE`, so that
/// what it prepares then (the ticket, the spec's request, the cgroup
/// hierarchies) takes only CPU time nothing else wants, and the runtime's
/// exit wakes the caller before it; its policy back once the runtime has
/// exited, for the work `start` waits on. On two CPUs the runtime's
/// `create` through the wrapper was 0.45 ms faster so (median paired, 800
/// rounds of `create` alone; bench/README.md, runs 40–45). Only from
/// `SCHED_OTHER` or `SCHED_BATCH` (a caller's real-time or idle policy is
/// left as it is), with `SCHED_RESET_ON_FORK`: an agent the helper starts
/// never inherits it.
struct Background {
    /// The policy to go back to; None when it was left as it was.
    policy: Option<libc::c_int>,
}

impl Background {
    fn enter() -> Background {
        let policy = sched_getscheduler();
        let fair = policy.filter(|p| [libc::SCHED_OTHER, libc::SCHED_BATCH].contains(p));
        let policy = fair.filter(|_| sched_setscheduler(libc::SCHED_IDLE).is_ok());
        Background { policy }
    }

    fn leave(self) -> std::io::Result<()> {
        match self.policy {
            Some(p) => sched_setscheduler(p),
            None => Ok(()),
        }
    }
}

/// This process's policy, without `SCHED_RESET_ON_FORK`. (Raw system
/// calls: musl's wrappers are stubs that fail with ENOSYS.)
fn sched_getscheduler() -> Option<libc::c_int> {
    // SAFETY: takes a pid (0: this process), returns the policy or -1.
    let p = unsafe { libc::syscall(libc::SYS_sched_getscheduler, 0) } as libc::c_int;
    (p >= 0).then_some(p & !libc::SCHED_RESET_ON_FORK)
}

/// Set a non-real-time `policy` (priority 0), with `SCHED_RESET_ON_FORK`.
fn sched_setscheduler(policy: libc::c_int) -> std::io::Result<()> {
    // struct sched_param { int sched_priority; }
    let param: libc::c_int = 0;
    // SAFETY: pid 0 (this process), a policy, a pointer to a live sched_param.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_setscheduler,
            0,
            policy | libc::SCHED_RESET_ON_FORK,
            &param as *const libc::c_int,
        )
    };
    match r {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Leave the caller: a session of its own, stdio on /dev/null, every other
/// descriptor closed (the caller may wait for its pipes to close, and the
/// runtime's preserved descriptors are the container's).
fn detach() {
    // SAFETY: plain system calls on this process's own descriptors.
    unsafe {
        libc::setsid();
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        for fd in 0..3 {
            if null >= 0 {
                libc::dup2(null, fd);
            } else {
                libc::close(fd);
            }
        }
        if libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) != 0 {
            // Before Linux 5.9: one by one.
            let open: Vec<i32> = std::fs::read_dir("/proc/self/fd")
                .map(|d| {
                    d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                        .collect()
                })
                .unwrap_or_default();
            for fd in open.into_iter().filter(|fd| *fd >= 3) {
                libc::close(fd);
            }
        }
    }
}

/// The exit of process `pid`, this one's parent (the runtime: the
/// wrapper's exec kept its pid): a pidfd opened once, or before Linux 5.3
/// this process's reparenting.
struct RuntimeExit {
    pid: u32,
    pidfd: Option<i32>,
}

impl RuntimeExit {
    fn watch(pid: u32) -> RuntimeExit {
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) } as i32;
        RuntimeExit {
            pid,
            pidfd: (fd >= 0).then_some(fd),
        }
    }

    fn gone(&self) -> bool {
        // SAFETY: getppid has no preconditions.
        unsafe { libc::getppid() as u32 != self.pid }
    }

    /// Wait until the process has exited.
    fn wait(&self) {
        // First: a parent gone before the pidfd was opened leaves it naming
        // another process, or none.
        if self.gone() {
            return;
        }
        let Some(fd) = self.pidfd else {
            while !self.gone() {
                std::thread::sleep(Duration::from_micros(200));
            }
            return;
        };
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd owned here.
        unsafe {
            while libc::poll(&mut p, 1, -1) < 0
                && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
            {
            }
        }
    }
}

impl Drop for RuntimeExit {
    fn drop(&mut self) {
        if let Some(fd) = self.pidfd {
            // SAFETY: the pidfd this value owns, closed once.
            unsafe { libc::close(fd) };
        }
    }
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

    /// The helper's background policy: SCHED_IDLE between enter and
    /// leave, then the policy it had (this test's thread: SCHED_OTHER or a
    /// caller's SCHED_BATCH); a real-time or idle policy is left alone.
    #[test]
    fn background_is_idle_until_left() {
        let before = sched_getscheduler().unwrap();
        assert!([libc::SCHED_OTHER, libc::SCHED_BATCH].contains(&before));
        let b = Background::enter();
        assert_eq!(sched_getscheduler(), Some(libc::SCHED_IDLE));
        b.leave().unwrap();
        assert_eq!(sched_getscheduler(), Some(before));
        // Already idle: left so, and so after leave.
        sched_setscheduler(libc::SCHED_IDLE).unwrap();
        let b = Background::enter();
        assert!(b.policy.is_none());
        b.leave().unwrap();
        assert_eq!(sched_getscheduler(), Some(libc::SCHED_IDLE));
        sched_setscheduler(before).unwrap();
        assert_eq!(sched_getscheduler(), Some(before));
    }

    /// The helper's wait ends when its parent exits, not before.
    #[test]
    fn the_helper_waits_for_its_parent_to_exit() {
        let mut fds = [0; 2];
        // SAFETY: the forked processes run only system calls and
        // `RuntimeExit::wait`, then `_exit`.
        unsafe {
            assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
            let [r, w] = fds;
            match libc::fork() {
                0 => {
                    let me = std::process::id();
                    if libc::fork() == 0 {
                        let t0 = std::time::Instant::now();
                        RuntimeExit::watch(me).wait();
                        let ms = (t0.elapsed().as_millis() as u32).to_le_bytes();
                        libc::write(w, ms.as_ptr().cast(), 4);
                        libc::_exit(0)
                    }
                    std::thread::sleep(Duration::from_millis(200));
                    libc::_exit(0)
                }
                child => {
                    libc::close(w);
                    let mut st = 0;
                    libc::waitpid(child, &mut st, 0);
                    let mut b = [0u8; 4];
                    let n = libc::read(r, b.as_mut_ptr().cast(), 4);
                    libc::close(r);
                    assert_eq!(n, 4, "the grandchild reported");
                    let ms = u32::from_le_bytes(b);
                    assert!(
                        (150..5000).contains(&ms),
                        "waited {ms} ms for a 200 ms parent"
                    );
                }
            }
        }
    }
}
