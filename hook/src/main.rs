//! `throttlewatch-hook createRuntime|prestart|poststop [--config FILE]`:
//! the OCI hook. Everything lives in the library.

fn main() {
    std::process::exit(throttlewatch_hook::run(
        std::env::args_os().skip(1).collect(),
    ));
}
