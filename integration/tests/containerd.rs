//! The shim `containerd-shim-throttlewatch-v2` under a real, private
//! containerd 1.6 (`ctr run --runtime io.containerd.throttlewatch.v2`).
//! Run `cargo build --workspace --bins` first. Set TW_SHIM_DIR to a folder
//! holding another build of the shim (e.g. target/release) to measure that one.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use containerd_shim::protos::protobuf::well_known_types::any::Any;
use containerd_shim::protos::protobuf::MessageField;
use containerd_shim::protos::shim::shim::UpdateTaskRequest;
use containerd_shim::protos::shim::shim_ttrpc::TaskClient;
use containerd_shim::protos::ttrpc;
use throttlewatch_cgroup::proc::cpu_cgroup_of_pid;
use throttlewatch_cgroup::{CpuCgroup, Hierarchies};
use throttlewatch_core::protocol::{call, Request};
use throttlewatch_integration::containerd::{
    build_busybox_image, mem_summary, vm_rss_kb, Containerd, IMAGE_NAME, SHIM_RUNTIME,
};
use throttlewatch_integration::{bin, cpu_lock, of_type, read_log, Scratch};

/// A private throttlewatch config (logs, socket, state under `dir`).
fn tw_config(dir: &Path) -> PathBuf {
    let p = dir.join("throttlewatch.toml");
    let text = format!(
        "log_dir = \"{0}/logs\"\nsocket = \"{0}/agent.sock\"\nstate_dir = \"{0}/state\"\n\
         start_agent = false\nmetrics_addr = \"\"\nsnapshot_interval_s = 1\n",
        dir.display()
    );
    std::fs::write(&p, text).unwrap();
    p
}

struct Setup {
    ctd: Containerd,
    tw: Scratch,
    config: PathBuf,
}

fn setup() -> Setup {
    let tw = Scratch::new("twcfg");
    let config = tw_config(&tw.0);
    let shim_dir = std::env::var_os("TW_SHIM_DIR").map(PathBuf::from);
    let mut dirs: Vec<PathBuf> = shim_dir.into_iter().collect();
    dirs.push(
        bin("containerd-shim-throttlewatch-v2")
            .parent()
            .unwrap()
            .to_path_buf(),
    );
    let ctd = Containerd::start(&dirs, &[("THROTTLEWATCH_CONFIG", config.to_str().unwrap())]);
    let img = Scratch::new("img");
    ctd.import(&build_busybox_image(&img.0));
    Setup { ctd, tw, config }
}

