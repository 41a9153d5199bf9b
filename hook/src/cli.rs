//! The hook's command line: the stage, then `--config FILE`.

use std::ffi::OsString;
use std::path::PathBuf;

pub use throttlewatch_lifecycle::modifiers::CREATED_FLAG;
pub use throttlewatch_lifecycle::HookStage;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookArgs {
    pub stage: HookStage,
    pub config: Option<PathBuf>,
    /// `--created-unix-ns N`: when the runtime was asked to create the
    /// container (the wrapper's `run` writes it into our hook's arguments).
    pub created_ns: Option<u64>,
}

/// A command line the hook cannot run with: each names the argument, the
/// value and what is accepted, then the usage line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgsError {
    #[error("--config needs a file; {USAGE}")]
    ConfigMissing,
    #[error("{CREATED_FLAG}: invalid value {0:?}: expected a Unix time in nanoseconds; {USAGE}")]
    CreatedNs(Option<String>),
    #[error("stage {0:?}: expected {accepted}; {USAGE}", accepted = HookStage::ACCEPTED)]
    Stage(String),
    #[error("unexpected argument {0:?}; {USAGE}")]
    Unexpected(String),
    #[error("no stage given; {USAGE}")]
    NoStage,
}

pub const USAGE: &str = "usage: throttlewatch-hook createRuntime|prestart|poststop [--config FILE] [--created-unix-ns N] (OCI state JSON on stdin)";

/// What `-h`/`--help` prints (on stdout, exit 0).
pub const HELP: &str =
    "throttlewatch-hook: the OCI hook of throttlewatch. The container runtime runs it
(runc run, Podman, CRI-O: from the hook files `throttlewatch install podman|crio`
writes) with the container's OCI state JSON on stdin:
  createRuntime  applies the throttlewatch.io/* annotations' QoS and registers the
                 container with the agent (its log starts here)
  prestart       the same, for runtimes that have no createRuntime stage
  poststop       finalises the container's log
Options:
  --config FILE  configuration file (default: $THROTTLEWATCH_CONFIG, then
                 /etc/throttlewatch/throttlewatch.toml)
  --created-unix-ns N
                 when the runtime was asked to create the container (the
                 wrapper's `run` passes it; the cold-start timeline)
  -h, --help     this text
";

/// True when the arguments ask for help.
pub fn wants_help(args: &[OsString]) -> bool {
    args.iter().any(|a| a == "-h" || a == "--help")
}

impl HookArgs {
    pub fn parse(args: &[OsString]) -> Result<HookArgs, ArgsError> {
        let mut stage = None;
        let mut config = None;
        let mut created_ns = None;
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let s = a.to_string_lossy();
            if s == "--config" {
                let v = it.next().ok_or(ArgsError::ConfigMissing)?;
                config = Some(PathBuf::from(v));
            } else if let Some(v) = s.strip_prefix("--config=") {
                config = Some(PathBuf::from(v));
            } else if s == CREATED_FLAG {
                let v = it.next().map(|v| v.to_string_lossy().into_owned());
                created_ns = Some(
                    v.as_deref()
                        .and_then(|v| v.parse().ok())
                        .ok_or(ArgsError::CreatedNs(v))?,
                );
            } else if stage.is_none() && !s.starts_with('-') {
                stage = Some(HookStage::parse(&s).ok_or_else(|| ArgsError::Stage(s.to_string()))?);
            } else {
                return Err(ArgsError::Unexpected(s.to_string()));
            }
        }
        let stage = stage.ok_or(ArgsError::NoStage)?;
        Ok(HookArgs {
            stage,
            config,
            created_ns,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(a: &[&str]) -> Result<HookArgs, String> {
        HookArgs::parse(&a.iter().map(OsString::from).collect::<Vec<_>>())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn help_is_asked_for_with_h_or_help_anywhere() {
        let v = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        assert!(wants_help(&v(&["--help"])));
        assert!(wants_help(&v(&["poststop", "-h"])));
        assert!(!wants_help(&v(&["poststop", "--config", "/x"])));
        assert!(HELP.contains("createRuntime") && HELP.contains("--config FILE"));
    }

    #[test]
    fn the_create_time_is_an_argument_and_a_bad_one_is_named() {
        let a = p(&["createRuntime", "--created-unix-ns", "1796192890448994702"]).unwrap();
        assert_eq!(a.created_ns, Some(1_796_192_890_448_994_702));
        assert_eq!(p(&["poststop"]).unwrap().created_ns, None);
        let e = p(&["createRuntime", "--created-unix-ns", "soon"]).unwrap_err();
        assert!(
            e.starts_with("--created-unix-ns: invalid value Some(\"soon\")"),
            "{e}"
        );
        assert!(p(&["createRuntime", "--created-unix-ns"]).is_err());
    }

    #[test]
    fn stage_and_config() {
        let a = p(&["createRuntime", "--config", "/etc/tw.toml"]).unwrap();
        assert_eq!(a.stage, HookStage::CreateRuntime);
        assert_eq!(a.config, Some(PathBuf::from("/etc/tw.toml")));
        assert_eq!(
            p(&["--config=/x", "poststop"]).unwrap().stage,
            HookStage::Poststop
        );
    }

    #[test]
    fn errors_name_the_value() {
        let e = p(&["createruntime"]).unwrap_err();
        assert!(
            e.contains("\"createruntime\"") && e.contains("createRuntime, prestart or poststop"),
            "{e}"
        );
        assert!(p(&[]).unwrap_err().contains("no stage"));
        assert!(p(&["prestart", "--config"])
            .unwrap_err()
            .contains("--config needs"));
        assert!(p(&["prestart", "--bogus"]).unwrap_err().contains("--bogus"));
    }
}
