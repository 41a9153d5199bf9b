//! A node's containerd with its CRI plugin, and the CRI client to it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use k8s_cri::v1 as api;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::containerd::{build_busybox_image, build_busybox_image_as, procs_matching, IMAGE_NAME};
use crate::Scratch;

use super::names::{ETC_CONTAINERD, NAMESPACE, PAUSE_IMAGE};
use super::release::ContainerdRelease;

pub(super) const START_TIMEOUT: Duration = Duration::from_secs(20);
pub(super) const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A node's containerd configuration tree and the containerd serving it.
/// `start` runs containerd on `<etc_root>/etc/containerd/config.toml`;
/// `stop` ends it, keeping its root (images, sandboxes); drop removes the
/// pods left, stops containerd and the shims it started (by PID), and
/// removes the pods' cgroups and every directory.
pub struct CriNode {
    pub dir: Scratch,
    /// The configuration tree's root: `etc/containerd` lies below it.
    pub etc_root: PathBuf,
    pub socket: PathBuf,
    /// The parent of every pod's cgroup (absolute, cgroupfs driver).
    pub cgroup_root: String,
    pub(super) path_dirs: Vec<PathBuf>,
    pub(super) env: Vec<(String, String)>,
    pub(super) child: Option<Child>,
    pub(super) channel: Option<Channel>,
    pub(super) tokio: tokio::runtime::Runtime,
    /// Pods and containers this node made, for the clean-up.
    pub(super) ids: Mutex<Vec<String>>,
    pub(super) images_imported: bool,
    /// containerd in its own network and IPC namespaces with a tmpfs over
    /// /run (`isolate`): pod networks, netns files, shim sockets stay private.
    pub(super) isolated: bool,
    /// The process that holds an isolated node's namespaces (and its /run)
    /// from its first start to the node's drop: a restarted containerd
    /// finds its shims, their sockets and the pods' netns files again, as
    /// on a node where /run outlives the daemon.
    pub(super) holder: Option<Child>,
    pub release: ContainerdRelease,
}

impl CriNode {
    /// A configuration tree holding a node's main `config.toml`: private
    /// root, state, sockets and CNI dirs, the CRI settings this sandbox needs
    /// (`restrict_oom_score_adj`, our pause image), the default handler
    /// `runc` — and `extra_toml` appended (more runtimes, as on a real node).
    /// `path_dirs` go first in containerd's PATH (where it finds a shim);
    /// `env` is added to its environment (shims and hooks inherit it).
    pub fn new(extra_toml: &str, path_dirs: &[PathBuf], env: &[(&str, &str)]) -> CriNode {
        CriNode::new_on(ContainerdRelease::V1_6, extra_toml, path_dirs, env)
    }

    /// The same node on `release` (its binaries, its config shape; the
    /// handler tables in `extra_toml` in its CRI runtime plugin:
    /// [`ContainerdRelease::handler_toml`]).
    pub fn new_on(
        release: ContainerdRelease,
        extra_toml: &str,
        path_dirs: &[PathBuf],
        env: &[(&str, &str)],
    ) -> CriNode {
        assert!(
            Path::new(ETC_CONTAINERD).is_dir(),
            "{ETC_CONTAINERD} is missing: the tests bind-mount over it (apt-get install containerd)"
        );
        let dir = Scratch::new("cri");
        let etc_root = dir.0.join("node");
        let etc = etc_root.join("etc/containerd");
        std::fs::create_dir_all(&etc).unwrap();
        let socket = dir.0.join("containerd.sock");
        let cgroup_root = format!("/tw-cri-{}-{}", std::process::id(), crate::unique());
        let config = format!("{}{extra_toml}\n", release.config(&dir.0, &socket));
        std::fs::write(etc.join("config.toml"), config).unwrap();
        let mut path_dirs = path_dirs.to_vec();
        path_dirs.extend(release.path_dirs());
        let tokio = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        CriNode {
            dir,
            etc_root,
            socket,
            cgroup_root,
            path_dirs,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            child: None,
            channel: None,
            tokio,
            ids: Mutex::new(vec![]),
            images_imported: false,
            isolated: false,
            holder: None,
            release,
        }
    }

