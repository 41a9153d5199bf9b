//! Who the plugin registers as, and which containers it watches.
//!
//! The identity follows NRI's stub: a runtime-launched plugin gets
//! `NRI_PLUGIN_NAME` and `NRI_PLUGIN_IDX`, or has them in its file name
//! (`10-throttlewatch`); a daemon takes `--name`/`--idx`, else the
//! defaults. The watch mode comes from `--watch-all`, and the runtime's
//! plugin configuration (`conf.d/<idx>-<name>.conf`, or the configuration
//! a daemon is given by the runtime) may set it too: `watch = "all"` or
//! `watch = "annotated"`, `config = "/path/throttlewatch.toml"` names
//! throttlewatch's configuration for a plugin the runtime launches (it gets
//! no arguments and none of the runtime's environment), and `log =
//! "/path/file.log"` where such a plugin writes its own lines. NRI reads
//! that file (`<plugin_config_path>/<idx>-<name>.conf`, else `<name>.conf`)
//! only for a plugin it launches, and hands its text over in `Configure`
//! (`pkg/adaptation/plugin.go`, `getPluginConfig`); an external plugin gets
//! an empty text and takes its settings from its arguments.

use serde::Deserialize;

/// Default registration name.
pub const DEFAULT_NAME: &str = "throttlewatch";
/// Default invocation index (plugins are called in ascending order).
pub const DEFAULT_IDX: &str = "10";

/// A name or index NRI would refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("plugin name {0:?}: expected one or more of a-z A-Z 0-9 _ . + -")]
    Name(String),
    #[error("plugin index {0:?}: expected two digits, 00 to 99")]
    Index(String),
}

/// The name and index the plugin registers with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub name: String,
    pub idx: String,
}

impl Identity {
    /// Command-line values first, then the runtime's environment, then the
    /// `NN-name` file name, then the defaults; both checked as NRI checks
    /// them.
    pub fn resolve(
        cli_name: Option<&str>,
        cli_idx: Option<&str>,
        env_name: Option<&str>,
        env_idx: Option<&str>,
        file_name: &str,
    ) -> Result<Identity, IdentityError> {
        let from_file = file_name
            .split_once('-')
            .filter(|(idx, name)| check_idx(idx).is_ok() && !name.is_empty());
        let name = cli_name
            .or(env_name)
            .or(from_file.map(|(_, n)| n))
            .unwrap_or(DEFAULT_NAME);
        let idx = cli_idx
            .or(env_idx)
            .or(from_file.map(|(i, _)| i))
            .unwrap_or(DEFAULT_IDX);
        check_name(name)?;
        check_idx(idx)?;
        Ok(Identity {
            name: name.into(),
            idx: idx.into(),
        })
    }
}

/// NRI's `CheckPluginName`.
pub fn check_name(name: &str) -> Result<(), IdentityError> {
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'+'));
    match ok {
        true => Ok(()),
        false => Err(IdentityError::Name(name.into())),
    }
}

/// NRI's `CheckPluginIndex`.
pub fn check_idx(idx: &str) -> Result<(), IdentityError> {
    match idx.len() == 2 && idx.bytes().all(|b| b.is_ascii_digit()) {
        true => Ok(()),
        false => Err(IdentityError::Index(idx.into())),
    }
}

/// Which containers get watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WatchMode {
    /// Those whose pod or container has a `throttlewatch.io/` annotation
    /// (the contract of the hooks.d files and the runtime class).
    #[default]
    Annotated,
    /// Every container on the node.
    All,
}

/// The plugin's part of the runtime's NRI configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NriConfig {
    pub watch: Option<WatchMode>,
    /// throttlewatch's configuration file: for a plugin the runtime
    /// launches, which gets neither arguments nor the runtime's environment.
    pub config: Option<std::path::PathBuf>,
    /// The file a launched plugin writes its own lines to (its stderr is
    /// `/dev/null`); default: `throttlewatch-nri.log` in the `log_dir` of
    /// throttlewatch's configuration.
    pub log: Option<std::path::PathBuf>,
}

