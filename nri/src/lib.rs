//! `throttlewatch-nri`: throttlewatch as an NRI (Node Resource Interface)
//! plugin, the front end for any containerd 2.x or CRI-O node, with no
//! runtime class, runtime wrapper or hooks.d file. Like the hook, the
//! wrapper and the shim it is a thin layer over `throttlewatch-lifecycle`.
//!
//! - [`api`]: the NRI API, generated at build time by `ttrpc-codegen` from
//!   the vendored `proto/github.com/containerd/nri/pkg/api/api.proto`
//!   (NRI [`NRI_VERSION`], the version containerd v2.3.x vendors);
//! - [`mux`]: NRI's connection multiplexer (`pkg/net/multiplex`);
//! - [`rpc`]: ttrpc framing, server and client over a multiplexed
//!   connection;
//! - [`session`]: registration, the daemon's redial and the inherited
//!   connection of a runtime-launched plugin;
//! - [`plugin`]: what each event does with a container;
//! - [`container`]: a container's spec, burst and clean-up in lifecycle's terms;
//! - [`registered`]: the containers this plugin registered, for the
//!   `Synchronize` that finds them gone;
//! - [`options`]: the plugin's identity and watch mode;
//! - [`diag`]: the plugin's own diagnostic lines (stderr, or a file for a
//!   plugin the runtime launched);
//! - [`locked`]: a mutex taken whatever a panicked holder left.

/// The NRI API (`nri.pkg.api.v1alpha1`), generated.
#[allow(
    clippy::all,
    clippy::pedantic,
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    unused_imports,
    unused_qualifications,
    missing_docs,
    dead_code,
    unused_mut,
    unused_results,
    deprecated
)]
pub mod api {
    include!(concat!(env!("OUT_DIR"), "/api.rs"));
}

pub mod container;
pub mod diag;
pub mod locked;
pub mod mux;
pub mod options;
pub mod plugin;
pub mod registered;
pub mod rpc;
pub mod session;

/// Prefix of every line the plugin prints, and its name in `hook.log`.
pub const NAME: &str = "throttlewatch-nri";
/// The NRI release whose API this plugin speaks.
pub const NRI_VERSION: &str = "v0.12.0";
