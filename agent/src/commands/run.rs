//! `throttlewatch run -- CMD`: a transient cgroup with limits, the command
//! in it, live freezes on stderr, the log, the summary, CMD's exit status.

use std::ffi::CString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use throttlewatch_cgroup::{CpuCgroup, Hierarchies, TransientCgroup};
use throttlewatch_core::config::Config;
use throttlewatch_core::units::{self, parse_duration};
use throttlewatch_core::CpuList;
use throttlewatch_core::EndReason;

use crate::cli::{OutputArgs, RunArgs};
use crate::engine::{probe_options, Engine};
use crate::labels::ContainerLabels;
use crate::live::LiveLoop;
use crate::spec::SessionSpec;
use crate::{signals, CliError};

/// Limits asked for on the command line, validated.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct RunLimits {
    pub quota_us: Option<u64>,
    pub period_us: u64,
    pub burst_us: Option<u64>,
    pub cpuset: Option<CpuList>,
}

fn us(d: Duration) -> u64 {
    d.as_micros() as u64
}

/// Validate --cpus/--quota/--period/--burst/--cpuset against each other and
/// the CPUs available (`available`: the root cpuset's CPUs).
pub(crate) fn parse_limits(
    a: &RunArgs,
    available: Option<&CpuList>,
) -> Result<RunLimits, CliError> {
    let period_us = parse_period(a)?;
    let quota_us = parse_quota(a, period_us)?;
    Ok(RunLimits {
        quota_us,
        period_us,
        burst_us: parse_burst(a, quota_us)?,
        cpuset: parse_cpuset(a, available)?,
    })
}

/// A limit the command can never reach: more CPUs than it may run on.
pub(crate) fn limit_above_cpus(l: &RunLimits, available: Option<&CpuList>) -> Option<String> {
    let q = l.quota_us?;
    let cpus = l.cpuset.as_ref().or(available)?;
    let limit = q as f64 / l.period_us.max(1) as f64;
    (limit > cpus.len() as f64 + 1e-9).then(|| {
        format!(
            "the limit of {limit} CPUs is above the {} CPUs the command may run on ({cpus}): it will never be throttled by it",
            cpus.len()
        )
    })
}

fn unit_err(e: units::UnitError) -> CliError {
    CliError::usage(e.to_string())
}

fn parse_period(a: &RunArgs) -> Result<u64, CliError> {
    let period_us = match &a.period {
        Some(p) => us(parse_duration("--period", p).map_err(unit_err)?),
        None => 100_000,
    };
    if !(1_000..=1_000_000).contains(&period_us) {
        return Err(CliError::usage(format!(
            "--period: invalid value {:?}: the kernel accepts a period from 1ms to 1s",
            a.period.as_deref().unwrap_or_default()
        )));
    }
    Ok(period_us)
}

fn parse_quota(a: &RunArgs, period_us: u64) -> Result<Option<u64>, CliError> {
    match (&a.cpus, &a.quota) {
        (Some(c), _) => Ok(Some(units::quota_for_cpus(
            units::parse_cpus("--cpus", c).map_err(unit_err)?,
            period_us,
        ))),
        (None, Some(q)) => {
            let q_us = us(parse_duration("--quota", q).map_err(unit_err)?);
            if q_us < 1_000 {
                return Err(CliError::usage(format!(
                    "--quota: invalid value {q:?}: the kernel's smallest quota is 1ms"
                )));
            }
            Ok(Some(q_us))
        }
        (None, None) => Ok(None),
    }
}

fn parse_burst(a: &RunArgs, quota_us: Option<u64>) -> Result<Option<u64>, CliError> {
    let Some(b) = &a.burst else { return Ok(None) };
    let b_us = us(parse_duration("--burst", b).map_err(unit_err)?);
    let Some(q) = quota_us else {
        return Err(CliError::usage(format!(
            "--burst: invalid value {b:?}: a burst needs a quota (--cpus or --quota)"
        )));
    };
    if b_us > q {
        return Err(CliError::usage(format!(
            "--burst: invalid value {b:?}: larger than the quota ({}); the kernel accepts a burst up to the quota",
            units::format_duration(Duration::from_micros(q))
        )));
    }
    Ok(Some(b_us))
}

fn parse_cpuset(a: &RunArgs, available: Option<&CpuList>) -> Result<Option<CpuList>, CliError> {
    let Some(s) = &a.cpuset else { return Ok(None) };
    let l = CpuList::parse("--cpuset", s).map_err(unit_err)?;
    if l.is_empty() {
        return Err(CliError::usage(format!(
            "--cpuset: invalid value {s:?}: {}",
            throttlewatch_core::cpulist::CPULIST_ACCEPTED
        )));
    }
    if let Some(avail) = available {
        let outside = l.difference(avail);
        if !outside.is_empty() {
            return Err(CliError::usage(format!(
                "--cpuset: invalid value {s:?}: CPUs {outside} are not available here; accepted: a subset of {avail}"
            )));
        }
    }
    Ok(Some(l))
}

