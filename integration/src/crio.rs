//! CRI-O from `../shared/bin` on a private configuration, as
//! `../shared/bin/README.md` starts it: `unshare --mount --propagation
//! private crio --config FILE --config-dir DIR` with private storage,
//! registries, socket, hooks directory, NRI socket and every state path
//! CRI-O would otherwise put on the host; cgroupfs; runc and conmon from
//! Debian. The image is a static busybox put into its storage with skopeo
//! (no registry). Pods have no infra container (`drop_infra_ctr = true`
//! and a container PID namespace: this sandbox forbids the infra
//! container's oom_score_adj) and the host network (no CNI). `crictl` talks
//! to its socket. On drop: every pod stopped and removed, CRI-O stopped by
//! its PID, what is left in the pods' cgroup parent killed and the cgroups
//! removed, mounts below the scratch directory detached.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::bundle::{text, CGROUP_PREFIX};
use crate::daemons::{stop_child, unmount_below};
use crate::{shared_bin, Scratch};

/// The image every container runs (and the pause image CRI-O is told of).
pub const IMAGE: &str = "localhost/twbusybox:latest";

pub struct Crio {
    pub dir: Scratch,
    /// `crio.conf` and its drop-in directory, as CRI-O is started with them.
    pub config: PathBuf,
    pub config_dir: PathBuf,
    /// Its `hooks_dir` (the only one).
    pub hooks_dir: PathBuf,
    /// Its `nri_listen`.
    pub nri_socket: PathBuf,
    pub socket: PathBuf,
    /// Absolute cgroup parent of every pod (`/tw-test-crio-…`).
    pub cgroup_parent: String,
    child: Option<Child>,
}

/// The configuration that keeps CRI-O off the host's paths.
fn config_text(d: &Path) -> String {
    let p = |s: &str| d.join(s).display().to_string();
    format!(
        r#"[crio]
root = "{root}"
runroot = "{runroot}"
storage_driver = "overlay"
log_dir = "{logs}"
version_file = "{version}"
version_file_persist = "{version_p}"
clean_shutdown_file = "{clean}"

[crio.api]
listen = "{sock}"

[crio.runtime]
default_runtime = "runc"
cgroup_manager = "cgroupfs"
drop_infra_ctr = true
hooks_dir = ["{hooks}"]
cdi_spec_dirs = ["{cdi}"]
default_mounts_file = "{mounts}"
container_exits_dir = "{exits}"
container_attach_socket_dir = "{attach}"
namespaces_dir = "{ns}"
pinns_path = "{pinns}"
decryption_keys_path = "{keys}"
irqbalance_config_file = "{irq}"
irqbalance_config_restore_file = "disable"

[crio.runtime.runtimes.runc]
runtime_path = "/usr/sbin/runc"
runtime_root = "{runc_root}"
monitor_path = "/usr/bin/conmon"
monitor_cgroup = "pod"

[crio.image]
pause_image = "{IMAGE}"
pause_command = "/bin/sleep"
signature_policy = "{policy}"
signature_policy_dir = "{sigdir}"
namespaced_auth_dir = "{auth}"

[crio.network]
network_dir = "{cni}"
plugin_dirs = ["{cni_bin}"]

[crio.nri]
enable_nri = true
nri_listen = "{nri}"
nri_plugin_dir = "{nri_plugins}"
nri_plugin_config_dir = "{nri_conf}"
"#,
        root = p("root"),
        runroot = p("runroot"),
        logs = p("logs"),
        version = p("version"),
        version_p = p("version-persist"),
        clean = p("clean.shutdown"),
        sock = p("crio.sock"),
        hooks = p("hooks.d"),
        cdi = p("cdi"),
        mounts = p("mounts.conf"),
        exits = p("exits"),
        attach = p("attach"),
        ns = p("ns"),
        pinns = shared_bin("pinns").display(),
        keys = p("keys"),
        irq = p("irqbalance"),
        runc_root = p("runc"),
        policy = p("policy.json"),
        sigdir = p("sigstore"),
        auth = p("auth"),
        cni = p("cni"),
        cni_bin = p("cni-bin"),
        nri = p("nri.sock"),
        nri_plugins = p("nri-plugins"),
        nri_conf = p("nri-conf"),
    )
}

/// Write the private files CRI-O and skopeo read.
fn write_private_files(d: &Path) {
    for sub in [
        "root",
        "runroot",
        "logs",
        "hooks.d",
        "cdi",
        "exits",
        "attach",
        "ns",
        "keys",
        "runc",
        "sigstore",
        "auth",
        "cni",
        "cni-bin",
        "nri-plugins",
        "nri-conf",
        "crio.conf.d",
        "pods",
    ] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    std::fs::write(d.join("crio.conf"), config_text(d)).unwrap();
    std::fs::write(d.join("mounts.conf"), "").unwrap();
    std::fs::write(
        d.join("policy.json"),
        r#"{"default":[{"type":"insecureAcceptAnything"}]}"#,
    )
    .unwrap();
    std::fs::write(
        d.join("storage.conf"),
        format!(
            "[storage]\ndriver = \"overlay\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
            d.join("root").display(),
            d.join("runroot").display()
        ),
    )
    .unwrap();
    std::fs::write(
        d.join("registries.conf"),
        "unqualified-search-registries = []\n",
    )
    .unwrap();
}

