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
//! The helper starts its work once this process's exec is done (a pipe
//! whose write end only this process holds, close-on-exec: the helper
//! reads its end-of-file). Before that the two share one address space and
//! CPU time on the caller's path; the helper's work at once made the
//! wrapper's `create` ≈ 0.1 ms slower in place (bench/README.md, runs 40–45).
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
    // arguments below), and the pipe whose end-of-file says the exec is done.
    let mut job = Job {
        run: Some(run),
        exec_done: None,
    };
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

    let stack = match helper_stack() {
        Ok(s) => s,
        Err(e) => return e,
    };

    job.exec_done = exec_done_pipe();
    // The runtime gets SIGPIPE's default (the Rust runtime ignores it, and
    // an exec keeps what is ignored); the helper, whose dispositions are
    // copied at the clone, ignores it again first thing (`entry`).
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
            (&mut job as *mut Job<F>).cast(),
        )
    };
    if pid < 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: as above; the helper never ran.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
            libc::munmap(stack, STACK_BYTES + GUARD_BYTES);
            if let Some([r, w]) = job.exec_done {
                libc::close(r);
                libc::close(w);
            }
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

/// The helper's stack: a fresh private mapping, its lowest page a guard.
fn helper_stack() -> std::io::Result<*mut libc::c_void> {
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
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the lowest page of the mapping just made.
    unsafe { libc::mprotect(stack, GUARD_BYTES, libc::PROT_NONE) };
    Ok(stack)
}

/// The helper's first frame, on its own stack: wait for the parent's exec
/// (the pipe's end of file), then run the job and `_exit`.
extern "C" fn entry<F: FnOnce()>(arg: *mut libc::c_void) -> libc::c_int {
    // SIGPIPE ignored again, as the wrapper had it (the helper writes
    // to a socket whose reader may be gone).
    // SAFETY: sets a signal disposition of this process.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    // SAFETY: `arg` is the parent's `job`, which stays in place: the
    // parent never returns from its exec, and the address space it
    // leaves is this child's.
    let job = unsafe { &mut *(arg as *mut Job<F>) };
    if let Some([r, w]) = job.exec_done {
        // SAFETY: this process's copies of the pipe's descriptors; the
        // read returns 0 once the parent's copy of `w` is closed (its
        // exec, or its exit), or fails.
        unsafe {
            libc::close(w);
            let mut b = 0u8;
            while libc::read(r, (&mut b as *mut u8).cast(), 1) < 0
                && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
            {
            }
            libc::close(r);
        }
    }
    if let Some(f) = job.run.take() {
        f();
    }
    // SAFETY: ends the helper without running anything of the wrapper's.
    unsafe { libc::_exit(0) }
}

/// What the helper is given: its work, and the pipe (read end, write end)
/// that tells it the exec is done.
struct Job<F> {
    run: Option<F>,
    exec_done: Option<[libc::c_int; 2]>,
}

/// A close-on-exec pipe; None when none can be made (the helper then
/// starts at once).
fn exec_done_pipe() -> Option<[libc::c_int; 2]> {
    let mut fds = [-1; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    (unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } == 0).then_some(fds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// The runtime is exec'd with the arguments given (argv\[0\] its path)
    /// and SIGPIPE at its default; the helper runs on after the exec, on
    /// memory the wrapper allocated before it (the address space the exec
    /// left to the helper), with SIGPIPE ignored, and begins only once the
    /// exec is done.
    #[test]
    fn the_helper_outlives_the_exec_on_the_memory_it_shares() {
        let d = tempfile::tempdir().unwrap();
        let (ran, helped) = (d.path().join("ran"), d.path().join("helped"));
        let script = format!(
            "printf '%s %s ' \"$0\" \"$1\" > {0}; grep '^SigIgn' /proc/$$/status >> {0}",
            ran.display()
        );
        // SAFETY: the child calls helper_then_exec and ends in exec or _exit.
        let child = unsafe { libc::fork() };
        if child == 0 {
            let message = format!("built before the clone by {}", std::process::id());
            let parent = std::process::id();
            let me = std::fs::read_link("/proc/self/exe").unwrap();
            let helped = helped.clone();
            let argv: Vec<OsString> = ["-c", &script, "name", "arg"].map(Into::into).to_vec();
            let e = helper_then_exec(
                Path::new("/bin/sh"),
                &argv,
                move || {
                    // Whether the parent had exec'd when the helper began.
                    let exe = || std::fs::read_link(format!("/proc/{parent}/exe")).ok();
                    let after_exec = exe() != Some(me.clone());
                    // Until the parent is no longer this program: it exec'd.
                    let t0 = Instant::now();
                    while exe() == Some(me.clone()) && t0.elapsed() < Duration::from_secs(5) {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    let status = std::fs::read_to_string("/proc/self/status").unwrap();
                    let ign = status
                        .lines()
                        .find(|l| l.starts_with("SigIgn"))
                        .unwrap()
                        .to_string();
                    std::fs::write(&helped, format!("{message}\n{ign}\n{after_exec}")).unwrap();
                },
                &mut Phases::start("test"),
                |_| {},
            );
            eprintln!("no helper: {e}");
            // SAFETY: ends the forked test process.
            unsafe { libc::_exit(3) }
        }
        let mut st = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { libc::waitpid(child, &mut st, 0) }, child);
        assert!(
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
            "status {st}"
        );
        let t0 = Instant::now();
        while !helped.exists() && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let sig_ign = |line: &str| {
            u64::from_str_radix(line.rsplit(['\t', ' ']).next().unwrap().trim(), 16).unwrap()
        };
        let pipe = 1u64 << (libc::SIGPIPE - 1);
        let ran = std::fs::read_to_string(&ran).unwrap();
        assert!(ran.starts_with("name arg SigIgn:"), "{ran}");
        assert_eq!(
            sig_ign(&ran) & pipe,
            0,
            "the runtime ignores SIGPIPE: {ran}"
        );
        let helped = std::fs::read_to_string(&helped).unwrap();
        let mut lines = helped.lines();
        let (msg, ign) = (lines.next().unwrap(), lines.next().unwrap());
        assert_eq!(
            lines.next(),
            Some("true"),
            "the helper began before the parent's exec was done"
        );
        assert_eq!(msg, format!("built before the clone by {child}"));
        assert_ne!(sig_ign(ign) & pipe, 0, "the helper ignores SIGPIPE: {ign}");
    }
}
