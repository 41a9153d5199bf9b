//! Streaming per-container logs (docs/log-format.md); finding them is
//! log_source.rs.
//!
//! A log is read one line at a time into a reused buffer, so memory stays flat
//! in the log's size. Rotated parts (`X.jsonl.2`, `X.jsonl.1`, then `X.jsonl`)
//! are read oldest first as one log. A last line without its newline that does
//! not parse is a write in progress (or cut by a crash): it is skipped and
//! counted. Anything else that does not parse stops the read with one line
//! naming the file, the line number and the problem.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};

use serde::Deserialize;
use throttlewatch_core::logfmt::{Line, Record, Throttle, SCHEMA_VERSION};

pub use crate::log_source::{
    earlier_lifetimes, logs_in_dir, resolve, with_rotated_parts, LogSource,
};
use crate::read_error::RECORD_TYPES;
pub use crate::read_error::{LineError, ReadError};

/// Counters from one read.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReadStats {
    pub bytes: u64,
    pub lines: u64,
    /// Last lines without their newline that did not parse (being written, or cut).
    pub truncated_lines: u64,
    /// Lines with a schema version older than this reader's (read as v1 reads them).
    pub older_version_lines: u64,
}

/// Enough of a line to check its version and pick how to read the rest.
#[derive(Deserialize)]
struct Head<'a> {
    v: Option<u64>,
    #[serde(rename = "type", borrow)]
    ty: Option<std::borrow::Cow<'a, str>>,
}

/// A `throttle` line read straight into its fields: the bulk of every log,
/// so it skips the generic (buffering) tagged-enum path.
#[derive(Deserialize)]
struct ThrottleLine {
    ts: u64,
    tid: u32,
    pid: u32,
    comm: String,
    cpu: u32,
    cpu_in: u32,
    start_ns: u64,
    frozen_ns: u64,
    cgroup_id: u64,
    throttled_cgroup_id: u64,
    throttled_level: u32,
    #[serde(default)]
    queued: bool,
}

const THROTTLE_TAG: &[u8] = b"\"type\":\"throttle\"";

/// Stream every record of `src` to `each`; `progress` gets the bytes read so far.
pub fn read(
    src: &LogSource,
    mut each: impl FnMut(u64, Record),
    mut progress: impl FnMut(u64),
) -> Result<ReadStats, ReadError> {
    let mut stats = ReadStats::default();
    let mut buf = Vec::with_capacity(4096);
    for path in &src.parts {
        let io = |source| ReadError::Io {
            path: path.clone(),
            source,
        };
        let f = File::open(path).map_err(io)?;
        let mut r = BufReader::with_capacity(256 * 1024, f);
        let mut lineno = 0u64;
        loop {
            buf.clear();
            let n = r.by_ref().read_until(b'\n', &mut buf).map_err(io)?;
            if n == 0 {
                break;
            }
            lineno += 1;
            stats.bytes += n as u64;
            if lineno & 0xffff == 0 {
                progress(stats.bytes);
            }
            let complete = buf.last() == Some(&b'\n');
            let text = trim(&buf);
            if text.is_empty() {
                continue;
            }
            match parse_line(text) {
                Ok(Some((v, ts, rec))) => {
                    stats.lines += 1;
                    if v < SCHEMA_VERSION as u64 {
                        stats.older_version_lines += 1;
                    }
                    each(ts, rec);
                }
                Ok(None) => stats.lines += 1,
                // A cut last line: the writer is mid-line, or crashed there.
                Err(_) if !complete => stats.truncated_lines += 1,
                Err(problem) => {
                    return Err(ReadError::Malformed {
                        path: path.clone(),
                        line: lineno,
                        problem,
                    })
                }
            }
        }
    }
    progress(stats.bytes);
    Ok(stats)
}

fn trim(b: &[u8]) -> &[u8] {
    let s = b
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(b.len());
    let e = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(s, |e| e + 1);
    &b[s..e]
}

/// One line: `Ok(Some((v, ts, record)))`, or the problem in words.
fn parse_line(text: &[u8]) -> Result<Option<(u64, u64, Record)>, LineError> {
    if memfind(text, THROTTLE_TAG) {
        if let Ok(t) = serde_json::from_slice::<ThrottleLine>(text) {
            let v = check_version(text)?;
            return Ok(Some((v, t.ts, Record::Throttle(t.into()))));
        }
    }
    let head: Head =
        serde_json::from_slice(text).map_err(|e| LineError::NotJson(describe(text, &e)))?;
    check_head(&head)?;
    let line: Line = serde_json::from_slice(text).map_err(|e| LineError::Unreadable {
        ty: head.ty.as_deref().unwrap_or("").to_string(),
        detail: describe(text, &e),
    })?;
    Ok(Some((line.v as u64, line.ts, line.record)))
}

