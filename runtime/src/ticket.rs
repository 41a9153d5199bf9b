//! Start tickets: what the wrapper's `start` needs, written by its `create`
//! where `start` finds it from its own arguments, so that `start` neither
//! loads the configuration nor looks for the low-level runtime in PATH.
//!
//! `start` is a process of its own between the caller and runc's `start`;
//! loading the configuration (the cached one: the TOML file read and
//! hashed, the cache entry read and decoded, the keys checked) and finding
//! the runtime were two thirds of its work and most of the code it touched:
//! 0.37 ms over plain runc's `start` in the bench's rounds, against 0.15 ms
//! for a wrapper that execs runc at once (bench/README.md, run 33). With a
//! ticket, `start` reads one small file, looks for the container's pending
//! register (`throttlewatch_lifecycle::pending`) and, when there is none —
//! the agent has taken it, as it usually has by then — execs the runtime the
//! ticket names. A pending register, a missing or unreadable ticket, or one
//! written for another configuration file sends `start` the whole way
//! (configuration, `CreateMarks::before_start`), which waits for the watch as
//! before: the ticket can make `start` faster, never let it skip the wait.
//!
//! Tickets live in [`DIR`], not in the configured `state_dir`: `start`
//! would need the configuration to find that. They are named by the
//! container key and the configuration file's path (see [`file`]), so two
//! configurations on one node never share one. Only root's, only in a
//! directory of root's closed to others (0700, as the configuration cache
//! beside it); opened without following symlinks. One per container key
//! (`<id>@<scope>`): the wrapper's `create` removes any before the runtime
//! runs (a ticket left by an earlier container of that id is never read
//! for this one), its helper writes the new one while the runtime creates
//! (off the caller's path: 0.06 ms where /run is on disk) and removes it
//! when the create failed, `delete` removes it.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use throttlewatch_core::state_dir::{is_root, is_root_private_dir, make_root_private_dir};
use throttlewatch_core::ContainerKey;

/// Where the tickets live (tmpfs, as the runtimes' own state).
pub const DIR: &str = "/run/throttlewatch/start";

/// The first field of a ticket: its format.
const VERSION: &[u8] = b"throttlewatch-start-ticket-1";

/// A ticket is three paths; more is not one of ours.
const MAX_BYTES: u64 = 3 * 4096 + 64;

/// What `start` needs from `create`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    /// The configuration file `create` loaded (`--throttlewatch-config`,
    /// else $THROTTLEWATCH_CONFIG; None: neither, the default path). A
    /// `start` given another one goes the whole way.
    pub config: Option<PathBuf>,
    /// The low-level runtime `create` ran (resolved: never the wrapper).
    pub runtime: PathBuf,
    /// The container's `pending/<key>` record in the configured state dir.
    pub pending: PathBuf,
}

impl Ticket {
    /// Fields separated by NUL, which no path contains.
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(256);
        for f in [
            VERSION,
            self.config
                .as_deref()
                .map_or(&[][..], |p| p.as_os_str().as_bytes()),
            self.runtime.as_os_str().as_bytes(),
            self.pending.as_os_str().as_bytes(),
        ] {
            b.extend_from_slice(f);
            b.push(0);
        }
        b
    }

    fn decode(b: &[u8]) -> Option<Ticket> {
        let mut f = b.strip_suffix(&[0])?.split(|c| *c == 0);
        let path = |f: &[u8]| PathBuf::from(std::ffi::OsString::from_vec(f.to_vec()));
        if f.next()? != VERSION {
            return None;
        }
        let config = f.next().map(|c| (!c.is_empty()).then(|| path(c)))?;
        let runtime = path(f.next().filter(|r| r.starts_with(b"/"))?);
        let pending = path(f.next().filter(|p| p.starts_with(b"/"))?);
        f.next().is_none().then_some(Ticket {
            config,
            runtime,
            pending,
        })
    }
}