fn run_args<'a>(id: &'a str, extra: &[&'a str], cmd: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["run", "--rm", "--runtime", SHIM_RUNTIME];
    a.extend_from_slice(extra);
    a.extend_from_slice(&[IMAGE_NAME, id]);
    a.extend_from_slice(cmd);
    a
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn shim_runs_containers_with_output_and_exit_codes() {
    let s = setup();
    let out = s.ctd.ctr(&run_args("echo1", &[], &["echo", "hello"]));
    assert!(
        out.status.success(),
        "ctr run: {}\n{}",
        text(&out.stderr),
        s.ctd.log()
    );
    assert_eq!(text(&out.stdout), "hello\n");
    let out = s.ctd.ctr(&run_args(
        "exit3",
        &[],
        &["sh", "-c", "echo oops >&2; exit 3"],
    ));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("oops"),
        "stderr passed through: {}",
        text(&out.stderr)
    );
    wait_until("shims to exit", Duration::from_secs(5), || {
        s.ctd.shim_pids().is_empty()
    });
    // Issue 19: nothing of the namespace's cgroup parent is left behind.
    let ns = s.ctd.namespace.clone();
    drop(s);
    let root = std::path::Path::new("/sys/fs/cgroup");
    let left: Vec<_> = std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .map(|h| h.path().join(&ns))
        .chain([root.join(&ns)])
        .filter(|p| p.exists())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn shim_exec_kill_delete_and_memory() {
    let s = setup();
    let ctr = |a: &[&str]| s.ctd.ctr(a);
    let out = ctr(&[
        "run",
        "-d",
        "--runtime",
        SHIM_RUNTIME,
        IMAGE_NAME,
        "long1",
        "sleep",
        "1000",
    ]);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stderr),
        s.ctd.log()
    );
    let out = ctr(&["task", "exec", "--exec-id", "e1", "long1", "echo", "hi"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "hi\n");
    let out = ctr(&[
        "task",
        "exec",
        "--exec-id",
        "e2",
        "long1",
        "sh",
        "-c",
        "exit 5",
    ]);
    assert_eq!(out.status.code(), Some(5), "{}", text(&out.stderr));
    let out = ctr(&["task", "ps", "long1"]);
    assert!(
        out.status.success() && text(&out.stdout).lines().count() >= 2,
        "ps: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let out = ctr(&["task", "metrics", "long1"]);
    assert!(out.status.success(), "metrics: {}", text(&out.stderr));

    let shims = s.ctd.shim_pids();
    assert_eq!(shims.len(), 1, "one shim for one container");
    assert!(vm_rss_kb(shims[0]).is_some(), "shim {} is gone", shims[0]);
    eprintln!(
        "shim with one running container: {} ({})",
        mem_summary(shims[0]),
        bin_kind()
    );

    let out = ctr(&["task", "kill", "-s", "SIGKILL", "long1"]);
    assert!(out.status.success(), "kill: {}", text(&out.stderr));
    wait_until("the task to stop", Duration::from_secs(5), || {
        text(&ctr(&["task", "ls"]).stdout).contains("STOPPED")
    });
    let out = ctr(&["task", "delete", "long1"]);
    assert!(out.status.success(), "task delete: {}", text(&out.stderr));
    let out = ctr(&["containers", "rm", "long1"]);
    assert!(out.status.success(), "containers rm: {}", text(&out.stderr));
    wait_until("the shim to exit", Duration::from_secs(5), || {
        s.ctd.shim_pids().is_empty()
    });
    let _ = &s.tw;
}

#[test]
fn containers_of_one_sandbox_share_one_shim() {
    let s = setup();
    let ann = ["--annotation", "io.kubernetes.cri.sandbox-id=sandbox1"];
    for id in ["pod1a", "pod1b"] {
        let mut a = vec!["run", "-d", "--runtime", SHIM_RUNTIME];
        a.extend_from_slice(&ann);
        a.extend_from_slice(&[IMAGE_NAME, id, "sleep", "1000"]);
        let out = s.ctd.ctr(&a);
        assert!(
            out.status.success(),
            "{id}: {}\n{}",
            text(&out.stderr),
            s.ctd.log()
        );
    }
    let shims = s.ctd.shim_pids();
    assert_eq!(shims.len(), 1, "one shim for the sandbox: {shims:?}");
    eprintln!(
        "shim with two containers of one sandbox: {} ({})",
        mem_summary(shims[0]),
        bin_kind()
    );
    for id in ["pod1a", "pod1b"] {
        assert!(s
            .ctd
            .ctr(&["task", "kill", "-s", "SIGKILL", id])
            .status
            .success());
    }
    // The first container's exit must not take the shared shim down.
    wait_until("both tasks to stop", Duration::from_secs(5), || {
        text(&s.ctd.ctr(&["task", "ls"]).stdout)
            .matches("STOPPED")
            .count()
            == 2
    });
    for id in ["pod1a", "pod1b"] {
        let out = s.ctd.ctr(&["task", "delete", id]);
        assert!(out.status.success(), "delete {id}: {}", text(&out.stderr));
        if id == "pod1a" {
            assert_eq!(
                s.ctd.shim_pids(),
                shims,
                "the shim stays while pod1b is left"
            );
        }
        assert!(s.ctd.ctr(&["containers", "rm", id]).status.success());
    }
    wait_until("the shim to exit", Duration::from_secs(5), || {
        s.ctd.shim_pids().is_empty()
    });
}

/// `ctr run -t`: the container gets a terminal of the caller's size (ctr
/// sends ResizePty after start), output comes back, the exit code too.
#[test]
fn shim_runs_a_container_with_a_terminal() {
    let s = setup();
    // Until ctr's ResizePty arrives the window is 0×0 (busybox `stty size`
    // then prints nothing or fails).
    let script = "if [ -t 0 ] && [ -t 1 ]; then echo tty-yes; fi; i=0; s=; \
                  until [ -n \"$s\" ] && [ \"$s\" != '0 0' ] || [ $i -ge 50 ]; do \
                  sleep 0.1; i=$((i+1)); s=$(stty size 2>/dev/null); done; echo \"size=$s\"; exit 7";
    let args = run_args("tty1", &["-t"], &["sh", "-c", script]);
    let (out, code) = s
        .ctd
        .ctr_on_pty(&args, (33, 101), "", b"", Duration::from_secs(30));
    assert_eq!(code, Some(7), "ctr run -t: {out}\n{}", s.ctd.log());
    assert!(
        out.contains("tty-yes"),
        "stdin and stdout are a terminal: {out}"
    );
    assert!(
        out.contains("size=33 101"),
        "the window size came through: {out:?}"
    );
    wait_until("the shim to exit", Duration::from_secs(5), || {
        s.ctd.shim_pids().is_empty()
    });
}

/// `ctr task exec -t … sh`, typing into the terminal like a user.
#[test]
fn shim_exec_with_a_terminal_takes_typed_input() {
    let s = setup();
    let out = s.ctd.ctr(&[
        "run",
        "-d",
        "--runtime",
        SHIM_RUNTIME,
        IMAGE_NAME,
        "ttyx",
        "sleep",
        "1000",
    ]);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stderr),
        s.ctd.log()
    );
    let args = ["task", "exec", "-t", "--exec-id", "sh1", "ttyx", "sh"];
    let (out, code) = s.ctd.ctr_on_pty(
        &args,
        (24, 80),
        "# ",
        b"echo $((6*7)); exit 3\r",
        Duration::from_secs(30),
    );
    assert_eq!(code, Some(3), "ctr task exec -t: {out}\n{}", s.ctd.log());
    assert!(out.contains("42"), "the typed command ran: {out}");
    remove_task(&s, "ttyx");
}

