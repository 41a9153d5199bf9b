//! The containers this plugin registered with the agent, one file each
//! under `<state_dir>/nri/` ([`StateDir::nri_file`]). Written before the
//! register at `StartContainer` (and at `Synchronize`), removed once the
//! container's `end` is asked for and its burst record and exclusive cores
//! are released. A `Synchronize` that no longer lists one as running ends
//! it: the container stopped or was removed while the plugin was not
//! connected. Containers of the other front ends (hook, wrapper, shim) have
//! no file here, so a `Synchronize` never touches them.

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use throttlewatch_core::state_dir::{write_atomic, StateDir, WriteOptions};
use throttlewatch_core::{ContainerKey, Scope};

/// The version of a registration file.
pub const REGISTRATION_VERSION: u32 = 1;

/// One registration file: the container as the agent keys it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Registration {
    v: u32,
    container_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scope: Option<Scope>,
}

/// A registration file that cannot be used: its path and why.
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("{}: {source}; expected {{\"v\":1,\"container_id\":\"…\",\"scope\":\"…\"}}", path.display())]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{}: v = {v}; expected {REGISTRATION_VERSION}", path.display())]
    Version { path: PathBuf, v: u32 },
}

/// The registrations in one state directory.
pub struct Registered {
    state: StateDir,
}

impl Registered {
    pub fn new(state_dir: &Path) -> Registered {
        Registered {
            state: StateDir::new(state_dir),
        }
    }

    /// `key` is (about to be) registered by this plugin.
    pub fn add(&self, key: &ContainerKey) -> Result<(), RegistrationError> {
        let path = self.state.nri_file(key);
        let io = |source| RegistrationError::Io {
            path: path.clone(),
            source,
        };
        StateDir::create_dir(&self.state.nri_dir()).map_err(io)?;
        let r = Registration {
            v: REGISTRATION_VERSION,
            container_id: key.id.clone(),
            scope: key.scope.clone(),
        };
        let bytes = serde_json::to_vec(&r).map_err(|e| io(e.into()))?;
        write_atomic(&path, &bytes, &WriteOptions::STATE).map_err(io)
    }

    /// `key` is ended: its file goes.
    pub fn remove(&self, key: &ContainerKey) {
        let _ = std::fs::remove_file(self.state.nri_file(key));
    }

    /// Whether `key` has a file.
    pub fn contains(&self, key: &ContainerKey) -> bool {
        self.state.nri_file(key).exists()
    }

    /// Every registration; a file that cannot be read or parsed is removed
    /// (nothing could end its container) and given to `bad`.
    pub fn all(&self, bad: &mut dyn FnMut(RegistrationError)) -> Vec<ContainerKey> {
        let Ok(rd) = std::fs::read_dir(self.state.nri_dir()) else {
            return vec![];
        };
        let mut keys = vec![];
        for path in rd.flatten().map(|e| e.path()) {
            if path.extension().is_none_or(|x| x != "json") {
                continue; // a writer's temporary file
            }
            match read(&path) {
                Ok(k) => keys.push(k),
                Err(e) => {
                    let _ = std::fs::remove_file(&path);
                    bad(e);
                }
            }
        }
        keys.sort();
        keys
    }
}

fn read(path: &Path) -> Result<ContainerKey, RegistrationError> {
    let text = std::fs::read(path).map_err(|source| RegistrationError::Io {
        path: path.into(),
        source,
    })?;
    let r: Registration =
        serde_json::from_slice(&text).map_err(|source| RegistrationError::Parse {
            path: path.into(),
            source,
        })?;
    if r.v != REGISTRATION_VERSION {
        return Err(RegistrationError::Version {
            path: path.into(),
            v: r.v,
        });
    }
    Ok(ContainerKey::new(r.container_id, r.scope))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn added_listed_removed_and_bad_files_said() {
        let d = tempfile::tempdir().unwrap();
        let reg = Registered::new(d.path());
        let mut said = vec![];
        assert_eq!(reg.all(&mut |e| said.push(e.to_string())), vec![]);
        let a = ContainerKey::new("a/../b", Some(Scope::of_namespace("k8s.io")));
        let b = ContainerKey::new("b", None);
        reg.add(&a).unwrap();
        reg.add(&b).unwrap();
        reg.add(&b).unwrap();
        assert!(reg.contains(&a));
        let mut want = vec![a.clone(), b.clone()];
        want.sort();
        assert_eq!(reg.all(&mut |e| said.push(e.to_string())), want);
        let dir = d.path().join("nri");
        std::fs::write(dir.join("junk.json"), "{").unwrap();
        std::fs::write(dir.join("old.json"), r#"{"v":7,"container_id":"x"}"#).unwrap();
        std::fs::write(dir.join(".b.json.9.tmp"), "").unwrap();
        assert_eq!(reg.all(&mut |e| said.push(e.to_string())), want);
        assert_eq!(said.len(), 2, "{said:?}");
        assert!(said.iter().any(|s| s.contains("junk.json")), "{said:?}");
        assert!(
            said.iter()
                .any(|s| s.contains("old.json") && s.contains("v = 7; expected 1")),
            "{said:?}"
        );
        assert!(!dir.join("junk.json").exists(), "a bad file goes");
        reg.remove(&a);
        assert!(!reg.contains(&a));
        assert_eq!(reg.all(&mut |_| {}), vec![b]);
    }
}