/// Find the program like execvp would; a clear error if it is not there.
pub(crate) fn resolve_program(prog: &str) -> Result<PathBuf, CliError> {
    let exec_ok = |p: &Path| {
        let c = CString::new(p.as_os_str().as_encoded_bytes()).ok();
        // SAFETY: access(2) with a valid C string.
        p.is_file() && c.is_some_and(|c| unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0)
    };
    if prog.contains('/') {
        let p = PathBuf::from(prog);
        return if exec_ok(&p) {
            Ok(p)
        } else {
            Err(CliError::usage(format!(
                "command not found or not executable: {prog:?}"
            )))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(prog))
        .find(|p| exec_ok(p))
        .ok_or_else(|| CliError::usage(format!("command not found: {prog:?} (searched PATH)")))
}

pub(crate) fn threshold_ns(out: &OutputArgs, cfg: &Config) -> Result<u64, CliError> {
    match &out.threshold {
        Some(t) => Ok(parse_duration("--threshold", t)
            .map_err(|e| CliError::usage(e.to_string()))?
            .as_nanos() as u64),
        None => Ok(cfg.threshold_ns()),
    }
}

/// Where the log goes; checks the directory before anything is created.
pub(crate) fn log_path(
    out: &OutputArgs,
    cfg: &Config,
    default_name: &str,
) -> Result<PathBuf, CliError> {
    let p = match &out.log {
        Some(p) => p.clone(),
        None => {
            std::fs::create_dir_all(&cfg.log_dir).map_err(|e| {
                CliError::fail(format!(
                    "creating log directory {}: {e}",
                    cfg.log_dir.display()
                ))
            })?;
            cfg.log_dir.join(default_name)
        }
    };
    let dir = p
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.is_dir() {
        return Err(CliError::usage(format!(
            "--log: invalid value {:?}: directory {} does not exist",
            p.display(),
            dir.display()
        )));
    }
    if p.is_dir() {
        return Err(CliError::usage(format!(
            "--log: invalid value {:?}: is a directory; give a file path",
            p.display()
        )));
    }
    Ok(p)
}

fn root_cpus(h: &Hierarchies) -> Option<CpuList> {
    let g = CpuCgroup::at(h, "/");
    g.effective_cpus()
        .and_then(|s| CpuList::parse("cpuset", &s).ok())
}

fn apply_limits(g: &CpuCgroup, l: &RunLimits) -> Result<(), CliError> {
    let kernel = |what: &str, e: throttlewatch_cgroup::CgroupError| {
        CliError::usage(format!("{what}: the kernel refused it: {e}"))
    };
    if l.quota_us.is_some() || l.period_us != 100_000 {
        g.set_quota(l.quota_us, l.period_us)
            .map_err(|e| kernel("--cpus/--quota/--period", e))?;
    }
    if let Some(b) = l.burst_us {
        g.set_burst(b).map_err(|e| kernel("--burst", e))?;
    }
    if let Some(c) = &l.cpuset {
        g.set_cpuset(Some(&c.to_string()), None)
            .map_err(|e| kernel("--cpuset", e))?;
    }
    Ok(())
}

/// Paths the child writes its pid to before exec, prepared before fork.
fn procs_files(g: &CpuCgroup) -> Vec<CString> {
    let mut dirs = vec![g.cpu_dir.clone()];
    dirs.extend(g.cpuset_dir.iter().filter(|d| **d != g.cpu_dir).cloned());
    dirs.extend(g.extra_dirs.iter().cloned());
    dirs.iter()
        .filter_map(|d| {
            CString::new(d.join("cgroup.procs").into_os_string().into_encoded_bytes()).ok()
        })
        .collect()
}

/// The cgroup parent, checked to exist.
fn parent_cgroup(h: &Hierarchies, a: &RunArgs) -> Result<String, CliError> {
    let parent = a.cgroup_parent.clone().unwrap_or_else(|| "/".into());
    let parent_g = CpuCgroup::at(h, &parent);
    if !parent_g.exists() {
        return Err(CliError::usage(format!(
            "--cgroup-parent: invalid value {parent:?}: no such cgroup ({} does not exist)",
            parent_g.cpu_dir.display()
        )));
    }
    Ok(parent)
}

pub fn run(cfg: &Config, a: &RunArgs) -> Result<i32, CliError> {
    run_to_end(cfg, a, std::process::Stdio::inherit).map(|(code, _)| code)
}

/// `run`, returning the command's exit status and the log's `end` record
/// (none when the command never ran). The command's stdout is `stdout()`
/// (`demo` keeps its workload's machine-readable line out of its own
/// output).
pub(crate) fn run_to_end(
    cfg: &Config,
    a: &RunArgs,
    stdout: fn() -> std::process::Stdio,
) -> Result<(i32, Option<throttlewatch_core::logfmt::End>), CliError> {
    // Before the probe loads (slow on a busy or emulated machine): a signal
    // from then on still removes the cgroup and writes the `end` record.
    signals::install();
    let h = Hierarchies::discover().map_err(|e| CliError::fail(e.to_string()))?;
    let limits = parse_limits(a, root_cpus(&h).as_ref())?;
    if let Some(w) = limit_above_cpus(&limits, root_cpus(&h).as_ref()) {
        eprintln!("throttlewatch: warning: {w}");
    }
    let threshold = threshold_ns(&a.out, cfg)?;
    let prog = resolve_program(&a.cmd[0])?;
    let parent = parent_cgroup(&h, a)?;
    let me = std::process::id();
    let now_s = throttlewatch_core::logfmt::now_unix_ns() / 1_000_000_000;
    let log = log_path(&a.out, cfg, &format!("run-{now_s}-{me}.jsonl"))?;

    let mut engine = Engine::load(
        &probe_options(cfg),
        crate::gpu::GpuSampler::open(&cfg.nvml_library),
    )
    .map_err(|e| CliError::fail(e.to_string()))?;
    let rel = format!("{}/throttlewatch-run-{me}", parent.trim_end_matches('/'));
    let mut cg = TransientCgroup::create(&h, &rel)
        .map_err(|e| CliError::fail(format!("creating cgroup {rel}: {e}")))?;
    apply_limits(&cg.group, &limits)?;
    tracing::debug!(cgroup = %rel, "run: transient cgroup created, limits applied");

    let name: String = a.cmd.join(" ").chars().take(200).collect();
    let spec = SessionSpec {
        labels: Arc::new(ContainerLabels::plain(&format!("run-{me}"), &name)),
        threshold_ns: threshold,
        log_path: log.clone(),
        log: crate::budget::LogLimits {
            cmdline: cfg.log_cmdline,
            ..Default::default()
        },
        ..Default::default()
    };
    let id = engine
        .watch(spec, cg.group.clone())
        .map_err(|e| CliError::fail(e.to_string()))?;
    if let Some(sig) = signals::received() {
        // Stopped while setting up: the command never runs.
        engine.finish(id, EndReason::Signal, None);
        cg.remove();
        return Ok((128 + sig, None));
    }
    let child = match spawn_in(&cg.group, &prog, &a.cmd[1..], stdout()) {
        Ok(c) => c,
        Err(e) => {
            engine.finish(id, EndReason::SpawnFailed, None);
            let _ = std::fs::remove_file(&log);
            cg.remove();
            return Err(CliError::usage(format!("cannot run {:?}: {e}", a.cmd[0])));
        }
    };
    let mut live = LiveLoop::new(cfg, &a.out);
    let (code, reason) = supervise(child, &mut engine, &mut live);
    let end = live.finish(
        &mut engine,
        id,
        reason,
        Some(code),
        &format!("{:?} exited {code}", a.cmd[0]),
    );
    cg.remove();
    Ok((code, end))
}

/// Start the command inside the cgroup: the child moves itself before exec.
pub(crate) fn spawn_in(
    g: &CpuCgroup,
    prog: &Path,
    args: &[String],
    stdout: std::process::Stdio,
) -> std::io::Result<std::process::Child> {
    let procs = procs_files(g);
    let mut cmd = std::process::Command::new(prog);
    cmd.args(args).stdout(stdout);
    // SAFETY: the closure only makes async-signal-safe syscalls on buffers
    // prepared before fork.
    unsafe {
        cmd.pre_exec(move || {
            let mut buf = [0u8; 16];
            let pid = libc::getpid() as u32;
            let n = fmt_u32(pid, &mut buf);
            for p in &procs {
                let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 || libc::write(fd, buf.as_ptr().cast(), n) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(fd);
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// Poll until the child exits, forwarding a signal to it (SIGKILL 5 s
/// later). Returns its exit status as a shell would and the end reason.
fn supervise(
    mut child: std::process::Child,
    engine: &mut Engine,
    live: &mut LiveLoop,
) -> (i32, EndReason) {
    let cpid = child.id() as i32;
    let mut forwarded: Option<(i32, Instant)> = None;
    let status = loop {
        live.poll(engine);
        if let Ok(Some(st)) = child.try_wait() {
            break st;
        }
        if let Some(sig) = signals::received() {
            match forwarded {
                None => {
                    // SAFETY: kill(2) on our own child.
                    unsafe { libc::kill(cpid, sig) };
                    forwarded = Some((sig, Instant::now()));
                }
                Some((_, at)) if at.elapsed() > Duration::from_secs(5) => {
                    let _ = child.kill();
                }
                _ => {}
            }
        }
        live.sleep();
    };
    match (status.code(), status.signal()) {
        (Some(c), _) if forwarded.is_some() => (c, EndReason::Signal),
        (Some(c), _) => (c, EndReason::Exit),
        (None, Some(s)) => (128 + s, EndReason::Signal),
        _ => (1, EndReason::Exit),
    }
}

fn fmt_u32(mut v: u32, buf: &mut [u8; 16]) -> usize {
    let mut tmp = [0u8; 10];
    let mut i = 0;
    loop {
        tmp[i] = b'0' + (v % 10) as u8;
        v /= 10;
        i += 1;
        if v == 0 {
            break;
        }
    }
    for j in 0..i {
        buf[j] = tmp[i - 1 - j];
    }
    i
}

#[cfg(test)]
#[path = "run_tests.rs"]
mod tests;
