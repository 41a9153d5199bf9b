//! The event pipeline: the node-wide probe's events (engine) into one
//! session per watched container (session, spec), its records and log
//! budget (freezes, budget), the kernel's counters (reading,
//! kernel_counters), run-queue waits, cold starts and per-thread CPU (runq,
//! coldstart, threadcpu), and the typed fan-out to the log, the metrics and
//! the live view (output).

pub(crate) mod budget;
pub(crate) mod clock;
pub(crate) mod coldstart;
pub(crate) mod engine;
pub(crate) mod freezes;
pub(crate) mod gpu;
pub(crate) mod histograms;
pub(crate) mod kernel_counters;
pub(crate) mod labels;
pub(crate) mod output;
pub(crate) mod placement;
pub(crate) mod probe_facts;
pub(crate) mod procinfo;
pub(crate) mod reading;
pub(crate) mod records;
pub(crate) mod runq;
pub(crate) mod session;
pub(crate) mod spec;
pub(crate) mod threadcpu;
pub(crate) mod wakeups;
