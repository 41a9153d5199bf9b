//! A bundle's `config.json` as a JSON document: read once without following
//! a symlink, edited as a `serde_json::Value` (fields throttlewatch does not
//! know survive), written back atomically with its original mode and owner.
//!
//! Why not `oci-spec`'s `Spec` (in the lock file through containerd-shim):
//! it has no place for unknown fields, so a write would drop what a newer
//! runtime or another tool put there, and its closed enums (capabilities,
//! namespaces, ...) refuse a spec that runc accepts. Its `State` has no
//! `paused` status, which `runc state` reports. The typed reading is
//! [`crate::BundleSpec`], taken from this same document.

use std::fs::{Metadata, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde_json::Value;
use throttlewatch_core::state_dir::{write_atomic, WriteOptions};

use crate::bundle_spec::BundleSpec;

pub const CONFIG_JSON: &str = "config.json";
/// config.json files above this size are refused (real ones are a few KiB).
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("{}: is a symlink; refused (never followed)", .0.display())]
    Symlink(PathBuf),
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: larger than {MAX_CONFIG_BYTES} bytes", .0.display())]
    TooLarge(PathBuf),
    #[error("{}: not valid JSON: {source}", path.display())]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{}: not a valid OCI config.json: {source}", path.display())]
    Shape {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{}: expected a JSON object (an OCI runtime spec), got {kind}", path.display())]
    NotAnObject { path: PathBuf, kind: &'static str },
    #[error("{}: modifier {modifier:?}: {why}", path.display())]
    Modifier {
        path: PathBuf,
        modifier: &'static str,
        why: String,
    },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// One bundle's config.json, as read.
#[derive(Debug, Clone)]
pub struct SpecFile {
    pub path: PathBuf,
    pub value: Value,
    /// Mode and owner of the file read, kept by [`SpecFile::write`].
    meta: Metadata,
}

impl SpecFile {
    pub fn path_in(bundle: &Path) -> PathBuf {
        bundle.join(CONFIG_JSON)
    }

    /// Read `<bundle>/config.json` without following a symlink there.
    pub fn read(bundle: &Path) -> Result<SpecFile, SpecError> {
        let path = Self::path_in(bundle);
        let f = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) => SpecError::Symlink(path.clone()),
                _ => SpecError::Read {
                    path: path.clone(),
                    source: e,
                },
            })?;
        let read_err = |source| SpecError::Read {
            path: path.clone(),
            source,
        };
        let meta = f.metadata().map_err(read_err)?;
        let mut buf = Vec::new();
        f.take(MAX_CONFIG_BYTES + 1)
            .read_to_end(&mut buf)
            .map_err(read_err)?;
        if buf.len() as u64 > MAX_CONFIG_BYTES {
            return Err(SpecError::TooLarge(path));
        }
        match serde_json::from_slice(&buf) {
            Ok(value) => Ok(SpecFile { path, value, meta }),
            Err(source) => Err(SpecError::Json { path, source }),
        }
    }

    /// The typed reading (annotations, environment, CPU resources).
    pub fn typed(&self) -> Result<BundleSpec, SpecError> {
        BundleSpec::from_value(&self.value).map_err(|source| SpecError::Shape {
            path: self.path.clone(),
            source,
        })
    }

    /// Write the (edited) document back: temp file + rename, with the
    /// original mode and owner. No fsync: the bundle lives as long as the
    /// container and the runtime that made it writes it without one.
    pub fn write(&self) -> Result<(), SpecError> {
        let opts = WriteOptions {
            mode: self.meta.mode() & 0o7777,
            owner: Some((self.meta.uid(), self.meta.gid())),
            fsync: false,
        };
        let write_err = |source| SpecError::Write {
            path: self.path.clone(),
            source,
        };
        let bytes = serde_json::to_vec(&self.value).map_err(|e| write_err(e.into()))?;
        write_atomic(&self.path, &bytes, &opts).map_err(write_err)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn symlinked_config_is_refused() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("real.json"), "{}").unwrap();
        std::os::unix::fs::symlink(d.path().join("real.json"), d.path().join(CONFIG_JSON)).unwrap();
        let e = SpecFile::read(d.path()).unwrap_err().to_string();
        assert!(e.contains("symlink"), "{e}");
    }

    #[test]
    fn malformed_or_misshapen_config_names_the_file() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(CONFIG_JSON), "{not json").unwrap();
        let e = SpecFile::read(d.path()).unwrap_err().to_string();
        assert!(
            e.contains("config.json") && e.contains("not valid JSON"),
            "{e}"
        );
        std::fs::write(d.path().join(CONFIG_JSON), r#"{"annotations":3}"#).unwrap();
        let e = SpecFile::read(d.path())
            .unwrap()
            .typed()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("config.json") && e.contains("not a valid OCI config.json"),
            "{e}"
        );
    }

    #[test]
    fn write_keeps_unknown_fields_and_the_mode() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join(CONFIG_JSON);
        std::fs::write(&p, r#"{"ociVersion":"1.0.2","vendor.x":{"y":[1,2]}}"#).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        let mut f = SpecFile::read(d.path()).unwrap();
        f.value["hostname"] = "h".into();
        f.write().unwrap();
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert_eq!(v["vendor.x"]["y"][1], 2);
        assert_eq!(v["hostname"], "h");
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o640);
    }
}
