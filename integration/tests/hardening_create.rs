//! Issue 11, the create path: an agent that answers nothing (stopped, its
//! backlog full), idle clients and a held exclusive-cores lock cost a create
//! a bounded time. Each test drives the real agent, hook, wrapper and runc.

use std::os::unix::net::UnixStream;
use std::process::Stdio;
use std::time::Duration;

use throttlewatch_core::protocol::{call, Request};
use throttlewatch_integration::bundle::{text, Bundle, ContainerOpts, OciCli};
use throttlewatch_integration::daemons::{Agent, PrivateConfig};
use throttlewatch_integration::fixtures::force_delete;
use throttlewatch_integration::unique;

fn id(tag: &str) -> String {
    format!("tw-hard-{tag}-{}-{}", std::process::id(), unique())
}

/// `run -d` through the wrapper, timed; a create still running after 20 s is
/// killed and reported (today's hang), never waited on for ever.
fn timed_run(rt: &OciCli, b: &Bundle) -> (std::process::ExitStatus, Duration, String) {
    let err = rt.root.0.join(format!("err-{}", unique()));
    let t = std::time::Instant::now();
    let mut c = rt
        .command()
        .args(["run", "-d", "--bundle", b.dir().to_str().unwrap(), &b.id])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    loop {
        if let Some(st) = c.try_wait().unwrap() {
            let e = std::fs::read_to_string(&err).unwrap_or_default();
            return (st, t.elapsed(), e);
        }
        if t.elapsed() > Duration::from_secs(20) {
            let _ = c.kill();
            let _ = c.wait();
            panic!("create of {} still running after 20 s: it hangs", b.id);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// SIGSTOP a process for the guard's lifetime (SIGCONT on drop).
struct Stopped(u32);

impl Stopped {
    fn new(pid: u32) -> Stopped {
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
    }
}

/// Finding 4: a stopped agent (SIGSTOP: it accepts nothing, answers
/// nothing) costs a create at most `agent_timeout_ms` (500 ms), in both fail
/// modes, also once its listen backlog is full (connect would block for
/// ever); our hook entries carry a `timeout`.
#[test]
fn stopped_agent_bounds_create_in_both_fail_modes() {
    for mode in ["open", "closed"] {
        let cfg = PrivateConfig::new(&format!("fail_mode = {mode:?}"));
        let agent = Agent::start(&cfg);
        let rt = OciCli::throttlewatch(&cfg);
        let stopped = Stopped::new(agent.child.id());
        let b = Bundle::new(&id("stopped"), &ContainerOpts::sh("sleep 30"));
        let (st, took, err) = timed_run(&rt, &b);
        eprintln!("{mode}: create+start with the agent stopped: {took:?}");
        let hook_log = cfg.hook_log();
        if mode == "open" {
            assert!(st.success(), "fail-open starts the container: {err}");
            assert_eq!(rt.status(&b.id).as_deref(), Some("running"));
        } else {
            assert!(!st.success(), "fail-closed refuses it");
        }
        assert!(
            took <= Duration::from_secs(1),
            "{mode}: create took {took:?} with a stopped agent"
        );
        assert!(
            hook_log.contains("no answer within 500ms"),
            "{mode}: the hook says why: {hook_log}"
        );
        let spec = b.config();
        for stage in ["createRuntime", "poststop"] {
            let ours: Vec<_> = spec["hooks"][stage]
                .as_array()
                .unwrap()
                .iter()
                .filter(|h| h["path"].as_str().unwrap().ends_with("throttlewatch-hook"))
                .collect();
            assert_eq!(ours.len(), 1, "{stage}: {spec}");
            assert_eq!(ours[0]["timeout"], 15, "{stage} hook has a timeout: {spec}");
        }
        force_delete(&rt, &b.id);

        // Fill the stopped agent's listen backlog: connect(2) now blocks.
        let mut fillers = vec![];
        loop {
            let fd = unsafe {
                libc::socket(
                    libc::AF_UNIX,
                    libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                    0,
                )
            };
            assert!(fd >= 0);
            let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
            addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
            let p = cfg.socket.as_os_str().as_encoded_bytes();
            for (d, c) in addr.sun_path.iter_mut().zip(p) {
                *d = *c as libc::c_char;
            }
            let rc = unsafe {
                libc::connect(
                    fd,
                    &addr as *const _ as *const libc::sockaddr,
                    std::mem::size_of::<libc::sockaddr_un>() as u32,
                )
            };
            if rc != 0 {
                unsafe { libc::close(fd) };
                break;
            }
            fillers.push(fd);
            assert!(fillers.len() < 20_000, "backlog never filled");
        }
        let b = Bundle::new(&id("backlog"), &ContainerOpts::sh("sleep 30"));
        let (st, took, err) = timed_run(&rt, &b);
        eprintln!(
            "{mode}: create+start with the agent stopped and {} connections queued: {took:?}",
            fillers.len()
        );
        assert_eq!(st.success(), mode == "open", "{mode}: {err}");
        assert!(
            took <= Duration::from_secs(1),
            "{mode}: create took {took:?} (backlog full)"
        );
        for fd in fillers {
            unsafe { libc::close(fd) };
        }
        force_delete(&rt, &b.id);
        drop(stopped);
    }
}

/// Finding 4: the agent serves connections side by side: clients that
/// connect and send nothing do not delay a register behind them.
#[test]
fn idle_clients_do_not_delay_others() {
    let cfg = PrivateConfig::new("");
    let _agent = Agent::start(&cfg);
    let idle: Vec<UnixStream> = (0..10)
        .map(|_| UnixStream::connect(&cfg.socket).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(50));
    let t = std::time::Instant::now();
    let r = call(&cfg.socket, &Request::Status, Duration::from_secs(15)).unwrap();
    let took = t.elapsed();
    eprintln!("status behind 10 idle connections: {took:?}");
    assert!(r.ok, "{r:?}");
    assert!(took < Duration::from_millis(300), "status took {took:?}");
    drop(idle);
}

/// Finding 4: a process that holds the exclusive-cores lock (stopped, or
/// wedged) costs a create at most `cpuset_lock_timeout_ms`; the cpuset is
/// refused naming the lock, the container starts (fail-open).
#[test]
fn held_cpuset_lock_bounds_create() {
    let cfg = PrivateConfig::new("");
    let _agent = Agent::start(&cfg);
    let rt = OciCli::throttlewatch(&cfg);
    let dir = cfg.state_dir.join("cpusets");
    std::fs::create_dir_all(&dir).unwrap();
    let f = std::fs::File::create(dir.join("cpusets.lock")).unwrap();
    let lock = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive).unwrap();
    let opts = ContainerOpts::sh("sleep 30").annotation("throttlewatch.io/cpuset", "0");
    let b = Bundle::new(&id("flock"), &opts);
    let (st, took, err) = timed_run(&rt, &b);
    eprintln!("create+start with the cpuset lock held: {took:?}");
    drop(lock);
    assert!(st.success(), "{err}");
    assert!(took <= Duration::from_secs(1), "create took {took:?}");
    let log = cfg.hook_log();
    assert!(
        log.contains("cpusets.lock is held by another process")
            && log.contains("cpuset_lock_timeout_ms"),
        "{log}"
    );
    force_delete(&rt, &b.id);
    let _ = text;
}
