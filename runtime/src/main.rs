//! `throttlewatch-runtime`: a runc-compatible wrapper. See the library.

/// A bump allocator: the wrapper execs the low-level runtime (or exits)
/// within milliseconds (see the module).
#[global_allocator]
static ALLOC: throttlewatch_lifecycle::arena::Arena<{ 8 << 20 }> =
    throttlewatch_lifecycle::arena::Arena::new();

fn main() {
    std::process::exit(throttlewatch_runtime::wrapper::main(
        std::env::args_os().skip(1).collect(),
    ));
}