/// `<key>` for the default configuration file, `<key>#<FNV-1a of the
/// configuration path, 16 hex>` for any other: two configurations (a test's
/// or a second agent's beside the node's) never share a ticket, whatever
/// container ids they see. `#` is never part of a key's file stem.
fn file(dir: &Path, key: &ContainerKey, config: Option<&Path>) -> PathBuf {
    let stem = key.file_stem();
    match config {
        None => dir.join(stem),
        Some(c) => {
            let h = throttlewatch_core::container_key::fnv64(c.as_os_str().as_bytes());
            dir.join(format!("{stem}#{h:016x}"))
        }
    }
}

/// Write `key`'s ticket in [`DIR`] (see [`write_in`]), under its configuration.
pub fn write(key: &ContainerKey, t: &Ticket) -> std::io::Result<()> {
    write_in(Path::new(DIR), key, t)
}

/// `key`'s ticket for configuration file `config` in [`DIR`], if there is a
/// whole one of ours.
pub fn read(key: &ContainerKey, config: Option<&Path>) -> Option<Ticket> {
    read_in(Path::new(DIR), key, config)
}

/// Remove `key`'s ticket for `config` from [`DIR`] (none: nothing to do).
pub fn remove(key: &ContainerKey, config: Option<&Path>) -> std::io::Result<()> {
    remove_in(Path::new(DIR), key, config)
}

fn remove_in(dir: &Path, key: &ContainerKey, config: Option<&Path>) -> std::io::Result<()> {
    match std::fs::remove_file(file(dir, key, config)) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// Write `key`'s ticket, making `dir` (0700) when missing; the caller's
/// `create` removed any earlier one before the runtime ran. Created new,
/// and when one is there already — written by the helper of an earlier
/// container of this id, stalled until now, so one of the two is stale —
/// that one is removed and none written: `start` goes the whole way.
/// Not for another user than root, nor into a directory that is not ours.
fn write_in(dir: &Path, key: &ContainerKey, t: &Ticket) -> std::io::Result<()> {
    if !is_root() {
        return Err(std::io::Error::other("start tickets are root's only"));
    }
    if !make_root_private_dir(dir) {
        return Err(std::io::Error::other(format!(
            "{}: not a directory of root's closed to others (mode 0700)",
            dir.display()
        )));
    }
    // Written in place: `start` reading it half written finds no whole
    // ticket and goes the whole way.
    let path = file(dir, key, t.config.as_deref());
    let made = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path);
    let mut f = match made {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let _ = std::fs::remove_file(&path);
            return Err(std::io::Error::new(
                e.kind(),
                format!(
                    "{}: there already (an earlier container of this id's): removed",
                    path.display()
                ),
            ));
        }
        f => f?,
    };
    f.write_all(&t.encode())
}