/// The busybox image into CRI-O's storage with skopeo (before CRI-O runs).
fn put_image(d: &Path) {
    let img = d.join("image");
    std::fs::create_dir_all(&img).unwrap();
    crate::containerd::build_busybox_image_as(&img, IMAGE, &["sh"]);
    let dest = format!(
        "containers-storage:[overlay@{}+{}]{IMAGE}",
        d.join("root").display(),
        d.join("runroot").display()
    );
    let o = Command::new("skopeo")
        .arg("--policy")
        .arg(d.join("policy.json"))
        .arg("copy")
        .arg(format!("oci:{}:latest", img.join("oci").display()))
        .arg(&dest)
        .env("CONTAINERS_STORAGE_CONF", d.join("storage.conf"))
        .env("CONTAINERS_REGISTRIES_CONF", d.join("registries.conf"))
        .output()
        .expect("skopeo (apt-get install skopeo; scripts/setup.sh --test)");
    assert!(o.status.success(), "skopeo copy: {}", text(&o));
}

impl Crio {
    /// A private CRI-O, started and answering on its socket.
    pub fn start() -> Crio {
        let dir = Scratch::new("crio");
        let d = dir.0.clone();
        write_private_files(&d);
        put_image(&d);
        let cgroup_parent = format!(
            "{CGROUP_PREFIX}crio-{}-{}",
            std::process::id(),
            crate::unique()
        );
        let mut c = Crio {
            config: d.join("crio.conf"),
            config_dir: d.join("crio.conf.d"),
            hooks_dir: d.join("hooks.d"),
            nri_socket: d.join("nri.sock"),
            socket: d.join("crio.sock"),
            cgroup_parent,
            dir,
            child: None,
        };
        c.spawn();
        c
    }

