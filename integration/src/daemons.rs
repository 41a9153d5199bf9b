//! Real daemons started and stopped by tests: the throttlewatch agent on a
//! private configuration, and a private dockerd. Each guard kills what it
//! started, by PID, on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::json;
use throttlewatch_core::protocol::{call, Request};

use crate::{bin, Scratch};

/// A private throttlewatch configuration: socket, log dir and state dir in
/// a scratch directory.
pub struct PrivateConfig {
    pub dir: Scratch,
    pub path: PathBuf,
    pub log_dir: PathBuf,
    pub socket: PathBuf,
    pub state_dir: PathBuf,
}

impl PrivateConfig {
    /// `extra` is appended to the TOML (e.g. `fail_mode = "closed"`).
    pub fn new(extra: &str) -> PrivateConfig {
        let dir = Scratch::new("cfg");
        let log_dir = dir.0.join("logs");
        let socket = dir.0.join("run/agent.sock");
        let state_dir = dir.0.join("run");
        let path = dir.0.join("throttlewatch.toml");
        // Tests start their agent themselves unless `extra` says otherwise.
        let start_agent = if extra.contains("start_agent") {
            ""
        } else {
            "start_agent = false\n"
        };
        let toml = format!(
            "log_dir = {:?}\nsocket = {:?}\nstate_dir = {:?}\nmetrics_addr = \"\"\n{start_agent}{extra}\n",
            log_dir, socket, state_dir
        );
        std::fs::write(&path, toml).unwrap();
        PrivateConfig {
            dir,
            path,
            log_dir,
            socket,
            state_dir,
        }
    }
    /// As [`PrivateConfig::new`], the agent serving metrics on
    /// 127.0.0.1:`port` (in place of the default `metrics_addr = ""`).
    pub fn serving_metrics(port: u16, extra: &str) -> PrivateConfig {
        let cfg = PrivateConfig::new(&format!("metrics_addr = \"127.0.0.1:{port}\"\n{extra}"));
        let text = std::fs::read_to_string(&cfg.path).unwrap();
        std::fs::write(&cfg.path, text.replacen("metrics_addr = \"\"\n", "", 1)).unwrap();
        cfg
    }

    /// Registers the cgroup `cgroup_path` (process `pid`) as container `id`
    /// with this configuration's agent, the dynamic CPU controller asked for
    /// (`throttlewatch.io/cpu-control=auto`) when `cpu_control`; the log's
    /// path. 30 s for the answer: a debug agent in the VM lane is slow.
    pub fn register_control(
        &self,
        id: &str,
        cgroup_path: &str,
        pid: u32,
        cpu_control: bool,
    ) -> PathBuf {
        let mut annotations = std::collections::BTreeMap::new();
        if cpu_control {
            annotations.insert(
                "throttlewatch.io/cpu-control".to_string(),
                "auto".to_string(),
            );
        }
        let r = call(
            &self.socket,
            &Request::Register(throttlewatch_core::protocol::Register {
                container_id: id.into(),
                container_name: id.into(),
                pid: Some(pid),
                cgroup_path: cgroup_path.into(),
                annotations,
                ..Default::default()
            }),
            Duration::from_secs(30),
        )
        .unwrap_or_else(|e| panic!("register {id}: {e}"));
        assert!(r.ok, "register {id}: {r:?}");
        PathBuf::from(r.log_path.expect("a log path"))
    }