/// `echo … | ctr run … cat`: piped stdin reaches the container, written late
/// and in bulk, and EOF follows (ctr's CloseIO).
#[test]
fn shim_passes_piped_stdin() {
    let s = setup();
    let mut child = s
        .ctd
        .ctr_cmd(&run_args(
            "stdin1",
            &[],
            &["sh", "-c", "read first; echo first=$first; wc -c"],
        ))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500)); // the container reads first
        stdin.write_all(b"hi\n").unwrap();
        stdin.write_all(&vec![b'x'; 200_000]).unwrap();
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stderr),
        s.ctd.log()
    );
    let got = text(&out.stdout);
    assert_eq!(
        got.lines().map(str::trim).collect::<Vec<_>>(),
        ["first=hi", "200000"],
        "{got}"
    );
}

/// A container reading stdin before anyone writes waits for the writer
/// (`ctr run -d` leaves without closing stdin; `ctr task attach` writes later).
#[test]
fn stdin_waits_for_a_late_writer() {
    let s = setup();
    let mut run = s
        .ctd
        .ctr_cmd(&[
            "run",
            "-d",
            "--runtime",
            SHIM_RUNTIME,
            IMAGE_NAME,
            "late1",
            "sh",
            "-c",
            "read x; echo got=$x; exit 4",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let held = run.stdin.take(); // open, never written: ctr sees no EOF
    let out = run.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stderr),
        s.ctd.log()
    );
    std::thread::sleep(Duration::from_secs(1));
    let ls = text(&s.ctd.ctr(&["task", "ls"]).stdout);
    assert!(
        ls.lines()
            .any(|l| l.starts_with("late1") && l.contains("RUNNING")),
        "still waiting for input: {ls}"
    );
    let mut attach = s
        .ctd
        .ctr_cmd(&["task", "attach", "late1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    attach.stdin.take().unwrap().write_all(b"hi\n").unwrap();
    let out = attach.wait_with_output().unwrap();
    assert!(
        text(&out.stdout).contains("got=hi"),
        "attach: {}",
        text(&out.stdout)
    );
    assert_eq!(out.status.code(), Some(4));
    drop(held);
    remove_task(&s, "late1");
}

fn remove_task(s: &Setup, id: &str) {
    let _ = s.ctd.ctr(&["task", "kill", "-s", "SIGKILL", id]);
    wait_until("the task to stop", Duration::from_secs(5), || {
        !text(&s.ctd.ctr(&["task", "ls"]).stdout)
            .lines()
            .any(|l| l.starts_with(id) && l.contains("RUNNING"))
    });
    let out = s.ctd.ctr(&["task", "delete", id]);
    // `ctr task attach` deletes the task it saw exit.
    assert!(
        out.status.success() || text(&out.stderr).contains("not found"),
        "task delete {id}: {}",
        text(&out.stderr)
    );
    let out = s.ctd.ctr(&["containers", "rm", id]);
    assert!(
        out.status.success(),
        "containers rm {id}: {}",
        text(&out.stderr)
    );
    wait_until("the shim to exit", Duration::from_secs(5), || {
        s.ctd.shim_pids().is_empty()
    });
}

fn bin_kind() -> String {
    std::env::var("TW_SHIM_DIR")
        .map(|d| format!("shim from {d}"))
        .unwrap_or_else(|_| "debug build".into())
}

/// The agent, started privately with the test's config.
struct Agent(Child, PathBuf);

impl Agent {
    fn start(config: &Path, tw: &Path) -> Agent {
        let child = Command::new(bin("throttlewatch"))
            .args(["agent", "--config"])
            .arg(config)
            .stdin(Stdio::null())
            .stderr(std::fs::File::create(tw.join("agent.log")).unwrap())
            .spawn()
            .unwrap();
        let sock = tw.join("agent.sock");
        wait_until("the agent socket", Duration::from_secs(20), || {
            sock.exists()
        });
        Agent(child, sock)
    }

    fn watched(&self) -> Vec<String> {
        call(&self.1, &Request::Status, Duration::from_secs(5))
            .unwrap()
            .watched
            .unwrap_or_default()
    }

    fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.0.id()))
            .unwrap()
            .count()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // SAFETY: kill(2) of the agent this test started.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

fn count_dir(p: &Path) -> usize {
    std::fs::read_dir(p).map(|d| d.count()).unwrap_or(0)
}

#[test]
fn fifty_short_lived_containers_leak_nothing() {
    let s = setup();
    let agent = Agent::start(&s.config, &s.tw.0);
    // Warm-up: the first container creates the namespace's directories.
    assert!(
        s.ctd
            .ctr(&run_args("warm", &[], &["true"]))
            .status
            .success(),
        "{}",
        s.ctd.log()
    );
    let fds0 = agent.fds();
    let t0 = Instant::now();
    for i in 0..50 {
        let id = format!("short{i}");
        let out = s.ctd.ctr(&run_args(&id, &[], &["true"]));
        assert!(
            out.status.success(),
            "{id}: {}\n{}",
            text(&out.stderr),
            s.ctd.log()
        );
    }
    let took = t0.elapsed();
    eprintln!(
        "50 containers in {:.1} s ({:.0} ms each)",
        took.as_secs_f64(),
        took.as_secs_f64() * 20.0
    );
    wait_until("shims to exit", Duration::from_secs(10), || {
        s.ctd.shim_pids().is_empty()
    });
    let ns = &s.ctd.namespace;
    let runc_root = Path::new("/run/containerd/throttlewatch").join(ns);
    assert_eq!(
        count_dir(&runc_root),
        0,
        "runc state left in {}",
        runc_root.display()
    );
    let cg = Path::new("/sys/fs/cgroup/cpu").join(ns);
    let left: Vec<_> = std::fs::read_dir(&cg)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().is_dir())
        .collect();
    assert!(
        left.is_empty(),
        "cgroups left under {}: {left:?}",
        cg.display()
    );
    let fifos = Path::new("/run/containerd/fifo");
    let ours = walk_names(fifos)
        .into_iter()
        .filter(|n| n.starts_with("short"))
        .collect::<Vec<_>>();
    assert!(ours.is_empty(), "fifos left: {ours:?}");
    let bundles = s
        .ctd
        .dir
        .0
        .join("state/io.containerd.runtime.v2.task")
        .join(ns);
    assert_eq!(
        count_dir(&bundles),
        0,
        "bundles left in {}",
        bundles.display()
    );
    // Only this containerd's shims: other tests run theirs in parallel.
    assert_eq!(
        s.ctd.shim_pids(),
        Vec::<u32>::new(),
        "no shim of this containerd should be left"
    );
    wait_until(
        "the agent to forget the containers",
        Duration::from_secs(5),
        || agent.watched().is_empty(),
    );
    let fds1 = agent.fds();
    assert!(fds1 <= fds0 + 2, "agent fds grew from {fds0} to {fds1}");
    let logs = count_dir(&s.tw.0.join("logs"));
    assert!(logs >= 50, "one log per container: {logs}");
}

