//! Which container a record, a log or a state file belongs to: the
//! container id **and** the id space it lives in. The same id (`web`) may
//! run at once under two runc roots (`runc --root A`, `runc --root B`) or in
//! two containerd namespaces; their sessions, logs, burst records and
//! exclusive cores must stay apart.
//!
//! A [`Scope`] names the id space in a short, stable, file-name-safe form:
//! - `ns-<namespace>` — a containerd namespace (its runc root is
//!   `/run/containerd/runc/<ns>` for containerd's runc shim, or
//!   `/run/containerd/throttlewatch/<ns>` for ours: the same id space);
//! - `root-<last component>-<hash>` — any other runc root (the hash is FNV-1a
//!   of the normalised path, so two roots ending alike stay apart);
//! - no scope — runc's default root (`/run/runc`) and callers that do not
//!   know one; their files keep the names they had before scopes existed.

use std::fmt;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

/// runc's state root when `--root` is not given (as root).
pub const RUNC_DEFAULT_ROOT: &str = "/run/runc";
/// Runc roots whose last component is a containerd namespace.
const NAMESPACE_ROOTS: [&str; 2] = ["/run/containerd/runc", "/run/containerd/throttlewatch"];
/// Longest scope accepted from a client.
pub const MAX_SCOPE_BYTES: usize = 96;
/// Separates the escaped id from the scope in file names: [`escape_id`]
/// never emits it, so `<id>@<scope>` names can be split unambiguously.
pub const SCOPE_SEPARATOR: char = '@';

/// A container id space; see the module doc. Only `[A-Za-z0-9._-]`, 1 to
/// [`MAX_SCOPE_BYTES`] bytes, not starting with `.`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Scope(String);

/// A scope a client gave that is not one: the value and what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("scope {0:?}: expected 1 to {MAX_SCOPE_BYTES} bytes of [A-Za-z0-9._-], not starting with '.' (e.g. \"ns-k8s.io\", \"root-moby-1a2b3c4d\")")]
pub struct BadScope(pub String);

impl Scope {
    /// Check a scope given by a client.
    pub fn parse(s: &str) -> Result<Scope, BadScope> {
        let ok = !s.is_empty()
            && s.len() <= MAX_SCOPE_BYTES
            && !s.starts_with('.')
            && s.bytes().all(safe_byte);
        if ok {
            Ok(Scope(s.to_string()))
        } else {
            Err(BadScope(s.to_string()))
        }
    }

    /// The id space of a containerd namespace.
    pub fn of_namespace(namespace: &str) -> Scope {
        let clean = namespace.len() <= 64 && namespace.bytes().all(safe_byte);
        if clean && !namespace.is_empty() && !namespace.starts_with('.') {
            Scope(format!("ns-{namespace}"))
        } else {
            Scope(format!("ns-{:08x}", fnv32(namespace.as_bytes())))
        }
    }

    /// The id space of a runc state root; None for runc's default root. A
    /// relative root is taken from `cwd` (runc makes it absolute the same way).
    pub fn of_runc_root(root: &Path, cwd: &Path) -> Option<Scope> {
        let p = normalise(&cwd.join(root));
        if p == Path::new(RUNC_DEFAULT_ROOT) {
            return None;
        }
        if let (Some(parent), Some(ns)) = (p.parent(), p.file_name()) {
            if NAMESPACE_ROOTS.iter().any(|r| parent == Path::new(r)) {
                return Some(Scope::of_namespace(&ns.to_string_lossy()));
            }
        }
        let last: String = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
            .bytes()
            .filter(|b| safe_byte(*b) && *b != b'.')
            .take(32)
            .map(char::from)
            .collect();
        let h = fnv32(p.as_os_str().as_encoded_bytes());
        Some(Scope(if last.is_empty() {
            format!("root-{h:08x}")
        } else {
            format!("root-{last}-{h:08x}")
        }))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Scope {
    type Error = BadScope;
    fn try_from(s: String) -> Result<Scope, BadScope> {
        Scope::parse(&s)
    }
}

impl From<Scope> for String {
    fn from(s: Scope) -> String {
        s.0
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A container as throttlewatch keys it: (scope, id).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ContainerKey {
    pub id: String,
    pub scope: Option<Scope>,
}

impl ContainerKey {
    pub fn new(id: impl Into<String>, scope: Option<Scope>) -> ContainerKey {
        ContainerKey {
            id: id.into(),
            scope,
        }
    }

    /// A file-name stem unique per key: `<escaped id>` without a scope,
    /// `<escaped id>@<scope>` with one.
    pub fn file_stem(&self) -> String {
        match &self.scope {
            None => escape_id(&self.id),
            Some(s) => format!("{}{SCOPE_SEPARATOR}{s}", escape_id(&self.id)),
        }
    }

    /// One string per key for maps that hold keys of every scope (the
    /// exclusive-cores holdings): the bare id without a scope (as before
    /// scopes existed), [`file_stem`](Self::file_stem) with one. runc and
    /// containerd ids never contain `@`, so the two forms do not meet.
    pub fn qualified(&self) -> String {
        match &self.scope {
            None => self.id.clone(),
            Some(_) => self.file_stem(),
        }
    }

    /// The container's log file name: `<file stem>.jsonl`.
    pub fn log_file_name(&self) -> String {
        self.file_stem() + ".jsonl"
    }
}

impl fmt::Display for ContainerKey {
    /// `id` without a scope, `id` (scope) with one: for people, not files.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.scope {
            None => write!(f, "{:?}", self.id),
            Some(s) => write!(f, "{:?} (scope {s})", self.id),
        }
    }
}

fn safe_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.'
}

/// FNV-1a, 32 bits: stable across builds and platforms (unlike std's hasher).
fn fnv32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, b| {
        (h ^ *b as u32).wrapping_mul(0x0100_0193)
    })
}

