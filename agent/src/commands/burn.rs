//! `throttlewatch burn`: a CPU-bound multi-thread workload, the demo's (and
//! the tests' and benchmarks', as `tw-burn`). Threads are named `burn-N`;
//! once all run it prints `{"pid":P,"tids":[...]}` on stdout.
//!
//! Busy all the time by default; `--spin MS --sleep MS` spins MS of wall time
//! then sleeps, `--spin-cpu MS --sleep MS` spins until the thread had MS of
//! CPU (the same work however long it waits or is frozen), then sleeps.

use std::io::Write;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use crate::cli::BurnArgs;
use crate::CliError;

/// Where each thread runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pin {
    /// Thread i on CPU i mod the CPU count.
    Spread,
    /// All on CPU 0.
    Packed,
    None,
}

/// What each thread does, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Workload {
    pub threads: usize,
    pub duration: Duration,
    pub pin: Pin,
    pub spin_ms: u64,
    pub spin_cpu_ms: u64,
    pub sleep_ms: u64,
}

/// The most threads one burn starts (a typo must not fork-bomb the node).
pub(crate) const MAX_THREADS: usize = 4096;
/// The longest a burn runs: a week.
pub(crate) const MAX_MS: u64 = 7 * 24 * 3600 * 1000;

impl Workload {
    pub(crate) fn from_args(a: &BurnArgs) -> Result<Workload, CliError> {
        if !(1..=MAX_THREADS).contains(&a.threads) {
            return Err(CliError::usage(format!(
                "--threads: invalid value {}: accepted 1 to {MAX_THREADS}",
                a.threads
            )));
        }
        for (name, v) in [
            ("--ms", a.ms),
            ("--spin", a.spin),
            ("--spin-cpu", a.spin_cpu),
            ("--sleep", a.sleep),
        ] {
            if v > MAX_MS {
                return Err(CliError::usage(format!(
                    "{name}: invalid value {v}: accepted 0 to {MAX_MS} (milliseconds)"
                )));
            }
        }
        let pin = match a.pin.as_str() {
            "spread" => Pin::Spread,
            "packed" => Pin::Packed,
            "none" => Pin::None,
            other => {
                return Err(CliError::usage(format!(
                    "--pin: invalid value {other:?}: accepted spread, packed or none"
                )))
            }
        };
        if a.spin > 0 && a.spin_cpu > 0 {
            return Err(CliError::usage(
                "--spin and --spin-cpu: give one of them, not both",
            ));
        }
        if a.sleep > 0 && a.spin == 0 && a.spin_cpu == 0 {
            return Err(CliError::usage(format!(
                "--sleep: invalid value {}: only with --spin or --spin-cpu",
                a.sleep
            )));
        }
        Ok(Workload {
            threads: a.threads,
            duration: Duration::from_millis(a.ms),
            pin,
            spin_ms: a.spin,
            spin_cpu_ms: a.spin_cpu,
            sleep_ms: a.sleep,
        })
    }
}

fn pin_to(cpu: usize) {
    // SAFETY: sched_setaffinity on the calling thread with a zeroed, filled set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// CPU time of the calling thread, ns.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn work(w: &Workload, deadline: Instant) {
    let mut x = 0u64;
    let mut step = || {
        for _ in 0..1_000 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
    };
    while Instant::now() < deadline {
        if w.spin_cpu_ms > 0 {
            let until = thread_cpu_ns() + w.spin_cpu_ms * 1_000_000;
            while thread_cpu_ns() < until {
                step();
            }
            std::thread::sleep(Duration::from_millis(w.sleep_ms));
        } else if w.spin_ms > 0 {
            let until = Instant::now() + Duration::from_millis(w.spin_ms);
            while Instant::now() < until {
                step();
            }
            std::thread::sleep(Duration::from_millis(w.sleep_ms));
        } else {
            for _ in 0..10 {
                step();
            }
        }
    }
}

