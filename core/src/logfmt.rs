//! The per-container log: JSON Lines, one file per container, versioned.
//! Documented in docs/log-format.md; every line has `v` and `type`.

pub mod control;
pub mod gpu;
mod records;
pub mod rotate;
pub mod wakeups;
mod writer;
pub use crate::container_key::escape_id;
pub use control::Control;
pub use gpu::GpuSample;
pub use records::*;
pub use rotate::Rotation;
pub use wakeups::Wakeups;
pub use writer::{LogWriter, FLUSH_EVERY};

/// A container's log file name: `<escaped id>.jsonl` (see [`escape_id`]).
pub fn log_file_name(container_id: &str) -> String {
    escape_id(container_id) + ".jsonl"
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// Read a whole log back.
    pub fn read_log(path: &Path) -> std::io::Result<Vec<Line>> {
        let s = std::fs::read_to_string(path)?;
        s.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                serde_json::from_str(l)
                    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
            })
            .collect()
    }

    fn sample() -> Vec<Record> {
        vec![
            Record::Start(Start {
                container_id: "abc".into(),
                cgroup_mode: "v1".into(),
                quota_us: Some(50_000),
                period_us: 100_000,
                labels: [("k8s.pod".to_string(), "p".to_string())].into(),
                ..Default::default()
            }),
            Record::Throttle(Throttle {
                tid: 7,
                pid: 5,
                comm: "w".into(),
                frozen_ns: 80_000_000,
                ..Default::default()
            }),
            Record::Throttle(Throttle {
                tid: 8,
                pid: 5,
                comm: "q".into(),
                frozen_ns: 60_000_000,
                queued: true,
                ..Default::default()
            }),
            Record::CpuStat(CpuStatSnapshot {
                nr_periods: 3,
                local_throttled_ns: Some(4),
                gpu: vec![GpuSample {
                    gpu: 2,
                    start_ns: 1,
                    interval_ns: 1_000_000_000,
                    util_pct: 90,
                    ..Default::default()
                }],
                ..Default::default()
            }),
            Record::End(End {
                reason: "exit".into(),
                top_threads: vec![ThreadSummary {
                    tid: 7,
                    comm: "w".into(),
                    count: 2,
                    total_frozen_ns: 9,
                    max_frozen_ns: 5,
                }],
                probe_throttled_ns: 101,
                kernel_throttled_ns: 100,
                ..Default::default()
            }),
        ]
    }

    #[test]
    fn round_trip_through_a_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.jsonl");
        let mut w = LogWriter::open(&p, false).unwrap();
        for r in sample() {
            w.write(r).unwrap();
        }
        w.finish().unwrap();
        let lines = read_log(&p).unwrap();
        assert_eq!(lines.len(), sample().len());
        assert!(lines.iter().all(|l| l.v == SCHEMA_VERSION && l.ts > 0));
        let got: Vec<Record> = lines.into_iter().map(|l| l.record).collect();
        assert_eq!(got, sample());
    }

    #[test]
    fn every_line_has_v_and_type() {
        for r in sample() {
            let v: serde_json::Value = serde_json::to_value(Line {
                v: 1,
                ts: 1,
                record: r,
            })
            .unwrap();
            assert_eq!(v["v"], 1);
            assert!(v["type"].is_string(), "{v}");
        }
        let t = serde_json::to_value(Line {
            v: 1,
            ts: 1,
            record: sample()[1].clone(),
        })
        .unwrap();
        for k in [
            "tid",
            "pid",
            "comm",
            "cpu",
            "start_ns",
            "frozen_ns",
            "cgroup_id",
        ] {
            assert!(t.get(k).is_some(), "throttle record lacks {k}");
        }
    }

    #[test]
    fn fidelity() {
        let e = End {
            probe_throttled_ns: 101,
            kernel_throttled_ns: 100,
            ..Default::default()
        };
        assert!((e.fidelity_error() - 0.01).abs() < 1e-9);
    }

    #[test]
    fn file_names_are_safe() {
        assert_eq!(log_file_name("abc-123_x"), "abc-123_x.jsonl");
        assert_eq!(
            log_file_name("../../etc/passwd"),
            "%2E%2E%2F%2E%2E%2Fetc%2Fpasswd.jsonl"
        );
        assert_eq!(log_file_name(""), "%00.jsonl");
        let long = log_file_name(&"x".repeat(1000));
        assert!(long.len() < 220 && !long.contains('/'));
        assert_ne!(
            log_file_name(&"x".repeat(1000)),
            log_file_name(&"x".repeat(999))
        );
    }
}
