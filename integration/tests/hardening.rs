//! Issue 11: what an untrusted container can make the root daemons do. Each
//! test drives the real agent, hook, wrapper and runc with hostile input.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use throttlewatch_cgroup::{Hierarchies, TransientCgroup};
use throttlewatch_core::protocol::{call, Register, Request};
use throttlewatch_integration::bundle::{text, Bundle, ContainerOpts, OciCli};
use throttlewatch_integration::daemons::{Agent, PrivateConfig};
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

/// Kill the container runc left behind (it is not in OciCli's own list).
fn force_delete(rt: &OciCli, id: &str) {
    let _ = Command::new("runc")
        .arg("--root")
        .arg(&rt.root.0)
        .args(["delete", "-f", id])
        .output();
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

fn http_get(port: u16, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// A free loopback port (bound, read, released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A cgroup with a sleeping process in it: enough for the agent to watch.
struct Sleeper {
    cg: TransientCgroup,
    child: std::process::Child,
}

impl Sleeper {
    fn new(h: &Hierarchies, tag: &str) -> Sleeper {
        let cg = TransientCgroup::create(
            h,
            &format!("/tw-test-hard-{tag}-{}-{}", std::process::id(), unique()),
        )
        .unwrap();
        let child = Command::new("sleep").arg("600").spawn().unwrap();
        cg.group.add_pid(child.id()).unwrap();
        Sleeper { cg, child }
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Finding 1: label values from annotations (quotes, backslashes, newlines,
/// bytes that are not UTF-8) cannot forge series; Debian's promtool accepts
/// what the real agent serves.
#[test]
fn metrics_labels_are_escaped_and_promtool_accepts_them() {
    let port = free_port();
    let cfg = PrivateConfig::new("");
    let text = std::fs::read_to_string(&cfg.path).unwrap().replace(
        "metrics_addr = \"\"",
        &format!("metrics_addr = \"127.0.0.1:{port}\"\nsnapshot_interval_s = 1"),
    );
    std::fs::write(&cfg.path, text).unwrap();
    let _agent = Agent::start(&cfg);
    let h = Hierarchies::discover().unwrap();
    let quoted = Sleeper::new(&h, "quoted");
    let raw = Sleeper::new(&h, "raw");

    let mut ann = BTreeMap::new();
    ann.insert(
        "io.kubernetes.pod.name".to_string(),
        "evil\"} 1\ninjected_metric{x=\"y".to_string(),
    );
    ann.insert(
        "io.kubernetes.pod.namespace".to_string(),
        "back\\slash\\\\n\\".to_string(),
    );
    ann.insert(
        "io.kubernetes.container.name".to_string(),
        "cr\rtab\tnl\n# TYPE forged counter\nforged 1".to_string(),
    );
    let r = call(
        &cfg.socket,
        &Request::Register(Register {
            container_id: "quoted".into(),
            container_name: "q\"uote".into(),
            pid: Some(quoted.child.id()),
            cgroup_path: quoted.cg.group.rel.clone(),
            annotations: ann,
            ..Default::default()
        }),
        Duration::from_secs(5),
    )
    .unwrap();
    assert!(r.ok, "{r:?}");

    // Bytes that are not UTF-8 inside the JSON strings, sent as they are.
    let mut line = format!(
        "{{\"op\":\"register\",\"container_id\":\"raw\",\"container_name\":\"n\\u0000\",\"pid\":{},\"cgroup_path\":{:?},\"annotations\":{{\"io.kubernetes.pod.name\":\"",
        raw.child.id(),
        raw.cg.group.rel
    )
    .into_bytes();
    line.extend_from_slice(b"bad\xff\xfe\xc3(utf8\"");
    line.extend_from_slice(
        b"},\"bundle\":\"\",\"created_ns\":null,\"threshold_ns\":null,\"qos\":null}\n",
    );
    let mut s = UnixStream::connect(&cfg.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&line).unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    assert!(
        resp.contains("\"ok\":true"),
        "a register with bytes that are not UTF-8 is watched (replaced by U+FFFD): {resp}"
    );

    // Per-container series appear at the first snapshot.
    let t = std::time::Instant::now();
    let body = loop {
        let page = http_get(port, "/metrics");
        let body = page
            .split_once("\r\n\r\n")
            .map(|x| x.1)
            .unwrap_or("")
            .to_string();
        if body.contains("container_id=\"raw\"") || t.elapsed() > Duration::from_secs(10) {
            break body;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        body.contains("throttlewatch_watched_containers 2"),
        "{body}"
    );
    for l in body.lines() {
        assert!(
            !l.starts_with("injected_metric") && !l.starts_with("forged"),
            "a label value forged a series: {l:?}\n{body}"
        );
    }
    assert!(
        body.contains(r#"pod="evil\"} 1\ninjected_metric{x=\"y""#),
        "quote and newline escaped: {body}"
    );
    assert!(
        body.contains(r#"namespace="back\\slash\\\\n\\""#),
        "backslashes escaped: {body}"
    );
    assert!(body.contains("pod=\"bad\u{fffd}"), "{body}");
    let mut p = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus; scripts/setup.sh --test)");
    p.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    let out = p.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // promtool reads the 0.0.4 text format; the agent serves OpenMetrics,
    // whose counter samples end in `_total` while HELP names the family. Those
    // lint notes are the only thing allowed: a forged line is a parse error.
    assert!(
        !said.contains("error"),
        "promtool check metrics: {said}\n{body}"
    );
    for l in said.lines() {
        let family = l
            .strip_suffix("_total no help text")
            .unwrap_or_else(|| panic!("promtool check metrics: {l:?}\n{said}\n{body}"));
        assert!(body.contains(&format!("# HELP {family} ")), "{l}");
    }
    assert!(
        out.status.success() || !said.is_empty(),
        "promtool failed silently"
    );
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

/// The container's cpuset.cpus, read from its cgroup.
fn cpuset_of(b: &Bundle) -> String {
    let h = Hierarchies::discover().unwrap();
    let g = throttlewatch_cgroup::CpuCgroup::open(&h, &b.cgroup_path).unwrap();
    g.limits().unwrap().cpus.unwrap_or_default()
}

/// Finding 3: an image's `ENV THROTTLEWATCH_CPUSET` never moves a container,
/// and no request widens or replaces the cpuset the orchestrator set
/// (`docker --cpuset-cpus`, kubelet's CPU manager); a subset narrows it.
#[test]
fn image_env_and_requests_never_replace_the_orchestrator_cpuset() {
    let cfg = PrivateConfig::new("");
    let _agent = Agent::start(&cfg);
    let rt = OciCli::throttlewatch(&cfg);
    let with_cpus = |tag: &str, opts: ContainerOpts, cpus: &str| {
        let b = Bundle::new(&id(tag), &opts);
        b.edit(|v| v["linux"]["resources"]["cpu"]["cpus"] = serde_json::json!(cpus));
        b
    };
    // (what the container asks, the orchestrator's set, the cpuset it gets, what the hook says)
    let cases = [
        (
            ContainerOpts::sh("sleep 5").env("THROTTLEWATCH_CPUSET=1"),
            "0",
            "0",
            "THROTTLEWATCH_CPUSET=\"1\": cpusets are honoured from annotations only",
        ),
        (
            ContainerOpts::sh("sleep 5").env("THROTTLEWATCH_CPUSET=1,exclusive"),
            "",
            "",
            "THROTTLEWATCH_CPUSET=\"1,exclusive\": cpusets are honoured from annotations only",
        ),
        (
            ContainerOpts::sh("sleep 5").annotation("throttlewatch.io/cpuset", "1"),
            "0",
            "0",
            "throttlewatch.io/cpuset=\"1\": not inside the cpuset the orchestrator set (linux.resources.cpu.cpus = 0)",
        ),
        (
            ContainerOpts::sh("sleep 5").annotation("throttlewatch.io/cpuset", "1"),
            "0-1",
            "1",
            "",
        ),
    ];
    let all = std::fs::read_to_string("/sys/fs/cgroup/cpuset/cpuset.cpus")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    for (i, (opts, orch, want, said)) in cases.into_iter().enumerate() {
        let b = with_cpus(&format!("envcpus{i}"), opts, orch);
        let o = rt.run_detached(&b);
        assert!(o.status.success(), "{i}: {}", text(&o));
        let want = if want.is_empty() {
            all.clone()
        } else {
            want.to_string()
        };
        assert_eq!(cpuset_of(&b), want, "case {i}: orchestrator {orch:?}");
        let spec_cpus = b.config()["linux"]["resources"]["cpu"]["cpus"].clone();
        if orch == "0" {
            assert_eq!(
                spec_cpus, "0",
                "case {i}: the wrapper left the spec's cpuset"
            );
        }
        let log = cfg.hook_log();
        assert!(
            log.contains(said),
            "case {i}: {said:?} not in hook.log: {log}"
        );
        force_delete(&rt, &b.id);
    }
}

/// A configuration the code refuses: `fail_mode` as given, and a typo'd key
/// name in the policy (the kind of mistake docs used to invite).
fn bad_config(mode: &str) -> PrivateConfig {
    PrivateConfig::new(&format!(
        "fail_mode = {mode:?}\n[qos]\nallowed_keys = [\"cpu-brust\"]\n"
    ))
}

/// Finding 8: a bad configuration never widens what is allowed (the shim
/// used to fall back to permissive defaults and write the cpuset an
/// annotation asked for), and `fail_mode = "closed"` in a bad file still
/// refuses containers (the hook used to exit 0).
#[test]
fn bad_config_never_widens_and_keeps_fail_closed() {
    use throttlewatch_integration::containerd::{
        build_busybox_image, Containerd, IMAGE_NAME, SHIM_RUNTIME,
    };
    use throttlewatch_integration::{bin, Scratch};
    // The hook itself, as runc runs it from a spec that names the bad file.
    for (mode, ok) in [("open", true), ("closed", false)] {
        let cfg = bad_config(mode);
        let b = Bundle::new(&id("badcfg-hook"), &ContainerOpts::sh("sleep 5"));
        let hook = bin("throttlewatch-hook");
        b.edit(|v| {
            v["hooks"]["createRuntime"] = serde_json::json!([{
                "path": hook.to_str().unwrap(),
                "args": ["throttlewatch-hook", "createRuntime", "--config", cfg.path.to_str().unwrap()],
            }])
        });
        let rt = OciCli::new("runc");
        let o = rt.run_detached(&b);
        assert_eq!(
            o.status.success(),
            ok,
            "runc with our hook and a bad config, fail_mode {mode}: {}",
            text(&o)
        );
        if !ok {
            assert!(
                text(&o).contains("cpu-brust"),
                "the reason reaches runc: {}",
                text(&o)
            );
        }
        // Through the wrapper: refused before runc when closed was meant.
        let rt = OciCli::throttlewatch(&cfg);
        let b = Bundle::new(&id("badcfg-wrap"), &ContainerOpts::sh("sleep 5"));
        let o = rt.run_detached(&b);
        assert_eq!(
            o.status.success(),
            ok,
            "wrapper, fail_mode {mode}: {}",
            text(&o)
        );
        if ok {
            assert!(
                b.config()
                    .get("hooks")
                    .is_none_or(|h| h.get("createRuntime").is_none()),
                "spec left unchanged: {}",
                b.config()
            );
        }
    }
    // The shim: under a bad (fail-open) file, no spec change at all.
    let cfg = bad_config("open");
    let shim_dir = bin("containerd-shim-throttlewatch-v2")
        .parent()
        .unwrap()
        .to_path_buf();
    let ctd = Containerd::start(
        &[shim_dir],
        &[("THROTTLEWATCH_CONFIG", cfg.path.to_str().unwrap())],
    );
    let img = Scratch::new("img");
    ctd.import(&build_busybox_image(&img.0));
    let all = std::fs::read_to_string("/sys/fs/cgroup/cpuset/cpuset.cpus").unwrap();
    let out = ctd.ctr(&[
        "run",
        "--rm",
        "--runtime",
        SHIM_RUNTIME,
        "--annotation",
        "throttlewatch.io/cpuset=1",
        IMAGE_NAME,
        &id("badcfg-shim"),
        "sh",
        "-c",
        "grep Cpus_allowed_list /proc/self/status",
    ]);
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        ctd.log()
    );
    assert!(
        said.trim().ends_with(all.trim()),
        "the shim applied a cpuset under a bad config: {said:?} (machine: {all:?})"
    );
}

/// Finding 8: `throttlewatch config check [FILE]` validates as the hook
/// loads, and says what a file would do.
#[test]
fn config_check_validates_and_describes() {
    use throttlewatch_integration::bin;
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/throttlewatch.toml");
    let o = Command::new(bin("throttlewatch"))
        .args(["config", "check", shipped])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.contains("valid") && out.contains("may set: watch, threshold, cpu-burst"),
        "{out}"
    );
    let cfg = bad_config("closed");
    let o = Command::new(bin("throttlewatch"))
        .args(["config", "check"])
        .arg(&cfg.path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("\"cpu-brust\" is not a key") && err.contains("containers are refused"),
        "{err}"
    );
}

/// Finding 9: the `end` written at poststop after runc removed the cgroup
/// reports the last kernel reading, and says so (it used to report 0).
#[test]
fn end_after_the_cgroup_is_gone_keeps_the_last_kernel_reading() {
    let _l = throttlewatch_integration::cpu_lock();
    let cfg = PrivateConfig::new("snapshot_interval_s = 1");
    let _agent = Agent::start(&cfg);
    let rt = OciCli::throttlewatch(&cfg);
    let b = Bundle::new(
        &id("gone"),
        &ContainerOpts::busy(1, 3).quota(20_000, 100_000),
    );
    let o = rt.run_detached(&b);
    assert!(o.status.success(), "{}", text(&o));
    rt.wait_stopped(&b.id, Duration::from_secs(30));
    // runc itself (not the wrapper, which would end the log first): the
    // cgroup is removed before the poststop hook runs.
    let o = Command::new("runc")
        .arg("--root")
        .arg(&rt.root.0)
        .args(["delete", &b.id])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let log = throttlewatch_integration::read_log(&cfg.log_of(&b.id));
    let end = throttlewatch_integration::of_type(&log, "end")[0].clone();
    let k = end["kernel_throttled_ns"].as_u64().unwrap();
    assert!(k > 500_000_000, "a kernel figure that was read: {end}");
    assert!(
        end["kernel_stale"]
            .as_str()
            .is_some_and(|s| s.contains("last reading")),
        "{end}"
    );
}

/// Finding 9: the metrics server reads at most 8 KiB of a request and
/// answers at once (it used to read a line of any length, until its timeout).
#[test]
fn metrics_server_bounds_what_it_reads() {
    let port = free_port();
    let cfg = PrivateConfig::new("");
    let text = std::fs::read_to_string(&cfg.path).unwrap().replace(
        "metrics_addr = \"\"",
        &format!("metrics_addr = \"127.0.0.1:{port}\""),
    );
    std::fs::write(&cfg.path, text).unwrap();
    let _agent = Agent::start(&cfg);
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t = std::time::Instant::now();
    // 64 KiB of request line, no newline, and the connection kept open.
    let _ = s.write_all(&vec![b'A'; 64 * 1024]);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let took = t.elapsed();
    eprintln!("answer to a 64 KiB request line: {took:?}");
    assert!(
        String::from_utf8_lossy(&out).starts_with("HTTP/1.1 404"),
        "{out:?}"
    );
    assert!(took < Duration::from_millis(1000), "took {took:?}");
    assert!(http_get(port, "/metrics").starts_with("HTTP/1.1 200"));
}

/// Finding 9: a thread name with terminal escapes is printed escaped by
/// `throttlewatch run` (it used to reach the terminal raw).
#[test]
fn thread_names_reach_the_terminal_escaped() {
    use throttlewatch_integration::bin;
    let _l = throttlewatch_integration::cpu_lock();
    let o = Command::new(bin("throttlewatch"))
        .args(["run", "--cpus", "0.2", "--", "sh", "-c"])
        .arg("printf '\\033[2Jx\\ry' > /proc/self/comm; i=0; while [ $i -lt 150000 ]; do i=$((i+1)); done")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("frozen"), "some freezes are printed: {err}");
    assert!(
        !err.contains('\u{1b}') && !err.contains('\r'),
        "raw control characters: {err:?}"
    );
    assert!(err.contains("\\u{1b}[2Jx\\ry"), "{err}");
}

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

/// A tmpfs of `size` mounted on `dir`, unmounted on drop.
struct SmallDisk(std::path::PathBuf);

impl SmallDisk {
    fn mount(dir: &std::path::Path, size: &str) -> SmallDisk {
        std::fs::create_dir_all(dir).unwrap();
        let o = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0750"),
                "tmpfs",
            ])
            .arg(dir)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        SmallDisk(dir.to_path_buf())
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Finding 2 (the ENOSPC part): with the log directory full, the agent keeps
/// serving, says so once per container (it used to warn for every record),
/// keeps whole lines, and counts what it could not write in `end`.
#[test]
fn full_log_disk_is_said_once_and_counted() {
    let _l = throttlewatch_integration::cpu_lock();
    let cfg = PrivateConfig::new("snapshot_interval_s = 1");
    let _disk = SmallDisk::mount(&cfg.log_dir, "256k");
    // Leave about 4 KiB: the start record and a few throttle records.
    std::fs::write(cfg.log_dir.join("filler"), vec![0u8; 252 * 1024]).unwrap();
    let agent = Agent::start(&cfg);
    let rt = OciCli::throttlewatch(&cfg);
    let b = Bundle::new(
        &id("enospc"),
        &ContainerOpts::busy(12, 4).quota(20_000, 100_000),
    );
    let o = rt.run_detached(&b);
    assert!(o.status.success(), "{}", text(&o));
    rt.wait_stopped(&b.id, Duration::from_secs(30));
    let st = call(&cfg.socket, &Request::Status, Duration::from_secs(5)).unwrap();
    assert!(st.ok, "the agent still serves: {st:?}");
    std::fs::remove_file(cfg.log_dir.join("filler")).unwrap();
    let o = rt.delete(&b.id);
    assert!(o.status.success(), "{}", text(&o));
    let said = agent.output();
    let n = said.matches("writing the log").count();
    assert_eq!(n, 1, "said once: {said}");
    let raw = std::fs::read_to_string(cfg.log_of(&b.id)).unwrap();
    for (i, l) in raw.lines().enumerate() {
        assert!(
            serde_json::from_str::<serde_json::Value>(l).is_ok(),
            "line {i} of {} is cut: {l:?}",
            raw.lines().count()
        );
    }
    let log = throttlewatch_integration::read_log(&cfg.log_of(&b.id));
    let end = throttlewatch_integration::of_type(&log, "end")[0].clone();
    let unwritten = end["unwritten_records"].as_u64().unwrap_or(0);
    let written = throttlewatch_integration::of_type(&log, "throttle").len();
    eprintln!("full disk: {written} throttle records written, {unwritten} counted unwritten");
    assert!(unwritten > 0, "{end}");
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
            // runq_hist: the per-CPU hash (map_type 5) with value size 328.
            if field("map_type:") == Some(5) && field("value_size:") == Some(328) {
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
