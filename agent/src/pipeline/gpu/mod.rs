//! The GPUs a watched container uses, sampled once a second: utilisation,
//! memory and, where the GPU has GPM, SM activity from NVML (nvml.rs,
//! loaded at run time), behind [`GpuSource`] so tests feed recorded
//! series. One [`GpuSampler`] per agent (sampler.rs) opens NVML when a
//! watched container first uses a GPU, in a thread of its own, and reads
//! each GPU once per tick whatever the number of containers on it; each
//! session keeps its samples in a bounded [`GpuSeries`] (series.rs) that
//! its next `cpu_stat` record carries.
//!
//! Where the node has no NVIDIA GPU (PCI sysfs) the agent says so once at
//! its start; where there is no library, or NVML sees no GPU, once when a
//! container first needs it. It watches as before: GPU sampling never
//! fails or delays a watch.

mod nvml;
mod sampler;
mod series;

pub(crate) use nvml::NVML_LIBRARY;
pub(crate) use sampler::GpuSampler;
pub(crate) use series::GpuSeries;

/// Overrides the library's path (tests: a path that does not exist).
pub(crate) const NVML_LIB_ENV: &str = "THROTTLEWATCH_NVML_LIB";

/// GPUs read per tick at most (the series' and the metrics' bound).
pub(crate) const MAX_GPUS: usize = 64;

/// One GPU at one moment, as NVML reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct GpuReading {
    pub util_pct: u32,
    pub mem_util_pct: u32,
    pub mem_used_bytes: u64,
    pub mem_total_bytes: u64,
    /// The share of SMs busy since the GPU's previous reading, percent
    /// (GPM's `NVML_GPM_METRIC_SM_UTIL`; None without GPM).
    pub sm_active_pct: Option<u32>,
}

/// A read of one GPU that NVML refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} for GPU {index}: {message} (NVML return {code})")]
pub(crate) struct GpuReadError {
    pub call: &'static str,
    pub index: usize,
    pub code: i32,
    pub message: String,
}

/// Why there is no GPU sampling on this node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NvmlError {
    #[error("no NVIDIA management library ({path}: {reason})")]
    NoLibrary { path: String, reason: String },
    #[error("{path} has no {symbol} (not NVIDIA's management library, or too old)")]
    NoSymbol { path: String, symbol: &'static str },
    #[error("nvmlInit_v2: {message} (NVML return {code})")]
    Init { code: i32, message: String },
    #[error("NVML sees no GPU")]
    NoGpu,
    #[error("no NVIDIA GPU in PCI sysfs (NVML, {path}, is not opened)")]
    NoPciGpu { path: String },
    #[error("no thread to open NVML in: {0}")]
    Thread(String),
}

/// Where GPU readings come from: NVML, or a recorded series in tests.
pub(crate) trait GpuSource: Send {
    /// The GPUs' UUIDs in index order (empty strings where unknown).
    fn uuids(&self) -> Vec<String>;
    fn read(&mut self, index: usize) -> Result<GpuReading, GpuReadError>;
    /// The GPUs whose readings carry SM activity (GPM).
    fn sm_active_gpus(&self) -> Vec<usize> {
        Vec::new()
    }
}

#[cfg(test)]
#[path = "stub_tests.rs"]
mod stub_tests;

#[cfg(test)]
mod tests {
    use super::sampler::unavailable_line;
    use super::*;

    /// A recorded series per GPU, one reading per call; GPU 3 fails.
    pub(crate) struct Recorded(pub Vec<Vec<u32>>, pub usize);

    impl GpuSource for Recorded {
        fn uuids(&self) -> Vec<String> {
            vec![String::new(); self.0.len()]
        }
        fn read(&mut self, index: usize) -> Result<GpuReading, GpuReadError> {
            let at = self.1;
            self.1 += 1;
            let util = self
                .0
                .get(index)
                .filter(|s| !s.is_empty())
                .and_then(|s| s.get(at % s.len()).copied());
            util.map(|u| GpuReading {
                util_pct: u,
                ..Default::default()
            })
            .ok_or(GpuReadError {
                call: "recorded",
                index,
                code: 2,
                message: "none".into(),
            })
        }
    }

    #[test]
    fn a_missing_library_is_said_and_nothing_is_sampled() {
        let e = nvml::Nvml::open("/nonexistent/libnvidia-ml.so.1").err();
        let Some(e) = e else {
            panic!("a library that does not exist opened")
        };
        assert!(matches!(e, NvmlError::NoLibrary { .. }), "{e:?}");
        let line = unavailable_line(&e);
        assert!(
            line.contains("GPU utilisation is not sampled: no NVIDIA management library (/nonexistent/libnvidia-ml.so.1:"),
            "{line}"
        );
        let mut s = GpuSampler::with(None);
        assert!(!s.available());
        assert!(s.read([0, 1]).is_empty());
    }

    #[test]
    fn a_library_without_nvml_names_the_symbol() {
        // libc is loaded everywhere and has none of NVML's entry points.
        match nvml::Nvml::open("libc.so.6") {
            Err(NvmlError::NoSymbol { symbol, .. }) => assert_eq!(symbol, "nvmlInit_v2"),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("libc passed for NVML"),
        }
    }
}
