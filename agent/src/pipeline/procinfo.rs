//! What a `process` record says of a process: its parent, executable and
//! (bounded) command line, read once from `/proc/<pid>`. The agent runs as
//! root on behalf of untrusted containers: nothing here follows a link the
//! container controls (`exe` is read with readlink, never opened), and every
//! read is bounded.

use std::io::Read;
use std::path::Path;

use throttlewatch_core::logfmt::Process;

/// Bytes of the command line kept.
pub(crate) const CMDLINE_MAX: usize = 256;

pub(crate) fn read(proc: &Path, pid: u32, cmdline: bool) -> Process {
    let dir = proc.join(pid.to_string());
    Process {
        pid,
        ppid: read_bounded(&dir.join("stat"), 4096).and_then(|s| ppid(&s)),
        exe: std::fs::read_link(dir.join("exe"))
            .ok()
            .map(|p| clip(&p.to_string_lossy(), CMDLINE_MAX)),
        cmdline: cmdline
            .then(|| read_bounded(&dir.join("cmdline"), CMDLINE_MAX + 1))
            .flatten()
            .map(|s| args(&s))
            .filter(|s| !s.is_empty()),
    }
}

fn read_bounded(path: &Path, max: usize) -> Option<String> {
    let f = std::fs::File::open(path).ok()?;
    let mut b = Vec::new();
    f.take(max as u64).read_to_end(&mut b).ok()?;
    Some(String::from_utf8_lossy(&b).into_owned())
}

/// The 4th field of `/proc/<pid>/stat`, after the `(comm)` that may hold
/// spaces and parentheses (so: after the last `)`).
fn ppid(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// NUL-separated arguments as one line: control characters shown as `?`,
/// cut at CMDLINE_MAX bytes with `…`.
fn args(raw: &str) -> String {
    let cut = raw.len() > CMDLINE_MAX;
    let joined: String = raw
        .trim_end_matches('\0')
        .chars()
        .map(|c| match c {
            '\0' => ' ',
            c if c.is_control() => '?',
            c => c,
        })
        .collect();
    let s = clip(&joined, CMDLINE_MAX);
    if cut && !s.ends_with('…') {
        format!("{s}…")
    } else {
        s
    }
}

fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_from_a_proc_tree() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("42");
        std::fs::create_dir(&p).unwrap();
        std::fs::write(p.join("stat"), "42 (py (worker) 1) S 7 42 42 0 -1").unwrap();
        std::fs::write(p.join("cmdline"), b"python3\0train.py\0--x\x1b\0").unwrap();
        std::os::unix::fs::symlink("/usr/bin/python3.11", p.join("exe")).unwrap();
        let r = read(d.path(), 42, true);
        assert_eq!(r.ppid, Some(7));
        assert_eq!(r.exe.as_deref(), Some("/usr/bin/python3.11"));
        assert_eq!(r.cmdline.as_deref(), Some("python3 train.py --x?"));
        assert_eq!(
            read(d.path(), 42, false).cmdline,
            None,
            "log_cmdline = false"
        );
        let gone = read(d.path(), 43, true);
        assert_eq!((gone.ppid, gone.exe, gone.cmdline), (None, None, None));
    }

    #[test]
    fn a_long_command_line_is_cut_at_256_bytes() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("5");
        std::fs::create_dir(&p).unwrap();
        std::fs::write(p.join("cmdline"), "é".repeat(400)).unwrap();
        let c = read(d.path(), 5, true).cmdline.unwrap();
        assert!(c.len() <= CMDLINE_MAX + '…'.len_utf8(), "{}", c.len());
        assert!(c.ends_with('…'));
    }
}
