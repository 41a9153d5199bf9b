//! A process's stdio, the way containerd's runc shim provides it.
//!
//! Without a terminal, containerd's fifos are handed to runc as the
//! container's stdio (no copy threads). The shim also keeps a writer on the
//! stdin fifo, so a container that reads stdin before containerd has opened
//! its end blocks instead of reading EOF; the writer is dropped on CloseIO
//! (ctr and the CRI send it when their input ends), and the container then
//! sees EOF once containerd's own writer is closed too.
//!
//! With a terminal, runc sends the pty master over a console socket and the
//! shim copies between it and the fifos (see `console.rs`).

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use crate::console::{Console, ConsoleSocket};
use crate::runc_error::RuncError;

/// How long runc may take to send the pty master after `create`/`exec` returned.
const CONSOLE_TIMEOUT: Duration = Duration::from_secs(10);

/// The three stdio files runc passes on to the container process.
pub struct Stdio3 {
    pub stdin: File,
    pub stdout: File,
    pub stderr: File,
}

impl Stdio3 {
    /// containerd's fifos, and our writer on the stdin fifo (if there is one).
    pub fn open(
        stdin: &str,
        stdout: &str,
        stderr: &str,
    ) -> std::io::Result<(Stdio3, Option<File>)> {
        let (stdin, keeper) = open_input(stdin)?;
        Ok((
            Stdio3 {
                stdin,
                stdout: open_output(stdout)?,
                stderr: open_output(stderr)?,
            },
            keeper,
        ))
    }

    /// runc's own stdio when the process gets a terminal.
    pub fn null() -> std::io::Result<Stdio3> {
        let w = || OpenOptions::new().write(true).open("/dev/null");
        Ok(Stdio3 {
            stdin: File::open("/dev/null")?,
            stdout: w()?,
            stderr: w()?,
        })
    }
}

