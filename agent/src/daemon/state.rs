//! What the agent persists under `<state_dir>/containers/` so a restarted
//! agent resumes every running container's log instead of starting anew.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use throttlewatch_core::protocol::Register;
use throttlewatch_core::state_dir::{self, WriteOptions};
use throttlewatch_core::ContainerKey;

use crate::spec::Baseline;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Persisted {
    pub register: Register,
    pub log_path: PathBuf,
    pub cgroup_id: u64,
    pub baseline: Baseline,
}

/// `<state_dir>/containers/` (the layout is `throttlewatch_core::state_dir`'s).
pub(crate) struct ContainersDir {
    layout: state_dir::StateDir,
    dir: PathBuf,
    /// The baseline each file holds, as this agent last wrote it.
    written: RefCell<HashMap<ContainerKey, Baseline>>,
}

impl ContainersDir {
    pub(crate) fn open(root: &Path) -> std::io::Result<ContainersDir> {
        let layout = state_dir::StateDir::new(root);
        let dir = layout.containers_dir();
        state_dir::StateDir::create_dir(&dir)?;
        Ok(ContainersDir {
            layout,
            dir,
            written: RefCell::default(),
        })
    }

    fn path(&self, key: &ContainerKey) -> PathBuf {
        self.layout.container_file(key)
    }

    /// Write atomically, 0600. No fsync: the state lives on /run (tmpfs)
    /// and matters only while the node is up.
    pub(crate) fn save(&self, p: &Persisted) -> std::io::Result<()> {
        let key = p.register.key();
        let path = self.path(&key);
        state_dir::write_atomic(&path, &serde_json::to_vec(p)?, &WriteOptions::STATE)?;
        self.written.borrow_mut().insert(key, p.baseline.clone());
        Ok(())
    }

    /// Whether `key`'s file holds `baseline` already, as this agent wrote
    /// it (the rest of a file never changes): an idle container's state is
    /// not rewritten every second.
    pub(crate) fn holds(&self, key: &ContainerKey, baseline: &Baseline) -> bool {
        self.written.borrow().get(key) == Some(baseline)
    }

    pub(crate) fn remove(&self, key: &ContainerKey) {
        self.written.borrow_mut().remove(key);
        let _ = std::fs::remove_file(self.path(key));
    }

    pub(crate) fn load_all(&self) -> Vec<Persisted> {
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
        let s = ContainersDir::open(d.path()).unwrap();
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
        // The same id in another scope is another file.
        let mut q = p.clone();
        q.register.scope = Some(throttlewatch_core::Scope::of_namespace("n"));
        s.save(&q).unwrap();
        let mut all = s.load_all();
        all.sort_by_key(|p| p.register.scope.is_some());
        assert_eq!(all, vec![p.clone(), q]);
        assert!(s.holds(&p.register.key(), &p.baseline));
        let mut moved = p.baseline.clone();
        moved.probe_ns += 1;
        assert!(
            !s.holds(&p.register.key(), &moved),
            "a new figure is written"
        );
        s.remove(&p.register.key());
        assert!(!s.holds(&p.register.key(), &p.baseline));
        assert_eq!(s.load_all().len(), 1);
    }
}
