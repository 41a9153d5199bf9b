//! bench/pods-110.sh: 110 single-container pods and a few of 3 containers
//! (every 28th pod) through `crictl` on two containerd 2.3.4 nodes of one
//! run, one with the plugin connected and the agent, one without the
//! plugin, pod by pod in turn (the order swapped every pod): `crictl start`
//! of each container, p50 and p99 on each side. With every pod running
//! (the plugin-less node's pods removed first): the agent's CPU over a
//! steady window (/proc/PID/stat, % of one core), its RSS, and the
//! `/metrics` scrape. Then the three faults mid-churn at full size (10 pods
//! removed and 10 started around and after each) and the CI test's checks.
//! A benchmark: ignored in the suite; the figures are printed, the checks
//! asserted.
//!
//! `TW_PODS_BENCH` single-container pods (default 110),
//! `TW_PODS_BENCH_CHURN` pods per churn step (default 10),
//! `TW_PODS_BENCH_WINDOW_S` the CPU window (default 30).

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use throttlewatch_core::protocol::{call, Request};
use throttlewatch_integration::containerd::vm_rss_kb;
use throttlewatch_integration::cri::{CriNode, CrictlPod};
use throttlewatch_integration::daemons::PrivateConfig;
use throttlewatch_integration::modern_node::containerd_2_node;
use throttlewatch_integration::prometheus::free_port;

use super::churn::{Churn, WATCH};
use super::{checks, cpu_lock};

fn env_or(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Err(_) => default,
        Ok(v) => v
            .parse()
            .ok()
            .filter(|n| *n > 0)
            .unwrap_or_else(|| panic!("{name}={v:?}: expected a positive number")),
    }
}

/// Nearest-rank percentile `p` (0..=100) of `v`, sorted here.
fn percentile(v: &mut [Duration], p: usize) -> Duration {
    v.sort();
    v[(p * v.len()).div_ceil(100).max(1) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// (utime + stime) of a process, in seconds (stat(5) fields 14 and 15).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let f: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// One `GET /metrics` on loopback: body bytes and seconds.
fn scrape(port: u16) -> (usize, f64) {
    let t = Instant::now();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let secs = t.elapsed().as_secs_f64();
    let head = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    assert!(
        out.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&out[..head])
    );
    (out.len() - head - 4, secs)
}

/// A pod on the plugin-less node, shaped as the churn's pod `i`; its
/// containers' `crictl start` times added to `starts`.
fn off_pod(off: &CriNode, i: usize, n: usize, starts: &mut Vec<Duration>) -> CrictlPod {
    let pod = off.crictl_run_pod(&format!("off-{i}"), &[WATCH]);
    for k in 0..n {
        let (id, _) = off.crictl_create(&pod, &format!("c{k}"), &["sleep", "600"]);
        starts.push(off.crictl_timed(&["start", &id]).1);
    }
    pod
}

#[test]
#[ignore = "a benchmark: bench/pods-110.sh"]
fn pods_110_bench() {
    let singles = env_or("TW_PODS_BENCH", 110);
    let k = env_or("TW_PODS_BENCH_CHURN", 10);
    let window = env_or("TW_PODS_BENCH_WINDOW_S", 30) as u64;
    let _cpu = cpu_lock();
    let t0 = Instant::now();
    let port = free_port();
    let tw = PrivateConfig::serving_metrics(port, "");
    let mut c = Churn::start(&tw, 28);
    let tw_off = PrivateConfig::new("");
    let mut off = containerd_2_node(&tw_off);
    off.start();
    let (mut off_starts, mut off_pods, mut single) = (vec![], vec![], 0);
    while single < singles {
        let i = c.made;
        let n = c.shape(i);
        single += usize::from(n == 1);
        let first = i.is_multiple_of(2);
        for with in [first, !first] {
            match with {
                true => c.add_pod(),
                false => off_pods.push(off_pod(&off, i, n, &mut off_starts)),
            }
        }
    }
    c.wait_watched();
    let containers: usize = c.running.iter().map(|p| p.containers.len()).sum();
    let started = t0.elapsed();
    for p in &off_pods {
        off.crictl_ok(&["stopp", &p.id]);
        off.crictl_ok(&["rmp", &p.id]);
    }
    drop(off);
    let mut with = std::mem::take(&mut c.starts);
    let mut lines = vec![format!(
        "{} pods ({singles} of one container, {} of 3), {containers} containers per node, started and watched in {:.1} s (both nodes, interleaved)",
        c.made,
        c.made - singles,
        started.as_secs_f64()
    )];
    let (w50, w99) = (percentile(&mut with, 50), percentile(&mut with, 99));
    let (o50, o99) = (
        percentile(&mut off_starts, 50),
        percentile(&mut off_starts, 99),
    );
    lines.push(format!(
        "crictl start (StartContainer + the crictl process): with the plugin p50 {:.1} ms p99 {:.1} ms; without p50 {:.1} ms p99 {:.1} ms; added p50 {:+.1} ms ({} and {} containers)",
        ms(w50),
        ms(w99),
        ms(o50),
        ms(o99),
        ms(w50) - ms(o50),
        with.len(),
        off_starts.len()
    ));
    lines.push(steady_figures(&c, port, window));
    eprintln!("{}", lines.join("\n"));
    c.faults(k);
    c.remove_all();
    let summary = checks::nothing_lost(&c);
    lines.extend(c.events.iter().cloned());
    lines.push(format!(
        "after the faults, {} pods made: {}",
        c.made,
        summary.line()
    ));
    lines.push(format!("whole run {:.1} s", t0.elapsed().as_secs_f64()));
    for l in lines {
        println!("pods-110: {l}");
    }
}

/// With every pod running and watched: the agent's CPU over `window` s
/// (after 5 s to settle), its RSS, and the median of 7 scrapes.
fn steady_figures(c: &Churn, port: u16, window: u64) -> String {
    let pid = c.agent.as_ref().expect("an agent").child.id();
    std::thread::sleep(Duration::from_secs(5));
    let (cpu0, w0) = (cpu_seconds(pid), Instant::now());
    std::thread::sleep(Duration::from_secs(window));
    let cpu = (cpu_seconds(pid) - cpu0) / w0.elapsed().as_secs_f64() * 100.0;
    let rss = vm_rss_kb(pid).expect("the agent's VmRSS") as f64 / 1024.0;
    let mut scrapes: Vec<(usize, f64)> = (0..7).map(|_| scrape(port)).collect();
    scrapes.sort_by(|a, b| a.1.total_cmp(&b.1));
    let (bytes, secs) = scrapes[scrapes.len() / 2];
    let st = call(&c.tw.socket, &Request::Status, Duration::from_secs(5)).unwrap();
    format!(
        "agent with {} watched: {cpu:.2} % of a core over {window} s, RSS {rss:.1} MiB; /metrics {bytes} bytes in {:.1} ms (median of 7)",
        st.watched.map_or(0, |w| w.len()),
        secs * 1e3
    )
}
