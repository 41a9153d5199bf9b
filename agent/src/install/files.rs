//! Files as the installer touches them: read when present, written
//! atomically (a temporary file in the same directory, then rename) with the
//! mode of the file they replace, backups beside the original.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use throttlewatch_core::state_dir::{self, WriteOptions};

use crate::CliError;

/// The backup of `path`, beside it: `config.toml` → `config.toml.throttlewatch-backup`.
/// The name ends in neither `.toml` nor `.json`, so no `*.toml` import picks it up.
pub(crate) const BACKUP_SUFFIX: &str = ".throttlewatch-backup";

/// Mode of a file the installer creates (containerd's and docker's own default).
pub(crate) const NEW_FILE_MODE: u32 = 0o644;

pub(crate) fn backup_of(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(BACKUP_SUFFIX);
    path.with_file_name(name)
}

fn io_err(path: &Path, e: std::io::Error) -> CliError {
    CliError::fail(format!("{}: {e}", path.display()))
}

/// The text of `path`, `None` when it does not exist. Not UTF-8 is bad input.
pub(crate) fn read_optional(path: &Path) -> Result<Option<String>, CliError> {
    match std::fs::read(path) {
        Ok(bytes) => String::from_utf8(bytes).map(Some).map_err(|_| {
            CliError::usage(format!(
                "{}: not UTF-8 text; accepted: a text configuration file",
                path.display()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(path, e)),
    }
}

/// Mode, owner and group of `path` (following a symbolic link).
fn meta_of(path: &Path) -> Result<Option<(u32, u32, u32)>, CliError> {
    match std::fs::metadata(path) {
        Ok(m) => Ok(Some((m.permissions().mode() & 0o7777, m.uid(), m.gid()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(path, e)),
    }
}

/// The file a write to `path` must replace: the target when `path` is a
/// symbolic link (a rename over the link would turn it into a copy).
fn resolved(path: &Path) -> PathBuf {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {
            std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
        }
        _ => path.to_path_buf(),
    }
}

/// `write_atomic`, the new file also given `owner` (uid, gid) when known:
/// core's atomic writer with fsync (configuration must survive a crash),
/// then the directory synced so the rename does too.
fn write_as(
    path: &Path,
    text: &str,
    (mode, owner): (u32, Option<(u32, u32)>),
) -> Result<(), CliError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
    let opts = WriteOptions {
        mode,
        owner,
        fsync: true,
    };
    state_dir::write_atomic(path, text.as_bytes(), &opts).map_err(|e| io_err(path, e))?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

fn same_as(path: &Path) -> Result<(u32, Option<(u32, u32)>), CliError> {
    Ok(match meta_of(path)? {
        Some((mode, uid, gid)) => (mode, Some((uid, gid))),
        None => (NEW_FILE_MODE, None),
    })
}

/// Replace `path` (through a symbolic link) with `text`, keeping its mode
/// and owner (0644 when it is new).
pub(crate) fn replace(path: &Path, text: &str) -> Result<(), CliError> {
    write_as(&resolved(path), text, same_as(path)?)
}

/// Copy `path` (whose text is `text`) to its backup, with the same mode and owner.
pub(crate) fn back_up(path: &Path, text: &str) -> Result<PathBuf, CliError> {
    let b = backup_of(path);
    write_as(&b, text, same_as(path)?)?;
    Ok(b)
}

/// Move `from` over `to` (through a symbolic link at `to`; one rename: the
/// bytes and mode of `from` survive).
pub(crate) fn rename(from: &Path, to: &Path) -> Result<(), CliError> {
    std::fs::rename(from, resolved(to)).map_err(|e| io_err(to, e))
}

pub(crate) fn remove(path: &Path) -> Result<(), CliError> {
    std::fs::remove_file(path).map_err(|e| io_err(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backups_keep_the_mode_and_replacements_too() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("config.toml");
        std::fs::write(&p, "a\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let b = back_up(&p, "a\n").unwrap();
        assert_eq!(b, d.path().join("config.toml.throttlewatch-backup"));
        assert_eq!(std::fs::read_to_string(&b).unwrap(), "a\n");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&b), 0o600);
        replace(&p, "b\n").unwrap();
        assert_eq!(mode(&p), 0o600);
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "b\n");
        let n = d.path().join("sub/new.json");
        replace(&n, "{}").unwrap();
        assert_eq!(mode(&n), 0o644);
        let left: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("tmp"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn a_symbolic_link_stays_a_link() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().join("real.toml");
        let link = d.path().join("config.toml");
        std::fs::write(&real, "a\n").unwrap();
        std::os::unix::fs::symlink(&real, &link).unwrap();
        back_up(&link, "a\n").unwrap();
        replace(&link, "b\n").unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read_to_string(&real).unwrap(), "b\n");
        rename(&backup_of(&link), &link).unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read_to_string(&real).unwrap(), "a\n");
    }
}
