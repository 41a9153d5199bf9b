//! The `tw_iter_watched` task iterator run over the threads of the processes
//! in one cgroup instead of every task on the node (the walk is on
//! the register path, and its cost grew with the node's task count).
//!
//! A task iterator link created with `bpf_iter_link_info.task.pid` walks the
//! threads of that process only (Linux 6.1, `bpf_iter_attach_task`). Older
//! kernels ignore the link info of task iterators and walk every task, which
//! is what the node-wide link does: correct either way. libbpf-rs 0.25 has
//! no call for it, so the two bpf(2) commands are made here.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_ITER_CREATE: libc::c_long = 33;
const BPF_TRACE_ITER: u32 = 28;

/// `union bpf_iter_link_info`, its `task` member (16 bytes: the union's size).
#[repr(C)]
#[derive(Default)]
struct IterTask {
    tid: u32,
    pid: u32,
    pid_fd: u32,
    _pad: u32,
}

/// `union bpf_attr`, its `link_create` member for an iterator.
#[repr(C, align(8))]
#[derive(Default)]
struct LinkCreate {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    iter_info: u64,
    iter_info_len: u32,
    _pad: u32,
}

/// `union bpf_attr`, its `iter_create` member.
#[repr(C, align(8))]
#[derive(Default)]
struct IterCreate {
    link_fd: u32,
    flags: u32,
}

fn bpf<T>(cmd: libc::c_long, attr: &T) -> std::io::Result<OwnedFd> {
    // SAFETY: attr is a live, initialised value of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *const T,
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor the kernel just returned to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Run the task iterator `prog` over the threads of process `pid`.
pub fn run_for_process(prog: BorrowedFd<'_>, pid: u32) -> std::io::Result<()> {
    let info = IterTask {
        pid,
        ..Default::default()
    };
    let link = bpf(
        BPF_LINK_CREATE,
        &LinkCreate {
            prog_fd: prog.as_raw_fd() as u32,
            attach_type: BPF_TRACE_ITER,
            iter_info: &info as *const IterTask as u64,
            iter_info_len: std::mem::size_of::<IterTask>() as u32,
            ..Default::default()
        },
    )?;
    let it = bpf(
        BPF_ITER_CREATE,
        &IterCreate {
            link_fd: link.as_raw_fd() as u32,
            flags: 0,
        },
    )?;
    std::io::copy(&mut std::fs::File::from(it), &mut std::io::sink())?;
    Ok(())
}

/// The processes listed in a cgroup's `cgroup.procs`.
pub fn procs(file: &std::path::Path) -> std::io::Result<Vec<u32>> {
    let s = std::fs::read_to_string(file)?;
    s.lines()
        .map(|l| {
            l.trim().parse().map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: {l:?} is not a pid", file.display()),
                )
            })
        })
        .collect()
}

/// Runs the iterator over every process in a cgroup's `cgroup.procs`.
pub fn run_for_group(prog: BorrowedFd<'_>, procs_file: &std::path::Path) -> std::io::Result<()> {
    procs(procs_file)?
        .into_iter()
        .try_for_each(|pid| run_for_process(prog, pid))
}
