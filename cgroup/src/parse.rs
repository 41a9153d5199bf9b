//! Parsers named after the kernel's cgroup file formats.

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::{io_err, Result};
use crate::file_error::FileError;

pub fn read_string(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(io_err(path))
}

/// "single value" files, e.g. `cpu.cfs_quota_us` ("-1" or a number).
pub fn single_i64(path: &Path) -> Result<i64> {
    let s = read_string(path)?;
    s.trim()
        .parse()
        .map_err(|_| FileError::parse(path, "an integer", s.trim()).into())
}

/// "flat keyed" files, e.g. `cpu.stat`: `key value` per line.
pub fn flat_keyed_str(content: &str) -> BTreeMap<String, u64> {
    content
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let k = it.next()?;
            let v = it.next()?.parse().ok()?;
            Some((k.to_string(), v))
        })
        .collect()
}

/// v2 `cpu.max`: "max 100000" or "50000 100000". Returns (quota_us or None, period_us).
pub fn cpu_max_str(content: &str) -> Option<(Option<u64>, u64)> {
    let mut it = content.split_whitespace();
    let q = it.next()?;
    let p = it.next().map(|p| p.parse().ok()).unwrap_or(Some(100_000))?;
    let q = if q == "max" {
        None
    } else {
        Some(q.parse().ok()?)
    };
    Some((q, p))
}

pub fn write(path: &Path, value: &str) -> Result<()> {
    std::fs::write(path, value).map_err(io_err(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_keyed_parses_v1_cpu_stat() {
        let m = flat_keyed_str(
            "nr_periods 12\nnr_throttled 3\nthrottled_time 4500000\nnr_bursts 0\nburst_time 0\n",
        );
        assert_eq!(m["nr_periods"], 12);
        assert_eq!(m["throttled_time"], 4_500_000);
        assert_eq!(m.len(), 5);
    }

    #[test]
    fn flat_keyed_skips_garbage_lines() {
        let m = flat_keyed_str("a 1\nbroken\nb notanumber\n\nc 3");
        assert_eq!(m.len(), 2);
        assert_eq!(m["c"], 3);
    }

    #[test]
    fn cpu_max_forms() {
        assert_eq!(cpu_max_str("max 100000\n"), Some((None, 100_000)));
        assert_eq!(cpu_max_str("50000 20000"), Some((Some(50_000), 20_000)));
        assert_eq!(cpu_max_str("max"), Some((None, 100_000)));
        assert_eq!(cpu_max_str("x 1"), None);
        assert_eq!(cpu_max_str(""), None);
    }

    #[test]
    fn single_value_errors_name_the_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("cpu.cfs_quota_us");
        std::fs::write(&p, "-1\n").unwrap();
        assert_eq!(single_i64(&p).unwrap(), -1);
        std::fs::write(&p, "lots\n").unwrap();
        let e = single_i64(&p).unwrap_err().to_string();
        assert!(e.contains("cpu.cfs_quota_us") && e.contains("lots"), "{e}");
    }
}
