//! `throttlewatch-hook createRuntime|prestart|poststop [--config FILE]`:
//! the OCI hook. Everything lives in the library.

/// A bump allocator: the hook exits within milliseconds (see the module).
#[global_allocator]
static ALLOC: throttlewatch_lifecycle::arena::Arena<{ 8 << 20 }> =
    throttlewatch_lifecycle::arena::Arena::new();

fn main() {
    std::process::exit(throttlewatch_hook::run(
        std::env::args_os().skip(1).collect(),
    ));
}
