//! Exclusive cpusets: whole physical cores handed to one container at a
//! time, across hook processes.
//!
//! State is one JSON file in a directory chosen by the caller (e.g.
//! `/run/throttlewatch/cpusets`). Every read-modify-write holds an exclusive
//! `flock` on a lock file next to it, and writes go to a temporary file that
//! is renamed over the state, so a crash never leaves half a file. Files are
//! created 0600, the directory 0700.
//!
//! Recovery: an entry records its holder's pid and that process's start time
//! (field 22 of `/proc/<pid>/stat`). When the pid no longer exists, is a
//! zombie, or now belongs to a process with another start time (pid reuse),
//! the entry is reclaimed by the next `allocate`. Entries without a holder are
//! only freed by `release`.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use throttlewatch_core::state_dir::{write_atomic, WriteOptions};
use throttlewatch_core::CpuList;

pub const STATE_FILE: &str = "cpusets.json";
pub const LOCK_FILE: &str = "cpusets.lock";
pub const STATE_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holding {
    /// The kernel's list format.
    pub cpus: String,
    pub pid: Option<u32>,
    pub start_time: Option<u64>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct State {
    version: u32,
    holdings: BTreeMap<String, Holding>,
}

#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    #[error("{wanted} CPUs needed in whole free cores, only {free} free among the candidates{}", held_by(.holders))]
    Exhausted {
        wanted: usize,
        free: usize,
        holders: Vec<String>,
    },
    #[error("{0}")]
    Io(#[from] io::Error),
}

fn held_by(holders: &[String]) -> String {
    if holders.is_empty() {
        String::new()
    } else {
        format!(" (the rest is held by {})", holders.join(", "))
    }
}

/// How long `allocate`/`release` wait for the lock by default.
pub const LOCK_TIMEOUT: Duration = Duration::from_millis(500);

#[derive(Debug, Clone)]
pub struct ExclusiveAllocator {
    dir: PathBuf,
    procfs: PathBuf,
    holder: Option<u32>,
    /// A hook must never wait for ever on a lock that a stopped or wedged
    /// process holds: past this, the cpuset is refused with the reason.
    lock_timeout: Duration,
}

impl ExclusiveAllocator {
    /// Open (creating) the state directory.
    pub fn open(state_dir: &Path) -> io::Result<Self> {
        if !state_dir.is_dir() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(state_dir)?;
            std::fs::set_permissions(state_dir, std::fs::Permissions::from_mode(0o700))?;
        }
        let a = ExclusiveAllocator {
            dir: state_dir.into(),
            procfs: "/proc".into(),
            holder: None,
            lock_timeout: LOCK_TIMEOUT,
        };
        // Create the lock file (without taking the lock: that has a deadline).
        a.lock_file()?;
        Ok(a)
    }

    /// How long to wait for the lock before giving up (`TimedOut`).
    pub fn with_lock_timeout(mut self, t: Duration) -> Self {
        self.lock_timeout = t;
        self
    }

    /// Where holders' liveness is checked (tests use a fixture tree).
    pub fn with_procfs(mut self, procfs_root: &Path) -> Self {
        self.procfs = procfs_root.into();
        self
    }

    /// The holder pid that `plan` records for the allocations it makes
    /// (the container's init pid, when the caller knows it).
    pub fn for_holder(mut self, pid: Option<u32>) -> Self {
        self.holder = pid;
        self
    }

    pub fn holder(&self) -> Option<u32> {
        self.holder
    }

    pub fn state_path(&self) -> PathBuf {
        self.dir.join(STATE_FILE)
    }

    /// Take whole cores from `candidates` (in preference order) until at least
    /// `count` CPUs are held; `count` 0 takes every free candidate. A container
    /// that already holds CPUs gets the same CPUs back. Cores of dead holders
    /// are reclaimed first.
    pub fn allocate(
        &self,
        container_id: &str,
        candidates: &[CpuList],
        count: usize,
        holder_pid: Option<u32>,
    ) -> Result<CpuList, AllocError> {
        let _lock = self.lock()?;
        let mut state = self.load()?;
        let reclaimed = self.reclaim_dead(&mut state);
        let start_time = holder_pid.and_then(|p| self.start_time(p));
        if let Some(h) = state.holdings.get_mut(container_id) {
            let cpus = parse_held(&h.cpus);
            if holder_pid.is_some() && h.pid != holder_pid {
                h.pid = holder_pid;
                h.start_time = start_time;
                self.save(&state)?;
            }
            return Ok(cpus);
        }
        let held = held_cpus(&state, None);
        let mut got = CpuList::default();
        for core in candidates.iter().filter(|c| c.intersect(&held).is_empty()) {
            if count > 0 && got.len() >= count {
                break;
            }
            got = got.union(core);
        }
        if got.len() < count || got.is_empty() {
            let mut holders: Vec<String> = state
                .holdings
                .iter()
                .filter(|(_, h)| {
                    candidates
                        .iter()
                        .any(|c| !c.intersect(&parse_held(&h.cpus)).is_empty())
                })
                .map(|(id, _)| id.clone())
                .collect();
            holders.truncate(8);
            if reclaimed {
                self.save(&state)?;
            }
            return Err(AllocError::Exhausted {
                wanted: count.max(1),
                free: got.len(),
                holders,
            });
        }
        state.holdings.insert(
            container_id.into(),
            Holding {
                cpus: got.to_string(),
                pid: holder_pid,
                start_time,
            },
        );
        self.save(&state)?;
        Ok(got)
    }

    /// Free a container's CPUs; returns what it held.
    pub fn release(&self, container_id: &str) -> io::Result<Option<CpuList>> {
        let _lock = self.lock()?;
        let mut state = self.load()?;
        let old = state.holdings.remove(container_id);
        if old.is_some() {
            self.save(&state)?;
        }
        Ok(old.map(|h| parse_held(&h.cpus)))
    }

    /// Record the holder of an existing allocation (e.g. once the container's
    /// pid is known). Returns false when the container holds nothing.
    pub fn set_holder(&self, container_id: &str, pid: u32) -> io::Result<bool> {
        let _lock = self.lock()?;
        let mut state = self.load()?;
        let start_time = self.start_time(pid);
        let Some(h) = state.holdings.get_mut(container_id) else {
            return Ok(false);
        };
        h.pid = Some(pid);
        h.start_time = start_time;
        self.save(&state)?;
        Ok(true)
    }

    /// Current holdings whose holders are alive (or unknown).
    pub fn holdings(&self) -> io::Result<BTreeMap<String, Holding>> {
        let _lock = self.lock()?;
        let mut state = self.load()?;
        self.reclaim_dead(&mut state);
        Ok(state.holdings)
    }

    /// CPUs held by live containers other than `container_id`.
    pub fn held_cpus_except(&self, container_id: &str) -> io::Result<CpuList> {
        let _lock = self.lock()?;
        let mut state = self.load()?;
        self.reclaim_dead(&mut state);
        Ok(held_cpus(&state, Some(container_id)))
    }

    fn lock_file(&self) -> io::Result<File> {
        OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(self.dir.join(LOCK_FILE))
    }

    /// The exclusive lock, polled until `lock_timeout` (flock has no timeout
    /// of its own; a critical section lasts well under a millisecond).
    fn lock(&self) -> io::Result<Flock<File>> {
        let deadline = Instant::now() + self.lock_timeout;
        let mut f = self.lock_file()?;
        loop {
            match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
                Ok(l) => return Ok(l),
                Err((back, nix::errno::Errno::EWOULDBLOCK)) if Instant::now() < deadline => {
                    f = back;
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                        "{} is held by another process for more than {:?} (cpuset_lock_timeout_ms)",
                        self.dir.join(LOCK_FILE).display(),
                        self.lock_timeout
                    ),
                    ))
                }
                Err((_, e)) => return Err(io::Error::from(e)),
            }
        }
    }

    fn load(&self) -> io::Result<State> {
        let path = self.state_path();
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok(State {
                    version: STATE_VERSION,
                    ..Default::default()
                })
            }
            Err(e) => return Err(e),
        };
        let state: State = serde_json::from_str(&text).map_err(|e| {
            let msg = format!(
                "{}: not a valid cpuset state file ({e}); remove it to reset",
                path.display()
            );
            io::Error::new(io::ErrorKind::InvalidData, msg)
        })?;
        if state.version != STATE_VERSION {
            let msg = format!(
                "{}: state version {} is not {STATE_VERSION}",
                path.display(),
                state.version
            );
            return Err(io::Error::new(io::ErrorKind::InvalidData, msg));
        }
        Ok(state)
    }

    fn save(&self, state: &State) -> io::Result<()> {
        let bytes = serde_json::to_vec_pretty(state).map_err(io::Error::other)?;
        let opts = WriteOptions {
            fsync: true,
            ..WriteOptions::STATE
        };
        write_atomic(&self.state_path(), &bytes, &opts)
    }

    /// Drop holdings whose holder is gone; true when any was dropped.
    fn reclaim_dead(&self, state: &mut State) -> bool {
        let before = state.holdings.len();
        state.holdings.retain(|_, h| match h.pid {
            None => true,
            Some(pid) => self.alive(pid, h.start_time),
        });
        state.holdings.len() != before
    }

    fn alive(&self, pid: u32, start_time: Option<u64>) -> bool {
        match self.stat(pid) {
            None => false,
            Some((state, _)) if state == 'Z' || state == 'X' => false,
            Some((_, st)) => start_time.is_none() || start_time == st,
        }
    }

    fn start_time(&self, pid: u32) -> Option<u64> {
        self.stat(pid).and_then(|(_, st)| st)
    }

    /// (state, starttime) from `/proc/<pid>/stat`; None when the pid does not exist.
    fn stat(&self, pid: u32) -> Option<(char, Option<u64>)> {
        let s = std::fs::read_to_string(self.procfs.join(pid.to_string()).join("stat")).ok()?;
        let rest = &s[s.rfind(')')? + 1..];
        let mut fields = rest.split_whitespace();
        let state = fields.next()?.chars().next()?;
        // Fields after the command start at field 3; starttime is field 22.
        Some((state, fields.nth(18).and_then(|v| v.parse().ok())))
    }
}

fn parse_held(s: &str) -> CpuList {
    CpuList::parse("", s).unwrap_or_default()
}

fn held_cpus(state: &State, except: Option<&str>) -> CpuList {
    state
        .holdings
        .iter()
        .filter(|(id, _)| Some(id.as_str()) != except)
        .fold(CpuList::default(), |acc, (_, h)| {
            acc.union(&parse_held(&h.cpus))
        })
}

#[cfg(test)]
#[path = "exclusive_tests.rs"]
mod tests;
