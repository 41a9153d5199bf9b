//! What the engine hands out after each poll; the log has already been
//! written by then. The metrics and the live printer consume the same list.

use std::sync::Arc;

use throttlewatch_bpf::runq::RUNQ_SLOTS;
use throttlewatch_cgroup::CpuStat;
use throttlewatch_core::logfmt::{ColdStart, Runq, Throttle};

use crate::labels::ContainerLabels;

// A poll's outputs live for one drain and are moved, not stored: boxing
// the run-queue variant would add an allocation per record for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Output {
    /// A freeze, with the `throttle` record written for it (None: under the
    /// threshold, or folded into a `throttle_summary` past the log budget).
    Freeze {
        container: Arc<ContainerLabels>,
        frozen_ns: u64,
        record: Option<Throttle>,
    },
    /// A `cold_start` record was written.
    ColdStart {
        container: Arc<ContainerLabels>,
        record: ColdStart,
    },
    /// Run-queue waits of an interval: a `runq` record was written, or, at
    /// the end, the rest since the last one (no record: `end` has the
    /// totals). `slots` are the kernel's log2 histogram counts of the same
    /// interval (the metrics' buckets).
    Runq {
        container: Arc<ContainerLabels>,
        record: Runq,
        slots: [u64; RUNQ_SLOTS],
    },
    /// Kernel counters and the probe's throttled time since the last
    /// `Counters` of this container (from `Due::Tick`).
    Counters {
        container: Arc<ContainerLabels>,
        kernel: CpuStat,
        probe_throttled_ns: u64,
    },
    /// The dynamic CPU controller wrote a `control` record.
    Control {
        container: Arc<ContainerLabels>,
        record: throttlewatch_core::logfmt::Control,
    },
    /// One of the container's GPUs, read at a tick.
    Gpu {
        container: Arc<ContainerLabels>,
        gpu: usize,
        reading: crate::gpu::GpuReading,
    },
    /// Events lost node-wide since the last poll that read the totals, and
    /// inserts the kernel maps refused in the same time (per map).
    LostEvents {
        count: u64,
        map_full: throttlewatch_core::logfmt::MapFull,
    },
}
