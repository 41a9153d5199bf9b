//! `<state_dir>/control/<key>.json`: a controlled container's original
//! bandwidth and the values the controller is writing, saved before every
//! write. A restarted agent that finds one of those values in the cgroup
//! knows it is its own and puts the original back; any other value is an
//! operator's update made while no agent ran.

use std::path::Path;

use serde::{Deserialize, Serialize};
use throttlewatch_core::logfmt::control::Bandwidth;
use throttlewatch_core::state_dir::{self, WriteOptions};
use throttlewatch_core::ContainerKey;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Journalled {
    /// The cgroup it was for (a new container with the same key is another one).
    pub cgroup_id: u64,
    pub original: Bandwidth,
    /// The values before and after the write in progress.
    pub written: Vec<Bandwidth>,
    /// The pod cgroup whose quota follows the container's (its original).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<JournalledPod>,
}

/// A pod cgroup's quota as it was before the controller raised it with
/// its container's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct JournalledPod {
    pub cgroup_path: String,
    pub original_quota_us: u64,
    pub period_us: u64,
}

pub(crate) struct Journal {
    layout: state_dir::StateDir,
}

impl Journal {
    pub(crate) fn new(root: &Path) -> Journal {
        Journal {
            layout: state_dir::StateDir::new(root),
        }
    }

    pub(crate) fn save(&self, key: &ContainerKey, j: &Journalled) {
        let r = state_dir::StateDir::create_dir(&self.layout.control_dir()).and_then(|_| {
            let bytes = serde_json::to_vec(j)?;
            state_dir::write_atomic(&self.layout.control_file(key), &bytes, &WriteOptions::STATE)
        });
        if let Err(e) = r {
            tracing::warn!("{key}: journalling the bandwidth: {e}");
        }
    }

    pub(crate) fn load(&self, key: &ContainerKey) -> Option<Journalled> {
        let data = std::fs::read(self.layout.control_file(key)).ok()?;
        serde_json::from_slice(&data).ok()
    }

    pub(crate) fn remove(&self, key: &ContainerKey) {
        let _ = std::fs::remove_file(self.layout.control_file(key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_load_remove_0600() {
        let d = tempfile::tempdir().unwrap();
        let j = Journal::new(d.path());
        let key = ContainerKey::new("a/../b", None);
        let b = Bandwidth {
            quota_us: 1,
            period_us: 2,
            burst_us: 3,
        };
        let v = Journalled {
            cgroup_id: 7,
            original: b,
            written: vec![b],
            pod: None,
        };
        j.save(&key, &v);
        assert_eq!(j.load(&key), Some(v));
        let f = state_dir::StateDir::new(d.path()).control_file(&key);
        assert!(f.starts_with(d.path().join("control")));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&f).unwrap().permissions().mode() & 0o777,
            0o600
        );
        j.remove(&key);
        assert_eq!(j.load(&key), None);
    }
}
