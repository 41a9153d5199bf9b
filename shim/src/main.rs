//! containerd-shim-throttlewatch-v2: the runtime class `throttlewatch`.
//! runc with the throttlewatch spec modifiers applied on every create.

mod agent;
mod metrics;
mod runc;
mod service;
mod task;

fn main() {
    std::process::exit(service::main());
}