    fn spawn(&mut self) {
        let d = &self.dir.0;
        let out = std::fs::File::create(d.join("crio.log")).unwrap();
        let child = Command::new("unshare")
            .args(["--mount", "--propagation", "private"])
            .arg(shared_bin("crio"))
            .arg("--config")
            .arg(&self.config)
            .arg("--config-dir")
            .arg(&self.config_dir)
            .env("CONTAINERS_STORAGE_CONF", d.join("storage.conf"))
            .env("CONTAINERS_REGISTRIES_CONF", d.join("registries.conf"))
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("unshare");
        self.child = Some(child);
        let t0 = Instant::now();
        while !self.crictl(&["version"]).status.success() {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "CRI-O did not answer on {} within 30 s:\n{}",
                self.socket.display(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stop CRI-O (SIGTERM, by its PID; containers keep running) and start
    /// it again on the same configuration.
    pub fn restart(&mut self) {
        if let Some(mut c) = self.child.take() {
            stop_child(&mut c, Duration::from_secs(10));
        }
        self.spawn();
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("crio.log")).unwrap_or_default()
    }

    pub fn crictl(&self, args: &[&str]) -> Output {
        let ep = format!("unix://{}", self.socket.display());
        Command::new(shared_bin("crictl"))
            .args(["--runtime-endpoint", &ep, "--image-endpoint", &ep])
            .args(["--timeout", "20s"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// `crictl ARGS`, which must succeed; its stdout, trimmed.
    pub fn crictl_ok(&self, args: &[&str]) -> String {
        let o = self.crictl(args);
        assert!(
            o.status.success(),
            "crictl {args:?}: {}\nCRI-O's log:\n{}",
            text(&o),
            tail(&self.log(), 30)
        );
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }

    /// A pod named `name` with `annotations`, its config file and its id.
    pub fn run_pod(&self, name: &str, annotations: &[(&str, &str)]) -> Pod {
        let uid = format!("{name}-{}-{}", std::process::id(), crate::unique());
        let config = json!({
            "metadata": {"name": uid, "uid": uid, "namespace": "tw", "attempt": 0},
            "annotations": to_map(annotations),
            "log_directory": self.dir.0.join("pods").join(&uid),
            "linux": {
                "cgroup_parent": self.cgroup_parent,
                "security_context": {"namespace_options": namespaces()},
            },
        });
        let path = self.dir.0.join("pods").join(format!("{uid}.json"));
        std::fs::write(&path, config.to_string()).unwrap();
        let id = self.crictl_ok(&["runp", path.to_str().unwrap()]);
        Pod { id, config: path }
    }

    /// A container of `pod` running `sh -c script` with a CFS quota of
    /// `quota_us` per 100 ms (None: none), created and started; its id.
    pub fn run_container(
        &self,
        pod: &Pod,
        name: &str,
        script: &str,
        quota_us: Option<i64>,
        annotations: &[(&str, &str)],
    ) -> String {
        let id = self.create_container(pod, name, script, quota_us, annotations);
        self.crictl_ok(&["start", &id]);
        id
    }

    /// [`Crio::run_container`] without the start.
    pub fn create_container(
        &self,
        pod: &Pod,
        name: &str,
        script: &str,
        quota_us: Option<i64>,
        annotations: &[(&str, &str)],
    ) -> String {
        let mut resources = json!({});
        if let Some(q) = quota_us {
            resources = json!({"cpu_period": 100_000, "cpu_quota": q});
        }
        let config = json!({
            "metadata": {"name": name},
            "image": {"image": IMAGE},
            "command": ["sh", "-c", script],
            "annotations": to_map(annotations),
            // As kubelet labels its containers: CRI-O's log names them so.
            "labels": {
                "io.kubernetes.pod.namespace": "tw",
                "io.kubernetes.pod.name": pod.id,
                "io.kubernetes.container.name": name,
            },
            "log_path": format!("{name}.log"),
            "linux": {
                "resources": resources,
                "security_context": {"namespace_options": namespaces()},
            },
        });
        let path = self
            .dir
            .0
            .join("pods")
            .join(format!("{}-{name}.json", pod.id));
        std::fs::write(&path, config.to_string()).unwrap();
        self.crictl_ok(&[
            "create",
            &pod.id,
            path.to_str().unwrap(),
            pod.config.to_str().unwrap(),
        ])
    }

    /// The container's state as `crictl inspect` gives it (`CONTAINER_RUNNING`, …).
    pub fn state(&self, id: &str) -> String {
        let v: Value = serde_json::from_str(&self.crictl_ok(&["inspect", "-o", "json", id]))
            .unwrap_or_default();
        v["status"]["state"].as_str().unwrap_or("").to_string()
    }

    /// Wait until the container has exited.
    pub fn wait_exited(&self, id: &str, timeout: Duration) {
        let t0 = Instant::now();
        while self.state(id) != "CONTAINER_EXITED" {
            assert!(
                t0.elapsed() < timeout,
                "container {id} not exited after {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The container's cgroup directory in `controller` (cgroupfs:
    /// `<cgroup_parent>/crio-<id>`).
    pub fn cgroup_dir(&self, controller: &str, id: &str) -> PathBuf {
        Path::new("/sys/fs/cgroup")
            .join(controller)
            .join(self.cgroup_parent.trim_start_matches('/'))
            .join(format!("crio-{id}"))
    }
}

/// A pod's id and the config file it was made from (crictl create needs both).
pub struct Pod {
    pub id: String,
    pub config: PathBuf,
}

/// No infra container needs a container PID namespace (1 = CONTAINER); the
/// host network (2 = NODE) needs no CNI.
fn namespaces() -> Value {
    json!({"network": 2, "pid": 1})
}

fn to_map(kv: &[(&str, &str)]) -> Value {
    Value::Object(
        kv.iter()
            .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
            .collect(),
    )
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

impl Drop for Crio {
    fn drop(&mut self) {
        if self.child.is_some() {
            let _ = self.crictl(&["rmp", "-fa"]);
        }
        if let Some(mut c) = self.child.take() {
            stop_child(&mut c, Duration::from_secs(10));
        }
        for ctrl in std::fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
        {
            crate::cri::remove_cgroup_tree(
                &ctrl.path().join(self.cgroup_parent.trim_start_matches('/')),
            );
        }
        unmount_below(&self.dir.0);
    }
}

/// `throttlewatch-nri` as an external plugin on CRI-O's `nri_listen`, its
/// output in a file; stopped (SIGTERM, by its PID) on drop.
pub struct NriPlugin {
    child: Option<Child>,
    pub output: PathBuf,
}

impl NriPlugin {
    /// Started with throttlewatch's configuration `tw_config`; returns once
    /// CRI-O's log says the plugin is synchronized.
    pub fn start(crio: &Crio, tw_config: &Path) -> NriPlugin {
        let output = crio.dir.0.join(format!("nri-{}.out", crate::unique()));
        let f = std::fs::File::create(&output).unwrap();
        let child = Command::new(crate::bin("throttlewatch-nri"))
            .arg("--socket")
            .arg(&crio.nri_socket)
            .arg("--config")
            .arg(tw_config)
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .unwrap();
        let p = NriPlugin {
            child: Some(child),
            output,
        };
        let t0 = Instant::now();
        let synced = |log: &str| {
            log.lines()
                .any(|l| l.contains("throttlewatch") && l.contains("synchronized"))
        };
        while !synced(&crio.log()) {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "the NRI plugin was not synchronized within 30 s; plugin:\n{}\nCRI-O:\n{}",
                p.output_text(),
                tail(&crio.log(), 30)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        p
    }

    pub fn output_text(&self) -> String {
        std::fs::read_to_string(&self.output).unwrap_or_default()
    }
}

impl Drop for NriPlugin {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            stop_child(&mut c, Duration::from_secs(5));
        }
    }
}
