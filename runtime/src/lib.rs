//! The runc-compatible wrapper `throttlewatch-runtime`: on `create`/`run` it
//! adds the throttlewatch hooks and cpuset resources to the bundle's
//! config.json (the spec modifiers, shared with the containerd shim), keeps
//! the CFS burst across `update`, and execs the low-level runtime for
//! everything else with argv untouched.

pub mod args;
pub mod delete;
pub mod lowlevel;
pub mod modifiers;
pub mod runlog;
pub mod spec_cpuset;
pub mod update;
pub mod wrapper;
