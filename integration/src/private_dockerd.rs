//! dockerd 20.10 on a given daemon.json with everything else private
//! (data-root, exec-root, pidfile, socket as flags, so the file under test
//! stays as it is), for the installer's tests. Moved here from
//! tests/install.rs so tests/install_restart.rs can reload it too.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::daemons::{stop_child, unmount_below, DOCKER_API_VERSION};

/// dockerd on `daemon_json` with private data-root, exec-root, pidfile and
/// socket (as flags: the installed file stays as it is); on drop it and its
/// containerd are stopped by PID and its mounts below `dir` detached.
pub struct PrivateDockerd {
    child: Child,
    dir: PathBuf,
}

impl PrivateDockerd {
    pub fn start(daemon_json: &Path, dir: &Path) -> PrivateDockerd {
        let log = std::fs::File::create(dir.join("dockerd.log")).unwrap();
        let child = Command::new("dockerd")
            .arg("--config-file")
            .arg(daemon_json)
            .arg("--data-root")
            .arg(dir.join("data"))
            .arg("--exec-root")
            .arg(dir.join("x"))
            .arg("--pidfile")
            .arg(dir.join("d.pid"))
            .arg("-H")
            .arg(format!("unix://{}", dir.join("d.sock").display()))
            .args([
                "--iptables=false",
                "--ip6tables=false",
                "--ip-masq=false",
                "--ip-forward=false",
            ])
            .args(["--bridge=none", "--storage-driver=vfs"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("dockerd (apt-get install docker.io)");
        PrivateDockerd {
            child,
            dir: dir.to_path_buf(),
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("dockerd.log")).unwrap_or_default()
    }

    /// `docker info`'s runtimes (JSON), once dockerd answers.
    pub fn runtimes(&mut self) -> String {
        let t0 = Instant::now();
        loop {
            let o = Command::new("docker")
                .env("DOCKER_API_VERSION", DOCKER_API_VERSION)
                .arg("-H")
                .arg(format!("unix://{}", self.dir.join("d.sock").display()))
                .args(["info", "--format", "{{json .Runtimes}}"])
                .output()
                .unwrap();
            if o.status.success() {
                return String::from_utf8_lossy(&o.stdout).into_owned();
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("dockerd exited ({st}): {}", self.log());
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "dockerd did not answer: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for PrivateDockerd {
    fn drop(&mut self) {
        let containerd: Option<i32> =
            std::fs::read_to_string(self.dir.join("x/containerd/containerd.pid"))
                .ok()
                .and_then(|s| s.trim().parse().ok());
        stop_child(&mut self.child, Duration::from_secs(20));
        if let Some(pid) = containerd {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        unmount_below(&self.dir);
    }
}

impl PrivateDockerd {
    /// The pidfile dockerd writes (`--pidfile`).
    pub fn pidfile(&self) -> PathBuf {
        self.dir.join("d.pid")
    }
}
