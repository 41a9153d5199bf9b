//! The event pipeline: the node-wide probe's events (engine) into one
//! session per watched container (session, spec), its records and log
//! budget (freezes, budget), the kernel's counters (reading,
//! kernel_counters), run-queue waits, cold starts and per-thread CPU (runq,
//! coldstart, threadcpu), and the typed fan-out to the log, the metrics and
//! the live view (output).

pub mod budget;
pub mod clock;
pub mod coldstart;
pub mod engine;
pub mod freezes;
pub mod histograms;
pub mod kernel_counters;
pub mod labels;
pub mod output;
pub mod placement;
pub mod procinfo;
pub mod reading;
pub mod records;
pub mod runq;
pub mod session;
pub mod spec;
pub mod threadcpu;
