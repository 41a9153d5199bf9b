//! The node-wide throttle probes: one set of BPF programs for every watched
//! cgroup on the node, filtered in the kernel by the `watched` map.

mod skel {
    #![allow(
        clippy::all,
        unused_imports,
        dead_code,
        non_camel_case_types,
        unsafe_op_in_unsafe_fn
    )]
    include!(concat!(env!("OUT_DIR"), "/throttle.skel.rs"));
}

mod episodes;
pub mod event;
pub mod fentry;
mod load;
pub mod memory;
mod options;
pub mod probe;
pub mod runq;
mod task_iter;
pub mod wakeups;

pub use event::{ColdStartEvent, Event, ExecToCpu, FreezeEvent, ProbeStage, ThreadCpuEvent};
pub use probe::{
    EpisodeTotals, ExitBandwidth, MapFullCounts, ProbeError, ProbeKind, ProbeOptions,
    ThrottleModel, ThrottleProbe,
};
pub use runq::RunqTotals;
pub use wakeups::{WakeEdgeTotals, WakeKey, WakerKind};
