//! Start `create`'s helper and exec the runtime, with no copy of the
//! wrapper's memory: the helper is a child that shares this address space
//! (`clone(CLONE_VM)`, a stack of its own, its own descriptor table and
//! signal dispositions), and this process execs at once. The exec gives
//! this process a new address space and leaves the old one to the helper,
//! which frees it when it exits. A `fork` instead copies the page tables
//! of everything the wrapper touched (its arena, the spec's document), and
//! the exec then tears them down on the caller's path: 50-60 µs more for
//! the caller here, and copy-on-write faults for the helper.
//!
//! What makes sharing sound: after the clone this process runs nothing but
//! `execve` on arguments built before it (no allocation, no lock, no
//! thread-local state, SIGPIPE already back to its default for the
//! runtime). The helper never writes what `execve` reads: the argument
//! strings and arrays are this frame's, allocated after everything the
//! helper owns, so the arena's in-place free of its latest allocation
//! never reaches them. Only a failed exec returns here, to say so and exit.

use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use throttlewatch_lifecycle::timing::Phases;

/// The helper's stack (untouched pages cost nothing), and a guard page
/// below it.
const STACK_BYTES: usize = 2 << 20;
const GUARD_BYTES: usize = 4096;

extern "C" {
    static environ: *const *const libc::c_char;
}

/// Run `run` in a child sharing this address space, then replace this
/// process with `runtime argv...` (argv\[0\] is the runtime's path, as
/// `Command` sets it). Returns only when no helper could be started
/// (nothing is shared then: the caller goes on alone); when the exec
/// fails, `exec_failed` is told why and the process exits 127 without
/// leaving this frame (the helper may not have taken `run` from it yet).
pub fn helper_then_exec<F: FnOnce()>(
    runtime: &Path,
    argv: &[OsString],
    run: F,
    t: &mut Phases,
    exec_failed: impl FnOnce(std::io::Error),
) -> std::io::Error {
    let cstr = |b: &[u8]| CString::new(b).map_err(std::io::Error::other);
    let path = match cstr(runtime.as_os_str().as_bytes()) {
        Ok(p) => p,
        Err(e) => return e,
    };
    // The helper's closure (what it owns was allocated before the
    // arguments below).
    let mut job: Option<F> = Some(run);
    let args: Result<Vec<CString>, _> = argv.iter().map(|a| cstr(a.as_bytes())).collect();
    let args = match args {
        Ok(a) => a,
        Err(e) => return e,
    };
    let mut ptrs: Vec<*const libc::c_char> = Vec::with_capacity(args.len() + 2);
    ptrs.push(path.as_ptr());
    ptrs.extend(args.iter().map(|a| a.as_ptr()));
    ptrs.push(std::ptr::null());
    t.mark("argv");
    t.finish();

    // SAFETY: a fresh private mapping; the guard page is part of it.
    let stack = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            STACK_BYTES + GUARD_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if stack == libc::MAP_FAILED {
        return std::io::Error::last_os_error();
    }
    // SAFETY: the lowest page of the mapping just made.
    unsafe { libc::mprotect(stack, GUARD_BYTES, libc::PROT_NONE) };

    extern "C" fn entry<F: FnOnce()>(arg: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `arg` is the parent's `job`, which stays in place: the
        // parent never returns from its exec, and the address space it
        // leaves is this child's.
        let job = unsafe { &mut *(arg as *mut Option<F>) };
        if let Some(f) = job.take() {
            f();
        }
        // SAFETY: ends the helper without running anything of the wrapper's.
        unsafe { libc::_exit(0) }
    }

    // The runtime gets SIGPIPE's default (the Rust runtime ignores it);
    // the helper, whose dispositions are copied at the clone, ignores it
    // again first thing.
    // SAFETY: sets a signal disposition of this process.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    // SAFETY: the child runs `entry` on its own stack (the top of the
    // mapping, 16-byte aligned) and ends in `_exit`; CLONE_VM without
    // CLONE_THREAD, CLONE_FILES or CLONE_SIGHAND: a process of its own
    // sharing only memory, whose exit is reported to this pid (SIGCHLD).
    let pid = unsafe {
        libc::clone(
            entry::<F>,
            (stack as *mut u8).add(STACK_BYTES + GUARD_BYTES).cast(),
            libc::CLONE_VM | libc::SIGCHLD,
            (&mut job as *mut Option<F>).cast(),
        )
    };
    if pid < 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: as above; the helper never ran.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
            libc::munmap(stack, STACK_BYTES + GUARD_BYTES);
        }
        return e;
    }
    // SAFETY: NUL-terminated strings and arrays built above, alive here.
    unsafe { libc::execve(path.as_ptr(), ptrs.as_ptr(), environ) };
    exec_failed(std::io::Error::last_os_error());
    // SAFETY: ends this process at once (no exit handlers: their state is
    // shared with the helper).
    unsafe { libc::_exit(127) }
}
