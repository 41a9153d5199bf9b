//! `Configure`: the runtime's name and request timeout, the runtime's
//! plugin configuration (the conf file NRI hands a launched plugin:
//! throttlewatch's configuration, the log file, the watch mode), and the
//! events subscribed to.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::{event_mask, LoadedConfig, Plugin, RuntimeInfo, DEFAULT_REQUEST_TIMEOUT, EVENTS};
use crate::api;
use crate::diag::{self, say};
use crate::locked::lock;
use crate::options::{NriConfig, WatchMode};

impl Plugin {
    pub(super) fn configure(&self, req: api::ConfigureRequest) -> api::ConfigureResponse {
        let timeout = u64::try_from(req.request_timeout)
            .ok()
            .filter(|ms| *ms > 0)
            .map(Duration::from_millis)
            .unwrap_or(DEFAULT_REQUEST_TIMEOUT);
        *lock(&self.runtime) = RuntimeInfo {
            name: req.runtime_name.clone(),
            request_timeout: timeout,
        };
        let watch = self.take_plugin_config(&req.config);
        *lock(&self.watch) = watch;
        // A new connection: its Synchronize lists the containers anew.
        lock(&self.listed).clear();
        say(&format!(
            "configured by {}/{} (NRI {}), request timeout {timeout:?}, watching {} containers",
            req.runtime_name,
            req.runtime_version,
            req.NRI_version,
            match watch {
                WatchMode::All => "all",
                WatchMode::Annotated => "annotated",
            }
        ));
        let mut res = api::ConfigureResponse::new();
        res.events = event_mask(&EVENTS);
        res
    }

    /// The runtime's plugin configuration: throttlewatch's configuration
    /// file, a launched plugin's log file, the watch mode (returned).
    fn take_plugin_config(&self, text: &str) -> WatchMode {
        let c = match NriConfig::parse(text) {
            Ok(c) => c,
            Err(e) => {
                say(&format!("{e}; watching {:?} containers", self.cli_watch));
                NriConfig::default()
            }
        };
        if let Some(path) = c.config {
            self.load_settings(path);
        }
        if diag::to_file() {
            let log = c
                .log
                .unwrap_or_else(|| self.settings().cfg.log_dir.join(diag::LOG_FILE));
            if let Err(e) = diag::log_to(&log) {
                say(&format!("cannot write this plugin's lines to {e}"));
            }
        }
        c.watch.unwrap_or(self.cli_watch)
    }

    /// throttlewatch's configuration from `path` (named by the runtime's
    /// plugin configuration); one that cannot be used leaves the current one.
    fn load_settings(&self, path: PathBuf) {
        if self.settings().path.as_deref() == Some(path.as_path()) {
            return;
        }
        match throttlewatch_core::config_check::load_cached(Some(&path)) {
            Ok(cfg) => {
                say(&format!(
                    "throttlewatch configuration from {}",
                    path.display()
                ));
                *lock(&self.settings) = Arc::new(LoadedConfig {
                    cfg,
                    path: Some(path),
                });
            }
            Err(bad) => say(&format!("{bad}; keeping the configuration in use")),
        }
    }
}
