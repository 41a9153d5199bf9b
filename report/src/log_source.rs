//! Finding per-container logs: files, directories, or a container's id or
//! name in the log directory; a log's rotated parts (`X.jsonl.2`,
//! `X.jsonl.1`, then `X.jsonl`) oldest first, and its earlier lifetimes.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use throttlewatch_core::logfmt::rotate::LIFETIME_SEPARATOR;
use throttlewatch_core::logfmt::{log_file_name, Line, Record};

use crate::read_error::ReadError;

/// One container's log: its parts, oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSource {
    pub parts: Vec<PathBuf>,
}

impl LogSource {
    /// The current (newest) part, which names the log.
    pub fn path(&self) -> &Path {
        self.parts
            .last()
            .map(PathBuf::as_path)
            .unwrap_or(Path::new(""))
    }
    pub fn total_bytes(&self) -> u64 {
        self.parts
            .iter()
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .sum()
    }
}

/// Resolve the command-line arguments: files, directories (every log in
/// them), or container ids / names looked up in `log_dir`.
pub fn resolve(args: &[String], log_dir: &Path) -> Result<Vec<LogSource>, ReadError> {
    let mut out = Vec::new();
    for a in args {
        let p = Path::new(a);
        if p.is_dir() {
            let found = logs_in_dir(p)?;
            if found.is_empty() {
                return Err(ReadError::NotFound(format!(
                    "{a}: no *.jsonl logs in this directory"
                )));
            }
            out.extend(found);
        } else if p.is_file() {
            out.push(with_rotated_parts(p));
        } else {
            out.push(by_container(a, log_dir)?);
        }
    }
    Ok(out)
}

/// Every log in a directory (rotated parts folded into their log), by name.
pub fn logs_in_dir(dir: &Path) -> Result<Vec<LogSource>, ReadError> {
    let io = |source| ReadError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl") && p.is_file())
        .collect();
    names.sort();
    Ok(names.iter().map(|p| with_rotated_parts(p)).collect())
}

/// `X.jsonl` with its rotated parts `X.jsonl.N` (N = 1 is the newest of them).
pub fn with_rotated_parts(current: &Path) -> LogSource {
    let mut parts = Vec::new();
    let mut n = 1;
    loop {
        let mut s = current.as_os_str().to_owned();
        s.push(format!(".{n}"));
        let p = PathBuf::from(s);
        if !p.is_file() {
            break;
        }
        parts.push(p);
        n += 1;
    }
    parts.reverse();
    parts.push(current.to_path_buf());
    LogSource { parts }
}

/// A container id, an unambiguous id prefix, a log's file stem (`web@ns-k8s.io`:
/// the id of a runc root or containerd namespace), or a container name, in `log_dir`.
/// Each lifetime of a container has its own log; the latest is `X.jsonl`,
/// earlier ones `X+<start ts>.jsonl` (give that stem to read one of them).
pub(crate) fn by_container(key: &str, log_dir: &Path) -> Result<LogSource, ReadError> {
    let exact = log_dir.join(log_file_name(key));
    if exact.is_file() {
        return Ok(latest_lifetime(&exact));
    }
    let stem = log_dir.join(format!("{key}.jsonl"));
    if !key.contains('/') && stem.is_file() {
        return Ok(latest_lifetime(&stem));
    }
    // Only earlier lifetimes left (the latest removed by the directory cap).
    if let Some(newest) = earlier_lifetimes(&exact).pop() {
        return Ok(with_rotated_parts(&newest));
    }
    let all = logs_in_dir(log_dir).map_err(|_| {
        ReadError::NotFound(format!(
            "{key}: not a file, a directory, or a container with a log in {} (the configured log_dir, which cannot be read)",
            log_dir.display()
        ))
    })?;
    let prefix = log_file_name(key);
    let prefix = prefix.trim_end_matches(".jsonl");
    // An id prefix names a container, not one of its lifetimes: earlier
    // lifetimes (`X+<ts>.jsonl`) are found through their container's latest.
    let mut hits: Vec<LogSource> = all
        .iter()
        .filter(|s| {
            s.path().file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                n.starts_with(prefix) && !n.contains(LIFETIME_SEPARATOR)
            })
        })
        .cloned()
        .collect();
    if hits.len() == 1 {
        return Ok(latest_lifetime(hits.remove(0).path()));
    }
    if hits.is_empty() {
        hits = all
            .into_iter()
            .filter(|s| {
                !s.path()
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().contains(LIFETIME_SEPARATOR))
            })
            .filter(|s| start_of(s).is_some_and(|st| st.container_name == key))
            .collect();
        if hits.len() == 1 {
            return Ok(latest_lifetime(hits.remove(0).path()));
        }
    }
    match hits.len() {
        1 => Ok(hits.remove(0)),
        0 => Err(ReadError::NotFound(format!(
            "{key}: not a file, a directory, or a container id/name with a log in {} (the configured log_dir)",
            log_dir.display()
        ))),
        n => Err(ReadError::NotFound(format!(
            "{key}: matches {n} logs in {} ({}); give more of the id",
            log_dir.display(),
            hits.iter()
                .map(|h| h.path().display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// The earlier lifetimes of the container whose latest log is `current`
/// (`X.jsonl`): `X+<ts>.jsonl`, oldest first.
pub fn earlier_lifetimes(current: &Path) -> Vec<PathBuf> {
    let (Some(dir), Some(stem)) = (
        current.parent(),
        current
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".jsonl")),
    ) else {
        return Vec::new();
    };
    let head = format!("{stem}{LIFETIME_SEPARATOR}");
    let mut found: Vec<(u64, u64, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let life = name.strip_prefix(&head)?.strip_suffix(".jsonl")?;
            let (ts, n) = life.split_once('-').unwrap_or((life, "0"));
            Some((ts.parse().ok()?, n.parse().ok()?, e.path()))
        })
        .filter(|(.., p)| p.is_file())
        .collect();
    found.sort();
    found.into_iter().map(|(.., p)| p).collect()
}

/// The latest lifetime's log; the earlier ones listed on stderr, once.
fn latest_lifetime(current: &Path) -> LogSource {
    let earlier = earlier_lifetimes(current);
    if !earlier.is_empty() {
        let stem = |p: &Path| {
            p.file_name()
                .map(|n| n.to_string_lossy().trim_end_matches(".jsonl").to_string())
                .unwrap_or_default()
        };
        eprintln!(
            "report: {} lifetimes of this container in {}: {} (earlier; give one of these to report it), {} (the latest, reported here)",
            earlier.len() + 1,
            current.parent().unwrap_or(Path::new(".")).display(),
            earlier.iter().map(|p| stem(p)).collect::<Vec<_>>().join(", "),
            stem(current)
        );
    }
    with_rotated_parts(current)
}

/// The start record of a log, if its first line is one.
fn start_of(s: &LogSource) -> Option<throttlewatch_core::logfmt::Start> {
    let f = File::open(s.parts.first()?).ok()?;
    let mut line = String::new();
    BufReader::new(f).read_line(&mut line).ok()?;
    match serde_json::from_str::<Line>(&line).ok()?.record {
        Record::Start(st) => Some(st),
        _ => None,
    }
}
