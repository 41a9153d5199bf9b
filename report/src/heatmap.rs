//! The three heatmaps, filled while the log streams: time columns start one
//! CFS period wide and double (neighbours merged) whenever the log outgrows
//! `MAX_COLS`, so their size never depends on the log's length.
//!
//! 1. latency: time x freeze duration (log2 rows), freezes counted;
//! 2. offset: time x offset within the CFS period, frozen time summed. The
//!    period's phase is not in the log; freezes end at the refill (the
//!    unthrottle), so offset 0 is put at the most common thaw offset;
//! 3. threads: thread x time, frozen time summed.

use std::collections::HashMap;

use serde::Serialize;
use throttlewatch_core::logfmt::Throttle;

pub const MAX_COLS: usize = 120;
/// Latency rows: row r holds freezes in [2^(r+LAT_BASE), 2^(r+LAT_BASE+1)) ns; the first
/// row also everything shorter, the last everything longer.
pub const LAT_ROWS: usize = 18;
pub const LAT_BASE: u32 = 13;
/// Fine offset slots per period (the phase is found at this resolution).
const FINE: usize = 100;
/// Offset rows shown.
pub const OFF_ROWS: usize = 20;
/// Threads with a timeline row (the rest are summed into no row).
const MAX_THREADS: usize = 4096;

#[derive(Debug, Clone, Default)]
pub struct HeatmapBins {
    origin: u64,
    period: u64,
    bin_ns: u64,
    cols: usize,
    latency: Vec<[u64; LAT_ROWS]>,
    /// Frozen time in part of a fine slot, added directly.
    offset: Vec<[u64; FINE]>,
    /// Whole fine slots covered: a difference array (prefix sums give the time per slot).
    offset_full: Vec<[i64; FINE + 1]>,
    thaw: Vec<u64>,
    threads: HashMap<u32, Vec<u64>>,
}

/// A finished heatmap: `cells[col][row]`, and what the axes mean.
#[derive(Debug, Clone, Serialize)]
pub struct Grid {
    pub title: String,
    pub bin_ns: u64,
    pub origin_ns: u64,
    /// The span one row covers (offset map), 0 where rows are not spans of time.
    pub row_ns: u64,
    pub row_labels: Vec<String>,
    pub value: &'static str,
    pub cells: Vec<Vec<u64>>,
}

impl Grid {
    pub fn nonzero_cells(&self) -> usize {
        self.cells.iter().flatten().filter(|v| **v > 0).count()
    }
    pub fn max(&self) -> u64 {
        self.cells.iter().flatten().copied().max().unwrap_or(0)
    }
}