/// A plugin configuration from the runtime that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the runtime's plugin configuration {text:?}: {reason}; accepted: empty, or the keys watch (\"annotated\" or \"all\"), config and log (absolute paths)")]
pub struct NriConfigError {
    pub text: String,
    pub reason: String,
}

impl NriConfig {
    pub fn parse(text: &str) -> Result<NriConfig, NriConfigError> {
        if text.trim().is_empty() {
            return Ok(NriConfig::default());
        }
        let bad = |reason: String| NriConfigError {
            text: text.chars().take(200).collect(),
            reason,
        };
        let c: NriConfig = toml::from_str(text).map_err(|e| bad(e.message().to_string()))?;
        for (key, p) in [("config", &c.config), ("log", &c.log)] {
            if let Some(p) = p.as_ref().filter(|p| !p.is_absolute()) {
                return Err(bad(format!("{key} {p:?} is not an absolute path")));
            }
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_in_nri_stub_order() {
        let r = Identity::resolve;
        let id = |n: &str, i: &str| Identity {
            name: n.into(),
            idx: i.into(),
        };
        assert_eq!(
            r(None, None, None, None, "throttlewatch-nri"),
            Ok(id("throttlewatch", "10"))
        );
        assert_eq!(r(None, None, None, None, "05-tw"), Ok(id("tw", "05")));
        assert_eq!(
            r(None, None, Some("x"), Some("42"), "05-tw"),
            Ok(id("x", "42"))
        );
        assert_eq!(
            r(Some("y"), Some("07"), Some("x"), Some("42"), "05-tw"),
            Ok(id("y", "07"))
        );
        assert_eq!(
            r(None, Some("7"), None, None, "a").unwrap_err().to_string(),
            "plugin index \"7\": expected two digits, 00 to 99"
        );
        assert_eq!(
            r(Some("a b"), None, None, None, "a").unwrap_err(),
            IdentityError::Name("a b".into())
        );
    }

    #[test]
    fn nri_config_names_what_is_accepted() {
        assert_eq!(NriConfig::parse("").unwrap().watch, None);
        assert_eq!(
            NriConfig::parse("watch = \"all\"").unwrap().watch,
            Some(WatchMode::All)
        );
        assert_eq!(
            NriConfig::parse("watch = \"annotated\"\n").unwrap().watch,
            Some(WatchMode::Annotated)
        );
        let e = NriConfig::parse("watch = \"some\"")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("the runtime's plugin configuration \"watch = \\\"some\\\"\""),
            "{e}"
        );
        assert!(
            e.ends_with(
                "accepted: empty, or the keys watch (\"annotated\" or \"all\"), config and log (absolute paths)"
            ),
            "{e}"
        );
        let c = NriConfig::parse("config = \"/etc/tw.toml\"").unwrap();
        assert_eq!(c.config, Some("/etc/tw.toml".into()));
        assert!(NriConfig::parse("other = 1").is_err());
        let c = NriConfig::parse("log = \"/var/log/tw/nri.log\"").unwrap();
        assert_eq!(c.log, Some("/var/log/tw/nri.log".into()));
        let e = NriConfig::parse("log = \"nri.log\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("log \"nri.log\" is not an absolute path"), "{e}");
    }

    /// The conf file packaging/ installs for a launched plugin is accepted
    /// and names the node's configuration.
    #[test]
    fn the_packaged_conf_file_parses() {
        let text = include_str!("../../packaging/nri/90-throttlewatch.conf");
        let c = NriConfig::parse(text).unwrap();
        assert_eq!(
            c.config.as_deref(),
            Some(std::path::Path::new(
                throttlewatch_core::config::DEFAULT_PATH
            ))
        );
        assert_eq!(c.watch, Some(WatchMode::Annotated));
        assert_eq!(c.log, None, "the log follows the configuration's log_dir");
    }
}
