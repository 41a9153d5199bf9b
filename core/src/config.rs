//! `throttlewatch.toml`: one file for the agent, the hook, the runtime
//! wrapper and the shim. Unknown keys are rejected. See configs/throttlewatch.toml.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub const DEFAULT_PATH: &str = "/etc/throttlewatch/throttlewatch.toml";
pub const ENV_CONFIG: &str = "THROTTLEWATCH_CONFIG";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailMode {
    /// A missing agent or a bad annotation never breaks a container.
    Open,
    /// Refuse to create the container instead.
    Closed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QosPolicyConfig {
    /// Keys containers may use, from either channel, by name (`cpu-burst`)
    /// or full annotation key. Omitted: all keys; `[]`: none. Read from
    /// `allowed_keys` (as docs/annotations.md writes it) or the older name
    /// `allowed_annotations`.
    #[serde(alias = "allowed_annotations", skip_serializing_if = "Option::is_none")]
    pub allowed_keys: Option<Vec<String>>,
    /// Largest burst, as a percentage of the quota.
    pub max_burst_percent: u32,
    /// Whether containers may ask for exclusive cores.
    pub allow_exclusive: bool,
    /// Keys the container's environment (`THROTTLEWATCH_*`, which an image's
    /// `ENV` sets) may use. Cpuset keys are never honoured from it.
    pub env_keys: Vec<String>,
}

/// What the environment may set by default: keys that cannot touch other
/// tenants (`threshold` only upward, see `Config::threshold`).
pub const DEFAULT_ENV_KEYS: [&str; 3] = ["watch", "threshold", "cpu-burst"];

impl Default for QosPolicyConfig {
    fn default() -> Self {
        QosPolicyConfig {
            allowed_keys: None,
            max_burst_percent: 100,
            allow_exclusive: true,
            env_keys: DEFAULT_ENV_KEYS.iter().map(|k| k.to_string()).collect(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Per-container logs go here, one `<id>.jsonl` each.
    pub log_dir: PathBuf,
    /// The agent's root-only unix socket.
    pub socket: PathBuf,
    /// Runtime state (cpuset allocations, agent lock).
    pub state_dir: PathBuf,
    /// Low-level OCI runtime for the wrapper and shim; empty: first of runc, crun in PATH.
    pub runtime: String,
    pub fail_mode: FailMode,
    /// Freezes shorter than this are counted but not written as records ("0": all).
    pub threshold: String,
    /// Prometheus metrics listen address; empty disables.
    pub metrics_addr: String,
    /// Seconds an ended container's series stay in /metrics (so the last
    /// increments are scraped) before they are removed.
    pub metrics_grace_s: u64,
    /// Series per watched container: `basic` (at most 16 where Prometheus
    /// scrapes native histograms) or `full` (every split; docs/metrics.md).
    /// A pod's `throttlewatch.io/metrics-detail` annotation overrides it.
    pub metrics_detail: crate::metrics_detail::MetricsDetail,
    /// Whether the hook starts an agent when none answers.
    pub start_agent: bool,
    /// The `throttlewatch` binary the hook starts; empty: next to the hook, then PATH.
    pub agent_binary: String,
    /// Seconds between `cpu_stat` snapshots in the logs.
    pub snapshot_interval_s: u64,
    /// Milliseconds between ring-buffer drains (the kernel never wakes the reader).
    pub poll_interval_ms: u64,
    /// Size of the node-wide event ring buffer, KiB (a power of two).
    pub ring_buffer_kib: u32,
    /// Containers the agent watches at most. Sizes the kernel maps at load
    /// (`runq_hist` is per CPU and preallocated: this × 328 B × CPUs); a
    /// register past it is refused with the reason.
    pub max_containers: u32,
    /// Milliseconds the hook waits for the agent on the create path (connect,
    /// send, answer, each); past it the container starts unwatched (fail-open)
    /// or is refused (fail-closed).
    pub agent_timeout_ms: u64,
    /// Seconds written as the `timeout` of our hook entries in config.json:
    /// the runtime kills a hook that runs longer (a backstop; the hook's own
    /// deadlines are far shorter, except while it starts an agent).
    pub hook_timeout_s: u64,
    /// Milliseconds a hook waits for the exclusive-cores lock before it
    /// refuses the cpuset with the reason.
    pub cpuset_lock_timeout_ms: u64,
    /// Bytes per second of `throttle` records each container's log may take
    /// (a token bucket); past it freezes are folded into one
    /// `throttle_summary` per thread per snapshot interval. 0: no budget.
    pub log_budget_bytes_per_s: u64,
    /// The bucket's size: a burst of records the log takes at once.
    pub log_budget_burst_bytes: u64,
    /// A container log (and `hook.log`, `agent.log`) is cut into a new part
    /// before it passes this size; 0: never.
    pub log_max_bytes: u64,
    /// Rotated parts kept per log (`<log>.1` newest … `<log>.N`).
    pub log_keep: u32,
    /// `process` records carry the process's command line (at most 256
    /// bytes; docs/security.md). false: pid, parent and executable only.
    pub log_cmdline: bool,
    /// The log directory's size at most; past it the agent removes closed
    /// container logs, oldest first. 0: no cap.
    pub log_dir_max_bytes: u64,
    /// NVIDIA's management library, loaded at run time to sample the
    /// containers' GPUs (the environment's `THROTTLEWATCH_NVML_LIB` wins).
    pub nvml_library: String,
    pub qos: QosPolicyConfig,
    /// The dynamic CPU controller (docs/control.md); off by default.
    pub control: crate::control_config::ControlConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            log_dir: "/var/log/throttlewatch".into(),
            socket: "/run/throttlewatch/agent.sock".into(),
            state_dir: "/run/throttlewatch".into(),
            runtime: String::new(),
            fail_mode: FailMode::Open,
            threshold: "0".into(),
            metrics_addr: "127.0.0.1:9477".into(),
            metrics_grace_s: 300,
            metrics_detail: Default::default(),
            start_agent: true,
            agent_binary: String::new(),
            snapshot_interval_s: 10,
            poll_interval_ms: 50,
            ring_buffer_kib: 4096,
            max_containers: 1024,
            agent_timeout_ms: 500,
            hook_timeout_s: 15,
            cpuset_lock_timeout_ms: 500,
            log_budget_bytes_per_s: 16 * 1024,
            log_budget_burst_bytes: 64 * 1024,
            log_max_bytes: 16 * 1024 * 1024,
            log_keep: 3,
            log_cmdline: true,
            log_dir_max_bytes: 1024 * 1024 * 1024,
            nvml_library: "libnvidia-ml.so.1".into(),
            qos: QosPolicyConfig::default(),
            control: Default::default(),
        }
    }
}

/// A configuration that could not be used, with the fail mode its text
/// meant where that is still legible: a bad configuration never widens what
/// is allowed, and a node that asked for `fail_mode = "closed"` gets it.
#[derive(Debug)]
pub struct BadConfig {
    pub error: String,
    pub fail_mode: FailMode,
}

impl std::fmt::Display for BadConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.error)
    }
}

