//! The OCI hook of throttlewatch: applies annotation QoS to a container's
//! cgroup and registers it with the node agent (createRuntime / prestart),
//! then unregisters it (poststop). No BPF, no async runtime: it runs inside
//! every container start and must stay fast.
//!
//! Fail-open (the default): every error is one line on stderr and in
//! `<log_dir>/hook.log`, and the hook exits 0 so the container starts.
//! Fail-closed: the hook exits non-zero and the runtime refuses the create.

pub mod cli;
pub mod stages;

use std::ffi::OsString;

use throttlewatch_core::config::FailMode;
use throttlewatch_lifecycle::timing;

use crate::cli::HookArgs;
use throttlewatch_lifecycle::report::Reporter;

/// Prefix of every line the hook prints.
pub const NAME: &str = "throttlewatch-hook";

/// Run the hook with its arguments (without argv[0]); returns the exit code.
pub fn run(args: Vec<OsString>) -> i32 {
    if cli::wants_help(&args) {
        print!("{}", cli::HELP);
        return 0;
    }
    let mut t = timing::Phases::start(NAME);
    let args = match HookArgs::parse(&args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{NAME}: {e}");
            return 2;
        }
    };
    let cfg = match throttlewatch_core::config_check::load_cached(args.config.as_deref()) {
        Ok(c) => c,
        Err(bad) => {
            // Nothing is applied under a configuration that cannot be read
            // (its defaults would allow every key); the fail mode its text
            // meant decides whether the container starts.
            return match bad.fail_mode {
                FailMode::Open => {
                    eprintln!("{NAME}: {bad}; nothing applied, the container is not watched");
                    0
                }
                FailMode::Closed => {
                    eprintln!("{NAME}: {bad}; fail-closed: container refused");
                    1
                }
            };
        }
    };
    t.name(&format!("{NAME} {}", args.stage));
    t.mark("config");
    let mut rep = Reporter::new(&cfg, args.stage, NAME);
    let outcome = stages::run_stage(&args, &cfg, &mut rep, std::io::stdin().lock(), &mut t);
    match (outcome, cfg.fail_mode) {
        (Ok(()), _) if !rep.failed() => 0,
        (Ok(()), FailMode::Open) => 0,
        (Ok(()), FailMode::Closed) => 1,
        (Err(e), mode) => {
            rep.error(&format!("{e:#}"));
            match mode {
                FailMode::Open => 0,
                FailMode::Closed => 1,
            }
        }
    }
}
