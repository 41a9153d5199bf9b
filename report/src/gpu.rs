//! The container's GPUs against its freezes: the `cpu_stat` records' GPU
//! samples (docs/log-format.md) aligned with the frozen time of the
//! throttled periods. A period's frozen time is its throttled time per CPU
//! (`PeriodThrottle.throttled_ns / cpus`, at most the period), placed just
//! before the period's thaw; each sample's interval is split into frozen
//! and unfrozen time, its utilisation (and, where the GPU has GPM, its SM
//! activity) weighted by each.

use std::collections::BTreeMap;

use serde::Serialize;
use throttlewatch_core::logfmt::GpuSample;

use crate::heatmap::short;
use crate::model::Container;

pub use crate::gpu_samples::{GpuSamples, MAX_SAMPLES};

/// Buckets of the HTML timeline, and the GPUs it draws.
pub const TIMELINE_BUCKETS: usize = 240;
pub const TIMELINE_GPUS: usize = 8;

/// One GPU's utilisation while the container was frozen and while not.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GpuAlignment {
    pub gpu: usize,
    pub samples: u64,
    /// The time the samples cover, and the frozen time within it.
    pub sampled_ns: u64,
    pub frozen_ns: u64,
    /// Utilisation weighted by frozen time, and by unfrozen time, percent
    /// (null without such time).
    pub util_frozen_pct: Option<f64>,
    pub util_unfrozen_pct: Option<f64>,
    /// Frozen time times the share the GPU was idle over each sample: the
    /// time the GPU idled while its container's feeders were frozen.
    pub idle_while_frozen_ns: u64,
    pub mem_used_max_bytes: u64,
    pub mem_total_bytes: u64,
    /// The time covered by samples with SM activity (GPM; 0 without), and
    /// the SM activity weighted by its frozen and unfrozen time, percent
    /// (null without such samples or time).
    pub sm_sampled_ns: u64,
    pub sm_active_frozen_pct: Option<f64>,
    pub sm_active_unfrozen_pct: Option<f64>,
}

/// The HTML panel's series: per bucket, the share of time frozen and each
/// GPU's utilisation (percent; null: no sample).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GpuTimeline {
    /// Since the container's start (or the first sample).
    pub from_ns: u64,
    pub bucket_ns: u64,
    pub frozen_share: Vec<f64>,
    pub gpus: Vec<(usize, Vec<Option<f64>>)>,
    /// The same for SM activity, for the GPUs with it (GPM).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sm: Vec<(usize, Vec<Option<f64>>)>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GpuReport {
    pub gpus: Vec<GpuAlignment>,
    /// Samples the agent or the reader left out (caps).
    pub dropped_samples: u64,
    pub timeline: GpuTimeline,
}

/// The frozen spans of the throttled periods, in time order (Unix ns).
pub fn frozen_spans(c: &Container) -> Vec<(u64, u64)> {
    let p = c.period_ns();
    c.throttled_periods()
        .into_iter()
        .filter_map(|(k, t)| {
            let thaw = c.period_thaw_ns(k)?;
            let f = (t.throttled_ns / t.cpus.max(1) as u64).min(p);
            (f > 0).then(|| (thaw.saturating_sub(f), thaw))
        })
        .collect()
}

/// Frozen time within `[a, b)`; `spans` sorted, not overlapping.
pub fn frozen_in(spans: &[(u64, u64)], a: u64, b: u64) -> u64 {
    let first = spans.partition_point(|s| s.1 <= a);
    spans[first..]
        .iter()
        .take_while(|s| s.0 < b)
        .map(|s| s.1.min(b).saturating_sub(s.0.max(a)))
        .sum()
}

/// One GPU's sums while aligning: utilisation and SM activity times time.
#[derive(Default)]
struct Sums {
    g: GpuAlignment,
    busy_frozen: f64,
    busy_unfrozen: f64,
    sm_frozen_ns: u64,
    sm_frozen: f64,
    sm_unfrozen: f64,
}

impl Sums {
    fn add(&mut self, s: &GpuSample, f: u64) {
        let g = &mut self.g;
        let u = s.util_pct.min(100) as f64;
        g.samples += 1;
        g.sampled_ns += s.interval_ns;
        g.frozen_ns += f;
        self.busy_frozen += u * f as f64;
        self.busy_unfrozen += u * (s.interval_ns - f) as f64;
        g.idle_while_frozen_ns += (f as f64 * (100.0 - u) / 100.0).round() as u64;
        g.mem_used_max_bytes = g.mem_used_max_bytes.max(s.mem_used_bytes);
        g.mem_total_bytes = g.mem_total_bytes.max(s.mem_total_bytes);
        if let Some(sm) = s.sm_active_pct {
            let sm = sm.min(100) as f64;
            g.sm_sampled_ns += s.interval_ns;
            self.sm_frozen_ns += f;
            self.sm_frozen += sm * f as f64;
            self.sm_unfrozen += sm * (s.interval_ns - f) as f64;
        }
    }

    fn done(self) -> GpuAlignment {
        let ratio = |sum: f64, ns: u64| (ns > 0).then(|| sum / ns as f64);
        let mut g = self.g;
        g.util_frozen_pct = ratio(self.busy_frozen, g.frozen_ns);
        g.util_unfrozen_pct = ratio(self.busy_unfrozen, g.sampled_ns - g.frozen_ns);
        g.sm_active_frozen_pct = ratio(self.sm_frozen, self.sm_frozen_ns);
        g.sm_active_unfrozen_pct = ratio(self.sm_unfrozen, g.sm_sampled_ns - self.sm_frozen_ns);
        g
    }
}

