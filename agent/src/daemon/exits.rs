//! The end of a container at its exit, on the paths whose front end says
//! nothing until removal: the OCI hook (CRI-O, Podman: poststop comes at
//! `crictl rm`) and the runtime wrapper (`delete`). kubelet keeps exited
//! containers for a long time, and a log ended there claims a lifetime the
//! container never had.
//!
//! Event-driven, nothing polled per container: each such container's init
//! gets a pidfd (pidfd_open(2), Linux 5.3), held in one epoll set whose
//! descriptor the agent's socket wait also wakes for. A pidfd is readable
//! once its process has exited and been left by all its threads. The log
//! ends (reason `exit`) when the init has exited **and** the cgroup has
//! held no process for two of its periods (the kernel's last throttled
//! time comes in then); the cgroup is looked at again at every poll until
//! it empties. The exit code is
//! read from the zombie's `/proc/PID/stat` while its parent has not reaped
//! it yet, checked against the pidfd (a pid number can be reused); after
//! the reap it is unknown (`null`). A later poststop or delete finds the
//! container ended and is answered with its log, closed already
//! (ended_at_exit.rs): it writes nothing.
//!
//! NRI and the shim report the exit themselves, with its code
//! (`Register::exit_reported`): their containers are not watched here.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use throttlewatch_cgroup::CpuCgroup;
use throttlewatch_core::EndReason;

/// A container whose init is watched.
struct Armed {
    pidfd: OwnedFd,
    pid: u32,
}

/// A container whose init is gone, waiting for its cgroup to empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Exited {
    pub id: u64,
    pub reason: EndReason,
    pub exit_code: Option<i32>,
    /// When its cgroup was first found empty.
    empty_since: Option<Instant>,
}

/// How long an emptied cgroup is left before its log ends: the kernel
/// adds a CPU's throttled time at its unthrottle, by the bandwidth timer at
/// the next period, after the last thread has gone (agent.rs, restart: the
/// end read at the exit was 69 ms short of the probe's count). Two of its
/// periods, within 50 ms .. 2 s.
fn settle(g: &CpuCgroup) -> Duration {
    let period = g.bandwidth().map_or(100_000, |b| b.period_us);
    Duration::from_micros(2 * period).clamp(Duration::from_millis(50), Duration::from_secs(2))
}

/// The pidfds of the watched inits, in one epoll set.
pub(crate) struct ExitWatch {
    epoll: Option<OwnedFd>,
    armed: HashMap<u64, Armed>,
    exited: Vec<Exited>,
    /// Inits found exited since [`ExitWatch::take_news`] last said so.
    news: bool,
}

impl ExitWatch {
    /// Without epoll (it cannot fail short of a descriptor limit) logs end
    /// at removal, as before; said once.
    pub(crate) fn new() -> ExitWatch {
        // SAFETY: epoll_create1 returns a new descriptor we own, or -1.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        let epoll = (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) });
        if epoll.is_none() {
            eprintln!(
                "throttlewatch agent: epoll_create1: {}; hook and wrapper logs end at removal, not at exit",
                std::io::Error::last_os_error()
            );
        }
        ExitWatch {
            epoll,
            armed: HashMap::new(),
            exited: Vec::new(),
            news: false,
        }
    }

    /// The descriptor to wait on: readable when an init has exited.
    pub(crate) fn fd(&self) -> Option<RawFd> {
        self.epoll.as_ref().map(|e| e.as_raw_fd())
    }

