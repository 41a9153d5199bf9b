//! A request-serving workload for the control benchmark (bench/control.sh).
//!
//! tw-serve serve --socket PATH
//!     One thread per connection; a request is 8 bytes (µs of CPU to burn,
//!     little-endian); the reply is one byte once that CPU has been spent.
//! tw-serve load --socket PATH --secs S [--conns K] [--light-us U --light-every-ms M]
//!               [--burst-n N --burst-us U --burst-every-ms M]
//!     Open loop on a fixed schedule: a light request every M ms and N heavy
//!     ones at once every burst period (the first half a period in). `--warmup-ms W`:
//!     requests scheduled in the first W ms are served, not counted. Latency counts from the scheduled
//!     time (queueing included, no coordinated omission). Prints one JSON
//!     line: {"n","p50_us","p99_us","max_us","heavy_p99_us","late"}.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

fn thread_cpu_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000
}

fn arg(args: &[String], k: &str, d: &str) -> String {
    args.iter()
        .position(|a| a == k)
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_else(|| d.to_string())
}

fn num(args: &[String], k: &str, d: u64) -> u64 {
    arg(args, k, &d.to_string())
        .parse()
        .unwrap_or_else(|_| panic!("{k}: expected a whole number"))
}

fn serve(args: &[String]) {
    let path = arg(args, "--socket", "");
    let _ = std::fs::remove_file(&path);
    let l = UnixListener::bind(&path).expect("bind");
    println!("ready");
    let _ = std::io::stdout().flush();
    for c in l.incoming().flatten() {
        std::thread::spawn(move || {
            let mut c = c;
            let mut b = [0u8; 8];
            while c.read_exact(&mut b).is_ok() {
                let want = u64::from_le_bytes(b);
                let start = thread_cpu_us();
                while thread_cpu_us() - start < want {
                    std::hint::spin_loop();
                }
                if c.write_all(&[1]).is_err() {
                    break;
                }
            }
        });
    }
}

fn pct(v: &[u64], p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn load(args: &[String]) {
    let path = arg(args, "--socket", "");
    let secs = num(args, "--secs", 10);
    let conns = num(args, "--conns", 8);
    // Requests scheduled before this are served but not counted.
    let warmup = Duration::from_millis(num(args, "--warmup-ms", 0));
    let (light_us, light_ms) = (
        num(args, "--light-us", 2000),
        num(args, "--light-every-ms", 20),
    );
    let (burst_n, burst_us, burst_ms) = (
        num(args, "--burst-n", 8),
        num(args, "--burst-us", 25_000),
        num(args, "--burst-every-ms", 1000),
    );
    // The schedule: (offset, work, heavy).
    let mut sched: Vec<(Duration, u64, bool)> = vec![];
    let end = Duration::from_secs(secs);
    let mut t = Duration::ZERO;
    while t < end {
        sched.push((t, light_us, false));
        t += Duration::from_millis(light_ms);
    }
    let mut t = Duration::from_millis(burst_ms / 2);
    while t < end {
        for _ in 0..burst_n {
            sched.push((t, burst_us, true));
        }
        t += Duration::from_millis(burst_ms);
    }
    sched.sort_by_key(|s| s.0);
    let (tx, rx) = mpsc::channel::<(Instant, u64, bool, bool)>();
    let rx = Arc::new(Mutex::new(rx));
    let results = Arc::new(Mutex::new(Vec::<(u64, bool)>::new()));
    let workers: Vec<_> = (0..conns)
        .map(|_| {
            let (rx, results) = (rx.clone(), results.clone());
            let mut c = UnixStream::connect(&path).expect("connect");
            std::thread::spawn(move || loop {
                let job = rx.lock().unwrap().recv();
                let Ok((at, work, heavy, counted)) = job else {
                    return;
                };
                c.write_all(&work.to_le_bytes()).expect("send");
                let mut b = [0u8; 1];
                c.read_exact(&mut b).expect("reply");
                let us = at.elapsed().as_micros() as u64;
                if counted {
                    results.lock().unwrap().push((us, heavy));
                }
            })
        })
        .collect();
    let t0 = Instant::now() + Duration::from_millis(50);
    let mut late = 0u64;
    for (off, work, heavy) in sched {
        let at = t0 + off;
        let now = Instant::now();
        if at > now {
            std::thread::sleep(at - now);
        } else if now - at > Duration::from_millis(5) {
            late += 1;
        }
        tx.send((at, work, heavy, off >= warmup)).unwrap();
    }
    drop(tx);
    for w in workers {
        let _ = w.join();
    }
    let r = results.lock().unwrap();
    let mut all: Vec<u64> = r.iter().map(|x| x.0).collect();
    let mut heavy: Vec<u64> = r.iter().filter(|x| x.1).map(|x| x.0).collect();
    all.sort_unstable();
    heavy.sort_unstable();
    println!(
        "{{\"n\":{},\"p50_us\":{},\"p99_us\":{},\"max_us\":{},\"heavy_p99_us\":{},\"late\":{late}}}",
        all.len(),
        pct(&all, 0.5),
        pct(&all, 0.99),
        all.last().copied().unwrap_or(0),
        pct(&heavy, 0.99)
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("serve") => serve(&args),
        Some("load") => load(&args),
        _ => {
            eprintln!(
                "usage: tw-serve serve --socket PATH | tw-serve load --socket PATH --secs S ..."
            );
            std::process::exit(2);
        }
    }
}
