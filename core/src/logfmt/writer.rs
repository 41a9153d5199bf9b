//! The one writer of a container's log: whole JSON lines, batched, cut into
//! parts at a size (see [`super::rotate`]), never a cut line on disk.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::records::{now_unix_ns, Line, Record, SCHEMA_VERSION};
use super::rotate::{self, Rotation};

/// Writes one container's log, batching lines; `finish` flushes and syncs.
pub struct LogWriter {
    path: PathBuf,
    file: File,
    /// Whole lines not yet written.
    buf: Vec<u8>,
    /// The file's length after the last write that succeeded (a line end).
    len_ok: u64,
    pending: usize,
    /// When the file is cut into parts (`X.1` …); see [`rotate`].
    rotation: Rotation,
    rotations: u64,
}

/// The most bytes buffered; past it a record waits for a flush, or is
/// refused while the disk is full.
const BUFFER_BYTES: usize = 64 * 1024;

/// How many records are buffered before a flush (the agent also flushes on a timer).
pub const FLUSH_EVERY: usize = 256;

impl LogWriter {
    /// Create a new log (0640), or append to an existing one when `append`.
    /// Never follows a symlink at the final component.
    pub fn open(path: &Path, append: bool) -> std::io::Result<LogWriter> {
        Self::open_with(path, append, Rotation::NONE)
    }

    /// `open`, cutting the log into parts at `rotation.max_bytes`. A new log
    /// (not `append`) removes parts an older log of that name left.
    pub fn open_with(path: &Path, append: bool, rotation: Rotation) -> std::io::Result<LogWriter> {
        let mut o = OpenOptions::new();
        o.write(true)
            .mode(0o640)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
        if append {
            o.append(true).create(true);
        } else {
            o.create(true).truncate(true);
        }
        let f = o.open(path)?;
        if !append {
            rotate::remove_parts_from(path, 1)?;
        }
        let len_ok = f.metadata()?.len();
        Ok(LogWriter {
            path: path.to_path_buf(),
            file: f,
            buf: Vec::with_capacity(BUFFER_BYTES),
            len_ok,
            pending: 0,
            rotation,
            rotations: 0,
        })
    }

    /// Parts cut so far.
    pub fn rotations(&self) -> u64 {
        self.rotations
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Buffer one record; returns the bytes of its line.
    pub fn write(&mut self, record: Record) -> std::io::Result<usize> {
        let line = Line {
            v: SCHEMA_VERSION,
            ts: now_unix_ns(),
            record,
        };
        let mut bytes = serde_json::to_vec(&line)?;
        bytes.push(b'\n');
        // Whole lines or nothing: on a full disk (ENOSPC) a record that does
        // not fit the buffer is refused whole, never cut in the middle.
        if self.buf.len() + bytes.len() > BUFFER_BYTES {
            self.flush()?;
        }
        self.buf.extend_from_slice(&bytes);
        self.pending += 1;
        if self.pending >= FLUSH_EVERY {
            self.flush()?;
        }
        Ok(bytes.len())
    }

    /// Write the buffered lines. A write that fails part way (ENOSPC) is
    /// cut back to the last whole line and the lines stay buffered, so the
    /// log on disk is always valid JSONL and goes on once there is space.
    /// With a rotation, whole lines go to the current part while they fit
    /// (a single line longer than a part goes alone), then the part is cut.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.pending = 0;
        while !self.buf.is_empty() {
            let n = self.fitting();
            if n == 0 {
                self.rotate()?;
                continue;
            }
            self.write_out(n)?;
        }
        Ok(())
    }

    /// How many buffered bytes (whole lines) the current part takes.
    fn fitting(&self) -> usize {
        let max = self.rotation.max_bytes;
        if max == 0 || self.len_ok + self.buf.len() as u64 <= max {
            return self.buf.len();
        }
        let room = (max.saturating_sub(self.len_ok) as usize).min(self.buf.len());
        let lines = self.buf[..room].iter().rposition(|b| *b == b'\n');
        match (lines, self.len_ok) {
            (Some(i), _) => i + 1,
            // A line longer than a part goes alone into an empty part.
            (None, 0) => self
                .buf
                .iter()
                .position(|b| *b == b'\n')
                .map_or(self.buf.len(), |i| i + 1),
            (None, _) => 0,
        }
    }

    fn write_out(&mut self, n: usize) -> std::io::Result<()> {
        match self.file.write_all(&self.buf[..n]) {
            Ok(()) => {
                self.len_ok += n as u64;
                self.buf.drain(..n);
                Ok(())
            }
            Err(e) => {
                // Back to the last line end (the offset too: a log opened
                // without O_APPEND would otherwise leave a hole).
                let _ = self.file.set_len(self.len_ok);
                let _ = std::io::Seek::seek(&mut self.file, std::io::SeekFrom::Start(self.len_ok));
                Err(e)
            }
        }
    }

    /// Cut the current part. On failure rotation stops for this log (the
    /// lines still go to the current part) and the error is returned once.
    fn rotate(&mut self) -> std::io::Result<()> {
        let cut = rotate::rotate_parts(&self.path, self.rotation.keep).and_then(|_| {
            OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o640)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&self.path)
        });
        match cut {
            Ok(f) => {
                self.file = f;
                self.len_ok = 0;
                self.rotations += 1;
                Ok(())
            }
            Err(e) => {
                self.rotation = Rotation::NONE;
                Err(std::io::Error::new(
                    e.kind(),
                    format!("rotating {}: {e}", self.path.display()),
                ))
            }
        }
    }

    /// Flush and fsync; the log is complete on disk afterwards.
    pub fn finish(mut self) -> std::io::Result<()> {
        self.flush()?;
        self.file.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logfmt::tests::read_log;
    use crate::logfmt::Throttle;

    #[test]
    fn writer_rotates_whole_lines_at_the_size() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.jsonl");
        let rot = Rotation {
            max_bytes: 4096,
            keep: 2,
        };
        let mut w = LogWriter::open_with(&p, false, rot).unwrap();
        for i in 0..300 {
            let mut t = Throttle {
                tid: i,
                ..Default::default()
            };
            t.comm = format!("worker-{i}");
            w.write(Record::Throttle(t)).unwrap();
        }
        let cut = w.rotations();
        w.finish().unwrap();
        assert!(cut >= 5, "{cut} rotations");
        let parts = [p.clone(), rotate::part(&p, 1), rotate::part(&p, 2)];
        for f in &parts {
            let text = std::fs::read_to_string(f).unwrap();
            assert!(
                text.len() <= 4096 && text.ends_with('\n'),
                "{}",
                f.display()
            );
            assert!(read_log(f).is_ok(), "whole lines in {}", f.display());
        }
        assert!(!rotate::part(&p, 3).exists(), "kept count");
        let newest = read_log(&p).unwrap();
        assert!(matches!(&newest.last().unwrap().record, Record::Throttle(t) if t.tid == 299));
        // A new log of the same name does not inherit the old one's parts.
        LogWriter::open_with(&p, false, rot).unwrap();
        assert!(!rotate::part(&p, 1).exists());
    }

    #[test]
    fn writer_refuses_symlink() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("target");
        std::fs::write(&target, "keep").unwrap();
        let link = d.path().join("l.jsonl");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(LogWriter::open(&link, false).is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
    }
}
