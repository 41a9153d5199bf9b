//! `throttlewatch-nri`: see the library's documentation.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use throttlewatch_nri::diag::{self, say};
use throttlewatch_nri::options::{Identity, WatchMode};
use throttlewatch_nri::plugin::Plugin;
use throttlewatch_nri::session;

const HELP: &str = "\
throttlewatch-nri: throttlewatch as an NRI plugin (containerd 2.x, CRI-O)

USAGE:
    throttlewatch-nri [--socket PATH] [--config PATH] [--log PATH] [--name NAME] [--idx NN] [--watch-all]

As a daemon it dials the runtime's NRI socket (default /var/run/nri/nri.sock)
and dials again when the runtime restarts. Installed in the runtime's NRI
plugin directory as NN-NAME (e.g. 10-throttlewatch) it is launched by the
runtime, which hands it the connection (NRI_PLUGIN_SOCKET) and the text of
its conf file (<plugin_config_path>/NN-NAME.conf): config = \"PATH\" names
throttlewatch's configuration, log = \"PATH\" the file for this plugin's lines
(default: throttlewatch-nri.log in the configuration's log_dir; a launched
plugin's stderr is /dev/null), watch = \"all\" or \"annotated\".

OPTIONS:
    --socket PATH   the runtime's NRI socket (daemon)
    --config PATH   throttlewatch's configuration (default: as the other front ends find it)
    --log PATH      append this plugin's lines to PATH too (they always go to stderr)
    --name NAME     plugin name (default: NRI_PLUGIN_NAME, the file name, or throttlewatch)
    --idx NN        plugin index, two digits (default: NRI_PLUGIN_IDX, the file name, or 10)
    --watch-all     watch every container, not only those with a throttlewatch.io/ annotation
                    (the runtime's plugin configuration may say watch = \"all\" too)
";

#[derive(Debug, Default)]
struct Args {
    socket: Option<PathBuf>,
    config: Option<PathBuf>,
    log: Option<PathBuf>,
    name: Option<String>,
    idx: Option<String>,
    watch_all: bool,
}

/// An argument that is not one of ours.
#[derive(Debug, thiserror::Error)]
enum ArgError {
    #[error("{flag}: expected a value after it")]
    MissingValue { flag: String },
    #[error(
        "argument {0:?}: expected one of --socket, --config, --log, --name, --idx, --watch-all, --help"
    )]
    Unknown(String),
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Option<Args>, ArgError> {
    let mut a = Args::default();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = |flag: &str| {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or(ArgError::MissingValue {
                    flag: flag.to_string(),
                })
        };
        match flag.as_str() {
            "--help" | "-h" => return Ok(None),
            "--socket" => a.socket = Some(value(&flag)?.into()),
            "--config" => a.config = Some(value(&flag)?.into()),
            "--log" => a.log = Some(value(&flag)?.into()),
            "--name" => a.name = Some(value(&flag)?),
            "--idx" => a.idx = Some(value(&flag)?),
            "--watch-all" => a.watch_all = true,
            _ => return Err(ArgError::Unknown(arg)),
        }
    }
    Ok(Some(a))
}

fn main() -> ExitCode {
    let mut argv = std::env::args();
    let argv0 = argv.next().unwrap_or_default();
    let args = match parse(argv) {
        Ok(Some(a)) => a,
        Ok(None) => {
            print!("{HELP}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            say(&e.to_string());
            return ExitCode::from(2);
        }
    };
    if let Err(code) = where_lines_go(&args) {
        return code;
    }
    let file_name = std::path::Path::new(&argv0)
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let (env_name, env_idx) = (env("NRI_PLUGIN_NAME"), env("NRI_PLUGIN_IDX"));
    let id = match Identity::resolve(
        args.name.as_deref(),
        args.idx.as_deref(),
        env_name.as_deref(),
        env_idx.as_deref(),
        &file_name,
    ) {
        Ok(id) => id,
        Err(e) => {
            say(&e.to_string());
            return ExitCode::from(2);
        }
    };
    let cfg = match throttlewatch_core::config_check::load_cached(args.config.as_deref()) {
        Ok(c) => c,
        Err(bad) => {
            // Fail-open: a plugin that is not there holds no pod up.
            say(&format!("{bad}; not registering, no container is watched"));
            return ExitCode::FAILURE;
        }
    };
    let watch = match args.watch_all {
        true => WatchMode::All,
        false => WatchMode::Annotated,
    };
    let plugin = Arc::new(Plugin::new(cfg, args.config.clone(), watch));
    match session::inherited_socket() {
        Ok(Some(stream)) => match launched(stream, &plugin, &id) {
            Ok(()) => {
                say("the runtime closed the connection; exiting (it launches the plugin again)");
                ExitCode::SUCCESS
            }
            Err(e) => {
                say(&e.to_string());
                ExitCode::FAILURE
            }
        },
        Ok(None) => {
            let socket = args.socket.unwrap_or_else(session::default_socket);
            session::run_daemon(&socket, &plugin, &id)
        }
        Err(e) => {
            say(&e.to_string());
            ExitCode::FAILURE
        }
    }
}

/// `--log FILE`: the lines go there too. Launched by the runtime (its
/// stderr is /dev/null): they wait for the file the node's configuration
/// names at `Configure`.
fn where_lines_go(args: &Args) -> Result<(), ExitCode> {
    if let Some(log) = &args.log {
        if let Err(e) = diag::log_to(log) {
            say(&format!("--log: {e}"));
            return Err(ExitCode::from(2));
        }
    } else if std::env::var_os(session::SOCKET_ENV).is_some() {
        diag::hold();
    }
    Ok(())
}

/// A plugin the runtime launched: said first (held until `Configure`
/// names the log file), then the session on the handed-over connection.
fn launched(
    stream: std::os::unix::net::UnixStream,
    plugin: &Arc<Plugin>,
    id: &Identity,
) -> Result<(), session::SessionError> {
    say(&format!(
        "launched by the runtime as {}-{}; registering on the connection it handed over",
        id.idx, id.name
    ));
    session::run_session(stream, plugin, id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(a: &[&str]) -> Result<Option<Args>, ArgError> {
        parse(a.iter().map(|s| s.to_string()))
    }

    #[test]
    fn arguments() {
        let a = p(&[
            "--socket",
            "/s",
            "--config=/c",
            "--log",
            "/l",
            "--watch-all",
            "--idx",
            "05",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(a.socket, Some("/s".into()));
        assert_eq!(a.config, Some("/c".into()));
        assert_eq!(a.log, Some("/l".into()));
        assert_eq!(a.idx.as_deref(), Some("05"));
        assert!(a.watch_all);
        assert!(p(&["--help"]).unwrap().is_none());
        assert_eq!(
            p(&["--socket"]).err().unwrap().to_string(),
            "--socket: expected a value after it"
        );
        assert!(p(&["--bogus"])
            .err()
            .unwrap()
            .to_string()
            .starts_with("argument \"--bogus\""));
    }
}
