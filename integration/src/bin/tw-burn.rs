//! A CPU-bound multi-thread workload for the root tests and benchmarks.
//! Prints `{"pid":P,"tids":[...]}` on stdout once all threads run.
//!
//! tw-burn --threads N --ms DURATION [--pin spread|packed|none] [--spin MS --sleep MS]
//!         [--spin-cpu MS --sleep MS]
//!
//! `--spin` spins for MS of wall time, `--spin-cpu` until the thread had MS
//! of CPU (the same work however long it waits or is frozen), then sleeps.

use std::io::Write;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

fn pin(cpu: usize) {
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

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let get = |k: &str, d: &str| -> String {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1))
            .cloned()
            .unwrap_or_else(|| d.to_string())
    };
    let threads: usize = get("--threads", "2").parse().expect("--threads");
    let ms: u64 = get("--ms", "2000").parse().expect("--ms");
    let mode = get("--pin", "none");
    let spin: u64 = get("--spin", "0").parse().expect("--spin");
    let spin_cpu: u64 = get("--spin-cpu", "0").parse().expect("--spin-cpu");
    let sleep: u64 = get("--sleep", "0").parse().expect("--sleep");
    let ncpu = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let barrier = Arc::new(Barrier::new(threads + 1));
    let (tx, rx) = std::sync::mpsc::channel();
    let deadline = Instant::now() + Duration::from_millis(ms);
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let b = barrier.clone();
            let tx = tx.clone();
            let mode = mode.clone();
            std::thread::Builder::new()
                .name(format!("burn-{i}"))
                .spawn(move || {
                    match mode.as_str() {
                        "spread" => pin(i % ncpu),
                        "packed" => pin(0),
                        _ => {}
                    }
                    // SAFETY: gettid has no preconditions.
                    tx.send(unsafe { libc::gettid() }).unwrap();
                    b.wait();
                    let mut x = 0u64;
                    while Instant::now() < deadline {
                        if spin_cpu > 0 {
                            let until = thread_cpu_ns() + spin_cpu * 1_000_000;
                            while thread_cpu_ns() < until {
                                for _ in 0..1_000 {
                                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                                }
                            }
                            std::thread::sleep(Duration::from_millis(sleep));
                        } else if spin > 0 {
                            let until = Instant::now() + Duration::from_millis(spin);
                            while Instant::now() < until {
                                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                            }
                            std::thread::sleep(Duration::from_millis(sleep));
                        } else {
                            for _ in 0..10_000 {
                                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                            }
                        }
                    }
                })
                .unwrap()
        })
        .collect();
    drop(tx);
    let tids: Vec<i32> = rx.iter().take(threads).collect();
    println!("{{\"pid\":{},\"tids\":{:?}}}", std::process::id(), tids);
    std::io::stdout().flush().unwrap();
    barrier.wait();
    for h in handles {
        h.join().unwrap();
    }
}