/// The fail mode a configuration text meant, even when it does not parse:
/// its `fail_mode` value as TOML, else a line `fail_mode = "closed"`.
pub fn fail_mode_meant(text: &str) -> FailMode {
    if let Ok(t) = text.parse::<toml::Table>() {
        return match t.get("fail_mode").and_then(|v| v.as_str()) {
            Some("closed") => FailMode::Closed,
            _ => FailMode::Open,
        };
    }
    let closed = text.lines().any(|l| {
        let l = l.split('#').next().unwrap_or("");
        let mut kv = l.splitn(2, '=');
        kv.next().map(str::trim) == Some("fail_mode")
            && kv
                .next()
                .map(|v| v.trim().trim_matches(|c| c == '"' || c == '\''))
                == Some("closed")
    });
    if closed {
        FailMode::Closed
    } else {
        FailMode::Open
    }
}

/// The smallest log part and budget burst: room for the common records (a
/// longer line, an `end` with its wake-up edges, goes alone into a part).
const MIN_LOG_BYTES: u64 = 4096;
const MAX_LOG_KEEP: u32 = 100;

pub use crate::bad_value::BadValue;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config {path}: {message}")]
    Parse { path: PathBuf, message: String },
}

impl Config {
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let c: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.into(),
            message: e.to_string(),
        })?;
        crate::units::parse_duration("threshold", &c.threshold).map_err(|e| {
            ConfigError::Parse {
                path: path.into(),
                message: e.to_string(),
            }
        })?;
        let bad = |b: BadValue| ConfigError::Parse {
            path: path.into(),
            message: b.to_string(),
        };
        c.check_log_limits().map_err(bad)?;
        c.control.check().map_err(bad)?;
        Ok(c)
    }

    /// The log limits in range, or what is wrong with one (field, value, accepted).
    fn check_log_limits(&self) -> Result<(), BadValue> {
        let bad = |k: &str, v: u64, want: &str| Err(BadValue::new(k, v, want));
        if self.log_max_bytes != 0 && self.log_max_bytes < MIN_LOG_BYTES {
            return bad(
                "log_max_bytes",
                self.log_max_bytes,
                "0 (no rotation) or at least 4096 bytes",
            );
        }
        if self.log_budget_bytes_per_s != 0 && self.log_budget_burst_bytes < MIN_LOG_BYTES {
            return bad(
                "log_budget_burst_bytes",
                self.log_budget_burst_bytes,
                "at least 4096 bytes while log_budget_bytes_per_s is not 0",
            );
        }
        if self.log_keep > MAX_LOG_KEEP {
            return bad("log_keep", self.log_keep.into(), "0 to 100 parts");
        }
        Ok(())
    }

    /// How container logs, `hook.log` and `agent.log` are rotated.
    pub fn log_rotation(&self) -> crate::logfmt::Rotation {
        crate::logfmt::Rotation {
            max_bytes: self.log_max_bytes,
            keep: self.log_keep,
        }
    }

    /// $THROTTLEWATCH_CONFIG when set and not empty.
    pub fn env_path() -> Option<PathBuf> {
        std::env::var_os(ENV_CONFIG)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    }

    /// The file [`Config::load`] reads: `explicit` (from --config), else
    /// $THROTTLEWATCH_CONFIG, else the default path if it exists; None: the
    /// built-in defaults.
    pub fn path_to_load(explicit: Option<&Path>) -> Option<PathBuf> {
        match (explicit, Self::env_path()) {
            (Some(p), _) => Some(p.to_path_buf()),
            (None, Some(p)) => Some(p),
            (None, None) if Path::new(DEFAULT_PATH).exists() => Some(PathBuf::from(DEFAULT_PATH)),
            _ => None,
        }
    }

    /// The file [`Config::path_to_load`] names, parsed; else the defaults.
    pub fn load(explicit: Option<&Path>) -> Result<Config, ConfigError> {
        let Some(path) = Self::path_to_load(explicit) else {
            return Ok(Config::default());
        };
        let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Io {
            path: path.clone(),
            source,
        })?;
        Self::parse(&path, &text)
    }

    /// `load`, and on failure what the file meant (see [`BadConfig`]).
    pub fn load_checked(explicit: Option<&Path>) -> Result<Config, BadConfig> {
        Self::checked(Self::load(explicit))
    }

    pub(crate) fn checked(loaded: Result<Config, ConfigError>) -> Result<Config, BadConfig> {
        loaded.map_err(|e| {
            let text = match &e {
                ConfigError::Parse { path, .. } => {
                    std::fs::read_to_string(path).unwrap_or_default()
                }
                ConfigError::Io { .. } => String::new(),
            };
            BadConfig {
                error: e.to_string(),
                fail_mode: fail_mode_meant(&text),
            }
        })
    }

    /// Probe options from the configuration.
    pub fn poll_interval(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.poll_interval_ms.clamp(1, 10_000))
    }

    pub fn agent_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.agent_timeout_ms.clamp(1, 60_000))
    }

    pub fn cpuset_lock_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.cpuset_lock_timeout_ms.clamp(1, 60_000))
    }

    pub fn threshold_ns(&self) -> u64 {
        crate::units::parse_duration("threshold", &self.threshold)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_config_is_the_default() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/throttlewatch.toml");
        let text = std::fs::read_to_string(&p).unwrap();
        assert_eq!(Config::parse(&p, &text).unwrap(), Config::default());
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let e = Config::parse(Path::new("t.toml"), "log_dirr = \"/x\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("t.toml") && e.contains("log_dirr"), "{e}");
        let e = Config::parse(Path::new("t.toml"), "[qos]\nmax_burst = 5\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_burst"), "{e}");
    }

    #[test]
    fn bad_values_are_named() {
        let e = Config::parse(Path::new("t.toml"), "fail_mode = \"sometimes\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("sometimes") || e.contains("fail_mode"), "{e}");
        let e = Config::parse(Path::new("t.toml"), "threshold = \"soon\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("threshold") && e.contains("soon"), "{e}");
    }

    #[test]
    fn log_limits_out_of_range_are_named() {
        for (text, want) in [
            ("log_max_bytes = 100\n", "log_max_bytes = 100: expected 0"),
            (
                "log_budget_burst_bytes = 10\n",
                "log_budget_burst_bytes = 10: expected at least 4096",
            ),
            ("log_keep = 1000\n", "log_keep = 1000: expected 0 to 100"),
            ("log_keep = -1\n", "log_keep"),
        ] {
            let e = Config::parse(Path::new("t.toml"), text)
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
        let ok = "log_max_bytes = 0\nlog_budget_bytes_per_s = 0\nlog_budget_burst_bytes = 0\n";
        assert!(Config::parse(Path::new("t.toml"), ok).is_ok());
    }

    #[test]
    fn partial_file_keeps_defaults() {
        let c = Config::parse(
            Path::new("t"),
            "fail_mode = \"closed\"\nthreshold = \"1ms\"\n",
        )
        .unwrap();
        assert_eq!(c.fail_mode, FailMode::Closed);
        assert_eq!(c.threshold_ns(), 1_000_000);
        assert_eq!(c.log_dir, PathBuf::from("/var/log/throttlewatch"));
    }
}
