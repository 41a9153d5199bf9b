//! containerd-shim-throttlewatch-v2: the runtime class `throttlewatch`.
//! runc with the throttlewatch spec modifiers applied on every create.

mod console;
mod drain;
mod error;
mod info;
mod metrics;
mod metrics_v2;
mod oom;
mod rootfs;
mod runc;
mod runc_error;
mod service;
mod state;
mod stdio;
mod task;

fn main() {
    // One malloc arena for all threads: the shim's threads mostly sleep, and
    // each extra arena (one per thread that ever allocates) costs RSS.
    // SAFETY: mallopt(3) before any other thread exists.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
    std::process::exit(service::main());
}
