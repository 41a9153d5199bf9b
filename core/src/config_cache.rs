//! Parsed configurations kept for the short-lived front ends. The wrapper
//! runs twice per container start (`create`, `start`) and the hook once per
//! `run`; each parsed the same TOML file: 0.08–0.11 ms per process for the
//! shipped `configs/throttlewatch.toml` (cold code, toml_edit's document
//! model; bench/README.md). The cache holds the parsed [`Config`] as JSON
//! with the length and a 128-bit digest of the text it was parsed from, one
//! file per configuration path, and is used only when the file's text now
//! has that length and digest (no file times: a coarse clock can give two
//! edits the same ones).
//!
//! Only for root, only in [`CACHE_DIR`] when it is a directory (not a
//! symlink) owned by root and closed to others (0700, created so); entries
//! are opened without following symlinks and must name the path they are
//! for. Anything else — another user, a directory that is not ours, a
//! missing or unreadable entry — parses the file as before: the cache can
//! make a start faster, never change what is loaded.

use std::fs::OpenOptions;
use std::hash::{Hash, Hasher};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::config::{BadConfig, Config, ConfigError};
use crate::state_dir::{
    is_root, is_root_private_dir, make_root_private_dir, write_atomic, WriteOptions,
};

/// Where the entries live (tmpfs: gone at reboot, as the files may be).
pub const CACHE_DIR: &str = "/run/throttlewatch/config-cache";

/// An entry is a few KiB; more is not one of ours.
const MAX_ENTRY_BYTES: u64 = 1 << 20;

#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    /// The file's text, as parsed: its length and two independent 64-bit
    /// SipHash digests (the text itself would make the entry twice the
    /// size and its reading slower than the TOML it saves).
    text: TextId,
    config: Config,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct TextId {
    len: usize,
    digest: [u64; 2],
}

impl TextId {
    fn of(text: &str) -> TextId {
        let digest = [0u8, 1].map(|seed| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            seed.hash(&mut h);
            text.hash(&mut h);
            h.finish()
        });
        TextId {
            len: text.len(),
            digest,
        }
    }
}

/// `path` read and parsed ([`Config::parse`]), through the cache in `dir`.
pub fn load(dir: &Path, path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: path.into(),
        source,
    })?;
    if !is_root() {
        return Config::parse(path, &text);
    }
    let entry = dir.join(entry_name(path));
    let id = TextId::of(&text);
    if is_root_private_dir(dir) {
        if let Some(c) = read(&entry, id) {
            return Ok(c);
        }
    }
    let config = Config::parse(path, &text)?;
    if make_root_private_dir(dir) {
        let e = Entry {
            text: id,
            config: config.clone(),
        };
        if let Ok(bytes) = serde_json::to_vec(&e) {
            let _ = write_atomic(&entry, &bytes, &WriteOptions::STATE);
        }
    }
    Ok(config)
}

/// One file per configuration path (two paths sharing one is a miss now
/// and then, never the other file's configuration: the text decides).
fn entry_name(path: &Path) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    path.hash(&mut h);
    format!("{:016x}.json", h.finish())
}

fn read(entry: &Path, text: TextId) -> Option<Config> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(entry)
        .ok()?;
    // Sized from the file: one read, not a doubling series of them.
    let len = f.metadata().ok()?.len().min(MAX_ENTRY_BYTES);
    let mut buf = Vec::with_capacity(len as usize + 1);
    f.take(MAX_ENTRY_BYTES).read_to_end(&mut buf).ok()?;
    let e: Entry = serde_json::from_slice(&buf).ok()?;
    (e.text == text).then_some(e.config)
}

