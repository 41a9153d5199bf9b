//! Debian's Podman 4.3 on private storage: its own `--root`, `--runroot`,
//! `--tmpdir`, cgroupfs under a test cgroup parent, runc, file events, and a
//! hooks directory given with `--hooks-dir` (the host's hooks.d is not read).
//! The image is a busybox rootfs imported from a local tar (no registry).
//! On drop: containers removed, mounts below the scratch directory
//! detached, the cgroup parent removed from every hierarchy.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::bundle::{populate_rootfs, text, CGROUP_PREFIX};
use crate::daemons::unmount_below;
use crate::Scratch;

pub const IMAGE: &str = "localhost/twbusybox:latest";
/// Podman's default rlimits exceed this sandbox's hard limits.
pub const ULIMITS: [&str; 4] = [
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=1024:1024",
];

pub struct Podman {
    pub dir: Scratch,
    hooks_dir: PathBuf,
    /// Absolute cgroup parent of every container (`/tw-test-podman-…`).
    pub cgroup_parent: String,
}

impl Podman {
    /// Private storage with the busybox image imported; containers run the
    /// hooks in `hooks_dir`.
    pub fn new(hooks_dir: &Path) -> Podman {
        let dir = Scratch::new("podman");
        let p = Podman {
            cgroup_parent: format!(
                "{CGROUP_PREFIX}podman-{}-{}",
                std::process::id(),
                crate::unique()
            ),
            dir,
            hooks_dir: hooks_dir.to_path_buf(),
        };
        let rootfs = p.dir.0.join("rootfs");
        populate_rootfs(&rootfs);
        let tar = p.dir.0.join("rootfs.tar");
        let st = Command::new("tar")
            .arg("-C")
            .arg(&rootfs)
            .args(["--numeric-owner", "-cf"])
            .arg(&tar)
            .arg(".")
            .status()
            .unwrap();
        assert!(st.success(), "tar of the rootfs");
        let o = p.run(&["import", &tar.to_string_lossy(), IMAGE]);
        assert!(o.status.success(), "podman import: {}", text(&o));
        p
    }

    /// `podman GLOBAL-OPTIONS ARGS`.
    pub fn command(&self, args: &[&str]) -> Command {
        let d = &self.dir.0;
        let mut c = Command::new("podman");
        c.arg("--root")
            .arg(d.join("root"))
            .arg("--runroot")
            .arg(d.join("runroot"))
            .arg("--tmpdir")
            .arg(d.join("tmp"))
            .arg("--hooks-dir")
            .arg(&self.hooks_dir)
            .args([
                "--cgroup-manager",
                "cgroupfs",
                "--events-backend",
                "file",
                "--runtime",
                "runc",
                "--storage-driver",
                "overlay",
            ])
            .args(args);
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args)
            .output()
            .expect("podman (apt-get install podman)")
    }

    /// The cgroup directory of container `id` in the v1 `controller` hierarchy.
    pub fn cgroup_dir(&self, controller: &str, id: &str) -> PathBuf {
        PathBuf::from(format!(
            "/sys/fs/cgroup/{controller}{}/libpod-{id}",
            self.cgroup_parent
        ))
    }
}

/// Remove `dir` and every directory below it (deepest first; cgroupfs
/// directories go with rmdir once empty of tasks).
fn rmdir_tree(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            rmdir_tree(&e.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self.run(&["rm", "--all", "--force", "--time", "0"]);
        unmount_below(&self.dir.0);
        for h in std::fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
        {
            rmdir_tree(&h.path().join(self.cgroup_parent.trim_start_matches('/')));
        }
    }
}
