//! The burst the hook applied, kept in `<state_dir>/bursts/<key>.json`
//! ([`StateDir::burst_file`]) so that the runtime wrapper and the shim can
//! write it back after the low-level runtime's update (runc 1.1 does not
//! know the burst and a quota change can leave it invalid).

use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use throttlewatch_core::state_dir::{write_atomic, StateDir, WriteOptions};
use throttlewatch_core::{ContainerKey, Scope};
use throttlewatch_qos::BurstSpec;

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
    /// The id space of `container_id` (runc root or containerd namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Scope>,
    /// cpu-controller cgroup path relative to the hierarchy root.
    pub cgroup_path: String,
    pub request: BurstRequest,
    /// The policy's cap, percent of the quota (≤ 100).
    pub cap_percent: u32,
    pub applied_us: u64,
}

impl BurstRecord {
    pub fn key(&self) -> ContainerKey {
        ContainerKey::new(self.container_id.clone(), self.scope.clone())
    }

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

/// Write atomically ([`write_atomic`]): directory 0700, file 0600.
pub fn save(state: &StateDir, rec: &BurstRecord) -> std::io::Result<PathBuf> {
    let path = state.burst_file(&rec.key());
    StateDir::create_dir(&state.bursts_dir())?;
    write_atomic(&path, &serde_json::to_vec(rec)?, &WriteOptions::STATE)?;
    Ok(path)
}

pub fn load(state: &StateDir, key: &ContainerKey) -> std::io::Result<Option<BurstRecord>> {
    let path = state.burst_file(key);
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

pub fn remove(state: &StateDir, key: &ContainerKey) {
    let _ = std::fs::remove_file(state.burst_file(key));
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn rec(id: &str, request: BurstRequest) -> BurstRecord {
        BurstRecord {
            v: RECORD_VERSION,
            container_id: id.into(),
            scope: None,
            cgroup_path: "/tw/c".into(),
            request,
            cap_percent: 100,
            applied_us: 20_000,
        }
    }

    #[test]
    fn round_trip_and_escaped_names() {
        let d = tempfile::tempdir().unwrap();
        let st = StateDir::new(d.path());
        let r = rec("../../a..b", BurstRequest::Micros(20_000));
        let p = save(&st, &r).unwrap();
        assert_eq!(p.parent().unwrap(), d.path().join("bursts"));
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let key = r.key();
        // The same id in another scope is another record.
        let other = BurstRecord {
            scope: Some(Scope::of_namespace("b")),
            applied_us: 1,
            ..r.clone()
        };
        save(&st, &other).unwrap();
        assert_eq!(load(&st, &key).unwrap(), Some(r));
        remove(&st, &key);
        assert_eq!(load(&st, &key).unwrap(), None);
        assert_eq!(load(&st, &other.key()).unwrap(), Some(other));
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
