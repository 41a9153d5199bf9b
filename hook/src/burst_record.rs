//! The burst the hook applied, kept in `<state_dir>/bursts/<escaped id>.json`
//! so that `throttlewatch-runtime update` can write it back after the
//! low-level runtime's update (runc 1.1 does not know the burst and a quota
//! change can leave it invalid). The runtime wrapper reads this format.

use std::fs::{DirBuilder, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use throttlewatch_core::logfmt::log_file_name;
use throttlewatch_qos::BurstSpec;

pub const BURSTS_DIR: &str = "bursts";
pub const RECORD_VERSION: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BurstRequest {
    Micros(u64),
    /// Percent of the quota.
    Percent(u32),
}

impl From<BurstSpec> for BurstRequest {
    fn from(b: BurstSpec) -> Self {
        match b {
            BurstSpec::Micros(us) => BurstRequest::Micros(us),
            BurstSpec::Percent(p) => BurstRequest::Percent(p),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BurstRecord {
    pub v: u32,
    pub container_id: String,
    /// cpu-controller cgroup path relative to the hierarchy root.
    pub cgroup_path: String,
    pub request: BurstRequest,
    /// The policy's cap, percent of the quota (≤ 100).
    pub cap_percent: u32,
    pub applied_us: u64,
}

impl BurstRecord {
    /// The burst for a quota: the request, clamped to the cap (the kernel
    /// refuses a burst above the quota). None without a quota.
    pub fn burst_for_quota(&self, quota_us: Option<u64>) -> Option<u64> {
        let q = quota_us?;
        let want = match self.request {
            BurstRequest::Micros(us) => us,
            BurstRequest::Percent(p) => q * p as u64 / 100,
        };
        Some(want.min(q * self.cap_percent.min(100) as u64 / 100))
    }
}

/// `<state_dir>/bursts/<escaped id>.json`: the id is escaped like the log
/// file names, so it never leaves the directory.
pub fn record_path(state_dir: &Path, container_id: &str) -> PathBuf {
    let name = log_file_name(container_id);
    let stem = name.strip_suffix(".jsonl").unwrap_or(&name);
    state_dir.join(BURSTS_DIR).join(format!("{stem}.json"))
}

/// Write atomically (temp file + rename), directory 0700, file 0600.
pub fn save(state_dir: &Path, rec: &BurstRecord) -> std::io::Result<PathBuf> {
    let path = record_path(state_dir, &rec.container_id);
    let dir = state_dir.join(BURSTS_DIR);
    DirBuilder::new().recursive(true).mode(0o700).create(&dir)?;
    let tmp = dir.join(format!(".tmp-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)?;
    // No fsync: runtime state (tmpfs /run in production), rename is atomic.
    f.write_all(&serde_json::to_vec(rec)?)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

pub fn load(state_dir: &Path, container_id: &str) -> std::io::Result<Option<BurstRecord>> {
    let path = record_path(state_dir, container_id);
    let mut f = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut s = String::new();
    f.read_to_string(&mut s)?;
    let rec: BurstRecord = serde_json::from_str(&s).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{}: {e}", path.display()),
        )
    })?;
    Ok(Some(rec))
}

pub fn remove(state_dir: &Path, container_id: &str) {
    let _ = std::fs::remove_file(record_path(state_dir, container_id));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str, request: BurstRequest) -> BurstRecord {
        BurstRecord {
            v: RECORD_VERSION,
            container_id: id.into(),
            cgroup_path: "/tw/c".into(),
            request,
            cap_percent: 100,
            applied_us: 20_000,
        }
    }

    #[test]
    fn round_trip_and_escaped_names() {
        let d = tempfile::tempdir().unwrap();
        let r = rec("../../a..b", BurstRequest::Micros(20_000));
        let p = save(d.path(), &r).unwrap();
        assert_eq!(p.parent().unwrap(), d.path().join(BURSTS_DIR));
        assert_eq!(load(d.path(), "../../a..b").unwrap(), Some(r));
        remove(d.path(), "../../a..b");
        assert_eq!(load(d.path(), "../../a..b").unwrap(), None);
    }

    #[test]
    fn clamped_to_the_new_quota() {
        let r = rec("c", BurstRequest::Micros(20_000));
        assert_eq!(r.burst_for_quota(Some(30_000)), Some(20_000));
        assert_eq!(r.burst_for_quota(Some(10_000)), Some(10_000));
        assert_eq!(r.burst_for_quota(None), None);
        let r = BurstRecord {
            cap_percent: 50,
            ..rec("c", BurstRequest::Percent(80))
        };
        assert_eq!(r.burst_for_quota(Some(100_000)), Some(50_000));
    }
}
