//! A private containerd 1.6 that runs our shim
//! (`ctr run --runtime io.containerd.throttlewatch.v2`), with a private
//! throttlewatch configuration and the busybox image imported: what the
//! containerd*.rs tests share, with the agent on that configuration and
//! the shim's own `Update` call. Set TW_SHIM_DIR to a folder holding another
//! build of the shim (e.g. target/release) to run that one.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use containerd_shim::protos::protobuf::well_known_types::any::Any;
use containerd_shim::protos::protobuf::MessageField;
use containerd_shim::protos::shim::shim::UpdateTaskRequest;
use containerd_shim::protos::shim::shim_ttrpc::TaskClient;
use containerd_shim::protos::ttrpc;
use throttlewatch_core::protocol::{call, Request};

use crate::containerd::{build_busybox_image, Containerd, IMAGE_NAME, SHIM_BINARY, SHIM_RUNTIME};
use crate::{bin, Scratch};

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

/// The running containerd, the scratch folder of the throttlewatch
/// configuration (logs, socket, state) and the configuration file.
pub struct Setup {
    pub ctd: Containerd,
    pub tw: Scratch,
    pub config: PathBuf,
}

/// The folder of this build's shim binary.
pub fn shim_dir() -> PathBuf {
    bin(SHIM_BINARY).parent().unwrap().to_path_buf()
}

/// containerd with this build's shim on its PATH and THROTTLEWATCH_CONFIG
/// pointing at `config`.
pub fn containerd_with_shim(config: &Path) -> Containerd {
    Containerd::start(
        &[shim_dir()],
        &[("THROTTLEWATCH_CONFIG", config.to_str().unwrap())],
    )
}

/// containerd started with the shim on its PATH (TW_SHIM_DIR first, then
/// this build's) and THROTTLEWATCH_CONFIG pointing at a private file.
pub fn setup() -> Setup {
    setup_with(Containerd::start)
}

/// The same with containerd 2.3.4 (../shared/bin).
pub fn setup_2x() -> Setup {
    setup_with(Containerd::start_2x)
}

/// How a test starts its containerd: PATH directories and environment.
type StartContainerd = fn(&[PathBuf], &[(&str, &str)]) -> Containerd;

fn setup_with(start: StartContainerd) -> Setup {
    let tw = Scratch::new("twcfg");
    let config = tw_config(&tw.0);
    let shim_dir_env = std::env::var_os("TW_SHIM_DIR").map(PathBuf::from);
    let mut dirs: Vec<PathBuf> = shim_dir_env.into_iter().collect();
    dirs.push(shim_dir());
    let ctd = start(&dirs, &[("THROTTLEWATCH_CONFIG", config.to_str().unwrap())]);
    let img = Scratch::new("img");
    ctd.import(&build_busybox_image(&img.0));
    Setup { ctd, tw, config }
}

impl Setup {
    /// Kill the task `id`, delete it and its container, wait for the shim
    /// to exit (a task `ctr task attach` already deleted is fine).
    pub fn remove_task(&self, id: &str) {
        let _ = self.ctd.ctr(&["task", "kill", "-s", "SIGKILL", id]);
        wait_until("the task to stop", Duration::from_secs(5), || {
            !text(&self.ctd.ctr(&["task", "ls"]).stdout)
                .lines()
                .any(|l| l.starts_with(id) && l.contains("RUNNING"))
        });
        let out = self.ctd.ctr(&["task", "delete", id]);
        // `ctr task attach` deletes the task it saw exit.
        assert!(
            out.status.success() || text(&out.stderr).contains("not found"),
            "task delete {id}: {}",
            text(&out.stderr)
        );
        let out = self.ctd.ctr(&["containers", "rm", id]);
        assert!(
            out.status.success(),
            "containers rm {id}: {}",
            text(&out.stderr)
        );
        wait_until("the shim to exit", Duration::from_secs(5), || {
            self.ctd.shim_pids().is_empty()
        });
    }

    /// `ctr run -d --runtime <ours> EXTRA.. <image> ID CMD..`; panics with
    /// ctr's stderr and containerd's log when it fails.
    pub fn run_detached(&self, extra: &[&str], id: &str, cmd: &[&str]) {
        let mut a = vec!["run", "-d", "--runtime", SHIM_RUNTIME];
        a.extend_from_slice(extra);
        a.extend_from_slice(&[IMAGE_NAME, id]);
        a.extend_from_slice(cmd);
        let out = self.ctd.ctr(&a);
        assert!(
            out.status.success(),
            "{}\n{}",
            text(&out.stderr),
            self.ctd.log()
        );
    }
}

/// `ctr run --rm --runtime <ours> EXTRA.. <image> ID CMD..`.
pub fn run_args<'a>(id: &'a str, extra: &[&'a str], cmd: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["run", "--rm", "--runtime", SHIM_RUNTIME];
    a.extend_from_slice(extra);
    a.extend_from_slice(&[IMAGE_NAME, id]);
    a.extend_from_slice(cmd);
    a
}

/// Polls `f` every 50 ms; panics naming `what` after `timeout`.
pub fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Bytes a process wrote, as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The agent, started with the setup's configuration (stderr in the
/// scratch folder's agent.log); SIGTERMed and reaped on drop.
pub struct ShimAgent(Child, PathBuf);

impl Setup {
    /// Starts the agent on this setup's configuration and waits (20 s at
    /// most) for its socket.
    /// `ctr run` of a container `id` with two busy loops for 3 s under a
    /// 20 % quota; returns its log once the `end` is written.
    pub fn run_throttled_burn(&self, id: &str) -> PathBuf {
        let burn = "(timeout 3 sh -c 'while :; do :; done') & timeout 3 sh -c 'while :; do :; done'; wait; true";
        let quota = ["--cpu-quota", "20000", "--cpu-period", "100000"];
        let out = self.ctd.ctr(&run_args(id, &quota, &["sh", "-c", burn]));
        assert!(
            out.status.success(),
            "{}\n{}",
            text(&out.stderr),
            self.ctd.log()
        );
        let logs = self.tw.0.join("logs");
        let path = std::fs::read_dir(&logs)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.to_string_lossy().contains(id))
            .unwrap_or_else(|| panic!("no log for {id} in {}", logs.display()));
        wait_until("the end record", Duration::from_secs(5), || {
            !crate::of_type(&crate::read_log(&path), "end").is_empty()
        });
        path
    }

    pub fn start_agent(&self) -> ShimAgent {
        let child = Command::new(bin("throttlewatch"))
            .args(["agent", "--config"])
            .arg(&self.config)
            .stdin(Stdio::null())
            .stderr(std::fs::File::create(self.tw.0.join("agent.log")).unwrap())
            .spawn()
            .unwrap();
        let sock = self.tw.0.join("agent.sock");
        wait_until("the agent socket", Duration::from_secs(20), || {
            sock.exists()
        });
        ShimAgent(child, sock)
    }
}

impl ShimAgent {
    /// The container ids the agent watches (its status).
    pub fn watched(&self) -> Vec<String> {
        call(&self.1, &Request::Status, Duration::from_secs(5))
            .unwrap()
            .watched
            .unwrap_or_default()
    }

    /// How many file descriptors the agent holds open.
    pub fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.0.id()))
            .unwrap()
            .count()
    }
}

impl Drop for ShimAgent {
    fn drop(&mut self) {
        // SAFETY: kill(2) of the agent this test started.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

/// `Update` straight to the shim over its ttrpc socket, the way containerd
/// sends it (LinuxResources as JSON in an Any).
pub fn shim_update(s: &Setup, id: &str, resources: &str) -> Result<(), String> {
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
