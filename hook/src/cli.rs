//! The hook's command line: the stage, then `--config FILE`.

use std::ffi::OsString;
use std::path::PathBuf;

pub use throttlewatch_lifecycle::Stage;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookArgs {
    pub stage: Stage,
    pub config: Option<PathBuf>,
}

pub const USAGE: &str = "usage: throttlewatch-hook createRuntime|prestart|poststop [--config FILE] (OCI state JSON on stdin)";

impl HookArgs {
    pub fn parse(args: &[OsString]) -> Result<HookArgs, String> {
        let mut stage = None;
        let mut config = None;
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let s = a.to_string_lossy();
            if s == "--config" {
                let v = it
                    .next()
                    .ok_or_else(|| format!("--config needs a file; {USAGE}"))?;
                config = Some(PathBuf::from(v));
            } else if let Some(v) = s.strip_prefix("--config=") {
                config = Some(PathBuf::from(v));
            } else if stage.is_none() && !s.starts_with('-') {
                stage = Some(Stage::parse(&s).ok_or_else(|| {
                    format!("stage {s:?}: expected {}; {USAGE}", Stage::ACCEPTED)
                })?);
            } else {
                return Err(format!("unexpected argument {s:?}; {USAGE}"));
            }
        }
        let stage = stage.ok_or_else(|| format!("no stage given; {USAGE}"))?;
        Ok(HookArgs { stage, config })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(a: &[&str]) -> Result<HookArgs, String> {
        HookArgs::parse(&a.iter().map(OsString::from).collect::<Vec<_>>())
    }

    #[test]
    fn stage_and_config() {
        let a = p(&["createRuntime", "--config", "/etc/tw.toml"]).unwrap();
        assert_eq!(a.stage, Stage::CreateRuntime);
        assert_eq!(a.config, Some(PathBuf::from("/etc/tw.toml")));
        assert_eq!(
            p(&["--config=/x", "poststop"]).unwrap().stage,
            Stage::Poststop
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