fn read_in(dir: &Path, key: &ContainerKey, config: Option<&Path>) -> Option<Ticket> {
    if !is_root() || !is_root_private_dir(dir) {
        return None;
    }
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(file(dir, key, config))
        .ok()?;
    let mut b = Vec::with_capacity(512);
    f.take(MAX_BYTES).read_to_end(&mut b).ok()?;
    Ticket::decode(&b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use throttlewatch_core::container_key::Scope;

    fn ticket(config: Option<&str>) -> Ticket {
        Ticket {
            config: config.map(PathBuf::from),
            runtime: "/usr/sbin/runc".into(),
            pending: "/run/throttlewatch/pending/c1@ns-k8s.io".into(),
        }
    }

    fn key() -> ContainerKey {
        ContainerKey::new("c1", Some(Scope::of_namespace("k8s.io")))
    }

    #[test]
    fn tickets_round_trip_with_and_without_a_config_path() {
        for t in [ticket(Some("/etc/tw.toml")), ticket(None)] {
            assert_eq!(Ticket::decode(&t.encode()), Some(t));
        }
    }

    #[test]
    fn anything_but_a_whole_ticket_is_none() {
        let whole = ticket(Some("/etc/tw.toml")).encode();
        for cut in 0..whole.len() {
            assert_eq!(Ticket::decode(&whole[..cut]), None, "cut at {cut}");
        }
        let mut extra = whole.clone();
        extra.extend_from_slice(b"/x\0");
        assert_eq!(Ticket::decode(&extra), None);
        let other = [
            &b"throttlewatch-start-ticket-2"[..],
            &whole[VERSION.len()..],
        ]
        .concat();
        assert_eq!(Ticket::decode(&other), None);
        // Relative paths are not what create writes.
        let rel = Ticket {
            runtime: "runc".into(),
            ..ticket(None)
        };
        assert_eq!(Ticket::decode(&rel.encode()), None);
    }

    #[test]
    fn written_tickets_are_read_back_and_removed() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("start");
        let cfg = Some(Path::new("/etc/tw.toml"));
        let t = ticket(Some("/etc/tw.toml"));
        assert_eq!(read_in(&dir, &key(), cfg), None);
        write_in(&dir, &key(), &t).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&file(&dir, &key(), cfg)), 0o600);
        assert_eq!(read_in(&dir, &key(), cfg), Some(t.clone()));
        // A second writer of the same key and configuration: neither ticket is kept.
        let e = write_in(&dir, &key(), &t).unwrap_err();
        assert!(e.to_string().contains("earlier container"), "{e}");
        assert_eq!(read_in(&dir, &key(), cfg), None);
        write_in(&dir, &key(), &t).unwrap();
        // Another id, or the same id under another scope: not this ticket.
        assert_eq!(read_in(&dir, &ContainerKey::new("c1", None), cfg), None);
        assert_eq!(
            read_in(&dir, &ContainerKey::new("c2", key().scope), cfg),
            None
        );
        remove_in(&dir, &key(), cfg).unwrap();
        assert_eq!(read_in(&dir, &key(), cfg), None);
        remove_in(&dir, &key(), cfg).unwrap();
    }

    #[test]
    fn two_configurations_never_share_a_ticket() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("start");
        let (node, test) = (ticket(None), ticket(Some("/tmp/private/tw.toml")));
        write_in(&dir, &key(), &node).unwrap();
        write_in(&dir, &key(), &test).unwrap();
        assert_eq!(read_in(&dir, &key(), None), Some(node.clone()));
        assert_eq!(
            read_in(&dir, &key(), Some(Path::new("/tmp/private/tw.toml"))),
            Some(test)
        );
        assert_eq!(
            read_in(&dir, &key(), Some(Path::new("/tmp/other.toml"))),
            None
        );
        // The test's delete leaves the node's ticket alone.
        remove_in(&dir, &key(), Some(Path::new("/tmp/private/tw.toml"))).unwrap();
        assert_eq!(read_in(&dir, &key(), None), Some(node));
        assert!(
            dir.join("c1@ns-k8s.io").exists(),
            "the default configuration's name is the key"
        );
    }

    #[test]
    fn a_directory_open_to_others_or_a_symlink_is_not_used() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("start");
        write_in(&dir, &key(), &ticket(None)).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            read_in(&dir, &key(), None),
            None,
            "a directory others can read"
        );
        let e = write_in(&dir, &key(), &ticket(None)).unwrap_err();
        assert!(e.to_string().contains("0700"), "{e}");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert_eq!(read_in(&link, &key(), None), None, "a symlinked directory");
        // A ticket that is a symlink is not followed.
        let elsewhere = d.path().join("elsewhere");
        std::fs::write(&elsewhere, ticket(None).encode()).unwrap();
        std::fs::remove_file(dir.join("c1@ns-k8s.io")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir.join("c1@ns-k8s.io")).unwrap();
        assert_eq!(read_in(&dir, &key(), None), None, "a symlinked ticket");
        assert!(write_in(&dir, &key(), &ticket(None)).is_err());
        assert_eq!(std::fs::read(&elsewhere).unwrap(), ticket(None).encode());
    }
}
