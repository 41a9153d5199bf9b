//! The log's GPU samples as the reader keeps them (bounded).

use throttlewatch_core::logfmt::gpu::MAX_GPU_SAMPLES_PER_LOG;
use throttlewatch_core::logfmt::{CpuStatSnapshot, GpuSample};

/// Samples the report keeps (a log's cap, twice: rotated parts and an
/// earlier lifetime's overlap).
pub const MAX_SAMPLES: usize = 2 * MAX_GPU_SAMPLES_PER_LOG as usize;

/// The log's GPU samples as read.
#[derive(Debug, Default)]
pub struct GpuSamples {
    pub samples: Vec<GpuSample>,
    /// Past [`MAX_SAMPLES`] here, and as the agent counted them
    /// (`gpu_samples_dropped`, cumulative: the largest seen).
    pub read_dropped: u64,
    pub agent_dropped: u64,
}

impl GpuSamples {
    /// A `cpu_stat` record's samples (its `gpu` taken).
    pub fn add(&mut self, c: &mut CpuStatSnapshot) {
        let room = MAX_SAMPLES.saturating_sub(self.samples.len());
        let v = std::mem::take(&mut c.gpu);
        self.read_dropped += v.len().saturating_sub(room) as u64;
        self.agent_dropped = self.agent_dropped.max(c.gpu_samples_dropped);
        self.samples.extend(v.into_iter().take(room));
    }

    /// Samples left out, by the agent or here.
    pub fn dropped(&self) -> u64 {
        self.read_dropped + self.agent_dropped
    }
}