/// Each GPU's samples split by the frozen time in them.
pub fn align(samples: &[GpuSample], spans: &[(u64, u64)]) -> Vec<GpuAlignment> {
    let mut by: BTreeMap<usize, Sums> = BTreeMap::new();
    for s in samples {
        let sums = by.entry(s.gpu).or_default();
        sums.g.gpu = s.gpu;
        let f = frozen_in(spans, s.start_ns, s.end_ns()).min(s.interval_ns);
        sums.add(s, f);
    }
    by.into_values().map(Sums::done).collect()
}

/// The GPU figures of a log with GPU samples (None without).
pub fn report(c: &Container) -> Option<GpuReport> {
    let samples = &c.gpu.samples;
    if samples.is_empty() {
        return None;
    }
    let spans = frozen_spans(c);
    Some(GpuReport {
        gpus: align(samples, &spans),
        dropped_samples: c.gpu.dropped(),
        timeline: timeline(samples, &spans, c.start_ts),
    })
}

/// [`TIMELINE_BUCKETS`] buckets from the container's start (or the first
/// sample) to the last sample's end.
pub fn timeline(samples: &[GpuSample], spans: &[(u64, u64)], start: Option<u64>) -> GpuTimeline {
    let first = samples.iter().map(|s| s.start_ns).min().unwrap_or(0);
    let from = start.unwrap_or(first).min(first);
    let to = samples.iter().map(GpuSample::end_ns).max().unwrap_or(from);
    let bucket_ns = (to.saturating_sub(from) / TIMELINE_BUCKETS as u64).max(1);
    let n = (to.saturating_sub(from).div_ceil(bucket_ns) as usize).clamp(1, TIMELINE_BUCKETS + 1);
    let at = |i: usize| from + i as u64 * bucket_ns;
    let frozen_share: Vec<f64> = (0..n)
        .map(|i| frozen_in(spans, at(i), at(i + 1)) as f64 / bucket_ns as f64)
        .collect();
    let buckets = Buckets { from, bucket_ns, n };
    GpuTimeline {
        from_ns: from,
        bucket_ns,
        frozen_share,
        gpus: buckets.per_gpu(samples, |s| Some(s.util_pct)),
        sm: buckets.per_gpu(samples, |s| s.sm_active_pct),
    }
}

/// The timeline's buckets: `n` of `bucket_ns` from `from`.
struct Buckets {
    from: u64,
    bucket_ns: u64,
    n: usize,
}

impl Buckets {
    /// Per GPU (the first [`TIMELINE_GPUS`]) with a `value`, its average
    /// in each bucket weighted by time (null: no such sample there).
    fn per_gpu(
        &self,
        samples: &[GpuSample],
        value: impl Fn(&GpuSample) -> Option<u32>,
    ) -> Vec<(usize, Vec<Option<f64>>)> {
        let at = |i: usize| self.from + i as u64 * self.bucket_ns;
        let mut sums: BTreeMap<usize, Vec<(f64, u64)>> = BTreeMap::new();
        for s in samples {
            let Some(v) = value(s) else { continue };
            if !sums.contains_key(&s.gpu) && sums.len() >= TIMELINE_GPUS {
                continue;
            }
            let b = sums.entry(s.gpu).or_insert_with(|| vec![(0.0, 0); self.n]);
            let i0 = (s.start_ns.saturating_sub(self.from) / self.bucket_ns) as usize;
            for (i, slot) in b.iter_mut().enumerate().skip(i0) {
                if at(i) >= s.end_ns() {
                    break;
                }
                let t = s
                    .end_ns()
                    .min(at(i + 1))
                    .saturating_sub(s.start_ns.max(at(i)));
                slot.0 += v as f64 * t as f64;
                slot.1 += t;
            }
        }
        sums.into_iter()
            .map(|(g, v)| {
                let u = v
                    .into_iter()
                    .map(|(w, t)| (t > 0).then(|| w / t as f64))
                    .collect();
                (g, u)
            })
            .collect()
    }
}

/// A percentage as the terminal and the HTML table show it ("-": none).
pub fn pct(v: Option<f64>) -> String {
    v.map_or("-".to_string(), |v| format!("{v:.0}%"))
}

/// One line per GPU for the terminal.
pub fn describe(g: &GpuAlignment) -> String {
    let sm = match g.sm_sampled_ns {
        0 => String::new(),
        _ => format!(
            "; SM active {} while frozen, {} while not",
            pct(g.sm_active_frozen_pct),
            pct(g.sm_active_unfrozen_pct)
        ),
    };
    format!(
        "GPU {}: {} busy while frozen ({} frozen), {} while not{sm}; idle while frozen {} ({} samples over {})",
        g.gpu,
        pct(g.util_frozen_pct),
        short(g.frozen_ns),
        pct(g.util_unfrozen_pct),
        short(g.idle_while_frozen_ns),
        g.samples,
        short(g.sampled_ns)
    )
}

#[cfg(test)]
#[path = "gpu_tests.rs"]
mod tests;
