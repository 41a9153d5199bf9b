//! Histograms with power-of-two bucket bounds, the kernel's own resolution.
//!
//! The run-queue probe keeps a log2 histogram per (cgroup, CPU): slot `i`
//! counts waits of `[2^i, 2^(i+1))` ns (slot 0 also holds 0 and 1 ns; the last
//! slot, 31, everything from 2^31 ns ≈ 2.1 s up). Prometheus buckets are
//! cumulative upper bounds, so the honest mapping uses the slots' own edges:
//! bucket `le = 2^k ns` is the sum of slots `0..k`. Decimal bounds (10 µs,
//! 25 µs, …) would have to split a slot by guesswork. Freeze durations, which
//! the agent gets as exact nanoseconds, go through the same slots so the two
//! heatmaps share their rows.
//!
//! The one inexactness: a value of exactly `2^k` ns sits in slot `k` and so
//! counts under the next bound up (`le = 2^(k+1)`), where Prometheus' `le`
//! would take it. One nanosecond at a bucket edge; documented in docs/metrics.md.
//!
//! The same slots are also served as a **native histogram** (one series, in
//! the protobuf exposition; [`native_index`]): schema 0, whose buckets are
//! powers of two of *seconds*, `(2^(i-1), 2^i]`. A nanosecond is not a power
//! of two of a second (2^k ns = 2^(k - 29.897) s), so no slot coincides with
//! a native bucket; slot `k` goes whole into the native bucket that holds 90 %
//! of it (its log-width), `(2^(k-30), 2^(k-29)]` s = `(0.93, 1.86] × 2^k` ns.
//! A value in the slot's top tenth (`1.86 … 2 × 2^k` ns) is counted at most
//! 7.4 % below its own size; none is counted above it. Splitting a slot
//! between two native buckets would be a guess at how its waits spread.

use std::sync::{Arc, Mutex};

use prometheus_client::encoding::{
    EncodeMetric, MetricEncoder, NativeHistogram, NativeHistogramBuckets, NoLabelSet,
};
use prometheus_client::metrics::{MetricType, TypedMetric};
use throttlewatch_bpf::runq::RUNQ_SLOTS;

/// The first and last finite bounds, as powers of two of nanoseconds:
/// 2^13 ns = 8.192 µs … 2^30 ns = 1.074 s (18 bounds, factor 2 apart), the
/// 10 µs … 1 s range the dashboard resolves. Waits under 8.192 µs are in the
/// first bucket, over 1.074 s only in `+Inf`.
pub(crate) const FIRST_BOUND_LOG2: usize = 13;
pub(crate) const LAST_BOUND_LOG2: usize = 30;

/// The finite `le` bounds in seconds.
#[cfg(test)]
pub(crate) fn bounds_seconds() -> impl Iterator<Item = f64> {
    (FIRST_BOUND_LOG2..=LAST_BOUND_LOG2).map(|k| (1u64 << k) as f64 / 1e9)
}

