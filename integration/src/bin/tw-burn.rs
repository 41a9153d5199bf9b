//! The tests' and benchmarks' CPU-bound workload: `throttlewatch burn`
//! (agent/src/commands/burn.rs) under the name the tests spawn.
//!
//! tw-burn --threads N --ms DURATION [--pin spread|packed|none] [--spin MS --sleep MS]
//!         [--spin-cpu MS --sleep MS]

use clap::Parser;

#[derive(Parser)]
#[command(name = "tw-burn")]
struct Args {
    #[command(flatten)]
    burn: throttlewatch::cli::BurnArgs,
}

fn main() {
    let a = Args::parse();
    match throttlewatch::burn(&a.burn) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("tw-burn: {}", e.message);
            std::process::exit(e.code);
        }
    }
}