/// FNV-1a, 64 bits: stable across builds and platforms, for names built
/// from paths and ids (the long-id suffix of log names, start tickets).
pub fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// `.`, `..` and repeated or trailing slashes resolved by text (the root may
/// not exist yet at create); `/var/run` is `/run` (a symlink on every distribution).
fn normalise(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    match out.strip_prefix("/var/run") {
        Ok(rest) => Path::new("/run").join(rest),
        Err(_) => out,
    }
}

/// A file-name stem for a container id whatever characters it holds: safe
/// characters are kept, anything else (including `/` and `..`) is
/// percent-encoded, and long ids are cut with a hash suffix.
pub fn escape_id(container_id: &str) -> String {
    let mut s = String::new();
    for b in container_id.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            s.push(b as char);
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    if s.is_empty() {
        s.push_str("%00");
    }
    if s.len() > 200 {
        let h = fnv64(container_id.as_bytes());
        s.truncate(180);
        s.push_str(&format!("~{h:016x}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(p: &str) -> Option<String> {
        Scope::of_runc_root(Path::new(p), Path::new("/work")).map(|s| s.0)
    }

    #[test]
    fn default_root_has_no_scope_and_namespaces_are_readable() {
        assert_eq!(root("/run/runc"), None);
        assert_eq!(root("/var/run/runc/"), None);
        assert_eq!(
            root("/run/containerd/runc/k8s.io").as_deref(),
            Some("ns-k8s.io")
        );
        assert_eq!(
            root("/run/containerd/throttlewatch/default").as_deref(),
            Some("ns-default")
        );
        assert_eq!(Scope::of_namespace("a/b").0.len(), "ns-".len() + 8);
    }

    #[test]
    fn other_roots_are_short_stable_and_distinct() {
        let a = root("/tmp/x/A").unwrap();
        let b = root("/tmp/y/A").unwrap();
        assert!(
            a.starts_with("root-A-") && b.starts_with("root-A-"),
            "{a} {b}"
        );
        assert_ne!(a, b);
        assert_eq!(root("/tmp/x//A/").unwrap(), a);
        assert_eq!(root("x/A").unwrap(), root("/work/x/A").unwrap());
        // The same on every build: FNV-1a of the path.
        assert_eq!(a, format!("root-A-{:08x}", fnv32(b"/tmp/x/A")));
        let long = root(&format!("/r/{}", "z.".repeat(100))).unwrap();
        assert!(
            long.len() <= MAX_SCOPE_BYTES && Scope::parse(&long).is_ok(),
            "{long}"
        );
    }

    #[test]
    fn file_stems_differ_per_scope_and_never_leave_the_directory() {
        let web = |s: Option<&str>| ContainerKey::new("web", s.map(|s| Scope::parse(s).unwrap()));
        assert_eq!(web(None).log_file_name(), "web.jsonl");
        assert_eq!(
            web(Some("ns-default")).log_file_name(),
            "web@ns-default.jsonl"
        );
        assert_ne!(web(Some("ns-a")).file_stem(), web(Some("ns-b")).file_stem());
        let evil = ContainerKey::new("../x@ns-a", None).file_stem();
        assert!(!evil.contains('/') && !evil.contains('@'), "{evil}");
    }

    #[test]
    fn bad_scopes_are_refused_naming_what_is_accepted() {
        for bad in ["", "../x", "a/b", ".hidden", &"x".repeat(97)] {
            let e = Scope::parse(bad).unwrap_err().to_string();
            assert!(e.contains("[A-Za-z0-9._-]"), "{e}");
        }
        let e = serde_json::from_str::<Scope>("\"a b\"").unwrap_err();
        assert!(e.to_string().contains("scope"), "{e}");
    }
}