    /// The log of a container: `<escaped id>.jsonl` (runc's default root, or
    /// registered without a scope), else the one `<escaped id>@<scope>.jsonl`
    /// (a private runc root, a containerd namespace). Resolved when called:
    /// call it once the container is registered.
    pub fn log_of(&self, container_id: &str) -> PathBuf {
        let stem = throttlewatch_core::logfmt::escape_id(container_id);
        let bare = self.log_dir.join(format!("{stem}.jsonl"));
        if bare.exists() {
            return bare;
        }
        let scoped: Vec<PathBuf> = std::fs::read_dir(&self.log_dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                let n = p.file_name().unwrap_or_default().to_string_lossy();
                // `X+<ts>.jsonl`: an earlier lifetime of the same container.
                n.starts_with(&format!("{stem}@")) && n.ends_with(".jsonl") && !n.contains('+')
            })
            .collect();
        match <[PathBuf; 1]>::try_from(scoped) {
            Ok([one]) => one,
            Err(_) => bare,
        }
    }

    pub fn hook_log(&self) -> String {
        std::fs::read_to_string(self.log_dir.join("hook.log")).unwrap_or_default()
    }

    /// Every file under the scratch directory except the log dir, the
    /// state dir and the config itself (to check nothing is written elsewhere).
    pub fn stray_files(&self) -> Vec<PathBuf> {
        let mut out = vec![];
        for e in std::fs::read_dir(&self.dir.0).unwrap().flatten() {
            let p = e.path();
            let ours = p
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(AGENT_OUTPUT));
            if p != self.log_dir && p != self.state_dir && p != self.path && !ours {
                out.push(p);
            }
        }
        out
    }
}