/// The version of a line already known to be a well-formed throttle record.
/// Checked only where the writer put `"v":1` first; otherwise read the head.
fn check_version(text: &[u8]) -> Result<u64, LineError> {
    const V1: &[u8] = b"{\"v\":1,";
    const _: () = assert!(SCHEMA_VERSION == 1, "update V1");
    if text.starts_with(V1) {
        return Ok(SCHEMA_VERSION as u64);
    }
    let head: Head =
        serde_json::from_slice(text).map_err(|e| LineError::NotJson(describe(text, &e)))?;
    check_head(&head)?;
    Ok(head.v.unwrap_or(0))
}

/// serde_json's message with the field it stopped in, and the column on the line.
fn describe(text: &[u8], e: &serde_json::Error) -> String {
    let msg = e.to_string();
    let msg = msg
        .rsplit_once(" at line ")
        .map_or(msg.as_str(), |(m, _)| m)
        .to_string();
    let upto = &text[..e.column().min(text.len())];
    // The last `"key":` before the column is the field being read.
    let field = upto.windows(2).rposition(|w| w == b"\":").and_then(|end| {
        let start = upto[..end].iter().rposition(|c| *c == b'"')?;
        std::str::from_utf8(&upto[start + 1..end]).ok()
    });
    match field {
        Some(f) => format!("field `{f}`: {msg} (column {})", e.column()),
        None => format!("{msg} (column {})", e.column()),
    }
}

fn check_head(head: &Head) -> Result<(), LineError> {
    match head.v {
        None => return Err(LineError::NoVersion),
        Some(0) => return Err(LineError::ZeroVersion),
        Some(v) if v > SCHEMA_VERSION as u64 => return Err(LineError::NewerVersion(v)),
        Some(_) => {}
    }
    match head.ty.as_deref() {
        None => Err(LineError::NoType),
        Some(t) if !RECORD_TYPES.split(", ").any(|k| k == t) => {
            Err(LineError::UnknownType(t.to_string()))
        }
        Some(_) => Ok(()),
    }
}

fn memfind(hay: &[u8], needle: &[u8]) -> bool {
    // The tag sits near the start of every line the agent writes.
    let hay = &hay[..hay.len().min(64)];
    hay.windows(needle.len()).any(|w| w == needle)
}

