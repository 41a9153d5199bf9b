//! `throttlewatch demo`: the quickstart's workload, sure to be throttled
//! whatever else uses the CPUs. The threads first run unlimited for a moment
//! in a cgroup beside the demo's; the limit is a share (default 0.4) of the
//! CPU they got, so the quota runs out in every period even on a machine
//! that other jobs keep busy. Then `throttlewatch run --cpus LIMIT -- throttlewatch burn`,
//! printed so a person can type it again. Exit 3, with the reason in one line,
//! if the kernel throttled nothing after all.

use std::time::{Duration, Instant};

use throttlewatch_cgroup::{Hierarchies, TransientCgroup};
use throttlewatch_core::config::Config;
use throttlewatch_core::logfmt::End;
use throttlewatch_core::units::parse_duration;

use crate::cli::{DemoArgs, RunArgs};
use crate::{burn, run, CliError};

/// Exit status when the demo ran but was not throttled.
pub(crate) const EXIT_NOT_THROTTLED: i32 = 3;
/// How long the threads run unlimited to measure what the machine gives them.
const CALIBRATION: Duration = Duration::from_millis(400);
/// The smallest limit the demo sets: 5 ms of quota per 100 ms period.
const MIN_CPUS: f64 = 0.05;

/// Validated options.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DemoOptions {
    pub threads: usize,
    pub duration: Duration,
    pub share: f64,
}

pub(crate) fn plan(a: &DemoArgs) -> Result<DemoOptions, CliError> {
    if !(1..=burn::MAX_THREADS).contains(&a.threads) {
        return Err(CliError::usage(format!(
            "--threads: invalid value {}: accepted 1 to {}",
            a.threads,
            burn::MAX_THREADS
        )));
    }
    let duration =
        parse_duration("--duration", &a.duration).map_err(|e| CliError::usage(e.to_string()))?;
    if !(Duration::from_millis(500)..=Duration::from_secs(3600)).contains(&duration) {
        return Err(CliError::usage(format!(
            "--duration: invalid value {:?}: accepted 500ms to 1h",
            a.duration
        )));
    }
    let share = a
        .share
        .parse::<f64>()
        .ok()
        .filter(|s| (0.05..=0.9).contains(s))
        .ok_or_else(|| {
            CliError::usage(format!(
                "--share: invalid value {:?}: accepted a number from 0.05 to 0.9",
                a.share
            ))
        })?;
    Ok(DemoOptions {
        threads: a.threads,
        duration,
        share,
    })
}

/// The limit for threads that got `got_cpus` unlimited: `share` of it (of
/// the threads' count at most), rounded down to 0.05 CPU, at least 0.05.
pub(crate) fn limit_for(got_cpus: f64, share: f64, threads: usize) -> f64 {
    let want = got_cpus.min(threads as f64) * share;
    ((want * 20.0).floor() / 20.0).max(MIN_CPUS)
}