    /// Run containerd (once started) in private network and IPC namespaces
    /// (its loopback up) with a private tmpfs over `/run`, so a CNI's
    /// bridge, the pods' netns files under `/run/netns`, everything
    /// containerd keeps under `/run/containerd` and the "host" IPC objects
    /// of host-IPC pods never reach the machine's. A client that needs
    /// containerd's loopback (the stream server) or its host IPC enters its
    /// namespaces: `nsenter_cmd`.
    pub fn isolate(&mut self) {
        assert!(self.child.is_none(), "isolate() before start()");
        self.isolated = true;
    }

    /// containerd's PID (the node must be running).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("containerd is not running").id()
    }

    /// `program` run in containerd's mount, network and IPC namespaces,
    /// with its root and working directory: entering a mount namespace
    /// resets the root to the namespace's own, which in the VM lane (tests
    /// chrooted into the host's tree) is not where the binaries are.
    pub fn nsenter_cmd(&self, program: &Path) -> Command {
        let pid = match &self.holder {
            Some(h) => h.id(),
            None => self.pid(),
        };
        let mut c = Command::new("nsenter");
        c.arg("-t")
            .arg(pid.to_string())
            .args(["--mount", "--net", "--ipc", "--root", "--wd", "--"])
            .arg(program);
        c
    }

    /// `<etc_root>/etc/containerd/config.toml`.
    pub fn config_path(&self) -> PathBuf {
        self.etc_root.join("etc/containerd/config.toml")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("containerd.log")).unwrap_or_default()
    }

    /// containerd on the tree's config.toml, in a private mount namespace
    /// with the tree's `etc/containerd` over /etc/containerd; returns once
    /// the CRI plugin answers. The first start imports the busybox and
    /// pause images into `k8s.io` and waits until the CRI lists them.
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "containerd is already running");
        let mut path = self
            .path_dirs
            .iter()
            .map(|d| d.to_string_lossy().into_owned())
            .collect::<Vec<_>>();
        path.push(std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into()));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.0.join("containerd.log"))
            .unwrap();
        // `unshare`/`nsenter` and `sh` exec: the PID is containerd's.
        let mut cmd = match self.isolated {
            true => {
                let holder = self.hold_namespaces();
                let mut c = Command::new("nsenter");
                c.arg("-t")
                    .arg(holder.to_string())
                    .args(["--mount", "--net", "--ipc", "--root", "--wd", "sh", "-c"])
                    .arg(r#"exec "$4" --config "$3""#);
                c
            }
            false => {
                let mut c = Command::new("unshare");
                c.args(["--mount", "--propagation", "private", "sh", "-c"])
                    .arg(r#"mount --bind "$1" "$2" && exec "$4" --config "$3""#);
                c
            }
        };
        let child = cmd
            .arg("sh")
            .arg(self.etc_root.join("etc/containerd"))
            .arg(ETC_CONTAINERD)
            .arg(self.config_path())
            .arg(self.release.containerd())
            .env("PATH", path.join(":"))
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("unshare (util-linux)");
        self.child = Some(child);
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                panic!("containerd exited ({st}):\n{}", self.log());
            }
            if self.socket.exists() {
                if let Ok(ch) = self.connect() {
                    let v = self.block(RuntimeServiceClient::new(ch.clone()).version(
                        api::VersionRequest {
                            version: "v1".into(),
                        },
                    ));
                    if v.is_ok() {
                        self.channel = Some(ch);
                        break;
                    }
                }
            }
            assert!(
                t0.elapsed() < START_TIMEOUT,
                "the CRI plugin did not answer on {} in {START_TIMEOUT:?}:\n{}",
                self.socket.display(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        if !self.images_imported {
            self.import_images();
            self.images_imported = true;
        }
    }

    /// The PID holding an isolated node's namespaces, started at the first
    /// call: private mount (the tree's `etc/containerd` over
    /// /etc/containerd, a tmpfs over /run), network (loopback up) and IPC.
    fn hold_namespaces(&mut self) -> u32 {
        if let Some(h) = &self.holder {
            return h.id();
        }
        let ready = self.dir.0.join("namespaces-ready");
        let child = Command::new("unshare")
            .args([
                "--mount",
                "--net",
                "--ipc",
                "--propagation",
                "private",
                "sh",
                "-c",
            ])
            .arg(concat!(
                r#"mount --bind "$1" "$2" && mount -t tmpfs -o mode=755 tmpfs /run && "#,
                r#"ip link set lo up && : > "$3" && exec sleep 2147483647"#
            ))
            .arg("sh")
            .arg(self.etc_root.join("etc/containerd"))
            .arg(ETC_CONTAINERD)
            .arg(&ready)
            .stdin(Stdio::null())
            .spawn()
            .expect("unshare (util-linux)");
        self.holder = Some(child);
        let t0 = Instant::now();
        while !ready.exists() {
            if let Some(st) = self.holder.as_mut().unwrap().try_wait().unwrap() {
                self.holder = None;
                panic!("the node's namespaces could not be set up ({st})");
            }
            assert!(
                t0.elapsed() < START_TIMEOUT,
                "the node's namespaces: not ready"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        self.holder.as_ref().unwrap().id()
    }

    /// Stop containerd (SIGTERM, then SIGKILL after 10 s); its shims and
    /// their containers keep running, as on a node.
    pub fn stop(&mut self) {
        self.channel = None;
        if let Some(mut c) = self.child.take() {
            crate::daemons::stop_child(&mut c, Duration::from_secs(10));
        }
    }

    fn connect(&self) -> Result<Channel, String> {
        let path = self.socket.clone();
        self.block(async move {
            Endpoint::try_from("http://[::]:50051")
                .map_err(|e| e.to_string())?
                .timeout(CALL_TIMEOUT)
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(
                            tokio::net::UnixStream::connect(path).await?,
                        ))
                    }
                }))
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn block<F: std::future::Future>(&self, f: F) -> F::Output {
        self.tokio.block_on(f)
    }

    fn channel(&self) -> Channel {
        self.channel
            .clone()
            .expect("containerd is not running: call start() first")
    }

    /// The CRI RuntimeService.
    pub fn runtime(&self) -> RuntimeServiceClient<Channel> {
        RuntimeServiceClient::new(self.channel())
    }

    /// The CRI ImageService.
    pub fn images(&self) -> ImageServiceClient<Channel> {
        ImageServiceClient::new(self.channel())
    }

    /// Run a CRI call to completion; a gRPC error as "CODE: message".
    pub fn call<T, F>(&self, what: &str, f: F) -> Result<T, String>
    where
        F: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.block(f)
            .map(tonic::Response::into_inner)
            .map_err(|s| format!("{what}: {:?}: {}", s.code(), s.message()))
    }

    /// `ctr -a SOCK -n k8s.io args…`
    pub fn ctr(&self, args: &[&str]) -> Output {
        Command::new(self.release.ctr())
            .arg("-a")
            .arg(&self.socket)
            .args(["-n", NAMESPACE])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("ctr")
    }

    fn import_images(&self) {
        for (name, cmd) in [
            (IMAGE_NAME, None),
            (PAUSE_IMAGE, Some(["sleep", "2147483647"])),
        ] {
            let d = Scratch::new("criimg");
            let tar = match cmd {
                None => build_busybox_image(&d.0),
                Some(c) => build_busybox_image_as(&d.0, name, &c),
            };
            let out = self.ctr(&["images", "import", tar.to_str().unwrap()]);
            assert!(
                out.status.success(),
                "ctr images import {name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            // The CRI plugin learns of images from containerd's events.
            let t0 = Instant::now();
            while !self.image_known(name) {
                assert!(
                    t0.elapsed() < START_TIMEOUT,
                    "the CRI plugin does not list {name}:\n{}",
                    self.log()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Whether the CRI ImageService knows `image`.
    pub fn image_known(&self, image: &str) -> bool {
        let req = api::ImageStatusRequest {
            image: Some(api::ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            verbose: false,
        };
        self.call("ImageStatus", self.images().image_status(req))
            .is_ok_and(|r| r.image.is_some())
    }

    /// The OCI bundle of a task of this containerd (sandbox or container).
    pub fn bundle(&self, id: &str) -> PathBuf {
        self.dir
            .0
            .join("state/io.containerd.runtime.v2.task")
            .join(NAMESPACE)
            .join(id)
    }

    /// The CRI plugin's own directories of a container or sandbox (its
    /// fifos and /dev/shm live in the volatile one).
    pub fn cri_dirs(&self, id: &str) -> Vec<PathBuf> {
        let mut v = vec![];
        for base in ["root", "state"] {
            for kind in ["containers", "sandboxes"] {
                v.push(
                    self.dir
                        .0
                        .join(base)
                        .join("io.containerd.grpc.v1.cri")
                        .join(kind)
                        .join(id),
                );
            }
        }
        v
    }

    /// Shim processes serving this containerd (any runtime: their command
    /// line names its socket).
    pub fn shim_pids(&self) -> Vec<u32> {
        let needle = self.socket.to_string_lossy().into_owned();
        procs_matching(|cmd| cmd.contains("containerd-shim") && cmd.contains(&needle))
    }

    /// runc state directories of `id` (the runc shim's and ours).
    pub fn runc_state_dirs(id: &str) -> [PathBuf; 2] {
        [
            Path::new("/run/containerd/runc").join(NAMESPACE).join(id),
            Path::new("/run/containerd/throttlewatch")
                .join(NAMESPACE)
                .join(id),
        ]
    }
}

impl Drop for CriNode {
    fn drop(&mut self) {
        if self.channel.is_some() {
            let pods = self.call(
                "ListPodSandbox",
                self.runtime()
                    .list_pod_sandbox(api::ListPodSandboxRequest { filter: None }),
            );
            for p in pods.map(|r| r.items).unwrap_or_default() {
                let id = p.id;
                let _ = self.call(
                    "StopPodSandbox",
                    self.runtime().stop_pod_sandbox(api::StopPodSandboxRequest {
                        pod_sandbox_id: id.clone(),
                    }),
                );
                let _ = self.call(
                    "RemovePodSandbox",
                    self.runtime()
                        .remove_pod_sandbox(api::RemovePodSandboxRequest { pod_sandbox_id: id }),
                );
            }
        }
        self.stop();
        for pid in self.shim_pids() {
            // SAFETY: kill(2) of shims this containerd started.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        // The namespaces (and the private /run) go with their last process.
        if let Some(mut h) = self.holder.take() {
            let _ = h.kill();
            let _ = h.wait();
        }
        for id in self.ids.lock().unwrap().iter() {
            for d in Self::runc_state_dirs(id) {
                let _ = std::fs::remove_dir_all(d);
            }
        }
        // The pods' cgroups in every hierarchy, deepest first.
        for ctrl in std::fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
        {
            remove_cgroup_tree(&ctrl.path().join(self.cgroup_root.trim_start_matches('/')));
        }
        // Mounts made in containerd's namespace went with it; any made here
        // (none expected) must not be descended into.
        crate::daemons::unmount_below(&self.dir.0);
    }
}

/// `<cni>/net.d/10-<name>.conflist`: a bridge network (`cni0`, the gateway,
/// no masquerade) with host-local IPAM on `subnet`, its leases in
/// `<cni>/ipam` — for a node whose containerd has a network namespace of
/// its own (`isolate`), as critest's pod-network specs need.
pub fn bridge_cni(cni: &Path, name: &str, subnet: &str) {
    std::fs::create_dir_all(cni.join("net.d")).unwrap();
    let conf = serde_json::json!({
        "cniVersion": "0.4.0",
        "name": name,
        "plugins": [{
            "type": "bridge",
            "bridge": "cni0",
            "isGateway": true,
            "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "ranges": [[{ "subnet": subnet }]],
                "routes": [{ "dst": "0.0.0.0/0" }],
                "dataDir": cni.join("ipam"),
            },
        }],
    });
    std::fs::write(
        cni.join(format!("net.d/10-{name}.conflist")),
        serde_json::to_vec_pretty(&conf).unwrap(),
    )
    .unwrap();
}

/// Kill what is left in a private cgroup tree (a test that failed midway),
/// then remove its directories, deepest first.
pub fn remove_cgroup_tree(dir: &Path) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup_tree(&e.path());
        }
    }
    let procs = || std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    let t0 = Instant::now();
    while !procs().trim().is_empty() && t0.elapsed() < Duration::from_secs(5) {
        for pid in procs()
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            // SAFETY: kill(2) of a process in this test's own cgroup.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_dir(dir);
}
