//! Terminals, as containerd's runc shim does them: runc `--console-socket`
//! sends the pty master over a unix socket (SCM_RIGHTS); the shim copies
//! master → stdout fifo and stdin fifo → master, and applies ResizePty to
//! the master (TIOCSWINSZ).

use std::fs::File;
use std::io::{IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use log::warn;
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};

const COPY_STACK: usize = 64 * 1024;

/// A listening socket for one `runc create/exec --console-socket`, in a
/// fresh directory of its own (mkdtemp: 0700, unpredictable name), so no
/// other user of the shared temp directory can bind the name first or
/// connect to it; both are removed on drop.
pub struct ConsoleSocket {
    listener: UnixListener,
    path: PathBuf,
}

impl ConsoleSocket {
    pub fn new() -> std::io::Result<ConsoleSocket> {
        let dir = nix::unistd::mkdtemp(&std::env::temp_dir().join("tw-pty-XXXXXX"))?;
        let path = dir.join("console.sock");
        let listener = UnixListener::bind(&path).inspect_err(|_| {
            let _ = std::fs::remove_dir(&dir);
        })?;
        Ok(ConsoleSocket { listener, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The pty master runc sent (runc has returned by now; the connection
    /// and its message wait in the socket's backlog).
    pub fn receive(&self, timeout: Duration) -> std::io::Result<File> {
        self.listener.set_nonblocking(true)?;
        let t0 = Instant::now();
        let stream = loop {
            match self.listener.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && t0.elapsed() < timeout => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    return Err(std::io::Error::new(
                        e.kind(),
                        "runc did not connect to the console socket",
                    ));
                }
                Err(e) => return Err(e),
            }
        };
        stream.set_nonblocking(false)?;
        stream.set_read_timeout(Some(timeout))?;
        let mut name = [0u8; 256]; // runc sends the pty's name as the payload
        let mut iov = [IoSliceMut::new(&mut name)];
        let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
        let msg = recvmsg::<()>(
            stream.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )?;
        let mut fds: Vec<OwnedFd> = vec![];
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                // SAFETY: descriptors just received are ours alone.
                fds.extend(
                    raw.into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        let master = fds.into_iter().next();
        master.map(File::from).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "no descriptor in runc's message",
            )
        })
    }
}

impl Drop for ConsoleSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        if let Some(dir) = self.path.parent() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// A pty master and its copy threads. Dropping it closes the master (our
/// copy) and stops the stdin copy.
#[derive(Debug)]
pub struct Console {
    master: File,
    /// Write end of the stdin copy's stop pipe: closing it wakes the thread.
    stop: Option<File>,
    /// Disconnected when the output copy has ended (the last slave closed
    /// and everything it wrote is in the stdout fifo).
    out_done: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl Console {
    /// `input`: the stdin fifo (None: no stdin); `output`: the stdout fifo.
    pub fn start(master: File, input: Option<File>, output: File) -> std::io::Result<Console> {
        let out_master = master.try_clone()?;
        let (done, out_done) = std::sync::mpsc::channel::<()>();
        spawn("pty-out", move || {
            copy_out(out_master, output);
            drop(done);
        })?;
        let mut stop = None;
        if let Some(input) = input {
            let (r, w) = nix::unistd::pipe()?;
            let in_master = master.try_clone()?;
            spawn("pty-in", move || copy_in(input, in_master, File::from(r)))?;
            stop = Some(File::from(w));
        }
        Ok(Console {
            master,
            stop,
            out_done: std::sync::Mutex::new(out_done),
        })
    }

    /// Wait up to `limit` for the output copy to end: once the process has
    /// exited, what it wrote last is still in the pty until the copy reads
    /// it, and containerd's client stops reading stdout once it sees the
    /// exit. False: still copying (another process holds the terminal).
    pub fn wait_output(&self, limit: Duration) -> bool {
        let rx = self.out_done.lock().unwrap_or_else(|e| e.into_inner());
        !matches!(
            rx.recv_timeout(limit),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout)
        )
    }

