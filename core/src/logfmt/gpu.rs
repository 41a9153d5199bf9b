//! GPU samples in the log: the utilisation NVML reported for the GPUs a
//! container uses, carried by the periodic `cpu_stat` record (an optional
//! field, so readers of the same version that do not know it skip it).
//! `sm_active_pct` is optional within it: only GPUs with GPM have it.

use serde::{Deserialize, Serialize};

/// Samples one `cpu_stat` record carries at most (adjacent samples of a GPU
/// are merged into longer ones past this).
pub const MAX_GPU_SAMPLES_PER_RECORD: usize = 64;

/// Samples one log carries at most (a day of one sample a second for one
/// GPU); later ones are counted in `cpu_stat.gpu_samples_dropped`.
pub const MAX_GPU_SAMPLES_PER_LOG: u64 = 86_400;

/// One GPU's utilisation over one interval, as NVML reported it at the
/// interval's end (NVML's figures are averages over its own sample window).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuSample {
    /// Index into `start.topology.gpus` (PCI bus order, NVML's index).
    pub gpu: usize,
    /// The interval the sample stands for, Unix epoch nanoseconds.
    pub start_ns: u64,
    pub interval_ns: u64,
    /// Time one or more kernels ran, percent (`nvmlUtilization_t.gpu`).
    pub util_pct: u32,
    /// Time device memory was read or written, percent (`nvmlUtilization_t.memory`).
    pub mem_util_pct: u32,
    /// Device memory in use and in all (`nvmlMemory_t`).
    pub mem_used_bytes: u64,
    pub mem_total_bytes: u64,
    /// The share of SMs busy over the interval, percent (GPM's
    /// `NVML_GPM_METRIC_SM_UTIL`, Hopper and later; absent without GPM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_active_pct: Option<u32>,
}

impl GpuSample {
    /// The end of its interval, Unix epoch nanoseconds.
    pub fn end_ns(&self) -> u64 {
        self.start_ns.saturating_add(self.interval_ns)
    }

    /// `self` followed by `next` (the same GPU, adjacent): one sample over
    /// both intervals, percentages weighted by time, memory as at the end.
    pub fn merged(&self, next: &GpuSample) -> GpuSample {
        let (a, b) = (self.interval_ns as u128, next.interval_ns as u128);
        let avg = |x: u32, y: u32| match a + b {
            0 => (x + y) / 2,
            t => ((x as u128 * a + y as u128 * b + t / 2) / t) as u32,
        };
        GpuSample {
            gpu: self.gpu,
            start_ns: self.start_ns,
            interval_ns: next.end_ns().saturating_sub(self.start_ns),
            util_pct: avg(self.util_pct, next.util_pct),
            mem_util_pct: avg(self.mem_util_pct, next.mem_util_pct),
            mem_used_bytes: next.mem_used_bytes,
            mem_total_bytes: next.mem_total_bytes,
            sm_active_pct: match (self.sm_active_pct, next.sm_active_pct) {
                (Some(x), Some(y)) => Some(avg(x, y)),
                (x, y) => x.or(y),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merging_weights_by_time() {
        let a = GpuSample {
            gpu: 1,
            start_ns: 10,
            interval_ns: 3,
            util_pct: 100,
            mem_used_bytes: 5,
            ..Default::default()
        };
        let b = GpuSample {
            start_ns: 13,
            interval_ns: 1,
            util_pct: 0,
            mem_used_bytes: 7,
            ..a
        };
        let m = a.merged(&b);
        assert_eq!((m.start_ns, m.interval_ns, m.end_ns()), (10, 4, 14));
        assert_eq!(m.util_pct, 75);
        assert_eq!(m.mem_used_bytes, 7);
        assert_eq!(m.sm_active_pct, None);
        let sm = |a: &GpuSample, v| GpuSample {
            sm_active_pct: v,
            ..*a
        };
        let m = sm(&a, Some(40)).merged(&sm(&b, Some(0)));
        assert_eq!(m.sm_active_pct, Some(30));
        assert_eq!(sm(&a, None).merged(&sm(&b, Some(8))).sm_active_pct, Some(8));
    }

    #[test]
    fn sm_activity_is_optional_in_the_log() {
        let s = GpuSample {
            gpu: 1,
            interval_ns: 5,
            ..Default::default()
        };
        let j = serde_json::to_string(&s).unwrap();
        assert!(!j.contains("sm_active"), "{j}");
        let back: GpuSample = serde_json::from_str(&j).unwrap();
        assert_eq!(back, s);
        let with = GpuSample {
            sm_active_pct: Some(37),
            ..s
        };
        let j = serde_json::to_string(&with).unwrap();
        assert!(j.ends_with(",\"sm_active_pct\":37}"), "{j}");
        assert_eq!(serde_json::from_str::<GpuSample>(&j).unwrap(), with);
    }
}