/// The log2 slot of a duration, as the BPF side computes it (`log2_slot`).
pub(crate) fn slot_of(ns: u64) -> usize {
    let s = if ns == 0 { 0 } else { ns.ilog2() as usize };
    s.min(RUNQ_SLOTS - 1)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Inner {
    slots: [u64; RUNQ_SLOTS],
    sum_ns: u64,
}

impl Default for Inner {
    fn default() -> Self {
        Inner {
            slots: [0; RUNQ_SLOTS],
            sum_ns: 0,
        }
    }
}

/// A cumulative histogram fed with nanoseconds, exported in seconds.
#[derive(Debug, Clone, Default)]
pub(crate) struct Log2Histogram {
    inner: Arc<Mutex<Inner>>,
}

impl Log2Histogram {
    /// One value (a freeze).
    pub(crate) fn observe_ns(&self, ns: u64) {
        let mut i = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        i.slots[slot_of(ns)] += 1;
        i.sum_ns = i.sum_ns.saturating_add(ns);
    }

    /// The kernel's slot counts of an interval and the exact total of the
    /// same waits.
    pub(crate) fn add_slots(&self, slots: &[u64; RUNQ_SLOTS], sum_ns: u64) {
        let mut i = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        for (a, b) in i.slots.iter_mut().zip(slots) {
            *a += *b;
        }
        i.sum_ns = i.sum_ns.saturating_add(sum_ns);
    }

    /// (sum in seconds, count, per-bucket counts, not cumulative, the last
    /// one `+Inf`).
    pub(crate) fn snapshot(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let i = *self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::with_capacity(LAST_BOUND_LOG2 - FIRST_BOUND_LOG2 + 2);
        // le = 2^FIRST: every slot below it.
        out.push((
            (1u64 << FIRST_BOUND_LOG2) as f64 / 1e9,
            i.slots[..FIRST_BOUND_LOG2].iter().sum(),
        ));
        // le = 2^k adds slot k-1.
        for k in FIRST_BOUND_LOG2 + 1..=LAST_BOUND_LOG2 {
            out.push(((1u64 << k) as f64 / 1e9, i.slots[k - 1]));
        }
        out.push((f64::INFINITY, i.slots[LAST_BOUND_LOG2..].iter().sum()));
        let count = i.slots.iter().sum();
        (i.sum_ns as f64 / 1e9, count, out)
    }

    /// The slots as one span of native buckets (schema 0) from the first
    /// slot with a count to the last: (first bucket index, delta-encoded
    /// counts, as the exposition carries them). Empty: no observation.
    pub(crate) fn native(&self) -> (i32, Vec<i64>) {
        let i = *self.inner.lock().unwrap_or_else(|e| e.into_inner());
        native_deltas(&i.slots)
    }
}

/// The schema-0 native bucket that slot `k` is served in: `(2^(i-1), 2^i]` s
/// with `i = k - 29` (see the module's comment).
pub(crate) fn native_index(slot: usize) -> i32 {
    slot as i32 - 29
}

/// The zero bucket's half-width, 2^-30 s (0.93 ns): below the lowest native
/// bucket a slot goes to, so it stays empty; it is not 0 because Prometheus
/// 2.4x tells a native histogram from a classic one by a threshold, a zero
/// count or buckets (`isNativeHistogram`), and an idle container's empty
/// histogram must still be native (one series, not 21).
pub(crate) const NATIVE_ZERO_THRESHOLD: f64 = 1.0 / (1u64 << 30) as f64;

fn native_deltas(slots: &[u64; RUNQ_SLOTS]) -> (i32, Vec<i64>) {
    let Some(first) = slots.iter().position(|&n| n > 0) else {
        return (0, Vec::new());
    };
    let last = slots.iter().rposition(|&n| n > 0).unwrap_or(first);
    let mut prev = 0i64;
    let deltas = slots[first..=last]
        .iter()
        .map(|&n| {
            let n = n as i64;
            let d = n - prev;
            prev = n;
            d
        })
        .collect();
    (native_index(first), deltas)
}

impl TypedMetric for Log2Histogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Log2Histogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let (sum, count, buckets) = self.snapshot();
        let (offset, deltas) = self.native();
        let spans = [(offset, deltas.len() as u32)];
        let positive = NativeHistogramBuckets {
            spans: if deltas.is_empty() { &[] } else { &spans },
            deltas: &deltas,
        };
        // The text formats take the classic buckets; the protobuf one both,
        // and a Prometheus that scrapes native histograms keeps the native.
        encoder.encode_histogram_with_native::<NoLabelSet>(
            sum,
            count,
            &buckets,
            None,
            NativeHistogram {
                schema: 0,
                zero_threshold: NATIVE_ZERO_THRESHOLD,
                zero_count: 0,
                negative: NativeHistogramBuckets {
                    spans: &[],
                    deltas: &[],
                },
                positive,
                created: None,
            },
        )
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cumulative count at each finite bound.
    fn cumulative(h: &Log2Histogram) -> Vec<(f64, u64)> {
        let (_, _, b) = h.snapshot();
        let mut c = 0;
        b.into_iter()
            .map(|(le, n)| {
                c += n;
                (le, c)
            })
            .collect()
    }

    #[test]
    fn slots_match_the_bpf_log2() {
        assert_eq!(slot_of(0), 0);
        assert_eq!(slot_of(1), 0);
        assert_eq!(slot_of(2), 1);
        assert_eq!(slot_of(1023), 9);
        assert_eq!(slot_of(1024), 10);
        assert_eq!(slot_of(u64::MAX), RUNQ_SLOTS - 1);
    }

    #[test]
    fn bounds_span_10us_to_1s_factor_two() {
        let b: Vec<f64> = bounds_seconds().collect();
        assert_eq!(b.len(), 18);
        assert!(b[0] <= 10e-6 && *b.last().unwrap() >= 1.0, "{b:?}");
        assert!(b.windows(2).all(|w| (w[1] / w[0] - 2.0).abs() < 1e-12));
    }

    #[test]
    fn values_fall_under_the_first_bound_above_them() {
        let h = Log2Histogram::default();
        h.observe_ns(5_000); // 5 µs: under 8.192 µs
        h.observe_ns(90_000_000); // 90 ms: (67.1 ms, 134.2 ms]
        h.observe_ns(3_000_000_000); // 3 s: +Inf only
        let c = cumulative(&h);
        let at = |le: f64| c.iter().find(|(b, _)| (*b - le).abs() < 1e-12).unwrap().1;
        assert_eq!(at(8.192e-6), 1);
        assert_eq!(at((1u64 << 26) as f64 / 1e9), 1, "67.1 ms");
        assert_eq!(at((1u64 << 27) as f64 / 1e9), 2, "134.2 ms");
        assert_eq!(at((1u64 << 30) as f64 / 1e9), 2, "1.07 s");
        assert_eq!(c.last().unwrap(), &(f64::INFINITY, 3));
        let (sum, count, _) = h.snapshot();
        assert_eq!(count, 3);
        assert!((sum - 3.090005).abs() < 1e-9, "{sum}");
    }

    #[test]
    fn kernel_slots_map_onto_the_bounds() {
        let h = Log2Histogram::default();
        let mut s = [0u64; RUNQ_SLOTS];
        s[3] = 4; // [8, 16) ns
        s[13] = 2; // [8.192, 16.384) µs
        s[20] = 1; // [1.05, 2.1) ms
        s[31] = 1; // ≥ 2.1 s
        h.add_slots(&s, 12_345);
        let c = cumulative(&h);
        assert_eq!(c[0], (8.192e-6, 4), "le 2^13 ns: slots 0..13");
        assert_eq!(c[1].1, 6, "le 2^14 ns adds slot 13");
        assert_eq!(c[7].1, 6, "le 2^20 ns: slot 20 not yet");
        assert_eq!(c[8].1, 7, "le 2^21 ns adds slot 20");
        assert_eq!(c[17].1, 7, "le 2^30 ns");
        assert_eq!(c[18], (f64::INFINITY, 8));
        let (sum, count, _) = h.snapshot();
        assert_eq!((count, sum), (8, 12_345e-9));
    }

    /// Each slot's native bucket holds the slot's lower edge and 90 % of
    /// its width: `(2^(k-30), 2^(k-29)]` s against `[2^k, 2^(k+1))` ns.
    #[test]
    fn native_buckets_hold_most_of_each_slot() {
        for k in 0..RUNQ_SLOTS {
            let i = native_index(k);
            let (lo, hi) = (2f64.powi(i - 1), 2f64.powi(i));
            let (slot_lo, slot_hi) = ((1u64 << k) as f64 / 1e9, (1u64 << (k + 1)) as f64 / 1e9);
            assert!(lo < slot_lo && slot_lo <= hi, "slot {k}: ({lo}, {hi}]");
            let held = (hi.log2() - slot_lo.log2()) / (slot_hi.log2() - slot_lo.log2());
            assert!((0.89..0.91).contains(&held), "slot {k}: {held}");
            assert!(slot_hi / hi < 1.074, "at most 7.4 % low");
            assert!(lo > NATIVE_ZERO_THRESHOLD || k == 0 && lo >= NATIVE_ZERO_THRESHOLD);
        }
    }

    #[test]
    fn native_deltas_span_the_observed_slots() {
        let h = Log2Histogram::default();
        assert_eq!(h.native(), (0, vec![]), "no observation: no bucket");
        h.observe_ns(20_000); // slot 14
        h.observe_ns(20_000);
        h.observe_ns(90_000_000); // slot 26
        let (first, d) = h.native();
        assert_eq!(first, 14 - 29);
        assert_eq!(d.len(), 13);
        // Undo the delta encoding: 2 in the first bucket, 1 in the last.
        let counts: Vec<i64> = d
            .iter()
            .scan(0, |c, x| {
                *c += x;
                Some(*c)
            })
            .collect();
        assert_eq!(counts[0], 2);
        assert_eq!(counts[12], 1);
        assert_eq!(counts.iter().sum::<i64>(), 3);
        assert!(counts[1..12].iter().all(|&c| c == 0));
    }
}