fn walk_names(dir: &Path) -> Vec<String> {
    let mut v = vec![];
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        v.push(e.file_name().to_string_lossy().into_owned());
        if e.path().is_dir() {
            v.extend(walk_names(&e.path()));
        }
    }
    v
}

#[test]
fn throttled_container_log_agrees_with_cpu_stat() {
    let _cpu = cpu_lock();
    let s = setup();
    let agent = Agent::start(&s.config, &s.tw.0);
    let burn = "(timeout 3 sh -c 'while :; do :; done') & timeout 3 sh -c 'while :; do :; done'; wait; true";
    let quota = ["--cpu-quota", "20000", "--cpu-period", "100000"];
    let out = s
        .ctd
        .ctr(&run_args("throttled1", &quota, &["sh", "-c", burn]));
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stderr),
        s.ctd.log()
    );
    let logs = s.tw.0.join("logs");
    let path = std::fs::read_dir(&logs)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().contains("throttled1"))
        .unwrap_or_else(|| panic!("no log for throttled1 in {}", logs.display()));
    wait_until("the end record", Duration::from_secs(5), || {
        !of_type(&read_log(&path), "end").is_empty()
    });
    let log = read_log(&path);
    assert_eq!(
        log.first().unwrap()["type"],
        "start",
        "log begins with start"
    );
    assert_eq!(log.last().unwrap()["type"], "end", "log ends with end");
    assert!(!of_type(&log, "throttle").is_empty(), "throttle records");
    let end = of_type(&log, "end")[0];
    assert_eq!(
        end["exit_code"], 0,
        "the shim reports the exit status: {end}"
    );
    let probe = end["probe_throttled_ns"].as_u64().unwrap();
    let kernel = end["kernel_throttled_ns"].as_u64().unwrap();
    assert!(
        kernel > 100_000_000,
        "too little throttling to compare: {end}"
    );
    let err = (probe as f64 - kernel as f64).abs() / kernel as f64;
    eprintln!(
        "containerd shim fidelity: probe {probe} ns, kernel {kernel} ns, error {:.3} %",
        err * 100.0
    );
    assert!(
        err <= 0.02,
        "probe {probe} vs kernel {kernel}: {:.2} % > 2 %",
        err * 100.0
    );
    assert!(
        agent.watched().is_empty(),
        "agent still watches: {:?}",
        agent.watched()
    );
}

