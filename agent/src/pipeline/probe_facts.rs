//! What the log's `start` and `resume` records say about the loaded probe.

use throttlewatch_bpf::ThrottleModel;

/// What the log's `start` and `resume` records say about the probe.
#[derive(Debug, Clone)]
pub(crate) struct ProbeFacts {
    pub model: ThrottleModel,
    /// "tp_btf", "raw_tp", with "+fentry" when the fentry view loaded.
    pub description: String,
    /// Run-queue latency is measured.
    pub runq: bool,
}
