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
        why: crate::modifiers::FieldError,
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
        let mut buf = Vec::with_capacity(meta.len().min(MAX_CONFIG_BYTES) as usize + 1);
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

    /// Write the (edited) document back with its mode and owner. No fsync:
    /// the bundle lives as long as the container and the runtime that made
    /// it writes it without one. In place when the file read is still there
    /// with one link (the runtime made it; one open and one write on the
    /// start path, where a temp file, its mode and owner and a rename cost
    /// 30-60 µs here, more on a disk); else, or if that fails before a byte
    /// is written, temp file + rename.
    pub fn write(&self) -> Result<(), SpecError> {
        let write_err = |source| SpecError::Write {
            path: self.path.clone(),
            source,
        };
        let bytes = serde_json::to_vec(&self.value).map_err(|e| write_err(e.into()))?;
        match self.write_in_place(&bytes) {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => return Err(write_err(e)),
        }
        let opts = WriteOptions {
            mode: self.meta.mode() & 0o7777,
            owner: Some((self.meta.uid(), self.meta.gid())),
            fsync: false,
        };
        write_atomic(&self.path, &bytes, &opts).map_err(write_err)
    }

    /// Overwrite the file read (same device and inode, one link, never
    /// through a symlink): Ok(false) when it is not that file any more,
    /// nothing written.
    fn write_in_place(&self, bytes: &[u8]) -> std::io::Result<bool> {
        use std::os::unix::fs::FileExt;
        let f = match OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&self.path)
        {
            Ok(f) => f,
            Err(_) => return Ok(false),
        };
        let Ok(m) = f.metadata() else {
            return Ok(false);
        };
        if (m.dev(), m.ino(), m.nlink()) != (self.meta.dev(), self.meta.ino(), 1) || !m.is_file() {
            return Ok(false);
        }
        f.write_all_at(bytes, 0)?;
        if m.len() > bytes.len() as u64 {
            f.set_len(bytes.len() as u64)?;
        }
        Ok(true)
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

    /// The runtime's file is overwritten in place (same inode; a shorter
    /// document leaves no tail of the longer one); a file with a second
    /// link, or replaced since it was read, is replaced by rename and the
    /// other name keeps its text.
    #[test]
    fn written_in_place_only_when_it_is_the_file_read_with_one_link() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join(CONFIG_JSON);
        std::fs::write(
            &p,
            r#"{"ociVersion":"1.0.2","hostname":"a-long-host-name"}"#,
        )
        .unwrap();
        let ino = std::fs::metadata(&p).unwrap().ino();
        let mut f = SpecFile::read(d.path()).unwrap();
        f.value["hostname"] = "h".into();
        f.write().unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().ino(), ino, "in place");
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert_eq!(v["hostname"], "h", "truncated to the new document");

        let other = d.path().join("other.json");
        std::fs::hard_link(&p, &other).unwrap();
        let before = std::fs::read_to_string(&other).unwrap();
        let mut f = SpecFile::read(d.path()).unwrap();
        f.value["hostname"] = "linked".into();
        f.write().unwrap();
        assert_ne!(std::fs::metadata(&p).unwrap().ino(), ino, "renamed over");
        assert_eq!(std::fs::read_to_string(&other).unwrap(), before);
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert_eq!(v["hostname"], "linked");

        // Replaced after the read: the new file is not overwritten in place.
        let mut f = SpecFile::read(d.path()).unwrap();
        let replaced = d.path().join("replaced.json");
        std::fs::write(&replaced, "{}").unwrap();
        std::fs::rename(&replaced, &p).unwrap();
        let ino = std::fs::metadata(&p).unwrap().ino();
        f.value["hostname"] = "r".into();
        f.write().unwrap();
        assert_ne!(std::fs::metadata(&p).unwrap().ino(), ino);
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert_eq!(v["hostname"], "r");
    }
}