/// Send SIGTERM, wait up to `grace`, then SIGKILL; always reaps.
pub fn stop_child(child: &mut Child, grace: Duration) {
    let pid = Pid::from_raw(child.id() as i32);
    let _ = kill(pid, Signal::SIGTERM);
    let t = Instant::now();
    while t.elapsed() < grace {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The test's capture of the agent's stdout/stderr (not written by the agent).
const AGENT_OUTPUT: &str = "agent-output-";

/// `throttlewatch agent --config FILE` in the foreground, as a child.
pub struct Agent {
    pub child: Child,
    pub output: PathBuf,
}

impl Agent {
    pub fn start(cfg: &PrivateConfig) -> Agent {
        let output = cfg.dir.0.join(format!("{AGENT_OUTPUT}{}", crate::unique()));
        let f = std::fs::File::create(&output).unwrap();
        let child = Command::new(bin("throttlewatch"))
            .args(["agent", "--config"])
            .arg(&cfg.path)
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .unwrap();
        let mut a = Agent { child, output };
        a.wait_ready(&cfg.socket, Duration::from_secs(20));
        a
    }

    fn wait_ready(&mut self, socket: &Path, timeout: Duration) {
        let t = Instant::now();
        loop {
            if call(socket, &Request::Status, Duration::from_secs(1)).is_ok_and(|r| r.ok) {
                return;
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!(
                    "the agent exited ({st}): {}",
                    std::fs::read_to_string(&self.output).unwrap_or_default()
                );
            }
            assert!(
                t.elapsed() < timeout,
                "the agent did not answer on {} in {timeout:?}",
                socket.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL, as a crash would (the restart test).
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.output).unwrap_or_default()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        stop_child(&mut self.child, Duration::from_secs(10));
    }
}

/// Agents that a test did not start itself (the hook's `agent --detach`
/// with `start_agent = true`): found by their command line, which names the
/// private configuration, and killed by PID on drop.
pub struct DetachedAgents {
    pub config: PathBuf,
}

impl DetachedAgents {
    pub fn new(cfg: &PrivateConfig) -> DetachedAgents {
        DetachedAgents {
            config: cfg.path.clone(),
        }
    }

    /// Running `throttlewatch ... agent` processes on this configuration,
    /// without the short-lived `agent --detach` launchers.
    pub fn pids(&self) -> Vec<u32> {
        agent_processes(&self.config)
            .into_iter()
            .filter(|(_, args)| !args.iter().any(|a| a == "--detach"))
            .map(|(p, _)| p)
            .collect()
    }

    /// Wait until no `--detach` launcher is left and the agent count is stable.
    pub fn settle(&self, timeout: Duration) -> Vec<u32> {
        let t = Instant::now();
        loop {
            let all = agent_processes(&self.config);
            let launching = all.iter().any(|(_, a)| a.iter().any(|x| x == "--detach"));
            if !launching || t.elapsed() > timeout {
                return self.pids();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for DetachedAgents {
    fn drop(&mut self) {
        let pids = agent_processes(&self.config)
            .into_iter()
            .map(|(p, _)| p)
            .collect::<Vec<_>>();
        for p in &pids {
            let _ = kill(Pid::from_raw(*p as i32), Signal::SIGTERM);
        }
        let t = Instant::now();
        while pids
            .iter()
            .any(|p| Path::new(&format!("/proc/{p}")).exists())
            && t.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        for p in pids {
            let _ = kill(Pid::from_raw(p as i32), Signal::SIGKILL);
        }
    }
}

/// (pid, argv) of every `throttlewatch` process whose command line holds
/// `agent` and the configuration path.
pub fn agent_processes(config: &Path) -> Vec<(u32, Vec<String>)> {
    let want = config.to_string_lossy();
    let mut out = vec![];
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(raw) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = raw
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let is_agent = args.first().is_some_and(|a| a.ends_with("/throttlewatch"))
            && args.iter().any(|a| a == "agent");
        if is_agent && args.iter().any(|a| *a == want) {
            out.push((pid, args));
        }
    }
    out
}

/// The pid holding the agent's single-instance flock (`<state_dir>/agent.lock`),
/// from /proc/locks (device as hex `major:minor`, then the inode).
pub fn lock_holder(state_dir: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(throttlewatch_core::StateDir::new(state_dir).agent_lock()).ok()?;
    let want = format!(
        "{:02x}:{:02x}:{}",
        libc::major(m.dev()),
        libc::minor(m.dev()),
        m.ino()
    );
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    locks.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().filter(|x| *x != "->").collect();
        (f.get(1) == Some(&"FLOCK") && f.get(5) == Some(&want.as_str()))
            .then(|| f.get(4)?.parse().ok())
            .flatten()
    })
}

/// The API version of Debian's dockerd 20.10; pinned for newer clients.
pub const DOCKER_API_VERSION: &str = "1.41";
/// The image every docker test runs.
pub const BUSYBOX_IMAGE: &str = "tw-busybox:latest";

/// A private dockerd: own data-root, exec-root, pidfile and socket, no
/// networking, cgroups under `/tw-docker-<pid>`, and the runtime
/// `throttlewatch` = our wrapper with the private configuration.
pub struct Dockerd {
    pub dir: Scratch,
    pub socket: PathBuf,
    pub exec_root: PathBuf,
    pub cgroup_parent: String,
    pub storage_driver: String,
    child: Child,
}

impl Dockerd {
    pub fn start(cfg: &PrivateConfig) -> Dockerd {
        match Self::start_with(cfg, "overlay2") {
            Ok(d) => d,
            Err(e) => {
                eprintln!("dockerd with overlay2 failed ({e}); trying vfs");
                Self::start_with(cfg, "vfs").unwrap_or_else(|e| panic!("dockerd: {e}"))
            }
        }
    }

    fn start_with(cfg: &PrivateConfig, driver: &str) -> Result<Dockerd, String> {
        // Short paths: containerd's sockets live under the exec-root.
        let dir = Scratch(PathBuf::from(format!(
            "/tmp/twd{}-{}",
            std::process::id(),
            crate::unique()
        )));
        std::fs::create_dir_all(&dir.0).unwrap();
        let socket = dir.0.join("docker.sock");
        let exec_root = dir.0.join("x");
        let cgroup_parent = format!("/tw-docker-{}", std::process::id());
        let daemon_json = json!({
            "data-root": dir.0.join("data"),
            "exec-root": exec_root,
            "pidfile": dir.0.join("docker.pid"),
            "hosts": [format!("unix://{}", socket.display())],
            "iptables": false, "ip6tables": false, "ip-masq": false, "ip-forward": false,
            "bridge": "none", "userland-proxy": false,
            "storage-driver": driver,
            "cgroup-parent": cgroup_parent,
            "exec-opts": ["native.cgroupdriver=cgroupfs"],
            "log-level": "warn",
            "runtimes": {"throttlewatch": {
                "path": bin("throttlewatch-runtime"),
                "runtimeArgs": ["--throttlewatch-config", cfg.path],
            }},
        });
        let cfg_file = dir.0.join("daemon.json");
        std::fs::write(&cfg_file, serde_json::to_vec_pretty(&daemon_json).unwrap()).unwrap();
        let out = std::fs::File::create(dir.0.join("dockerd.log")).unwrap();
        let child = Command::new("dockerd")
            .arg("--config-file")
            .arg(&cfg_file)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .map_err(|e| format!("dockerd: {e} (apt-get install docker.io)"))?;
        let mut d = Dockerd {
            dir,
            socket,
            exec_root,
            cgroup_parent,
            storage_driver: driver.into(),
            child,
        };
        let t = Instant::now();
        loop {
            if d.docker(&["version"]).status.success() {
                break;
            }
            if let Ok(Some(st)) = d.child.try_wait() {
                return Err(format!("dockerd exited ({st}): {}", d.log()));
            }
            if t.elapsed() > Duration::from_secs(30) {
                return Err(format!("dockerd did not answer in 30 s: {}", d.log()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let tar = crate::bundle::busybox_image_tar(&d.dir.0, BUSYBOX_IMAGE);
        let o = d.docker(&["load", "-i", tar.to_str().unwrap()]);
        if !o.status.success() {
            return Err(format!("docker load: {}", crate::bundle::text(&o)));
        }
        Ok(d)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("dockerd.log")).unwrap_or_default()
    }

    /// The docker CLI against this daemon.
    pub fn docker(&self, args: &[&str]) -> Output {
        Command::new("docker")
            .env("DOCKER_API_VERSION", DOCKER_API_VERSION)
            .arg("-H")
            .arg(format!("unix://{}", self.socket.display()))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// The container's cgroup directory in a v1 controller hierarchy.
    pub fn cgroup_dir(&self, controller: &str, full_id: &str) -> PathBuf {
        Path::new("/sys/fs/cgroup")
            .join(controller)
            .join(self.cgroup_parent.trim_start_matches('/'))
            .join(full_id)
    }

    fn containerd_pid(&self) -> Option<i32> {
        let p = self.exec_root.join("containerd/containerd.pid");
        std::fs::read_to_string(p).ok()?.trim().parse().ok()
    }
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        let ids = self.docker(&["ps", "-aq"]);
        for id in String::from_utf8_lossy(&ids.stdout).split_whitespace() {
            let _ = self.docker(&["rm", "-f", id]);
        }
        let containerd = self.containerd_pid();
        stop_child(&mut self.child, Duration::from_secs(20));
        if let Some(pid) = containerd {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        unmount_below(&self.dir.0);
        for ctrl in std::fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
        {
            let _ =
                std::fs::remove_dir(ctrl.path().join(self.cgroup_parent.trim_start_matches('/')));
        }
    }
}

/// Detach every mount below `dir`, deepest first, so removing it never
/// descends into a mounted filesystem.
pub fn unmount_below(dir: &Path) {
    let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<PathBuf> = mi
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for p in points {
        let _ = nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH);
    }
}

impl crate::bundle::OciCli {
    /// `throttlewatch-runtime` with the private config, as dockerd or
    /// containerd would call it.
    pub fn throttlewatch(cfg: &PrivateConfig) -> crate::bundle::OciCli {
        let mut c = crate::bundle::OciCli::new(crate::bin("throttlewatch-runtime"));
        c.global = vec![
            "--throttlewatch-config".into(),
            cfg.path.to_string_lossy().into(),
        ];
        c
    }
}
