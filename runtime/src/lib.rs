//! The runc-compatible wrapper `throttlewatch-runtime`: on `create`/`run` it
//! adds the throttlewatch hooks and cpuset resources to the bundle's
//! config.json (the spec modifiers of `throttlewatch-lifecycle`, which the
//! containerd shim applies too), keeps the CFS burst across `update`, ends
//! the log before `delete`, and execs the low-level runtime for everything
//! with argv untouched.

pub mod args;
pub mod delete;
pub mod lowlevel;
pub mod runlog;
pub mod update;
pub mod wrapper;