/// The task's status and init pid as `ctr task ls` shows them.
fn task_row(s: &Setup, id: &str) -> Option<(u32, String)> {
    let out = s.ctd.ctr(&["task", "ls"]);
    text(&out.stdout).lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() >= 3 && f[0] == id).then(|| (f[1].parse().unwrap_or(0), f[2].to_string()))
    })
}

/// `Update` straight to the shim over its ttrpc socket, the way containerd
/// sends it (LinuxResources as JSON in an Any).
fn shim_update(s: &Setup, id: &str, resources: &str) -> Result<(), String> {
    let bundle = s
        .ctd
        .dir
        .0
        .join("state/io.containerd.runtime.v2.task")
        .join(&s.ctd.namespace)
        .join(id);
    let addr = std::fs::read_to_string(bundle.join("address"))
        .map_err(|e| format!("{}/address: {e}", bundle.display()))?;
    let client = ttrpc::Client::connect(addr.trim()).map_err(|e| e.to_string())?;
    let req = UpdateTaskRequest {
        id: id.into(),
        resources: MessageField::some(Any {
            type_url: "types.containerd.io/opencontainers/runtime-spec/1/LinuxResources".into(),
            value: resources.as_bytes().to_vec(),
            ..Default::default()
        }),
        ..Default::default()
    };
    TaskClient::new(client)
        .update(ttrpc::context::with_timeout(10_000_000_000), &req)
        .map(drop)
        .map_err(|e| e.to_string())
}

