//! `throttlewatch config check [FILE]`: validate a configuration as the hook,
//! the wrapper and the shim load it, and say what it would do.

use std::path::Path;

use throttlewatch_core::config::{Config, FailMode};
use throttlewatch_qos::{Key, Policy};

use crate::CliError;

/// Exit 0 and a description for a valid file; 1 and the reason otherwise.
pub fn check(file: Option<&Path>) -> Result<i32, CliError> {
    let shown = file
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "the configuration in use".into());
    match throttlewatch_qos::config_check::load(file) {
        Ok(cfg) => {
            println!("{shown}: valid");
            print!("{}", describe(&cfg));
            Ok(0)
        }
        Err(bad) => {
            let then = match bad.fail_mode {
                FailMode::Closed => "fail_mode = \"closed\" is meant: containers are refused",
                FailMode::Open => "containers start unchanged and unwatched",
            };
            Err(CliError::fail(format!(
                "{bad}\nwith this file the hook, the wrapper and the shim apply nothing; {then}"
            )))
        }
    }
}

fn keys(list: impl Iterator<Item = Key>) -> String {
    let v: Vec<&str> = list.map(|k| k.name()).collect();
    if v.is_empty() {
        "nothing".into()
    } else {
        v.join(", ")
    }
}

/// What the configuration does, one line per concern.
pub(crate) fn describe(cfg: &Config) -> String {
    let p = Policy::for_config(cfg);
    let annotations = keys(Key::ALL.into_iter().filter(|k| p.allows(*k)));
    let env = keys(
        Key::ALL
            .into_iter()
            .filter(|k| p.allows(*k) && p.env_allows(*k).is_ok()),
    );
    let mode = match cfg.fail_mode {
        FailMode::Open => "open: a bad annotation or a missing agent never breaks a container",
        FailMode::Closed => "closed: a container whose QoS or registration fails is refused",
    };
    format!(
        "fail_mode: {mode}\n\
         annotations may set: {annotations}\n\
         the environment (an image's ENV too) may set: {env}\n\
         threshold: {} (containers may raise it, never lower it)\n\
         max_burst_percent: {}; allow_exclusive: {}\n\
         agent: socket {}, answer within {} ms, else the container {}\n\
         hook entries: timeout {} s; exclusive-cores lock: wait at most {} ms\n\
         logs: {}; metrics: {}\n\
         {}\n\
         {}\n",
        cfg.threshold,
        p.burst_cap_percent(),
        cfg.qos.allow_exclusive,
        cfg.socket.display(),
        cfg.agent_timeout().as_millis(),
        match cfg.fail_mode {
            FailMode::Open => "starts unwatched",
            FailMode::Closed => "is refused",
        },
        cfg.hook_timeout_s.max(1),
        cfg.cpuset_lock_timeout().as_millis(),
        cfg.log_dir.display(),
        if cfg.metrics_addr.is_empty() {
            "off".to_string()
        } else {
            format!(
                "{}, an ended container's series kept {} s (metrics_grace_s)",
                cfg.metrics_addr, cfg.metrics_grace_s
            )
        },
        log_limits(cfg),
        control(cfg),
    )
}

/// The dynamic CPU controller, as `config check` says it.
fn control(cfg: &Config) -> String {
    let c = &cfg.control;
    if !c.enabled {
        return "cpu control: off ([control] enabled = false; cpu-control annotations are ignored)"
            .into();
    }
    format!(
        "cpu control: on for containers with cpu-control: auto; burst up to {} %, quota up to {} % of the original, steps of at least {} %, raises {} ms apart, back down after {} ms calm; node guard at PSI some >= {} % of the last 0.5 s in {} and idle CPU <= {} %",
        c.burst_ceiling_percent,
        c.quota_ceiling_percent,
        c.step_percent,
        c.cooldown_ms,
        c.calm_ms,
        c.pressure_psi_some_percent,
        c.pressure_psi_file,
        c.pressure_idle_percent
    )
}

/// The log limits, as `config check` says them.
fn log_limits(cfg: &Config) -> String {
    let or_off = |n: u64, what: String| if n == 0 { "off".to_string() } else { what };
    format!(
        "log budget per container: {} (log_budget_bytes_per_s, log_budget_burst_bytes)\n\
         log rotation: {} (log_max_bytes, log_keep; container logs, hook.log, agent.log)\n\
         log directory cap: {} (log_dir_max_bytes; closed logs removed oldest first)",
        or_off(
            cfg.log_budget_bytes_per_s,
            format!(
                "{} bytes/s, bursts of {} bytes; past it freezes are folded into throttle_summary records",
                cfg.log_budget_bytes_per_s, cfg.log_budget_burst_bytes
            )
        ),
        or_off(
            cfg.log_max_bytes,
            format!("at {} bytes, keeping {} parts", cfg.log_max_bytes, cfg.log_keep)
        ),
        or_off(cfg.log_dir_max_bytes, format!("{} bytes", cfg.log_dir_max_bytes)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_limits_are_said_with_their_keys() {
        let d = describe(&Config::default());
        for want in [
            "log budget per container: 16384 bytes/s, bursts of 65536 bytes;",
            "(log_budget_bytes_per_s, log_budget_burst_bytes)",
            "at 16777216 bytes, keeping 3 parts (log_max_bytes, log_keep",
            "log directory cap: 1073741824 bytes (log_dir_max_bytes",
        ] {
            assert!(d.contains(want), "{want} not in {d}");
        }
        let off = Config {
            log_budget_bytes_per_s: 0,
            log_max_bytes: 0,
            log_dir_max_bytes: 0,
            ..Config::default()
        };
        let d = describe(&off);
        assert_eq!(d.matches(": off (log").count(), 3, "{d}");
    }
}

#[cfg(test)]
mod control_tests {
    use super::*;

    #[test]
    fn cpu_control_is_said_off_or_with_its_bounds() {
        assert!(describe(&Config::default()).contains("cpu control: off"));
        let mut on = Config::default();
        on.control.enabled = true;
        let d = describe(&on);
        assert!(
            d.contains("cpu control: on") && d.contains("quota up to 300 %"),
            "{d}"
        );
    }
}