fn fmt_cpus(c: f64) -> String {
    let s = format!("{c:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// CPU time (user + system) of an exited child, reaped here.
fn wait_cpu(child: std::process::Child) -> std::io::Result<(Duration, bool)> {
    let pid = child.id() as i32;
    let mut status = 0;
    // SAFETY: zeroed rusage is valid; wait4 on our own child, which std has
    // not reaped (we own the Child and never waited on it).
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    drop(child); // reaped above; dropping a Child neither waits nor kills
    Ok((tv(ru.ru_utime) + tv(ru.ru_stime), ok))
}

/// Run the threads unlimited for a moment in their own cgroup beside the
/// demo's (the same place in the hierarchy: the same competition) and return
/// the CPUs they got.
fn calibrate(threads: usize, exe: &std::path::Path) -> Result<f64, CliError> {
    let h = Hierarchies::discover().map_err(|e| CliError::fail(e.to_string()))?;
    let rel = format!("/throttlewatch-demo-{}-calibrate", std::process::id());
    let mut cg = TransientCgroup::create(&h, &rel)
        .map_err(|e| CliError::fail(format!("creating cgroup {rel}: {e}")))?;
    let args = [
        "burn".to_string(),
        "--threads".into(),
        threads.to_string(),
        "--ms".into(),
        CALIBRATION.as_millis().to_string(),
    ];
    let started = Instant::now();
    let res = run::spawn_in(&cg.group, exe, &args, std::process::Stdio::null()).and_then(wait_cpu);
    let wall = started.elapsed();
    cg.remove();
    let (cpu, ok) = res.map_err(|e| CliError::fail(format!("demo: calibrating: {e}")))?;
    if !ok {
        return Err(CliError::fail("demo: calibrating: the workload failed"));
    }
    Ok(cpu.as_secs_f64() / wall.as_secs_f64().max(1e-3))
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}

/// Why a demo that ran was not throttled, in one line; None when it was.
pub(crate) fn not_throttled_reason(end: &End, cpus: f64, load: &str) -> Option<String> {
    if end.kernel_throttled_ns > 0 || end.probe_throttled_ns > 0 {
        return None;
    }
    let ncpu = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    Some(if end.nr_periods == 0 {
        format!(
            "demo: not throttled: the kernel ran no CFS period with the {} CPU limit (cpu.stat nr_periods 0): the threads never ran under it",
            fmt_cpus(cpus)
        )
    } else {
        format!(
            "demo: not throttled: in none of {} periods did the threads use their {} CPU of quota: other jobs kept the {ncpu} CPUs busy (load average {load}); run it again when the machine is less busy, or with --share 0.1",
            end.nr_periods,
            fmt_cpus(cpus)
        )
    })
}

/// `throttlewatch demo`.
pub fn demo(cfg: &Config, a: &DemoArgs) -> Result<i32, CliError> {
    let p = plan(a)?;
    let exe = std::env::current_exe()
        .map_err(|e| CliError::fail(format!("demo: finding my own binary: {e}")))?;
    let got = calibrate(p.threads, &exe)?;
    let cpus = limit_for(got, p.share, p.threads);
    let ms = p.duration.as_millis().to_string();
    let log = a.out.log.as_ref().map(|l| l.display().to_string());
    eprintln!(
        "demo: {} busy threads got {:.2} CPUs here just now (unlimited, {} ms); limited to {} of that: --cpus {}",
        p.threads,
        got,
        CALIBRATION.as_millis(),
        p.share,
        fmt_cpus(cpus)
    );
    eprintln!(
        "+ throttlewatch run --cpus {}{} -- throttlewatch burn --threads {} --ms {ms}",
        fmt_cpus(cpus),
        log.map(|l| format!(" --log {l}")).unwrap_or_default(),
        p.threads
    );
    let r = RunArgs {
        cpus: Some(fmt_cpus(cpus)),
        quota: None,
        period: None,
        burst: None,
        cpuset: None,
        cgroup_parent: None,
        out: a.out.clone(),
        cmd: vec![
            exe.display().to_string(),
            "burn".into(),
            "--threads".into(),
            p.threads.to_string(),
            "--ms".into(),
            ms,
        ],
    };
    // The workload's `{"pid":…,"tids":[…]}` line is for scripts that run
    // `burn` themselves, not part of the demo's output.
    let (code, end) = run::run_to_end(cfg, &r, std::process::Stdio::null)?;
    if code != 0 {
        return Ok(code);
    }
    let Some(end) = end else {
        return Ok(code);
    };
    match not_throttled_reason(&end, cpus, &load_average()) {
        Some(why) => {
            eprintln!("{why}");
            Ok(EXIT_NOT_THROTTLED)
        }
        None => Ok(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::OutputArgs;

    fn args(threads: usize, duration: &str, share: &str) -> DemoArgs {
        DemoArgs {
            threads,
            duration: duration.into(),
            share: share.into(),
            out: OutputArgs {
                log: None,
                threshold: None,
                json: false,
                quiet: false,
            },
        }
    }

    #[test]
    fn limits_are_a_share_of_what_the_threads_got() {
        // A quiet 2-CPU machine: 4 threads get 2 CPUs; 0.4 of that.
        assert_eq!(limit_for(1.98, 0.4, 4), 0.75);
        // Two other busy jobs: the threads got 1.3.
        assert_eq!(limit_for(1.3, 0.4, 4), 0.5);
        // A machine so busy that they got 0.1: the floor, still below it.
        assert_eq!(limit_for(0.1, 0.4, 4), MIN_CPUS);
        // 64 free CPUs, 4 threads: never more than the threads can use.
        assert!((limit_for(64.0, 0.4, 4) - 1.6).abs() < 1e-9);
    }

    #[test]
    fn bad_options_name_the_option_the_value_and_what_is_accepted() {
        let e = plan(&args(0, "3s", "0.4")).unwrap_err();
        assert!(
            e.message.starts_with("--threads: invalid value 0"),
            "{}",
            e.message
        );
        let e = plan(&args(4, "100ms", "0.4")).unwrap_err();
        assert_eq!(
            e.message,
            "--duration: invalid value \"100ms\": accepted 500ms to 1h"
        );
        let e = plan(&args(4, "3s", "1.5")).unwrap_err();
        assert!(e.message.contains("0.05 to 0.9"), "{}", e.message);
        let e = plan(&args(4, "3s", "lots")).unwrap_err();
        assert!(
            e.message.starts_with("--share: invalid value \"lots\""),
            "{}",
            e.message
        );
        assert_eq!(
            plan(&args(4, "2s", "0.3")).unwrap(),
            DemoOptions {
                threads: 4,
                duration: Duration::from_secs(2),
                share: 0.3
            }
        );
    }

    #[test]
    fn an_unthrottled_demo_says_why_in_one_line() {
        let mut end = End {
            nr_periods: 31,
            ..Default::default()
        };
        let why = not_throttled_reason(&end, 0.5, "7.93").unwrap();
        assert!(!why.contains('\n'));
        assert!(why.contains("none of 31 periods"), "{why}");
        assert!(why.contains("load average 7.93"), "{why}");
        end.nr_periods = 0;
        assert!(not_throttled_reason(&end, 0.5, "1")
            .unwrap()
            .contains("nr_periods 0"));
        end.kernel_throttled_ns = 1;
        assert_eq!(not_throttled_reason(&end, 0.5, "1"), None);
    }
}
