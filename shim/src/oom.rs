//! OOM kills in a container's memory cgroup, published as `TaskOOM` the way
//! the runc shim does (containerd's `pkg/oom/v1` epoll on an eventfd
//! registered in `cgroup.event_control` for `memory.oom_control`;
//! `internal/oom/v2` watching `memory.events` for a higher `oom_kill`).
//! containerd's CRI turns the event into the container's `OOMKilled` reason.
//!
//! One thread per container, blocked in the kernel until something happens;
//! it ends when the cgroup goes away (v1: the eventfd fires on rmdir; v2:
//! the watch is dropped with the file).

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use throttlewatch_cgroup::{memory_dir_of, oom_kills, CgroupMode};

/// Watch the memory cgroup of `pid`; `on_oom` runs once per OOM event.
/// Err when the cgroup cannot be watched (no memory controller, no files).
pub fn watch(pid: u32, on_oom: impl Fn() + Send + 'static) -> std::io::Result<()> {
    let (dir, mode) = memory_dir_of(pid).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("no memory cgroup for process {pid}"),
        )
    })?;
    let waiter = match mode {
        CgroupMode::V1 => Waiter::v1(&dir)?,
        CgroupMode::V2 => Waiter::v2(&dir)?,
    };
    std::thread::Builder::new()
        .name("oom".into())
        .spawn(move || waiter.run(&dir, mode, on_oom))?;
    Ok(())
}

enum Waiter {
    /// An eventfd the kernel signals on OOM (and on the cgroup's removal).
    V1 { efd: OwnedFd, _control: File },
    /// An inotify instance watching `memory.events`.
    V2 { ifd: OwnedFd },
}

fn owned(fd: i32) -> std::io::Result<OwnedFd> {
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor this function's caller just created.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl Waiter {
    fn v1(dir: &Path) -> std::io::Result<Waiter> {
        let control = File::open(dir.join("memory.oom_control"))?;
        // SAFETY: eventfd(2) with no pointers.
        let efd = owned(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) })?;
        let mut ev = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join("cgroup.event_control"))?;
        ev.write_all(format!("{} {}", efd.as_raw_fd(), control.as_raw_fd()).as_bytes())?;
        Ok(Waiter::V1 {
            efd,
            _control: control,
        })
    }

    fn v2(dir: &Path) -> std::io::Result<Waiter> {
        // SAFETY: inotify_init1(2) with no pointers.
        let ifd = owned(unsafe { libc::inotify_init1(libc::IN_CLOEXEC) })?;
        let path = std::ffi::CString::new(
            dir.join("memory.events")
                .into_os_string()
                .into_encoded_bytes(),
        )
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        // SAFETY: a valid descriptor and C string.
        let wd =
            unsafe { libc::inotify_add_watch(ifd.as_raw_fd(), path.as_ptr(), libc::IN_MODIFY) };
        if wd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Waiter::V2 { ifd })
    }

    fn run(self, dir: &Path, mode: CgroupMode, on_oom: impl Fn()) {
        let mut seen = oom_kills(dir, mode).unwrap_or(0);
        let mut buf = [0u8; 4096];
        loop {
            let fd = match &self {
                Waiter::V1 { efd, .. } => efd.as_raw_fd(),
                Waiter::V2 { ifd } => ifd.as_raw_fd(),
            };
            // SAFETY: reading into a buffer of its stated length.
            let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return;
            }
            if !dir.exists() {
                return; // the cgroup is gone: its container too
            }
            match (&self, oom_kills(dir, mode)) {
                // v1 signals OOM itself (the runc shim publishes each one).
                (Waiter::V1 { .. }, now) => {
                    seen = now.unwrap_or(seen);
                    on_oom();
                }
                // v2 signals any change of memory.events: only a new kill counts.
                (Waiter::V2 { .. }, Some(now)) if now > seen => {
                    seen = now;
                    on_oom();
                }
                (Waiter::V2 { .. }, _) => {}
            }
        }
    }
}
