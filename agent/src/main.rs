use std::path::Path;

use clap::Parser;
use throttlewatch::cli::{Cli, Command, ConfigCommand};
use throttlewatch::CliError;

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("THROTTLEWATCH_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(throttlewatch_core::printable::colour_on(
            std::io::IsTerminal::is_terminal(&std::io::stderr()),
        ))
        .init();
    let cli = Cli::parse();
    let code = match dispatch(&cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("throttlewatch: {}", e.message);
            e.code
        }
    };
    std::process::exit(code);
}

fn dispatch(cli: &Cli) -> Result<i32, CliError> {
    // `config check` reports a bad file itself instead of failing to load it.
    if let Command::Config(ConfigCommand::Check { file }) = &cli.command {
        return throttlewatch::config_check(file.as_deref().or(cli.config.as_deref()));
    }
    let cfg = throttlewatch_qos::config_check::load(cli.config.as_deref())
        .map_err(|e| CliError::usage(e.to_string()))?;
    let needs_probe = match &cli.command {
        Command::Run(_) => Some("throttlewatch run"),
        Command::Watch(_) => Some("throttlewatch watch"),
        Command::Demo(_) => Some("throttlewatch demo"),
        Command::Agent(_) => Some("throttlewatch agent"),
        _ => None,
    };
    if let Some(what) = needs_probe {
        throttlewatch::check_privileges(what).map_err(|e| CliError::usage(e.to_string()))?;
    }
    match &cli.command {
        Command::Run(a) => throttlewatch::run(&cfg, a),
        Command::Watch(a) => throttlewatch::watch(&cfg, a),
        Command::Demo(a) => throttlewatch::demo(&cfg, a),
        Command::Burn(a) => throttlewatch::burn(a),
        Command::Agent(a) if a.detach => throttlewatch::detach_daemon(&cfg, cli.config.as_deref()),
        Command::Agent(_) => throttlewatch::run_daemon(&cfg),
        Command::Report(a) => throttlewatch_report::run(a, &cfg.log_dir)
            .map(|()| 0)
            .map_err(|e| CliError::fail(e.to_string())),
        Command::Fleet(a) => match throttlewatch_fleet::run(a) {
            Ok(out) => {
                use std::io::Write;
                let mut so = std::io::stdout().lock();
                // A closed pipe (| head) is not an error worth a message.
                let _ = so.write_all(out.as_bytes()).and_then(|_| so.flush());
                Ok(0)
            }
            Err(e) if e.is_usage() => Err(CliError::usage(e.to_string())),
            Err(e) => Err(CliError::fail(e.to_string())),
        },
        Command::Topology(a) => throttlewatch::topology(&cfg, a),
        Command::Install(a) => {
            let mut o = install_options(cli, &cfg, a.dry_run, &a.etc_root, &a.bin_dir, &a.restart)?;
            o.hook_paths = hook_paths(&a.hooks)?;
            throttlewatch::install(&a.engine, &o)
        }
        Command::Uninstall(a) => {
            let mut o = install_options(
                cli,
                &cfg,
                a.dry_run,
                &a.etc_root,
                Path::new("/"),
                &a.restart,
            )?;
            o.hook_paths = hook_paths(&a.hooks)?;
            throttlewatch::uninstall(&a.engine, &o)
        }
        Command::Config(ConfigCommand::Check { file }) => {
            throttlewatch::config_check(file.as_deref().or(cli.config.as_deref()))
        }
    }
}

/// `--hooks-dir`, `--crio-config`, `--crio-config-dir`, made absolute.
fn hook_paths(a: &throttlewatch::cli::HookPathArgs) -> Result<throttlewatch::HookPaths, CliError> {
    let abs = |p: &Option<std::path::PathBuf>, flag: &str| {
        p.as_deref()
            .map(std::path::absolute)
            .transpose()
            .map_err(|e| CliError::usage(format!("{flag}: {e}")))
    };
    Ok(throttlewatch::HookPaths {
        hooks_dir: abs(&a.hooks_dir, "--hooks-dir")?,
        crio_config: abs(&a.crio_config, "--crio-config")?,
        crio_config_dir: abs(&a.crio_config_dir, "--crio-config-dir")?,
    })
}

fn install_options(
    cli: &Cli,
    cfg: &throttlewatch_core::config::Config,
    dry_run: bool,
    root: &Path,
    bin_dir: &Path,
    restart: &str,
) -> Result<throttlewatch::InstallOptions, CliError> {
    let mut o = throttlewatch::InstallOptions::new(root, bin_dir);
    o.dry_run = dry_run;
    o.restart = throttlewatch::Restart::parse(restart)?;
    o.hook_config = cli
        .config
        .as_deref()
        .map(std::path::absolute)
        .transpose()
        .map_err(|e| CliError::fail(format!("--config: {e}")))?;
    o.hook_timeout_s = cfg.hook_timeout_s;
    Ok(o)
}