    /// Watch `pid`, the init of session `id` in `cgroup`. An init already
    /// gone (or a pid no longer in the cgroup: reused) counts as exited,
    /// `reason` being what its end will say then.
    pub(crate) fn arm(&mut self, id: u64, pid: u32, cgroup: &CpuCgroup, reason: EndReason) {
        let Some(epoll) = &self.epoll else { return };
        let pidfd = match pidfd_open(pid) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return self.gone(id, reason),
            Err(e) => return say_once(&format!("pidfd_open: {e}")),
        };
        // In the cgroup while the pidfd still names a live process: this pid
        // is the container's init, not a reuse of its number.
        let member = cgroup.pids().is_ok_and(|p| p.contains(&pid));
        if !member || !alive(&pidfd) {
            return self.gone(id, reason);
        }
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: id,
        };
        // SAFETY: both descriptors are open; ev outlives the call.
        let rc = unsafe {
            libc::epoll_ctl(
                epoll.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                pidfd.as_raw_fd(),
                &mut ev,
            )
        };
        if rc != 0 {
            return say_once(&format!("epoll_ctl: {}", std::io::Error::last_os_error()));
        }
        self.armed.insert(id, Armed { pidfd, pid });
    }

    fn gone(&mut self, id: u64, reason: EndReason) {
        self.news = true;
        self.exited.push(Exited {
            id,
            reason,
            exit_code: None,
            empty_since: None,
        });
    }

    /// Whether inits were found exited since the last call: the caller
    /// then looks at their cgroups ([`ExitWatch::ended`]) at once, not at
    /// the next tick.
    pub(crate) fn take_news(&mut self) -> bool {
        std::mem::take(&mut self.news)
    }

    /// Forget session `id` (it ended): its pidfd is closed, which takes it
    /// out of the epoll set.
    pub(crate) fn disarm(&mut self, id: u64) {
        self.armed.remove(&id);
        self.exited.retain(|e| e.id != id);
    }

    /// Take the inits that have exited since the last call (after the
    /// socket wait found the epoll descriptor readable).
    pub(crate) fn collect(&mut self) {
        let Some(epoll) = &self.epoll else { return };
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 64];
        loop {
            // SAFETY: evs is a valid buffer of evs.len() events.
            let n = unsafe {
                libc::epoll_wait(epoll.as_raw_fd(), evs.as_mut_ptr(), evs.len() as i32, 0)
            };
            if n <= 0 {
                return;
            }
            for ev in &evs[..n as usize] {
                let id = ev.u64;
                if let Some(a) = self.armed.remove(&id) {
                    self.news = true;
                    self.exited.push(Exited {
                        id,
                        reason: EndReason::Exit,
                        exit_code: exit_code(a.pid, &a.pidfd),
                        empty_since: None,
                    });
                }
            }
            if (n as usize) < evs.len() {
                return;
            }
        }
    }

    /// The exited containers whose cgroup is empty (or gone), taken out;
    /// the others stay for the next call. `cgroup_of(id)` is None for a
    /// session that ended meanwhile.
    pub(crate) fn ended<'a>(
        &mut self,
        cgroup_of: impl Fn(u64) -> Option<&'a CpuCgroup>,
    ) -> Vec<Exited> {
        let mut done = vec![];
        let now = Instant::now();
        self.exited.retain_mut(|e| match cgroup_of(e.id) {
            None => false,
            Some(g) if g.pids().map_or(true, |p| p.is_empty()) => {
                let since = *e.empty_since.get_or_insert(now);
                if now.duration_since(since) < settle(g) {
                    return true;
                }
                done.push(*e);
                false
            }
            Some(_) => true,
        });
        done
    }

    /// Session `id`'s exit, if its init has exited and its end waits (a
    /// front end's end that comes first ends it as exited, with its code).
    pub(crate) fn take_exited(&mut self, id: u64) -> Option<Exited> {
        let i = self.exited.iter().position(|e| e.id == id)?;
        Some(self.exited.remove(i))
    }

    /// Whether any exited container waits for its cgroup to empty.
    pub(crate) fn lingering(&self) -> bool {
        !self.exited.is_empty()
    }
}

fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open(2) with no flags returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just returned to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// The process is not reaped yet (running or a zombie): signal 0 reaches it.
fn alive(pidfd: &OwnedFd) -> bool {
    // SAFETY: pidfd_send_signal(2) with signal 0 only checks.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    rc == 0
}

/// The exit code of the zombie `pid`, as containerd and kubelet give it
/// (128 + signal for a signal), while its parent has not reaped it.
fn exit_code(pid: u32, pidfd: &OwnedFd) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Read before the check: if the pidfd's process is still there, so was
    // it when the file was read, and the pid was its own.
    if !alive(pidfd) {
        return None;
    }
    wait_status_of_stat(&stat).map(exit_code_of_wait_status)
}

/// Field 52 of /proc/PID/stat (proc(5), Linux 3.5): the wait(2) status.
pub(crate) fn wait_status_of_stat(stat: &str) -> Option<i32> {
    // Field 2 (comm) may hold spaces and parentheses: count after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_ascii_whitespace().nth(52 - 3)?.parse().ok()
}

pub(crate) fn exit_code_of_wait_status(st: i32) -> i32 {
    if libc::WIFSIGNALED(st) {
        128 + libc::WTERMSIG(st)
    } else {
        libc::WEXITSTATUS(st)
    }
}

fn say_once(what: &str) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        eprintln!("throttlewatch agent: {what}; hook and wrapper logs end at removal, not at exit");
    }
}

#[cfg(test)]
#[path = "exits_tests.rs"]
mod tests;
