//! The freeze histogram of replicas added together, classic (`le` buckets)
//! or native (the API's `[rule, lower, upper, count]` buckets), and its
//! quantiles as `histogram_quantile` computes them: linear inside the
//! bucket that holds the rank.

use std::collections::BTreeMap;

use serde_json::Value;

#[derive(Debug, Clone, Default)]
pub struct Hist {
    /// Classic: `le` → cumulative count (summed over replicas).
    classic: BTreeMap<OrdF64, f64>,
    /// Native: (lower, upper) → count.
    native: BTreeMap<(OrdF64, OrdF64), f64>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct OrdF64(f64);
impl Eq for OrdF64 {}
impl PartialOrd for OrdF64 {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for OrdF64 {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0)
    }
}

impl Hist {
    pub fn add_classic(&mut self, le: &str, cumulative: f64) {
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().unwrap_or(f64::NAN)
        };
        if !le.is_nan() {
            *self.classic.entry(OrdF64(le)).or_default() += cumulative;
        }
    }

    /// A native-histogram sample of the API (`"histogram": [t, {buckets}]`).
    pub fn add_native(&mut self, v: &Value) {
        let f = |x: &Value| x.as_str().and_then(|s| s.parse::<f64>().ok());
        for b in v["histogram"][1]["buckets"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if let (Some(lo), Some(hi), Some(n)) = (f(&b[1]), f(&b[2]), f(&b[3])) {
                *self.native.entry((OrdF64(lo), OrdF64(hi))).or_default() += n;
            }
        }
    }

    pub fn merge(&mut self, o: &Hist) {
        for (k, v) in &o.classic {
            *self.classic.entry(*k).or_default() += v;
        }
        for (k, v) in &o.native {
            *self.native.entry(*k).or_default() += v;
        }
    }

    /// (lower, upper, count) buckets, in order; native where there are any.
    fn buckets(&self) -> Vec<(f64, f64, f64)> {
        if !self.native.is_empty() {
            return self
                .native
                .iter()
                .map(|((l, h), n)| (l.0, h.0, *n))
                .collect();
        }
        let mut out = Vec::new();
        let (mut lo, mut prev) = (0.0, 0.0);
        for (le, cum) in &self.classic {
            out.push((lo, le.0, (cum - prev).max(0.0)));
            lo = le.0;
            prev = *cum;
        }
        out
    }

    pub fn count(&self) -> f64 {
        self.buckets().iter().map(|b| b.2).sum()
    }

    /// The `q` quantile in seconds; None without observations. A rank in
    /// the `+Inf` bucket is the highest finite bound, as Prometheus gives.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let b = self.buckets();
        let total: f64 = b.iter().map(|x| x.2).sum();
        if total <= 0.0 {
            return None;
        }
        let rank = q * total;
        let mut acc = 0.0;
        for (lo, hi, n) in &b {
            if acc + n >= rank && *n > 0.0 {
                if hi.is_infinite() {
                    return Some(*lo);
                }
                return Some(lo + (hi - lo) * ((rank - acc) / n));
            }
            acc += n;
        }
        b.iter().rev().find(|x| x.1.is_finite()).map(|x| x.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_of_merged_classic_and_native_histograms() {
        let mut a = Hist::default();
        for (le, c) in [
            ("0.016777216", 0.0),
            ("0.033554432", 10.0),
            ("0.067108864", 90.0),
            ("+Inf", 100.0),
        ] {
            a.add_classic(le, c);
        }
        let mut b = a.clone();
        b.merge(&a);
        assert_eq!(b.count(), 200.0);
        // p50: rank 100 of 200, in (0.0336, 0.0671] after 20: 80/160 of the way.
        let p50 = b.quantile(0.5).unwrap();
        assert!(
            (p50 - (0.033554432 + 0.033554432 * 0.5)).abs() < 1e-9,
            "{p50}"
        );
        assert_eq!(
            b.quantile(0.999),
            Some(0.067108864),
            "+Inf: the highest finite bound"
        );
        let native: Value = serde_json::json!({"histogram": [1, {"count": "4", "sum": "1",
            "buckets": [[0, "0.03125", "0.0625", "3"], [0, "0.0625", "0.125", "1"]]}]});
        let mut n = Hist::default();
        n.add_native(&native);
        n.add_native(&native);
        assert_eq!(n.count(), 8.0);
        let p99 = n.quantile(0.99).unwrap();
        assert!(p99 > 0.0625 && p99 <= 0.125, "{p99}");
        assert_eq!(Hist::default().quantile(0.5), None);
    }
}