impl From<ThrottleLine> for Throttle {
    fn from(t: ThrottleLine) -> Throttle {
        Throttle {
            tid: t.tid,
            pid: t.pid,
            comm: t.comm,
            cpu: t.cpu,
            cpu_in: t.cpu_in,
            start_ns: t.start_ns,
            frozen_ns: t.frozen_ns,
            cgroup_id: t.cgroup_id,
            throttled_cgroup_id: t.throttled_cgroup_id,
            throttled_level: t.throttled_level,
            queued: t.queued,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::log_source::by_container;

    const START: &str = r#"{"v":1,"ts":5,"type":"start","container_id":"abc","container_name":"web","pid":null,"cgroup_path":"/x","cgroup_id":1,"cgroup_mode":"v1","quota_us":50000,"period_us":100000,"burst_us":0,"cpus":"0-1","mems":"0","kernel_release":"6.18","throttle_model":"task","probe":"tp_btf","threshold_ns":0}"#;
    const THR: &str = r#"{"v":1,"ts":6,"type":"throttle","tid":7,"pid":7,"comm":"w","cpu":1,"cpu_in":1,"start_ns":10,"frozen_ns":20,"cgroup_id":1,"throttled_cgroup_id":1,"throttled_level":1}"#;

    fn read_all(p: &Path) -> Result<(Vec<Record>, ReadStats), ReadError> {
        let mut v = Vec::new();
        let s = read(&with_rotated_parts(p), |_, r| v.push(r), |_| {})?;
        Ok((v, s))
    }

    #[test]
    fn a_container_id_reports_its_latest_lifetime_and_each_earlier_one_by_its_stem() {
        let d = tempfile::tempdir().unwrap();
        let at = |name: &str| d.path().join(name);
        let first = START.replace("\"ts\":5", "\"ts\":100");
        std::fs::write(at("abc+100.jsonl"), format!("{first}\n")).unwrap();
        std::fs::write(at("abc+100.jsonl.1"), format!("{THR}\n")).unwrap();
        std::fs::write(at("abc+200.jsonl"), format!("{START}\n")).unwrap();
        std::fs::write(at("abc.jsonl"), format!("{START}\n{THR}\n")).unwrap();
        std::fs::write(at("abcdef.jsonl"), format!("{START}\n")).unwrap();
        let paths = |key: &str| by_container(key, d.path()).map(|s| s.parts);
        assert_eq!(paths("abc").unwrap(), vec![at("abc.jsonl")]);
        assert_eq!(
            paths("abc+100").unwrap(),
            vec![at("abc+100.jsonl.1"), at("abc+100.jsonl")]
        );
        assert_eq!(
            earlier_lifetimes(&at("abc.jsonl")),
            vec![at("abc+100.jsonl"), at("abc+200.jsonl")]
        );
        // A prefix names a container, never one of its lifetimes.
        assert_eq!(paths("abcd").unwrap(), vec![at("abcdef.jsonl")]);
        let e = by_container("ab", d.path()).unwrap_err().to_string();
        assert!(e.contains("matches 2 logs"), "{e}");
        // The latest removed (the directory cap): the newest earlier one.
        std::fs::remove_file(at("abc.jsonl")).unwrap();
        assert_eq!(paths("abc").unwrap(), vec![at("abc+200.jsonl")]);
        // A directory report holds every lifetime.
        assert_eq!(logs_in_dir(d.path()).unwrap().len(), 3);
    }

    #[test]
    fn reads_records_and_skips_a_cut_last_line() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("abc.jsonl");
        std::fs::write(&p, format!("{START}\n{THR}\n{}", &THR[..40])).unwrap();
        let (recs, s) = read_all(&p).unwrap();
        assert_eq!(recs.len(), 2);
        assert!(matches!(&recs[1], Record::Throttle(t) if t.frozen_ns == 20 && t.tid == 7));
        assert_eq!(s.truncated_lines, 1);
    }

    #[test]
    fn malformed_line_names_file_line_and_problem() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("abc.jsonl");
        let cases = [
            (
                "{\"v\":1,\"ts\":1,\"type\":\"bogus\"}",
                "unknown record type `bogus`",
            ),
            (
                "{\"v\":2,\"ts\":1,\"type\":\"end\"}",
                "schema version 2 is newer",
            ),
            ("{\"ts\":1,\"type\":\"end\"}", "no `v`"),
            ("not json", "not JSON"),
            (
                "{\"v\":1,\"ts\":1,\"type\":\"throttle\",\"tid\":\"x\"}",
                "`throttle` record that schema version 1 cannot read: field `tid`: invalid type: string \"x\", expected u32",
            ),
        ];
        for (bad, want) in cases {
            std::fs::write(&p, format!("{START}\n{bad}\n{THR}\n")).unwrap();
            let e = read_all(&p).unwrap_err().to_string();
            assert!(e.starts_with(&format!("{}:2: ", p.display())), "{e}");
            assert!(e.contains(want), "{e} lacks {want}");
        }
    }

    #[test]
    fn summary_records_are_read() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("abc.jsonl");
        let sum = r#"{"v":1,"ts":7,"type":"throttle_summary","tid":7,"pid":7,"comm":"w","cgroup_id":1,"interval_start_ns":1,"interval_end_ns":2,"threads":1,"freezes":3,"frozen_ns":30,"max_frozen_ns":12}"#;
        std::fs::write(&p, format!("{START}\n{THR}\n{sum}\n")).unwrap();
        let (recs, _) = read_all(&p).unwrap();
        assert!(matches!(&recs[2], Record::ThrottleSummary(s) if s.freezes == 3 && s.tid == 7));
    }

    #[test]
    fn rotated_parts_are_read_oldest_first() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("abc.jsonl");
        std::fs::write(d.path().join("abc.jsonl.2"), format!("{START}\n")).unwrap();
        std::fs::write(d.path().join("abc.jsonl.1"), format!("{THR}\n")).unwrap();
        std::fs::write(&p, THR.replace("\"tid\":7", "\"tid\":8") + "\n").unwrap();
        let src = with_rotated_parts(&p);
        assert_eq!(src.parts.len(), 3);
        let (recs, _) = read_all(&p).unwrap();
        assert!(matches!(recs[0], Record::Start(_)));
        assert!(matches!(&recs[2], Record::Throttle(t) if t.tid == 8));
        // A directory folds the parts into one log.
        assert_eq!(logs_in_dir(d.path()).unwrap(), vec![src]);
    }

    #[test]
    fn containers_resolve_by_id_prefix_and_name() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("abcdef.jsonl"), format!("{START}\n")).unwrap();
        std::fs::write(d.path().join("zzz.jsonl"), "").unwrap();
        let want = d.path().join("abcdef.jsonl");
        for key in ["abcdef", "abc", "web"] {
            let got = resolve(&[key.to_string()], d.path()).unwrap();
            assert_eq!(got[0].path(), want, "{key}");
        }
        let e = resolve(&["nope".to_string()], d.path()).unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
    }
}
