//! A log-linear histogram of durations: 32 buckets per power of two (values
//! within 3 % of the truth), fixed size whatever the number of samples.

use serde::Serialize;

const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS;
const BUCKETS: usize = ((64 - SUB_BITS) as usize + 1) * SUB as usize;

#[derive(Debug, Clone)]
pub struct LogHistogram {
    counts: Vec<u64>,
    pub count: u64,
    pub sum: u64,
    pub max: u64,
}

impl Default for LogHistogram {
    fn default() -> Self {
        LogHistogram {
            counts: vec![0; BUCKETS],
            count: 0,
            sum: 0,
            max: 0,
        }
    }
}

fn index(v: u64) -> usize {
    if v < SUB {
        return v as usize;
    }
    let msb = 63 - v.leading_zeros();
    let sub = (v >> (msb - SUB_BITS)) & (SUB - 1);
    ((msb - SUB_BITS + 1) as u64 * SUB + sub) as usize
}

/// The lowest value of bucket `i` and the bucket's width.
fn bounds(i: usize) -> (u64, u64) {
    let i = i as u64;
    if i < SUB {
        return (i, 1);
    }
    let msb = i / SUB + SUB_BITS as u64 - 1;
    let sub = i % SUB;
    let width = 1u64 << (msb - SUB_BITS as u64);
    ((SUB + sub) * width, width)
}

/// Summary figures for the JSON output.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Quantiles {
    pub count: u64,
    pub total_ns: u64,
    pub p50_ns: Option<u64>,
    pub p99_ns: Option<u64>,
    pub max_ns: Option<u64>,
}

impl LogHistogram {
    pub fn add(&mut self, v: u64) {
        self.counts[index(v)] += 1;
        self.count += 1;
        self.sum += v;
        self.max = self.max.max(v);
    }

    /// The value below which a fraction `q` of the samples lie (bucket middle, at most max).
    pub fn quantile(&self, q: f64) -> Option<u64> {
        if self.count == 0 {
            return None;
        }
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (lo, w) = bounds(i);
                return Some((lo + w / 2).min(self.max));
            }
        }
        Some(self.max)
    }

    pub fn quantiles(&self) -> Quantiles {
        Quantiles {
            count: self.count,
            total_ns: self.sum,
            p50_ns: self.quantile(0.5),
            p99_ns: self.quantile(0.99),
            max_ns: (self.count > 0).then_some(self.max),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_value_in_order() {
        let mut last = 0;
        for v in [0u64, 1, 31, 32, 33, 63, 64, 1000, 1 << 40, u64::MAX] {
            let i = index(v);
            assert!(i >= last && i < BUCKETS, "{v}");
            let (lo, w) = bounds(i);
            assert!(lo <= v && v - lo < w, "{v}: {lo}+{w}");
            last = i;
        }
    }

    #[test]
    fn quantiles_within_three_percent() {
        let mut h = LogHistogram::default();
        for v in 1..=10_000u64 {
            h.add(v * 1000);
        }
        let p50 = h.quantile(0.5).unwrap() as f64;
        let p99 = h.quantile(0.99).unwrap() as f64;
        assert!((p50 / 5_000_000.0 - 1.0).abs() < 0.03, "{p50}");
        assert!((p99 / 9_900_000.0 - 1.0).abs() < 0.03, "{p99}");
        assert_eq!(h.quantile(1.0), Some(10_000_000));
        assert_eq!(LogHistogram::default().quantile(0.5), None);
    }
}