impl HeatmapBins {
    pub fn new(origin: u64, period: u64) -> HeatmapBins {
        let period = if period == 0 { 100_000_000 } else { period };
        HeatmapBins {
            origin,
            period,
            bin_ns: period,
            cols: 0,
            latency: vec![[0; LAT_ROWS]; MAX_COLS],
            offset: vec![[0; FINE]; MAX_COLS],
            offset_full: vec![[0; FINE + 1]; MAX_COLS],
            thaw: vec![0; FINE],
            threads: HashMap::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.latency.is_empty()
    }

    fn column(&mut self, t: u64) -> usize {
        let rel = t.saturating_sub(self.origin);
        while rel / self.bin_ns >= MAX_COLS as u64 {
            self.halve();
        }
        let c = (rel / self.bin_ns) as usize;
        self.cols = self.cols.max(c + 1);
        c
    }

    /// Merge neighbouring columns: twice the width, half the columns.
    fn halve(&mut self) {
        fn fold<T: Copy + Default, const N: usize>(v: &mut [[T; N]], add: fn(T, T) -> T) {
            for i in 0..v.len() / 2 {
                let (a, b) = (v[2 * i], v[2 * i + 1]);
                for r in 0..N {
                    v[i][r] = add(a[r], b[r]);
                }
            }
            let half = v.len() / 2;
            for x in v[half..].iter_mut() {
                *x = [T::default(); N];
            }
        }
        fold(&mut self.latency, |a, b| a + b);
        fold(&mut self.offset, |a, b| a + b);
        fold(&mut self.offset_full, |a, b| a + b);
        for row in self.threads.values_mut() {
            for i in 0..row.len() / 2 {
                row[i] = row[2 * i] + row[2 * i + 1];
            }
            let n = row.len();
            row[n / 2..].iter_mut().for_each(|x| *x = 0);
        }
        self.bin_ns *= 2;
        self.cols = self.cols.div_ceil(2);
    }

    pub fn add(&mut self, t: &Throttle) {
        if self.latency.is_empty() {
            *self = HeatmapBins::new(t.start_ns, 100_000_000);
        }
        let c = self.column(t.start_ns);
        let msb = 63 - t.frozen_ns.max(1).leading_zeros();
        let row = (msb.saturating_sub(LAT_BASE) as usize).min(LAT_ROWS - 1);
        self.latency[c][row] += 1;

        // Spread the freeze over the offsets it covers (whole periods evenly).
        let whole = t.frozen_ns / self.period;
        let rest = t.frozen_ns % self.period;
        if whole > 0 {
            let slot = (self.period / FINE as u64) as i64;
            self.offset_full[c][0] += whole as i64 * slot;
            self.offset_full[c][FINE] -= whole as i64 * slot;
        }
        let from = t.start_ns % self.period;
        if from + rest <= self.period {
            self.add_offsets(c, from, from + rest);
        } else {
            self.add_offsets(c, from, self.period);
            self.add_offsets(c, 0, from + rest - self.period);
        }
        let thaw =
            ((t.start_ns + t.frozen_ns) % self.period / (self.period / FINE as u64)) as usize;
        self.thaw[thaw.min(FINE - 1)] += 1;

        if self.threads.len() < MAX_THREADS || self.threads.contains_key(&t.tid) {
            self.threads
                .entry(t.tid)
                .or_insert_with(|| vec![0; MAX_COLS])[c] += t.frozen_ns;
        }
    }

    /// Frozen time over offsets [from, to) of the period: the slots it covers
    /// whole go into the difference array (constant time per freeze).
    fn add_offsets(&mut self, c: usize, from: u64, to: u64) {
        let slot = self.period / FINE as u64;
        let (from, to) = (from.min(slot * FINE as u64), to.min(slot * FINE as u64));
        if from >= to {
            return;
        }
        let (i0, i1) = ((from / slot) as usize, (to / slot) as usize);
        if i0 == i1 {
            self.offset[c][i0] += to - from;
            return;
        }
        self.offset[c][i0] += (i0 as u64 + 1) * slot - from;
        if i1 < FINE {
            self.offset[c][i1] += to - i1 as u64 * slot;
        }
        if i1 > i0 + 1 {
            self.offset_full[c][i0 + 1] += slot as i64;
            self.offset_full[c][i1] -= slot as i64;
        }
    }

    /// Frozen time per fine offset slot of column `c`.
    fn offsets(&self, c: usize) -> [u64; FINE] {
        let mut out = self.offset[c];
        let mut run = 0i64;
        for (i, v) in out.iter_mut().enumerate() {
            run += self.offset_full[c][i];
            *v += run.max(0) as u64;
        }
        out
    }

    /// The fine slot where periods begin: the most common thaw.
    fn phase(&self) -> usize {
        (0..FINE)
            .max_by_key(|i| (self.thaw[*i], FINE - i))
            .unwrap_or(0)
    }

    fn cols(&self) -> usize {
        self.cols.max(1)
    }

    pub fn latency(&self) -> Grid {
        let row_labels = (0..LAT_ROWS)
            .map(|r| {
                let lo = 1u64 << (r as u32 + LAT_BASE);
                if r == 0 {
                    format!("<{}", short(lo * 2))
                } else {
                    format!(">={}", short(lo))
                }
            })
            .collect();
        Grid {
            title: "freezes: time x duration".into(),
            bin_ns: self.bin_ns,
            origin_ns: self.origin,
            row_ns: 0,
            row_labels,
            value: "freezes",
            cells: self.latency[..self.cols()]
                .iter()
                .map(|c| c.to_vec())
                .collect(),
        }
    }

    pub fn offset(&self) -> Grid {
        let ph = self.phase();
        let per = FINE / OFF_ROWS;
        let cells = (0..self.cols())
            .map(|i| self.offsets(i))
            .map(|c| {
                (0..OFF_ROWS)
                    .map(|r| (0..per).map(|k| c[(ph + r * per + k) % FINE]).sum())
                    .collect()
            })
            .collect();
        let row_ns = self.period / OFF_ROWS as u64;
        Grid {
            title: "frozen time: time x offset in the CFS period".into(),
            bin_ns: self.bin_ns,
            origin_ns: self.origin,
            row_ns,
            row_labels: (0..OFF_ROWS)
                .map(|r| format!("+{}", short(r as u64 * row_ns)))
                .collect(),
            value: "frozen ns",
            cells,
        }
    }

    /// Rows: the `n` threads with the most frozen time (tid order for ties).
    pub fn threads(&self, top: &[(u32, String)]) -> Grid {
        let cols = self.cols();
        let cells = (0..cols)
            .map(|c| {
                top.iter()
                    .map(|(tid, _)| self.threads.get(tid).map_or(0, |r| r[c]))
                    .collect()
            })
            .collect();
        Grid {
            title: "frozen time: thread x time".into(),
            bin_ns: self.bin_ns,
            origin_ns: self.origin,
            row_ns: 0,
            row_labels: top.iter().map(|(t, c)| format!("{t} {c}")).collect(),
            value: "frozen ns",
            cells,
        }
    }
}

/// A compact duration: 16µs, 2.5ms, 1s.
pub fn short(ns: u64) -> String {
    let (v, u) = if ns >= 1_000_000_000 {
        (ns as f64 / 1e9, "s")
    } else if ns >= 1_000_000 {
        (ns as f64 / 1e6, "ms")
    } else if ns >= 1_000 {
        (ns as f64 / 1e3, "µs")
    } else {
        (ns as f64, "ns")
    };
    let s = format!("{v:.1}");
    format!("{}{u}", s.trim_end_matches(".0"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn freeze(tid: u32, start_ns: u64, frozen_ns: u64) -> Throttle {
        Throttle {
            tid,
            start_ns,
            frozen_ns,
            ..Default::default()
        }
    }

    #[test]
    fn columns_double_and_keep_every_count() {
        let p = 100_000_000;
        let mut h = HeatmapBins::new(0, p);
        for i in 0..1000u64 {
            h.add(&freeze(1, i * p + 60_000_000, 40_000_000));
        }
        let g = h.latency();
        assert!(
            g.cells.len() <= MAX_COLS && g.bin_ns == 16 * p,
            "{}",
            g.bin_ns
        );
        assert_eq!(g.cells.iter().flatten().sum::<u64>(), 1000);
        // 40ms is in [2^25, 2^26) ns: row 25 - 13.
        assert!(g
            .cells
            .iter()
            .all(|c| c.iter().enumerate().all(|(r, v)| *v == 0 || r == 12)));
        let t = h.threads(&[(1, "w".into())]);
        assert_eq!(t.cells.iter().flatten().sum::<u64>(), 1000 * 40_000_000);
    }

    #[test]
    fn long_and_wrapping_freezes_cover_their_offsets() {
        let p = 100_000_000;
        let ms = 1_000_000;
        let mut h = HeatmapBins::new(0, p);
        // +90 ms for 130 ms: one whole period, then +90..+100 and +0..+20 (thaw at +20).
        h.add(&freeze(1, 90 * ms, 130 * ms));
        // +80..+100 (thaw at the refill: offset 0 stays where it is).
        h.add(&freeze(2, 80 * ms, 20 * ms));
        let g = h.offset();
        let rows: Vec<u64> = (0..OFF_ROWS)
            .map(|r| g.cells.iter().map(|c| c[r]).sum())
            .collect();
        let mut want = vec![5 * ms; OFF_ROWS];
        (0..4).for_each(|r| want[r] += 5 * ms);
        (16..20).for_each(|r| want[r] += 5 * ms);
        (18..20).for_each(|r| want[r] += 5 * ms);
        assert_eq!(rows, want);
        assert_eq!(rows.iter().sum::<u64>(), 150 * ms);
    }

    #[test]
    fn offset_zero_is_the_refill() {
        let p = 100_000_000;
        // Freezes from 60ms to the period's end, with a phase of 7ms.
        let mut h = HeatmapBins::new(0, p);
        for i in 0..10u64 {
            h.add(&freeze(1, 7_000_000 + i * p + 60_000_000, 40_000_000));
        }
        let g = h.offset();
        let rows: Vec<u64> = (0..OFF_ROWS)
            .map(|r| g.cells.iter().map(|c| c[r]).sum())
            .collect();
        // 5ms rows: frozen from +60ms to +100ms = rows 12..20, nothing before.
        assert!(rows[..12].iter().all(|v| *v == 0), "{rows:?}");
        assert!(rows[12..].iter().all(|v| *v == 10 * 5_000_000), "{rows:?}");
    }
}
