//! The runc-compatible wrapper `throttlewatch-runtime`: on `create`/`run` it
//! edits the bundle's config.json (the spec modifiers of
//! `throttlewatch-lifecycle`, which the containerd shim applies too: our
//! hooks, cpuset resources); on `create` it runs the low-level runtime as a
//! child and applies QoS and registers the container itself before
//! returning (no createRuntime hook on that path; `run` keeps the hook);
//! it keeps the CFS burst across `update`, ends the log before `delete`,
//! and execs the low-level runtime for everything else with argv untouched.

pub mod args;
pub mod create;
mod create_helper;
pub mod delete;
pub mod lowlevel;
pub mod runlog;
pub mod spawn;
pub mod start;
pub mod ticket;
pub mod update;
pub mod wrapper;
