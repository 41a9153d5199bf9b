//! What the agent persists under `<state_dir>/containers/` so a restarted
//! agent resumes every running container's log instead of starting anew.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use throttlewatch_core::logfmt::log_file_name;
use throttlewatch_core::protocol::Register;

use crate::spec::Baseline;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Persisted {
    pub register: Register,
    pub log_path: PathBuf,
    pub cgroup_id: u64,
    pub baseline: Baseline,
}

pub struct StateDir {
    dir: PathBuf,
}

impl StateDir {
    pub fn open(state_dir: &Path) -> std::io::Result<StateDir> {
        let dir = state_dir.join("containers");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        Ok(StateDir { dir })
    }

    fn path(&self, container_id: &str) -> PathBuf {
        self.dir
            .join(log_file_name(container_id).replace(".jsonl", ".json"))
    }

    /// Write atomically (temp file + rename), 0600.
    pub fn save(&self, p: &Persisted) -> std::io::Result<()> {
        let path = self.path(&p.register.container_id);
        let tmp = path.with_extension("json.tmp");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        // No fsync: the state lives on /run (tmpfs) and matters only while the node is up.
        f.write_all(&serde_json::to_vec(p)?)?;
        std::fs::rename(&tmp, &path)
    }

    pub fn remove(&self, container_id: &str) {
        let _ = std::fs::remove_file(self.path(container_id));
    }

    pub fn load_all(&self) -> Vec<Persisted> {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return vec![];
        };
        rd.filter_map(|e| e.ok())
            .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
            .filter_map(|e| {
                let data = std::fs::read(e.path()).ok()?;
                match serde_json::from_slice(&data) {
                    Ok(p) => Some(p),
                    Err(err) => {
                        tracing::warn!("{}: unreadable state, ignored: {err}", e.path().display());
                        None
                    }
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_load_remove() {
        let d = tempfile::tempdir().unwrap();
        let s = StateDir::open(d.path()).unwrap();
        let p = Persisted {
            register: Register {
                container_id: "a/../b".into(),
                ..Default::default()
            },
            log_path: "/x.jsonl".into(),
            cgroup_id: 9,
            baseline: Baseline {
                probe_ns: 5,
                ..Default::default()
            },
        };
        s.save(&p).unwrap();
        let files: Vec<_> = std::fs::read_dir(d.path().join("containers"))
            .unwrap()
            .collect();
        assert_eq!(files.len(), 1, "stays inside the state dir");
        assert_eq!(s.load_all(), vec![p]);
        s.remove("a/../b");
        assert!(s.load_all().is_empty());
    }
}
