//! The wrapper's flow: parse runc's arguments; on `create` edit the bundle,
//! leave the createRuntime work to a helper and exec the runtime's `create`
//! ([`crate::create`]); on `run` edit the bundle (the hook does that
//! work); run `update` as a child; exec the low-level runtime for
//! everything else (argv untouched).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use throttlewatch_core::config::{Config, FailMode};
use throttlewatch_lifecycle::modifiers::{default_hook_path, modify_bundle, ModifyContext};
use throttlewatch_lifecycle::timing::Phases;

use crate::args::{RuncArgs, Subcommand};
use crate::runlog::RuncLog;
use crate::{delete, lowlevel, update};

/// Run the wrapper with its arguments (without argv[0]); returns an exit
/// code only when it does not exec.
pub fn main(args: Vec<OsString>) -> i32 {
    let mut t = Phases::start(crate::runlog::NAME);
    let args = RuncArgs::parse(&args);
    t.name(&format!(
        "{} {}",
        crate::runlog::NAME,
        args.subcommand().unwrap_or("-")
    ));
    let log = RuncLog::new(args.log.clone(), args.log_format.as_deref());
    let config_path = config_path(&args);
    let command = args.command();
    if command == Subcommand::Start {
        // The usual case: the ticket of our `create`, nothing pending.
        if let Some(runtime) = crate::start::ready(&args, config_path.as_deref()) {
            t.mark("ticket");
            return exec(t, &runtime, &args.argv, &log);
        }
    }
    let (cfg, cfg_ok) = match load_config(config_path.as_deref(), command, &log) {
        Ok(c) => c,
        Err(code) => return code,
    };
    t.mark("config");
    let runtime = match lowlevel::resolve(&cfg) {
        Ok(r) => r,
        Err(e) => {
            log.error(&e.to_string());
            return 1;
        }
    };
    t.mark("resolve");
    // Arguments of our own for the runtime (create's `--pid-file`).
    let mut argv = None;
    match command {
        // Fail-closed keeps the hook (below, as `run`): runc's own create
        // is refused unless the container's log is open.
        Subcommand::Create if cfg_ok && cfg.fail_mode == FailMode::Open => {
            let crate::create::Next(a) =
                crate::create::create(&args, &cfg, config_path, &runtime, &log, &mut t);
            argv = Some(a);
        }
        Subcommand::Run | Subcommand::Create if cfg_ok => {
            // A ticket left by an earlier container of this id is not this one's.
            if let (Subcommand::Create, Some(key)) = (command, args.container_key()) {
                let _ = crate::ticket::remove(&key, config_path.as_deref());
            }
            if let Err(e) = modify(&args, &cfg, config_path, &mut t) {
                match cfg.fail_mode {
                    FailMode::Open => log.error(&format!(
                        "{e:#} (fail-open: creating the container unchanged)"
                    )),
                    FailMode::Closed => {
                        log.error(&format!("{e:#} (fail-closed: create refused)"));
                        return 1;
                    }
                }
            }
        }
        Subcommand::Start if cfg_ok => {
            crate::start::wait_for_watch(&args, &cfg, config_path.as_deref(), &log)
        }
        Subcommand::Update if cfg_ok => return update::update(&runtime, &args, &cfg, &log),
        Subcommand::Delete if cfg_ok => {
            delete::end_before_delete(&runtime, &args, &cfg, config_path.as_deref(), &log)
        }
        _ => {}
    }
    t.mark("subcommand");
    exec(t, &runtime, argv.as_deref().unwrap_or(&args.argv), &log)
}

/// The configuration (cached), and whether it loaded: a bad one passes
/// through with the defaults, except that fail-closed refuses a create
/// (the exit status).
fn load_config(
    config_path: Option<&std::path::Path>,
    command: Subcommand,
    log: &RuncLog,
) -> Result<(Config, bool), i32> {
    match throttlewatch_core::config_check::load_cached(config_path) {
        Ok(c) => Ok((c, true)),
        Err(bad) if bad.fail_mode == FailMode::Closed && command.creates() => {
            log.error(&format!("{bad} (fail-closed: create refused)"));
            Err(1)
        }
        Err(bad) => {
            log.error(&format!(
                "{bad}; passing through to the low-level runtime unchanged"
            ));
            Ok((Config::default(), false))
        }
    }
}

/// The phases written, then the runtime in this process's place; 127 when
/// it cannot be exec'd (said in runc's log).
fn exec(mut t: Phases, runtime: &Path, argv: &[OsString], log: &RuncLog) -> i32 {
    t.finish();
    let e = lowlevel::exec(runtime, argv);
    log.error(&format!("cannot exec {}: {e}", runtime.display()));
    127
}

/// `--throttlewatch-config`, else $THROTTLEWATCH_CONFIG; absolute, since the
/// hook runs in another directory.
fn config_path(args: &RuncArgs) -> Option<PathBuf> {
    let p = args.config.clone().or_else(Config::env_path)?;
    Some(std::path::absolute(&p).unwrap_or(p))
}

fn modify(
    args: &RuncArgs,
    cfg: &Config,
    config_path: Option<PathBuf>,
    t: &mut Phases,
) -> anyhow::Result<()> {
    let bundle = args.bundle()?;
    let ctx = ModifyContext {
        hook_path: default_hook_path()?,
        config_path,
        cfg: cfg.clone(),
        create_runtime_hook: true,
        created_unix_ns: Some(throttlewatch_core::logfmt::now_unix_ns()),
    };
    t.mark("hook_path");
    modify_bundle(&bundle, &ctx)?;
    t.mark("modify");
    Ok(())
}
