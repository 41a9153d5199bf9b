//! Issue 11, scale: a thousand containers register with an agent started
//! under a low open-files limit, and the kernel maps follow
//! `max_containers`. Real agent, real cgroups.

use std::process::{Command, Stdio};
use std::time::Duration;

use throttlewatch_cgroup::Hierarchies;
use throttlewatch_core::protocol::{call, Register, Request};
use throttlewatch_integration::daemons::{Agent, PrivateConfig};
use throttlewatch_integration::fixtures::Sleeper;

/// `throttlewatch agent` with RLIMIT_NOFILE set to (soft, hard) before exec;
/// killed (and reaped) on drop.
struct LimitedAgent(std::process::Child);

impl LimitedAgent {
    fn start(cfg: &PrivateConfig, soft: u64, hard: u64) -> LimitedAgent {
        use std::os::unix::process::CommandExt;
        let mut c = Command::new(throttlewatch_integration::bin("throttlewatch"));
        c.args(["agent", "--config"])
            .arg(&cfg.path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: setrlimit only, between fork and exec.
        unsafe {
            c.pre_exec(move || {
                let l = libc::rlimit {
                    rlim_cur: soft,
                    rlim_max: hard,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &l) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let a = LimitedAgent(c.spawn().unwrap());
        let t = std::time::Instant::now();
        while !call(&cfg.socket, &Request::Status, Duration::from_secs(1)).is_ok_and(|r| r.ok) {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "agent did not come up"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        a
    }

    /// (utime + stime) in clock ticks, and RSS in KiB, from /proc.
    fn cpu_ticks(&self) -> u64 {
        let st = std::fs::read_to_string(format!("/proc/{}/stat", self.0.id())).unwrap();
        let f: Vec<&str> = st.rsplit_once(')').unwrap().1.split_whitespace().collect();
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    }

    fn rss_kib(&self) -> u64 {
        throttlewatch_integration::containerd::vm_rss_kb(self.0.id()).unwrap()
    }
}

impl Drop for LimitedAgent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Finding 5: 1000 containers (cgroups with a sleeping process) register
/// with an agent started under a soft limit of 256 open files: the agent
/// raises it to the hard limit, every register answers; RSS and CPU per
/// container are printed.
#[test]
fn a_thousand_containers_register() {
    const N: usize = 1000;
    let cfg = PrivateConfig::new("snapshot_interval_s = 10");
    let agent = LimitedAgent::start(&cfg, 256, 20_000);
    let h = Hierarchies::discover().unwrap();
    let rss0 = agent.rss_kib();
    let t_setup = std::time::Instant::now();
    let sleepers: Vec<Sleeper> = (0..N).map(|i| Sleeper::new(&h, &format!("k{i}"))).collect();
    eprintln!("{N} cgroups with a sleeper: {:?}", t_setup.elapsed());
    let ticks0 = agent.cpu_ticks();
    let t = std::time::Instant::now();
    // Four hooks at a time, as containers start on a busy node.
    let failed: Vec<String> = std::thread::scope(|sc| {
        let chunks: Vec<_> = sleepers
            .iter()
            .enumerate()
            .collect::<Vec<_>>()
            .chunks(N / 4)
            .map(|c| c.to_vec())
            .collect();
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|chunk| {
                let socket = cfg.socket.clone();
                sc.spawn(move || {
                    let mut failed = vec![];
                    for (i, s) in chunk {
                        let r = call(
                            &socket,
                            &Request::Register(Register {
                                container_id: format!("k{i}"),
                                pid: Some(s.child.id()),
                                cgroup_path: s.cg.group.rel.clone(),
                                ..Default::default()
                            }),
                            Duration::from_secs(10),
                        );
                        match r {
                            Ok(r) if r.ok => {}
                            other => failed.push(format!("k{i}: {other:?}")),
                        }
                    }
                    failed
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let took = t.elapsed();
    let reg_ticks = agent.cpu_ticks() - ticks0;
    let ticks1 = agent.cpu_ticks();
    std::thread::sleep(Duration::from_secs(3));
    let idle_ticks = agent.cpu_ticks() - ticks1;
    let rss1 = agent.rss_kib();
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    eprintln!(
        "{N} registers in {took:?} ({:.2} ms each); agent CPU {:.1} ms per register; idle with {N} watched: {:.2} % of a CPU; RSS {rss0} KiB -> {rss1} KiB ({:.1} KiB per container)",
        took.as_secs_f64() * 1e3 / N as f64,
        reg_ticks as f64 / hz * 1e3 / N as f64,
        idle_ticks as f64 / hz / 3.0 * 100.0,
        (rss1.saturating_sub(rss0)) as f64 / N as f64
    );
    assert!(
        failed.is_empty(),
        "{} of {N} registers failed, first: {}",
        failed.len(),
        failed[0]
    );
    let st = call(&cfg.socket, &Request::Status, Duration::from_secs(5)).unwrap();
    assert_eq!(st.watch_map_entries, Some(N));
    drop(sleepers);
}

/// Kernel memory of the agent's BPF maps (`memlock` in each map's fdinfo),
/// and runq_hist's max_entries.
fn bpf_maps(pid: u32) -> (u64, Option<u64>) {
    let mut total = 0;
    let mut runq = None;
    for e in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .unwrap()
        .flatten()
    {
        let t = std::fs::read_to_string(e.path()).unwrap_or_default();
        let field = |k: &str| {
            t.lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        if let Some(m) = field("memlock:").filter(|_| t.contains("map_type:")) {
            total += m;
            // runq_hist: the per-CPU hash (map_type 5) with value size 336
            // (struct tw_runq; 328 before wake_dropped, issue 36).
            if field("map_type:") == Some(5) && field("value_size:") == Some(336) {
                runq = field("max_entries:");
            }
        }
    }
    (total, runq)
}

/// Finding 6 (the user-space part): the per-cgroup maps are sized from
/// `max_containers` before load, and a register past it is refused with
/// the reason. Prints the kernel memory of the loaded maps.
#[test]
fn kernel_maps_follow_max_containers() {
    let h = Hierarchies::discover().unwrap();
    let sleepers: Vec<Sleeper> = (0..5).map(|i| Sleeper::new(&h, &format!("m{i}"))).collect();
    for (max, want_ok) in [(4u32, 4usize), (1024, 5), (16384, 5)] {
        let cfg = PrivateConfig::new(&format!("max_containers = {max}"));
        let agent = Agent::start(&cfg);
        let (memlock, runq) = bpf_maps(agent.child.id());
        eprintln!(
            "max_containers = {max}: runq_hist max_entries {runq:?}, BPF maps {} KiB of kernel memory ({} CPUs)",
            memlock / 1024,
            std::thread::available_parallelism().unwrap()
        );
        assert_eq!(runq, Some(max as u64));
        let mut ok = 0;
        let mut last_err = String::new();
        for (i, s) in sleepers.iter().enumerate() {
            let r = call(
                &cfg.socket,
                &Request::Register(Register {
                    container_id: format!("m{i}"),
                    pid: Some(s.child.id()),
                    cgroup_path: s.cg.group.rel.clone(),
                    ..Default::default()
                }),
                Duration::from_secs(5),
            )
            .unwrap();
            if r.ok {
                ok += 1;
            } else {
                last_err = r.error.unwrap_or_default();
            }
        }
        assert_eq!(ok, want_ok, "{last_err}");
        if ok < sleepers.len() {
            assert!(
                last_err.contains("max_containers"),
                "the reason names the limit: {last_err}"
            );
        }
    }
}