/// Run the workload to its end; the tids line goes to `out` once all run.
/// Returns the CPU time its threads used.
pub(crate) fn run_workload(w: &Workload, out: &mut impl Write) -> std::io::Result<Duration> {
    let ncpu = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let barrier = Arc::new(Barrier::new(w.threads + 1));
    let (tx, rx) = std::sync::mpsc::channel();
    let deadline = Instant::now() + w.duration;
    let mut handles = Vec::with_capacity(w.threads);
    for i in 0..w.threads {
        let (b, tx, w) = (barrier.clone(), tx.clone(), w.clone());
        handles.push(
            std::thread::Builder::new()
                .name(format!("burn-{i}"))
                .spawn(move || {
                    match w.pin {
                        Pin::Spread => pin_to(i % ncpu),
                        Pin::Packed => pin_to(0),
                        Pin::None => {}
                    }
                    // SAFETY: gettid has no preconditions.
                    let _ = tx.send(unsafe { libc::gettid() });
                    b.wait();
                    work(&w, deadline);
                    thread_cpu_ns()
                })?,
        );
    }
    drop(tx);
    let tids: Vec<i32> = rx.iter().take(w.threads).collect();
    writeln!(
        out,
        "{{\"pid\":{},\"tids\":{:?}}}",
        std::process::id(),
        tids
    )?;
    out.flush()?;
    barrier.wait();
    let cpu_ns: u64 = handles.into_iter().filter_map(|h| h.join().ok()).sum();
    Ok(Duration::from_nanos(cpu_ns))
}

/// `throttlewatch burn`.
pub fn burn(a: &BurnArgs) -> Result<i32, CliError> {
    let w = Workload::from_args(a)?;
    run_workload(&w, &mut std::io::stdout().lock())
        .map_err(|e| CliError::fail(format!("burn: {e}")))?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(threads: usize, ms: u64, pin: &str) -> BurnArgs {
        BurnArgs {
            threads,
            ms,
            pin: pin.into(),
            spin: 0,
            spin_cpu: 0,
            sleep: 0,
        }
    }

    #[test]
    fn bad_values_name_the_option_the_value_and_what_is_accepted() {
        let e = Workload::from_args(&args(0, 10, "none")).unwrap_err();
        assert_eq!(e.message, "--threads: invalid value 0: accepted 1 to 4096");
        let e = Workload::from_args(&args(2, 10, "diagonal")).unwrap_err();
        assert!(
            e.message.starts_with("--pin: invalid value \"diagonal\""),
            "{}",
            e.message
        );
        assert!(
            e.message.contains("spread, packed or none"),
            "{}",
            e.message
        );
        let e = Workload::from_args(&args(2, MAX_MS + 1, "none")).unwrap_err();
        assert!(
            e.message.starts_with("--ms: invalid value"),
            "{}",
            e.message
        );
        let mut a = args(2, 10, "none");
        a.sleep = 5;
        let e = Workload::from_args(&a).unwrap_err();
        assert!(e.message.contains("only with --spin"), "{}", e.message);
        a.spin = 1;
        a.spin_cpu = 1;
        assert!(Workload::from_args(&a).is_err());
    }

    #[test]
    fn threads_burn_cpu_and_the_tids_line_names_each() {
        let w = Workload::from_args(&args(2, 150, "none")).unwrap();
        let mut out = Vec::new();
        let used = run_workload(&w, &mut out).unwrap().as_nanos();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["pid"], std::process::id());
        assert_eq!(v["tids"].as_array().unwrap().len(), 2);
        // Two busy threads for 150 ms: 300 ms of CPU on two free CPUs; even on
        // a machine that other jobs keep busy, more than 10 ms.
        assert!(used > 10_000_000, "burned {used} ns");
    }

    #[test]
    fn spin_cpu_does_the_same_work_then_sleeps() {
        let mut a = args(1, 120, "none");
        a.spin_cpu = 10;
        a.sleep = 50;
        let w = Workload::from_args(&a).unwrap();
        let used = run_workload(&w, &mut Vec::new()).unwrap().as_nanos();
        // 120 ms of 10 ms CPU + 50 ms asleep: 1 to 3 rounds, never busy throughout.
        assert!(
            (10_000_000..=60_000_000).contains(&used),
            "burned {used} ns"
        );
    }
}
