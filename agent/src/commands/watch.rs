//! `throttlewatch watch`: attach to an existing cgroup until interrupted,
//! the duration ends or the cgroup goes away.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use throttlewatch_cgroup::{proc::cpu_cgroup_of_pid, CpuCgroup, Hierarchies};
use throttlewatch_core::config::Config;
use throttlewatch_core::units::parse_duration;
use throttlewatch_core::EndReason;

use crate::cli::WatchArgs;
use crate::engine::{probe_options, Engine};
use crate::labels::ContainerLabels;
use crate::live::LiveLoop;
use crate::run::{log_path, threshold_ns};
use crate::spec::SessionSpec;
use crate::{signals, CliError};

/// Resolve --cgroup/--pid to an existing cpu cgroup.
pub(crate) fn target(h: &Hierarchies, a: &WatchArgs) -> Result<CpuCgroup, CliError> {
    if let Some(pid) = &a.pid {
        let n: u32 = pid.trim().parse().ok().filter(|p| *p > 0).ok_or_else(|| {
            CliError::usage(format!(
                "--pid: invalid value {pid:?}: expected a process id (a positive integer)"
            ))
        })?;
        let rel = cpu_cgroup_of_pid(Path::new("/proc"), n, h.mode).map_err(|_| {
            CliError::usage(format!("--pid: invalid value {pid:?}: no such process"))
        })?;
        return CpuCgroup::open(h, &rel).map_err(|e| CliError::usage(format!("--pid {pid}: {e}")));
    }
    let c = a.cgroup.as_deref().unwrap_or_default();
    // Accept the full path under the mount as well as the hierarchy-relative one.
    let rel = Path::new(c)
        .strip_prefix(&h.cpu)
        .map(|r| format!("/{}", r.display()))
        .unwrap_or_else(|_| c.to_string());
    CpuCgroup::open(h, &rel).map_err(|_| {
        CliError::usage(format!(
            "--cgroup: invalid value {c:?}: no such cgroup (looked for {}); accepted: a path in the cpu hierarchy such as /docker/ID, or its full path under {}",
            h.cpu_dir(&rel).display(),
            h.cpu.display()
        ))
    })
}

pub fn watch(cfg: &Config, a: &WatchArgs) -> Result<i32, CliError> {
    // Before the probe loads (slow on a busy or emulated machine): a signal
    // from then on still ends the watch with an `end` record.
    signals::install();
    let h = Hierarchies::discover().map_err(|e| CliError::fail(e.to_string()))?;
    let duration = match &a.duration {
        Some(d) => {
            Some(parse_duration("--duration", d).map_err(|e| CliError::usage(e.to_string()))?)
        }
        None => None,
    };
    let threshold = threshold_ns(&a.out, cfg)?;
    let g = target(&h, a)?;
    if let (Some(pid), "/") = (&a.pid, g.rel.as_str()) {
        // The root cgroup has no CFS quota: watching it would log "0 of 0
        // periods". `--cgroup /` still watches it on purpose.
        eprintln!(
            "throttlewatch: process {} is in the root cpu cgroup: it has no CPU limit, so nothing can throttle it; \
             nothing to watch (use --cgroup / to watch the root cgroup anyway)",
            pid.trim()
        );
        return Ok(0);
    }
    let name = g.rel.clone();
    let log = log_path(
        &a.out,
        cfg,
        &format!("watch-{}", throttlewatch_core::logfmt::log_file_name(&name)),
    )?;
    let mut engine = Engine::load(
        &probe_options(cfg),
        crate::gpu::GpuSampler::open(&cfg.nvml_library),
    )
    .map_err(|e| CliError::fail(e.to_string()))?;
    let spec = SessionSpec {
        labels: Arc::new(ContainerLabels::plain(&name, &name)),
        threshold_ns: threshold,
        log_path: log,
        log: crate::budget::LogLimits {
            cmdline: cfg.log_cmdline,
            ..Default::default()
        },
        ..Default::default()
    };
    let id = engine
        .watch(spec, g.clone())
        .map_err(|e| CliError::fail(e.to_string()))?;
    let mut live = LiveLoop::new(cfg, &a.out);
    let started = Instant::now();
    let reason = loop {
        live.poll(&mut engine);
        if signals::received().is_some() {
            break EndReason::Signal;
        }
        if duration.is_some_and(|d| started.elapsed() >= d) {
            break EndReason::Duration;
        }
        if !g.exists() {
            break EndReason::CgroupRemoved;
        }
        live.sleep();
    };
    let what = format!("watching {name} ended ({reason})");
    live.finish(&mut engine, id, reason, None, &what);
    Ok(0)
}