    pub fn resize(&self, width: u32, height: u32) -> std::io::Result<()> {
        let ws = libc::winsize {
            ws_row: u16::try_from(height).unwrap_or(u16::MAX),
            ws_col: u16::try_from(width).unwrap_or(u16::MAX),
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ with a valid winsize on a pty master we own.
        if unsafe { libc::ioctl(self.master.as_raw_fd(), libc::TIOCSWINSZ, &ws) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        self.stop.take();
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name(name.into())
        .stack_size(COPY_STACK)
        .spawn(f)
        .map(drop)
}

/// master → stdout until the last slave descriptor closes (EIO); then the
/// stdout fifo closes and containerd's copy sees EOF.
fn copy_out(mut master: File, mut output: File) {
    let mut buf = [0u8; 8192];
    loop {
        match master.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if let Err(e) = output.write_all(&buf[..n]) {
                    warn!("pty → stdout: {e}");
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.raw_os_error() == Some(libc::EIO) => break,
            Err(e) => {
                warn!("pty read: {e}");
                break;
            }
        }
    }
}

/// stdin fifo → master until stdin ends (containerd's writer and our keeper
/// closed) or the console is dropped (the stop pipe's writer closes).
fn copy_in(mut input: File, mut master: File, stop: File) {
    let mut buf = [0u8; 8192];
    loop {
        let mut fds = [
            libc::pollfd {
                fd: input.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: poll(2) on two valid descriptors.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if r < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        if fds[1].revents != 0 {
            break;
        }
        match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if master.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new pty: (master, slave) descriptors, the caller's to close.
    fn openpty() -> (i32, i32) {
        let (mut master, mut slave) = (0, 0);
        // SAFETY: openpty with valid out-pointers.
        let rc = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
        (master, slave)
    }

    /// A fake runc: connect to the console socket and send a pty master.
    #[test]
    fn master_arrives_over_the_socket_and_resizes() {
        let sock = ConsoleSocket::new().unwrap();
        let (master, slave) = openpty();
        let c = std::os::unix::net::UnixStream::connect(sock.path()).unwrap();
        let fds = [master];
        let cmsg = [nix::sys::socket::ControlMessage::ScmRights(&fds)];
        let iov = [std::io::IoSlice::new(b"/dev/pts/x")];
        nix::sys::socket::sendmsg::<()>(c.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None)
            .unwrap();
        let got = sock.receive(Duration::from_secs(2)).unwrap();
        // SAFETY: closing the descriptors openpty gave us (the master was duplicated by sending).
        unsafe { libc::close(master) };
        let (devnull, rx) = (File::create("/dev/null").unwrap(), None);
        let console = Console::start(got, rx, devnull).unwrap();
        console.resize(101, 33).unwrap();
        let mut ws = libc::winsize {
            ws_row: 0,
            ws_col: 0,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCGWINSZ into a valid winsize.
        assert_eq!(unsafe { libc::ioctl(slave, libc::TIOCGWINSZ, &mut ws) }, 0);
        assert_eq!((ws.ws_row, ws.ws_col), (33, 101));
        // SAFETY: our slave descriptor.
        unsafe { libc::close(slave) };
        let path = sock.path().to_path_buf();
        drop(sock);
        assert!(!path.exists(), "socket file removed");
        assert!(!path.parent().unwrap().exists(), "its directory too");
    }

    /// The output copy ends once the last slave descriptor is closed, with
    /// everything written before in the output; until then `wait_output`
    /// says it is still copying.
    #[test]
    fn wait_output_ends_after_the_last_write_is_copied() {
        let (master, slave) = openpty();
        // SAFETY: descriptors openpty just gave us, owned from here on.
        let (master, mut slave) = unsafe { (File::from_raw_fd(master), File::from_raw_fd(slave)) };
        let (r, w) = nix::unistd::pipe().unwrap();
        let console = Console::start(master, None, File::from(w)).unwrap();
        slave.write_all(b"first\n").unwrap();
        assert!(
            !console.wait_output(Duration::from_millis(100)),
            "the slave is open: still copying"
        );
        slave.write_all(b"last line\n").unwrap();
        drop(slave);
        assert!(console.wait_output(Duration::from_secs(5)), "copy ended");
        let mut out = String::new();
        File::from(r).read_to_string(&mut out).unwrap();
        assert!(
            out.contains("first") && out.ends_with("last line\r\n"),
            "{out:?}"
        );
        assert!(console.wait_output(Duration::ZERO), "and stays ended");
    }

    /// Issue 11: not a predictable name in the shared temp directory, but a
    /// private (0700) directory of its own.
    #[test]
    fn the_socket_lives_in_a_private_directory() {
        use std::os::unix::fs::PermissionsExt;
        let (a, b) = (ConsoleSocket::new().unwrap(), ConsoleSocket::new().unwrap());
        let dir = a.path().parent().unwrap();
        assert_ne!(dir, std::env::temp_dir());
        assert_ne!(dir, b.path().parent().unwrap());
        let mode = std::fs::metadata(dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{}", dir.display());
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        assert!(!name.contains(&std::process::id().to_string()), "{name}");
    }

    #[test]
    fn no_connection_is_a_timeout_error() {
        let sock = ConsoleSocket::new().unwrap();
        let e = sock.receive(Duration::from_millis(50)).unwrap_err();
        assert!(e.to_string().contains("did not connect"), "{e}");
    }
}