impl Config {
    /// [`Config::load_checked`] through this cache: for the
    /// wrapper and the hook, which load the same file at every container start.
    pub fn load_checked_cached(explicit: Option<&Path>) -> Result<Config, BadConfig> {
        let cache = Path::new(CACHE_DIR);
        Self::checked(match Self::path_to_load(explicit) {
            None => Ok(Config::default()),
            Some(path) => load(cache, &path),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn write(p: &Path, text: &str) {
        std::fs::write(p, text).unwrap();
    }

    /// A temporary directory with `tw.toml` (`agent_timeout_ms = 700`) and
    /// the path of a cache directory not made yet.
    fn fixture() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let (dir, p) = (d.path().join("cache"), d.path().join("tw.toml"));
        write(&p, "agent_timeout_ms = 700\n");
        (d, dir, p)
    }

    /// Change `agent_timeout_ms` in `path`'s entry behind the cache's back
    /// (what comes out then shows whether the entry was used).
    fn doctor_entry(dir: &Path, path: &Path, agent_timeout_ms: u64) {
        let entry = dir.join(entry_name(path));
        let mut e: Entry = serde_json::from_slice(&std::fs::read(&entry).unwrap()).unwrap();
        e.config.agent_timeout_ms = agent_timeout_ms;
        std::fs::write(&entry, serde_json::to_vec(&e).unwrap()).unwrap();
    }

    /// The entry is used while the file's text is unchanged (an entry edited
    /// by hand shows it), and not once the file changes — in place, even
    /// with the same size and times — or is replaced; every result equals a
    /// plain parse of the file at that time.
    #[test]
    fn an_entry_serves_only_the_unchanged_file() {
        let (d, dir, p) = fixture();
        let first = load(&dir, &p).unwrap();
        assert_eq!(first.agent_timeout_ms, 700);
        let m = std::fs::symlink_metadata(&dir).unwrap();
        assert_eq!(m.mode() & 0o777, 0o700);
        let entry = dir.join(entry_name(&p));
        assert_eq!(
            std::fs::metadata(&entry).unwrap().mode() & 0o777,
            0o600,
            "the entry is root's alone"
        );
        // Used: an entry changed behind the cache's back is what comes out.
        doctor_entry(&dir, &p, 701);
        assert_eq!(load(&dir, &p).unwrap().agent_timeout_ms, 701);
        // The file edited in place, same size, times put back: parsed again.
        let before = std::fs::metadata(&p).unwrap();
        write(&p, "agent_timeout_ms = 900\n");
        let f = std::fs::File::options().write(true).open(&p).unwrap();
        f.set_modified(before.modified().unwrap()).unwrap();
        assert_eq!(load(&dir, &p).unwrap().agent_timeout_ms, 900);
        // Replaced by rename (a ConfigMap update): parsed again.
        let q = d.path().join("new.toml");
        write(&q, "agent_timeout_ms = 901\n");
        std::fs::rename(&q, &p).unwrap();
        assert_eq!(load(&dir, &p).unwrap().agent_timeout_ms, 901);
        assert_eq!(
            load(&dir, &p).unwrap(),
            Config::parse(&p, &std::fs::read_to_string(&p).unwrap()).unwrap(),
            "from the entry, as parsed"
        );
    }

    /// What the cache stores comes back as parsed: the shipped file, and
    /// one that sets a value in every section away from its default.
    #[test]
    fn configs_survive_the_json_round_trip() {
        let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/throttlewatch.toml");
        let shipped = std::fs::read_to_string(shipped).unwrap();
        let set = "fail_mode = \"closed\"\nthreshold = \"3ms\"\nruntime = \"crun\"\n\
                   [qos]\nallowed_keys = [\"cpu-burst\"]\nenv_keys = []\n\
                   [control]\nenabled = true\n";
        for text in [shipped.as_str(), set] {
            let c = Config::parse(Path::new("t.toml"), text).unwrap();
            let e = Entry {
                text: TextId::of(text),
                config: c.clone(),
            };
            let back: Entry = serde_json::from_slice(&serde_json::to_vec(&e).unwrap()).unwrap();
            assert_eq!(back.config, c, "{text}");
        }
    }

    /// A directory open to others, or a symlinked one, is not used; a bad
    /// file is an error with or without an entry for its path.
    #[test]
    fn a_directory_not_ours_is_ignored_and_errors_still_come() {
        use std::os::unix::fs::PermissionsExt;
        let (d, dir, p) = fixture();
        load(&dir, &p).unwrap();
        doctor_entry(&dir, &p, 1);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(
            load(&dir, &p).unwrap().agent_timeout_ms,
            700,
            "0777: not read"
        );
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        let e2 = link.join(entry_name(&p));
        assert!(e2.exists());
        assert_eq!(
            load(&link, &p).unwrap().agent_timeout_ms,
            700,
            "symlinked: not read"
        );
        write(&p, "agent_timeout_ms = \"soon\"\n");
        let err = load(&dir, &p).unwrap_err().to_string();
        assert!(
            err.contains("tw.toml") && err.contains("agent_timeout_ms"),
            "{err}"
        );
    }
}
