//! The layout of the state directory (`state_dir`, default
//! `/run/throttlewatch`): every file and directory under it is named here
//! once, and every file in it is written by [`write_atomic`].
//!
//! ```text
//! agent.lock               the agent's single-instance flock
//! containers/<id>.json     a watched container, persisted by the agent (restart → resume)
//! bursts/<id>.json         the CFS burst the hook applied (the wrapper/shim restore it on update)
//! cpusets/                 exclusive cpuset holdings (throttlewatch-qos: cpusets.json, cpusets.lock)
//! unwatched/<id>           a container the agent was never told about (the hook skips its unregister)
//! control/<id>.json        the bandwidth a controlled container had before the agent moved it (restored after a crash)
//! pending/<id>             a register sent by the wrapper's `create` and not yet confirmed: the init pid (its `start` waits for the watch)
//! pids/<pid>               the init pid of a `create` the wrapper runs (its --pid-file when the caller gave none; removed at once)
//! nri/<id>.json            a container the NRI plugin registered (a Synchronize ends it once the runtime no longer runs it)
//! ```
//! `<id>` is the container's [`ContainerKey::file_stem`]: the id escaped like
//! the log file names (so it never leaves its directory), then `@<scope>`
//! when the container has a scope (a runc root or containerd namespace).

use std::fs::{DirBuilder, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::container_key::ContainerKey;

pub const AGENT_LOCK: &str = "agent.lock";
pub const CONTAINERS_DIR: &str = "containers";
pub const BURSTS_DIR: &str = "bursts";
pub const CPUSETS_DIR: &str = "cpusets";
pub const UNWATCHED_DIR: &str = "unwatched";
pub const CONTROL_DIR: &str = "control";
pub const PIDS_DIR: &str = "pids";
pub const PENDING_DIR: &str = "pending";
pub const ANSWERED_DIR: &str = "answered";
pub const NRI_DIR: &str = "nri";
/// Mode of the state directory and its subdirectories.
pub const DIR_MODE: u32 = 0o700;
/// Mode of the files in it.
pub const FILE_MODE: u32 = 0o600;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateDir {
    root: PathBuf,
}

impl StateDir {
    pub fn new(root: impl Into<PathBuf>) -> StateDir {
        StateDir { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn agent_lock(&self) -> PathBuf {
        self.root.join(AGENT_LOCK)
    }

    pub fn containers_dir(&self) -> PathBuf {
        self.root.join(CONTAINERS_DIR)
    }

    /// `containers/<key>.json`.
    pub fn container_file(&self, key: &ContainerKey) -> PathBuf {
        self.containers_dir()
            .join(format!("{}.json", key.file_stem()))
    }

    pub fn bursts_dir(&self) -> PathBuf {
        self.root.join(BURSTS_DIR)
    }

    /// `bursts/<key>.json`.
    pub fn burst_file(&self, key: &ContainerKey) -> PathBuf {
        self.bursts_dir().join(format!("{}.json", key.file_stem()))
    }

    pub fn control_dir(&self) -> PathBuf {
        self.root.join(CONTROL_DIR)
    }

    /// `control/<key>.json`.
    pub fn control_file(&self, key: &ContainerKey) -> PathBuf {
        self.control_dir().join(format!("{}.json", key.file_stem()))
    }

    pub fn cpusets_dir(&self) -> PathBuf {
        self.root.join(CPUSETS_DIR)
    }

    pub fn unwatched_dir(&self) -> PathBuf {
        self.root.join(UNWATCHED_DIR)
    }

    /// `unwatched/<key>` (an empty marker).
    pub fn unwatched_file(&self, key: &ContainerKey) -> PathBuf {
        self.unwatched_dir().join(key.file_stem())
    }

    pub fn pending_dir(&self) -> PathBuf {
        self.root.join(PENDING_DIR)
    }

    /// `pending/<key>`: a register sent and not yet seen done.
    pub fn pending_file(&self, key: &ContainerKey) -> PathBuf {
        self.pending_dir().join(key.file_stem())
    }

    pub fn answered_dir(&self) -> PathBuf {
        self.root.join(ANSWERED_DIR)
    }

    /// `answered/<key>`: a register the agent answered whose log and state
    /// file are not written yet (the agent's journal: an agent killed in
    /// between leaves it for the next, which takes the container).
    pub fn answered_file(&self, key: &ContainerKey) -> PathBuf {
        self.answered_dir().join(key.file_stem())
    }

    pub fn nri_dir(&self) -> PathBuf {
        self.root.join(NRI_DIR)
    }

    /// `nri/<key>.json`: a container the NRI plugin registered.
    pub fn nri_file(&self, key: &ContainerKey) -> PathBuf {
        self.nri_dir().join(format!("{}.json", key.file_stem()))
    }

    /// `key`'s register was taken (or will never be): its `pending/<key>`
    /// record goes. The agent's half of the create protocol
    /// (`throttlewatch_lifecycle::create_marks`).
    pub fn clear_pending(&self, key: &ContainerKey) {
        let _ = std::fs::remove_file(self.pending_file(key));
    }

    /// `pids/<pid>`: where the low-level runtime run by wrapper process
    /// `pid` writes its container's init pid.
    pub fn create_pid_file(&self, pid: u32) -> PathBuf {
        self.root.join(PIDS_DIR).join(pid.to_string())
    }

    /// Mark `key` as never registered: the empty `unwatched/<key>` (0600 in
    /// a 0700 directory), written by the front ends when their register
    /// fails and by the agent when it refuses one.
    pub fn mark_unwatched(&self, key: &ContainerKey) -> io::Result<()> {
        Self::create_dir(&self.unwatched_dir())?;
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(FILE_MODE)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(self.unwatched_file(key))
            .map(drop)
    }

    /// Create `dir` (and its parents) with [`DIR_MODE`].
    pub fn create_dir(dir: &Path) -> io::Result<()> {
        DirBuilder::new().recursive(true).mode(DIR_MODE).create(dir)
    }
}

/// The effective user is root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `dir` is a real directory (not a symlink) of root's that nobody else may
/// write or read: where the short-lived front ends keep what they read
/// before they have a configuration (`config_cache`, the wrapper's start
/// tickets), outside `state_dir`.
pub fn is_root_private_dir(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(dir)
        .is_ok_and(|m| m.is_dir() && m.uid() == 0 && m.mode() & 0o077 == 0)
}

/// [`is_root_private_dir`], creating `dir` (and its parents, [`DIR_MODE`])
/// when missing; whether it is one now.
pub fn make_root_private_dir(dir: &Path) -> bool {
    if !is_root_private_dir(dir) {
        let _ = StateDir::create_dir(dir);
    }
    is_root_private_dir(dir)
}

/// How [`write_atomic`] leaves the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteOptions {
    /// Permission bits, set explicitly (the umask does not apply).
    pub mode: u32,
    /// (uid, gid) to give the file; None: the writer's.
    pub owner: Option<(u32, u32)>,
    /// fsync before the rename: for state that must survive a crash of the
    /// host. Runtime state on tmpfs (`/run`) does not need it.
    pub fsync: bool,
}

impl WriteOptions {
    /// State-directory files: 0600, no fsync (tmpfs; the rename is atomic).
    pub const STATE: WriteOptions = WriteOptions {
        mode: FILE_MODE,
        owner: None,
        fsync: false,
    };
}

/// Write `bytes` to `path` all at once for readers: a temporary file in the
/// same directory (created new, never through a symlink), then renamed over
/// `path`. The temporary file is removed when anything fails.
pub fn write_atomic(path: &Path, bytes: &[u8], opts: &WriteOptions) -> io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other(format!("{}: no file name", path.display())))?;
    let tmp = path.with_file_name(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let _ = std::fs::remove_file(&tmp); // left by a crashed writer with our pid
    let res = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(opts.mode)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.set_permissions(std::fs::Permissions::from_mode(opts.mode))?;
        if let Some((uid, gid)) = opts.owner {
            std::os::unix::fs::fchown(&f, Some(uid), Some(gid))?;
        }
        if opts.fsync {
            f.sync_all()?;
        }
        std::fs::rename(&tmp, path)
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    #[test]
    fn every_file_stays_in_its_directory() {
        let s = StateDir::new("/run/tw");
        let key = |id: &str| ContainerKey::new(id, None);
        assert_eq!(s.agent_lock(), Path::new("/run/tw/agent.lock"));
        assert_eq!(
            s.container_file(&key("../../etc/x")),
            Path::new("/run/tw/containers/%2E%2E%2F%2E%2E%2Fetc%2Fx.json")
        );
        assert_eq!(
            s.burst_file(&key("c1")),
            Path::new("/run/tw/bursts/c1.json")
        );
        let scoped = ContainerKey::new("c1", Some(crate::container_key::Scope::of_namespace("a")));
        assert_eq!(
            s.burst_file(&scoped),
            Path::new("/run/tw/bursts/c1@ns-a.json")
        );
        assert_eq!(s.cpusets_dir(), Path::new("/run/tw/cpusets"));
        assert_eq!(s.nri_file(&scoped), Path::new("/run/tw/nri/c1@ns-a.json"));
        assert_eq!(
            s.unwatched_file(&key("a/b")),
            Path::new("/run/tw/unwatched/a%2Fb")
        );
    }

    #[test]
    fn write_atomic_replaces_with_the_mode_and_leaves_no_temp() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f.json");
        std::fs::write(&p, "old").unwrap();
        let opts = WriteOptions {
            mode: 0o640,
            ..WriteOptions::STATE
        };
        write_atomic(&p, b"new", &opts).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "new");
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o640);
        let names: Vec<_> = std::fs::read_dir(d.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "{names:?}");
        // A missing directory is an error, and nothing is left behind.
        let e = write_atomic(&d.path().join("no/f"), b"x", &WriteOptions::STATE).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }
}