#[test]
fn shim_pause_resume_and_update_keep_the_burst() {
    let s = setup();
    let ctr = |a: &[&str]| s.ctd.ctr(a);
    let out = ctr(&[
        "run",
        "-d",
        "--runtime",
        SHIM_RUNTIME,
        "--cpu-quota",
        "50000",
        "--cpu-period",
        "100000",
        "--env",
        "THROTTLEWATCH_CPU_BURST=20ms",
        IMAGE_NAME,
        "upd1",
        "sleep",
        "1000",
    ]);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stderr),
        s.ctd.log()
    );
    let (pid, status) = task_row(&s, "upd1").expect("task listed");
    assert_eq!(status, "RUNNING");
    let h = Hierarchies::discover().unwrap();
    let g = CpuCgroup::open(
        &h,
        &cpu_cgroup_of_pid(Path::new("/proc"), pid, h.mode).unwrap(),
    )
    .unwrap();
    let limits = || {
        let l = g.limits().unwrap();
        (l.quota_us, l.burst_us)
    };
    assert_eq!(limits(), (Some(50_000), Some(20_000)), "burst from the env");

    // Pause and resume: the cgroup freezer, the status containerd sees.
    let out = ctr(&["task", "pause", "upd1"]);
    assert!(out.status.success(), "pause: {}", text(&out.stderr));
    assert_eq!(task_row(&s, "upd1").unwrap().1, "PAUSED");
    let out = ctr(&["task", "pause", "upd1"]);
    assert!(!out.status.success(), "pausing a paused task must fail");
    let out = ctr(&["task", "resume", "upd1"]);
    assert!(out.status.success(), "resume: {}", text(&out.stderr));
    assert_eq!(task_row(&s, "upd1").unwrap().1, "RUNNING");
    let out = ctr(&["task", "exec", "--exec-id", "e1", "upd1", "echo", "thawed"]);
    assert_eq!(text(&out.stdout), "thawed\n", "{}", text(&out.stderr));

    // An update (Kubernetes in-place resize) through the shim: runc alone
    // leaves the burst at 0; the shim clamps it to a smaller quota and
    // restores the request when the quota grows again.
    shim_update(&s, "upd1", r#"{"cpu":{"quota":15000,"period":100000}}"#).unwrap();
    assert_eq!(
        limits(),
        (Some(15_000), Some(15_000)),
        "clamped to the quota"
    );
    shim_update(&s, "upd1", r#"{"cpu":{"quota":60000,"period":100000}}"#).unwrap();
    assert_eq!(limits(), (Some(60_000), Some(20_000)), "the request again");

    let out = ctr(&["task", "kill", "-s", "SIGKILL", "upd1"]);
    assert!(out.status.success(), "kill: {}", text(&out.stderr));
    wait_until("the task to stop", Duration::from_secs(5), || {
        task_row(&s, "upd1").is_some_and(|r| r.1 == "STOPPED")
    });
    assert!(ctr(&["task", "delete", "upd1"]).status.success());
    assert!(ctr(&["containers", "rm", "upd1"]).status.success());
    let _ = &s.tw;
}
