//! `throttlewatch-runtime`: a runc-compatible wrapper. See the library.

fn main() {
    std::process::exit(throttlewatch_runtime::wrapper::main(
        std::env::args_os().skip(1).collect(),
    ));
}