fn clear_nonblock(f: &File) -> std::io::Result<()> {
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        if flags < 0 || libc::fcntl(f.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The read end of a stdin fifo (blocking), and our writer on it that keeps
/// reads from seeing EOF before containerd's writer comes.
pub fn open_input(path: &str) -> std::io::Result<(File, Option<File>)> {
    if path.is_empty() {
        return Ok((File::open("/dev/null")?, None));
    }
    let with = |e: std::io::Error| std::io::Error::new(e.kind(), format!("{path}: {e}"));
    // O_NONBLOCK: the open does not wait for a writer; then a writer of our
    // own opens at once, since a reader exists.
    let r = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(with)?;
    let w = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(with)?;
    clear_nonblock(&r)?;
    Ok((r, Some(w)))
}

/// The write end of a stdout/stderr fifo (blocking writes).
pub fn open_output(path: &str) -> std::io::Result<File> {
    if path.is_empty() {
        return OpenOptions::new().write(true).open("/dev/null");
    }
    let with = |e: std::io::Error| std::io::Error::new(e.kind(), format!("{path}: {e}"));
    // A reader is normally there already (containerd opens its end first);
    // without one, O_RDWR keeps the open from blocking.
    let f = match OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(with)?,
        Err(e) => return Err(with(e)),
    };
    clear_nonblock(&f)?;
    Ok(f)
}

/// Why a process could not be started with its stdio: the step that failed
/// and what the system (or runc) answered.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("open stdio: {0}")]
    Stdio(std::io::Error),
    #[error("open stdin: {0}")]
    Stdin(std::io::Error),
    #[error("open stdout: {0}")]
    Stdout(std::io::Error),
    #[error("console socket: {0}")]
    ConsoleSocket(std::io::Error),
    #[error("open /dev/null: {0}")]
    DevNull(std::io::Error),
    #[error("receive the pty master from runc: {0}")]
    PtyMaster(std::io::Error),
    #[error("console copy: {0}")]
    ConsoleCopy(std::io::Error),
    /// `runc create` or `runc exec` itself failed.
    #[error(transparent)]
    Runc(#[from] RuncError),
}

/// What the shim holds of a running process's IO; dropped with the process.
#[derive(Debug, Default)]
pub struct ProcIo {
    stdin_keeper: Mutex<Option<File>>,
    console: Option<Console>,
}

impl ProcIo {
    /// Start a process through `run` (runc create or exec, given runc's stdio
    /// and, for a terminal, the console socket) with containerd's fifos.
    pub fn launch(
        stdin: &str,
        stdout: &str,
        stderr: &str,
        terminal: bool,
        run: impl FnOnce(Stdio3, Option<&Path>) -> Result<u32, RuncError>,
    ) -> Result<(u32, ProcIo), LaunchError> {
        if !terminal {
            let (stdio, keeper) =
                Stdio3::open(stdin, stdout, stderr).map_err(LaunchError::Stdio)?;
            let pid = run(stdio, None)?;
            return Ok((
                pid,
                ProcIo {
                    stdin_keeper: Mutex::new(keeper),
                    console: None,
                },
            ));
        }
        // Open the fifos first: a failure then leaves no process behind.
        let (input, keeper) = open_input(stdin).map_err(LaunchError::Stdin)?;
        let output = open_output(stdout).map_err(LaunchError::Stdout)?;
        let socket = ConsoleSocket::new().map_err(LaunchError::ConsoleSocket)?;
        let stdio = Stdio3::null().map_err(LaunchError::DevNull)?;
        let pid = run(stdio, Some(socket.path()))?;
        let master = socket
            .receive(CONSOLE_TIMEOUT)
            .map_err(LaunchError::PtyMaster)?;
        let input = if stdin.is_empty() { None } else { Some(input) };
        let console = Console::start(master, input, output).map_err(LaunchError::ConsoleCopy)?;
        Ok((
            pid,
            ProcIo {
                stdin_keeper: Mutex::new(keeper),
                console: Some(console),
            },
        ))
    }

    /// CloseIO(stdin): the process sees EOF once containerd's writer is closed.
    pub fn close_stdin(&self) {
        self.stdin_keeper
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
    }

    /// Wait up to `limit` for a terminal's output to be copied out (see
    /// [`Console::wait_output`]); at once without a terminal.
    pub fn wait_output(&self, limit: std::time::Duration) -> bool {
        self.console.as_ref().is_none_or(|c| c.wait_output(limit))
    }

    /// ResizePty; a process without a terminal ignores it (as in the runc shim).
    pub fn resize(&self, width: u32, height: u32) -> std::io::Result<()> {
        match &self.console {
            Some(c) => c.resize(width, height),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    fn fifo(dir: &Path, name: &str) -> String {
        let f = dir.join(name);
        nix::unistd::mkfifo(&f, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        f.to_string_lossy().into_owned()
    }

    #[test]
    fn stdio_opens_fifos_without_blocking() {
        let d = tempfile::tempdir().unwrap();
        let f = fifo(d.path(), "out");
        let (s, keeper) = Stdio3::open(&f, &f, "").unwrap();
        assert!(keeper.is_some());
        drop(s);
        let (_, keeper) = Stdio3::open("", "", "").unwrap();
        assert!(keeper.is_none());
    }

    #[test]
    fn stdin_waits_for_a_writer_until_closed() {
        let d = tempfile::tempdir().unwrap();
        let path = fifo(d.path(), "in");
        let (mut r, keeper) = open_input(&path).unwrap();
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            let mut w = OpenOptions::new().write(true).open(&path).unwrap();
            w.write_all(b"hi\n").unwrap();
            drop(w);
            drop(keeper); // CloseIO
        });
        let mut got = String::new();
        r.read_to_string(&mut got).unwrap();
        assert_eq!(
            got, "hi\n",
            "read waited for the late writer, then EOF after CloseIO"
        );
        late.join().unwrap();
    }

    #[test]
    fn missing_fifos_are_clear_errors() {
        let e = open_input("/nonexistent/stdin").unwrap_err();
        assert!(e.to_string().contains("/nonexistent/stdin"), "{e}");
        let e = ProcIo::launch("", "/nonexistent/out", "", true, |_, _| Ok(1)).unwrap_err();
        assert!(matches!(e, LaunchError::Stdout(_)), "{e:?}");
        assert!(
            e.to_string().starts_with("open stdout: /nonexistent/out: "),
            "{e}"
        );
    }
}
