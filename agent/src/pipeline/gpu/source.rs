//! What a GPU reading is, how one fails, and the source readings come
//! from (NVML, or a recorded series in tests).

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
