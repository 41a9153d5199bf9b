//! The helper of the wrapper's fail-open `create` (see create.rs): while
//! the runtime creates, at `SCHED_IDLE`, it writes the start ticket and
//! prepares; once the runtime has exited it reads the pid file and does the
//! create work (QoS, register) beside the caller's `start`.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use throttlewatch_core::config::Config;
use throttlewatch_core::ContainerKey;
use throttlewatch_lifecycle::create_marks::CreateMarks;
use throttlewatch_lifecycle::created::{
    on_prepared, prepare, read_pid_file, Answer, Created, PidFileError, Prepared,
};
use throttlewatch_lifecycle::report::Reporter;
use throttlewatch_lifecycle::timing::Phases;
use throttlewatch_lifecycle::{BundleSpec, HookStage, SpecFile};

use crate::runlog::NAME;

/// A file's identity: runc writes the pid file by rename, so a new one is
/// another inode or at least another change time.
pub(crate) type FileId = (u64, u64, i64, i64);

pub(crate) fn file_id(p: &Path) -> Option<FileId> {
    std::fs::symlink_metadata(p)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}

/// How long the helper stays once its work is done (see `Helper::run`):
/// a caller's `start` follows its `create` within milliseconds.
const EXIT_AFTER: Duration = Duration::from_millis(100);

/// The helper's share of `create` (see the module).
pub(crate) struct Helper<'a> {
    /// The wrapper's pid, which the runtime's `create` keeps across exec.
    pub(crate) runtime_pid: u32,
    /// The runtime it execs (for the start ticket).
    pub(crate) runtime: &'a Path,
    pub(crate) cfg: &'a Config,
    pub(crate) config_path: Option<&'a Path>,
    /// config.json as written (typed by the helper).
    pub(crate) spec: &'a SpecFile,
    pub(crate) key: &'a ContainerKey,
    pub(crate) bundle: PathBuf,
    pub(crate) pid_file: &'a Path,
    pub(crate) stale: Option<FileId>,
    /// The pid file is ours (`<state_dir>/pids/`): removed once read.
    pub(crate) ours: bool,
    /// When the wrapper was asked to create (the register's create time).
    pub(crate) created_ns: u64,
}

impl Helper<'_> {
    pub(crate) fn run(self) {
        // While the runtime creates: the CPUs only when idle (see Background).
        let background = Background::enter();
        detach();
        let mut t = Phases::start(NAME);
        t.name(&format!("{NAME} created"));
        let marks = CreateMarks::new(&self.cfg.state_dir, self.key);
        let mut rep = Reporter::new(self.cfg, HookStage::CreateRuntime, NAME);
        rep.set_container(&self.key.id);
        let ticketed = self.write_ticket(&marks, &mut rep);
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
        if let Err(e) = self.register(&mut rep, &spec, pid, prepared, &mut t) {
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

    /// What `start` needs, so that it loads no configuration; whether it
    /// was written.
    fn write_ticket(&self, marks: &CreateMarks, rep: &mut Reporter) -> bool {
        let ticket = crate::ticket::Ticket {
            config: self.config_path.map(Path::to_path_buf),
            runtime: self.runtime.to_path_buf(),
            pending: marks.state().pending_file(self.key),
        };
        crate::ticket::write(self.key, &ticket)
            .map_err(|e| {
                rep.warn(&format!(
                    "no start ticket ({e}): its start loads the configuration"
                ))
            })
            .is_ok()
    }

    /// The create work on the created container: QoS and the register.
    fn register(
        &self,
        rep: &mut Reporter,
        spec: &BundleSpec,
        pid: Result<u32, PidFileError>,
        prepared: Prepared,
        t: &mut Phases,
    ) -> anyhow::Result<()> {
        // As a message: its words already name the cause, which `{:#}` would repeat.
        let pid = pid.map_err(anyhow::Error::msg)?;
        let c = Created {
            key: self.key,
            bundle: &self.bundle,
            pid,
            spec,
            created_ns: Some(self.created_ns),
            exit_reported: false,
        };
        on_prepared(
            self.cfg,
            self.config_path,
            rep,
            c,
            prepared,
            Answer::AtStart,
            t,
        )
        .map_err(|e| match Path::new(&format!("/proc/{pid}")).exists() {
            true => e,
            false => e.context(format!(
                "init process {pid} gone (deleted before its start)"
            )),
        })
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
