//! busybox-static OCI bundles for the runtime tests, an OCI-runtime CLI with
//! a private `--root`, and a one-layer busybox image tar (docker-archive and
//! OCI layout at once) for `docker load` / `ctr images import`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{json, Value};

use crate::Scratch;

/// Debian's busybox-static.
pub const BUSYBOX: &str = "/bin/busybox";
/// Every test container's cgroup lies below this (absolute cgroupsPath).
/// Test containers' cgroups sit directly below the root, `/tw-test-<id>…`:
/// runc removes a container's own directory on delete, never a parent, so a
/// shared parent directory would be left behind in every v1 hierarchy.
pub const CGROUP_PREFIX: &str = "/tw-test-";
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// What the container runs and with which limits.
#[derive(Debug, Clone)]
pub struct ContainerOpts {
    pub args: Vec<String>,
    pub env: Vec<String>,
    pub annotations: BTreeMap<String, String>,
    /// µs per period; None: no quota.
    pub quota_us: Option<i64>,
    pub period_us: u64,
}

impl Default for ContainerOpts {
    fn default() -> Self {
        ContainerOpts {
            args: vec!["sleep".into(), "30".into()],
            env: vec![],
            annotations: BTreeMap::new(),
            quota_us: None,
            period_us: 100_000,
        }
    }
}

impl ContainerOpts {
    /// `sh -c SCRIPT`.
    pub fn sh(script: &str) -> ContainerOpts {
        ContainerOpts {
            args: vec!["sh".into(), "-c".into(), script.into()],
            ..Default::default()
        }
    }

    /// `threads` busy loops for `secs` seconds, then exit.
    pub fn busy(threads: u32, secs: u32) -> ContainerOpts {
        let loops: Vec<String> = (0..threads)
            .map(|_| "(while :; do :; done) &".to_string())
            .collect();
        Self::sh(&format!(
            "{} sleep {secs}; kill $(jobs -p) 2>/dev/null; true",
            loops.join(" ")
        ))
    }

    pub fn quota(mut self, quota_us: i64, period_us: u64) -> Self {
        self.quota_us = Some(quota_us);
        self.period_us = period_us;
        self
    }

    pub fn annotation(mut self, k: &str, v: &str) -> Self {
        self.annotations.insert(k.into(), v.into());
        self
    }

    pub fn env(mut self, kv: &str) -> Self {
        self.env.push(kv.into());
        self
    }
}

/// A bundle that runs the host-built `tw-burn ARGS` (copied into the
/// rootfs, the host's libraries bound read-only), named `tw-<tag>-<pid>-<n>`;
/// `opts` gives the rest (quota, annotations), its `args` are replaced.
pub fn tw_burn_bundle(tag: &str, args: &[&str], mut opts: ContainerOpts) -> Bundle {
    opts.args = std::iter::once("/tw-burn".to_string())
        .chain(args.iter().map(|a| a.to_string()))
        .collect();
    let b = Bundle::new(
        &format!("tw-{tag}-{}-{}", std::process::id(), crate::unique()),
        &opts,
    );
    add_tw_burn(&b);
    b
}

/// Put the host-built tw-burn in `b` as `/tw-burn`, the host's libraries
/// bound read-only for it.
pub fn add_tw_burn(b: &Bundle) {
    std::fs::copy(crate::bin("tw-burn"), b.dir().join("rootfs/tw-burn")).unwrap();
    b.edit(|v| {
        let mounts = v["mounts"].as_array_mut().unwrap();
        for d in ["/lib", "/lib64", "/usr/lib"] {
            if Path::new(d).exists() {
                std::fs::create_dir_all(b.dir().join("rootfs").join(d.trim_start_matches('/')))
                    .unwrap();
                mounts.push(json!({"destination": d, "type": "bind", "source": d, "options": ["rbind", "ro"]}));
            }
        }
    });
}

/// Fill `dir` with a busybox-static root filesystem.
pub fn populate_rootfs(dir: &Path) {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for d in ["proc", "sys", "dev", "tmp", "etc", "root"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    std::fs::copy(BUSYBOX, bin.join("busybox"))
        .unwrap_or_else(|e| panic!("{BUSYBOX}: {e} (apt-get install busybox-static)"));
    let list = Command::new(BUSYBOX).arg("--list").output().unwrap();
    for applet in String::from_utf8_lossy(&list.stdout)
        .lines()
        .filter(|a| *a != "busybox" && !a.is_empty())
    {
        let _ = std::os::unix::fs::symlink("busybox", bin.join(applet));
    }
    std::fs::write(dir.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    std::fs::write(dir.join("etc/group"), "root:x:0:\n").unwrap();
}

/// An OCI bundle in a temporary directory; on drop the directory and the
/// container's (empty) cgroup directories are removed.
pub struct Bundle {
    pub scratch: Scratch,
    pub id: String,
    /// Absolute cgroupsPath, `/tw-test-<escaped id>-<pid>-<n>`.
    pub cgroup_path: String,
}

impl Bundle {
    pub fn new(id: &str, opts: &ContainerOpts) -> Bundle {
        let scratch = Scratch::new("bundle");
        populate_rootfs(&scratch.0.join("rootfs"));
        let out = Command::new("runc")
            .args(["spec", "--bundle"])
            .arg(&scratch.0)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "runc spec: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let safe: String = id
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let cgroup_path = format!(
            "{CGROUP_PREFIX}{safe}-{}-{}",
            std::process::id(),
            crate::unique()
        );
        let b = Bundle {
            scratch,
            id: id.into(),
            cgroup_path,
        };
        b.edit(|v| {
            v["process"]["terminal"] = json!(false);
            v["process"]["args"] = json!(opts.args);
            let env = v["process"]["env"].as_array_mut().unwrap();
            env.extend(opts.env.iter().map(|e| json!(e)));
            v["root"] = json!({"path": "rootfs", "readonly": true});
            v["hostname"] = json!("tw");
            v["annotations"] = json!(opts.annotations);
            v["linux"]["cgroupsPath"] = json!(b.cgroup_path);
            let mut cpu = json!({"period": opts.period_us});
            if let Some(q) = opts.quota_us {
                cpu["quota"] = json!(q);
            }
            v["linux"]["resources"]["cpu"] = cpu;
        });
        b
    }

    pub fn dir(&self) -> &Path {
        &self.scratch.0
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir().join("config.json")
    }

    pub fn config(&self) -> Value {
        serde_json::from_slice(&std::fs::read(self.config_path()).unwrap()).unwrap()
    }

    pub fn edit(&self, f: impl FnOnce(&mut Value)) {
        let mut v = self.config();
        f(&mut v);
        std::fs::write(self.config_path(), serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    }

    /// The container's cpu cgroup, in whatever layout the host has (v1 or v2).
    pub fn group(&self) -> throttlewatch_cgroup::CpuCgroup {
        let h = throttlewatch_cgroup::Hierarchies::discover().expect("cgroup hierarchies");
        throttlewatch_cgroup::CpuCgroup::at(&h, &self.cgroup_path)
    }

    fn limits(&self) -> throttlewatch_cgroup::CpuLimits {
        let g = self.group();
        g.limits()
            .unwrap_or_else(|e| panic!("{}: {e}", g.cpu_dir.display()))
    }

    /// The CFS quota (µs) as the kernel has it; None: no quota.
    pub fn quota_us(&self) -> Option<u64> {
        self.limits().quota_us
    }

    /// The CFS burst (µs): `cpu.cfs_burst_us` (v1) or `cpu.max.burst` (v2).
    pub fn burst_us(&self) -> u64 {
        self.limits()
            .burst_us
            .expect("this kernel has a CFS burst file")
    }

    /// Throttled time of the container's `cpu.stat`, ns (v1 `throttled_time`,
    /// v2 `throttled_usec`).
    pub fn throttled_ns(&self) -> u64 {
        let g = self.group();
        g.cpu_stat()
            .unwrap_or_else(|e| panic!("{}: {e}", g.cpu_dir.display()))
            .throttled_ns
    }
}

impl Drop for Bundle {
    fn drop(&mut self) {
        let rel = self.cgroup_path.trim_start_matches('/');
        // v2: one tree; v1: one per controller.
        let _ = std::fs::remove_dir(Path::new(CGROUP_ROOT).join(rel));
        for ctrl in std::fs::read_dir(CGROUP_ROOT)
            .into_iter()
            .flatten()
            .flatten()
        {
            let _ = std::fs::remove_dir(ctrl.path().join(rel));
        }
    }
}

/// An OCI runtime CLI (runc or our wrapper) with a private `--root`.
pub struct OciCli {
    pub bin: PathBuf,
    pub root: Scratch,
    /// Global flags before `--root` (e.g. `--throttlewatch-config FILE`).
    pub global: Vec<String>,
    started: std::sync::Mutex<Vec<String>>,
}

impl OciCli {
    pub fn new(bin: impl Into<PathBuf>) -> OciCli {
        OciCli {
            bin: bin.into(),
            root: Scratch::new("ociroot"),
            global: vec![],
            started: Default::default(),
        }
    }

    pub fn command(&self) -> Command {
        let mut c = Command::new(&self.bin);
        c.args(&self.global).arg("--root").arg(&self.root.0);
        c
    }

    /// Run a subcommand; the container inherits stdout/stderr, so they go to
    /// files (a pipe would stay open as long as the container runs).
    pub fn run(&self, args: &[&str]) -> Output {
        let out = self.root.0.join(format!("out-{}", crate::unique()));
        let err = self.root.0.join(format!("err-{}", crate::unique()));
        let st = self
            .command()
            .args(args)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .status()
            .unwrap();
        Output {
            status: st,
            stdout: std::fs::read(&out).unwrap_or_default(),
            stderr: std::fs::read(&err).unwrap_or_default(),
        }
    }

    /// `run -d --bundle B ID`; the container is deleted on drop.
    pub fn run_detached(&self, b: &Bundle) -> Output {
        self.started.lock().unwrap().push(b.id.clone());
        self.run(&["run", "-d", "--bundle", b.dir().to_str().unwrap(), &b.id])
    }

    /// `create --bundle B ID` (`start ID` runs it); deleted on drop.
    pub fn create(&self, b: &Bundle) -> Output {
        self.started.lock().unwrap().push(b.id.clone());
        self.run(&["create", "--bundle", b.dir().to_str().unwrap(), &b.id])
    }

    pub fn delete(&self, id: &str) -> Output {
        self.run(&["delete", id])
    }

    /// The container's `status` from `state`, or None when it does not exist.
    pub fn status(&self, id: &str) -> Option<String> {
        let o = self.run(&["state", id]);
        let v: Value = serde_json::from_slice(&o.stdout).ok()?;
        v["status"].as_str().map(str::to_string)
    }

    /// Wait until the container has stopped (its workload finished).
    pub fn wait_stopped(&self, id: &str, timeout: std::time::Duration) {
        let t = std::time::Instant::now();
        while self.status(id).as_deref() == Some("running") {
            assert!(
                t.elapsed() < timeout,
                "container {id} still running after {timeout:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

impl Drop for OciCli {
    fn drop(&mut self) {
        for id in self.started.lock().unwrap().iter() {
            let _ = Command::new("runc")
                .arg("--root")
                .arg(&self.root.0)
                .args(["delete", "-f", id])
                .output();
        }
    }
}

/// Output as text, for assertion messages.
pub fn text(o: &Output) -> String {
    format!(
        "status {}; stdout {}; stderr {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn sha256_file(p: &Path) -> String {
    let o = Command::new("sha256sum").arg(p).output().unwrap();
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// A one-layer busybox image `tag` as a tar in `dir` that is both a
/// docker-archive (manifest.json) and an OCI image layout (index.json).
pub fn busybox_image_tar(dir: &Path, tag: &str) -> PathBuf {
    let root = dir.join("image");
    let blobs = root.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let layer_root = dir.join("layer");
    populate_rootfs(&layer_root);
    let layer = dir.join("layer.tar");
    let st = Command::new("tar")
        .arg("-C")
        .arg(&layer_root)
        .args(["--numeric-owner", "-cf"])
        .arg(&layer)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success(), "tar of the layer");
    let layer_hex = sha256_file(&layer);
    let layer_size = std::fs::metadata(&layer).unwrap().len();
    std::fs::rename(&layer, blobs.join(&layer_hex)).unwrap();
    let config = json!({
        "architecture": "amd64", "os": "linux", "created": "2024-01-01T00:00:00Z",
        "config": {"Cmd": ["sh"], "Env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_hex}")]},
        "history": [{"created": "2024-01-01T00:00:00Z", "created_by": "throttlewatch tests"}],
    });
    let put = |bytes: Vec<u8>| -> (String, u64) {
        let tmp = dir.join("blob.tmp");
        std::fs::write(&tmp, &bytes).unwrap();
        let hex = sha256_file(&tmp);
        std::fs::rename(&tmp, blobs.join(&hex)).unwrap();
        (hex, bytes.len() as u64)
    };
    let (config_hex, config_size) = put(serde_json::to_vec(&config).unwrap());
    let manifest = json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": format!("sha256:{config_hex}"), "size": config_size},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": format!("sha256:{layer_hex}"), "size": layer_size}],
    });
    let (man_hex, man_size) = put(serde_json::to_vec(&manifest).unwrap());
    let name = if tag.contains(':') {
        tag.to_string()
    } else {
        format!("{tag}:latest")
    };
    let index = json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": format!("sha256:{man_hex}"), "size": man_size,
                       "annotations": {"io.containerd.image.name": format!("docker.io/library/{name}"), "org.opencontainers.image.ref.name": name.rsplit(':').next().unwrap()}}],
    });
    std::fs::write(root.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    std::fs::write(root.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let docker_manifest = json!([{
        "Config": format!("blobs/sha256/{config_hex}"),
        "RepoTags": [name],
        "Layers": [format!("blobs/sha256/{layer_hex}")],
    }]);
    std::fs::write(
        root.join("manifest.json"),
        serde_json::to_vec(&docker_manifest).unwrap(),
    )
    .unwrap();
    let out = dir.join("busybox-image.tar");
    let st = Command::new("tar")
        .arg("-C")
        .arg(&root)
        .arg("-cf")
        .arg(&out)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success(), "tar of the image");
    out
}
