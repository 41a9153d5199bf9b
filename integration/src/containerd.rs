//! A private containerd for tests (own root, state, sockets, namespace; the
//! CRI plugin off) and a one-layer busybox image built here, as a tar that is
//! both an OCI layout and a docker-archive (`ctr images import`, `docker load`).

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::FromRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::Scratch;

pub const IMAGE_NAME: &str = "docker.io/library/twbusybox:latest";
pub const SHIM_RUNTIME: &str = "io.containerd.throttlewatch.v2";
pub const SHIM_BINARY: &str = "containerd-shim-throttlewatch-v2";

fn sh(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn sha256(path: &Path) -> String {
    let out = sh(Command::new("sha256sum").arg(path));
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// Store `file` as a blob; returns (digest, size).
fn blob(dir: &Path, file: &Path) -> (String, u64) {
    let hex = sha256(file);
    let size = std::fs::metadata(file).unwrap().len();
    std::fs::rename(file, dir.join("blobs/sha256").join(&hex)).unwrap();
    (format!("sha256:{hex}"), size)
}

fn write_json(path: &Path, v: &serde_json::Value) {
    std::fs::write(path, serde_json::to_vec(v).unwrap()).unwrap();
}

/// Build `<dir>/twbusybox.tar`: /bin/busybox (static) with every applet linked.
pub fn build_busybox_image(dir: &Path) -> PathBuf {
    build_busybox_image_as(dir, IMAGE_NAME, &["sh"])
}

/// The same image as `name` (`docker.io/library/NAME:TAG`) with `cmd` as its
/// command, in `<dir>/NAME.tar` (e.g. a pause image: `sleep` as pid 1).
pub fn build_busybox_image_as(dir: &Path, name: &str, cmd: &[&str]) -> PathBuf {
    let short = name.strip_prefix("docker.io/library/").unwrap_or(name);
    let base = short.rsplit('/').next().unwrap_or(short);
    let file = base.split(['@', ':']).next().unwrap_or(base);
    let busybox = Path::new("/bin/busybox");
    assert!(busybox.exists(), "apt-get install busybox-static");
    let root = dir.join("rootfs");
    for d in ["bin", "etc", "tmp", "proc", "sys", "dev"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::copy(busybox, root.join("bin/busybox")).unwrap();
    let list = sh(Command::new(busybox).arg("--list"));
    for applet in String::from_utf8_lossy(&list.stdout)
        .lines()
        .filter(|a| *a != "busybox")
    {
        let _ = std::os::unix::fs::symlink("busybox", root.join("bin").join(applet));
    }
    // A caller's own /etc/passwd (files put under `<dir>/rootfs` first) stays.
    if !root.join("etc/passwd").exists() {
        std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/:/bin/sh\n").unwrap();
    }
    let oci = dir.join("oci");
    std::fs::create_dir_all(oci.join("blobs/sha256")).unwrap();
    let layer = dir.join("layer.tar");
    sh(Command::new("tar")
        .args(["--numeric-owner", "--owner=0", "--group=0", "-C"])
        .arg(&root)
        .arg("-cf")
        .arg(&layer)
        .arg("."));
    let (layer_digest, layer_size) = blob(&oci, &layer);
    let config = dir.join("config.json");
    write_json(
        &config,
        &serde_json::json!({
            "architecture": "amd64", "os": "linux",
            "config": { "Env": ["PATH=/bin"], "Cmd": cmd },
            "rootfs": { "type": "layers", "diff_ids": [layer_digest] },
        }),
    );
    let (config_digest, config_size) = blob(&oci, &config);
    let manifest = dir.join("manifest");
    write_json(
        &manifest,
        &serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": { "mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config_size },
            "layers": [{ "mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest, "size": layer_size }],
        }),
    );
    let (manifest_digest, manifest_size) = blob(&oci, &manifest);
    std::fs::write(oci.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    write_json(
        &oci.join("index.json"),
        &serde_json::json!({
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest, "size": manifest_size,
                "annotations": { "io.containerd.image.name": name, "org.opencontainers.image.ref.name": short.rsplit(':').next() },
            }],
        }),
    );
    // docker-archive view of the same blobs.
    let hex = |d: &str| format!("blobs/sha256/{}", d.trim_start_matches("sha256:"));
    write_json(
        &oci.join("manifest.json"),
        &serde_json::json!([{
            "Config": hex(&config_digest), "RepoTags": [short], "Layers": [hex(&layer_digest)],
        }]),
    );
    let tar = dir.join(format!("{file}.tar"));
    sh(Command::new("tar")
        .arg("-C")
        .arg(&oci)
        .arg("-cf")
        .arg(&tar)
        .args(["oci-layout", "index.json", "manifest.json", "blobs"]));
    tar
}

/// containerd with a private config; stopped by PID (with the shims it
/// started) and its directories removed on drop.
pub struct Containerd {
    pub dir: Scratch,
    pub socket: PathBuf,
    pub namespace: String,
    child: Child,
    ctr: PathBuf,
}

impl Containerd {
    /// Debian's containerd 1.6. `path_dirs` go first in containerd's PATH
    /// (where it finds our shim); `env` is added to its environment (the
    /// shim and hooks inherit it).
    pub fn start(path_dirs: &[PathBuf], env: &[(&str, &str)]) -> Containerd {
        Containerd::start_bin(
            Path::new("containerd"),
            Path::new("ctr"),
            "",
            path_dirs,
            env,
        )
    }

    /// containerd 2.3.4 and its ctr from ../shared/bin, with its runc shim
    /// on PATH after `path_dirs` (Debian's is 1.6's) and NRI off (its
    /// default socket is node-wide).
    pub fn start_2x(path_dirs: &[PathBuf], env: &[(&str, &str)]) -> Containerd {
        let shared = crate::shared_bin("containerd-shim-runc-v2");
        let mut dirs = path_dirs.to_vec();
        dirs.push(shared.parent().unwrap().to_path_buf());
        Containerd::start_bin(
            &crate::shared_bin("containerd"),
            &crate::shared_bin("ctr"),
            ", \"io.containerd.nri.v1.nri\"",
            &dirs,
            env,
        )
    }

    fn start_bin(
        containerd: &Path,
        ctr: &Path,
        more_disabled: &str,
        path_dirs: &[PathBuf],
        env: &[(&str, &str)],
    ) -> Containerd {
        let dir = Scratch::new("ctd");
        let socket = dir.0.join("containerd.sock");
        let config = dir.0.join("config.toml");
        let p = |s: &str| dir.0.join(s).to_string_lossy().into_owned();
        std::fs::write(
            &config,
            format!(
                "version = 2\nroot = \"{}\"\nstate = \"{}\"\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"{more_disabled}]\n\
                 [grpc]\n  address = \"{}\"\n[ttrpc]\n  address = \"{}.ttrpc\"\n\
                 [plugins.\"io.containerd.internal.v1.opt\"]\n  path = \"{}\"\n",
                p("root"),
                p("state"),
                socket.display(),
                socket.display(),
                p("opt")
            ),
        )
        .unwrap();
        let mut path = path_dirs
            .iter()
            .map(|d| d.to_string_lossy().into_owned())
            .collect::<Vec<_>>();
        path.push(std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into()));
        let log = std::fs::File::create(dir.0.join("containerd.log")).unwrap();
        let child = Command::new(containerd)
            .arg("--config")
            .arg(&config)
            .env("PATH", path.join(":"))
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("containerd (apt-get install containerd)");
        let namespace = format!("tw{}x{}", std::process::id(), crate::unique());
        let c = Containerd {
            dir,
            socket,
            namespace,
            child,
            ctr: ctr.to_path_buf(),
        };
        let t0 = Instant::now();
        while !c.ctr(&["version"]).status.success() {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "containerd did not come up: {}",
                c.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        c
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("containerd.log")).unwrap_or_default()
    }

    /// `ctr -a SOCK -n NS args…`
    pub fn ctr_cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.ctr);
        c.arg("-a")
            .arg(&self.socket)
            .arg("-n")
            .arg(&self.namespace)
            .args(args)
            .stdin(Stdio::null());
        c
    }

    pub fn ctr(&self, args: &[&str]) -> Output {
        self.ctr_cmd(args).output().expect("ctr")
    }

    pub fn import(&self, tar: &Path) {
        let out = self.ctr(&["images", "import", tar.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "import: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// PIDs of shim processes serving this containerd.
    pub fn shim_pids(&self) -> Vec<u32> {
        let needle = self.socket.to_string_lossy().into_owned();
        procs_matching(|cmd| cmd.contains(SHIM_BINARY) && cmd.contains(&needle))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `ctr args…` on a new pty of `rows`×`cols` (its stdio and controlling
    /// terminal, as `ctr -t` needs). `input` is typed once `ready` shows in
    /// the output (at once when `ready` is empty). Returns the output and
    /// ctr's exit code (None: killed after `timeout`).
    pub fn ctr_on_pty(
        &self,
        args: &[&str],
        (rows, cols): (u16, u16),
        ready: &str,
        input: &[u8],
        timeout: Duration,
    ) -> (String, Option<i32>) {
        let (master, slave) = openpty(rows, cols);
        let mut cmd = self.ctr_cmd(args);
        cmd.stdin(slave.try_clone().unwrap())
            .stdout(slave.try_clone().unwrap())
            .stderr(slave);
        // SAFETY: setsid and TIOCSCTTY between fork and exec, async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("ctr");
        drop(cmd); // our copies of the slave: EIO on the master once ctr is gone
        let (tx, rx) = mpsc::channel::<Vec<u8>>();
        let mut reader = master.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = reader.read(&mut buf) {
                if tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        let mut out = Vec::new();
        let t0 = Instant::now();
        let mut typed = input.is_empty();
        let code = loop {
            while let Ok(chunk) = rx.recv_timeout(Duration::from_millis(20)) {
                out.extend_from_slice(&chunk);
            }
            if !typed && (ready.is_empty() || String::from_utf8_lossy(&out).contains(ready)) {
                (&master).write_all(input).unwrap();
                typed = true;
            }
            if let Some(st) = child.try_wait().unwrap() {
                break st.code();
            }
            if t0.elapsed() > timeout {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        };
        // What ctr wrote before it exited.
        while let Ok(chunk) = rx.recv_timeout(Duration::from_millis(500)) {
            out.extend_from_slice(&chunk);
        }
        (String::from_utf8_lossy(&out).into_owned(), code)
    }
}

/// A pty pair (master with close-on-exec) of the given window size.
fn openpty(rows: u16, cols: u16) -> (File, File) {
    let (mut m, mut s) = (0, 0);
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: openpty(3) with valid out-pointers and a winsize; the fds become ours.
    unsafe {
        assert_eq!(
            libc::openpty(&mut m, &mut s, std::ptr::null_mut(), std::ptr::null(), &ws),
            0,
            "openpty"
        );
        libc::fcntl(m, libc::F_SETFD, libc::FD_CLOEXEC);
        (File::from_raw_fd(m), File::from_raw_fd(s))
    }
}

/// PIDs whose NUL-separated cmdline (joined by spaces) satisfies `f`.
pub fn procs_matching(f: impl Fn(&str) -> bool) -> Vec<u32> {
    let mut pids = vec![];
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(raw) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&raw).replace('\0', " ");
        if f(&cmd) {
            pids.push(pid);
        }
    }
    pids
}

/// VmRSS of a process in kB.
pub fn vm_rss_kb(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Pss of a process in kB (`/proc/<pid>/smaps_rollup`).
pub fn pss_kb(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    s.lines()
        .find(|l| l.starts_with("Pss:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Number of threads of a process.
pub fn threads(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with("Threads:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// "VmRSS N kB, Pss N kB, N threads" of a process, for test output.
pub fn mem_summary(pid: u32) -> String {
    let f = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_else(|| "?".into());
    format!(
        "VmRSS {} kB, Pss {} kB, {} threads",
        f(vm_rss_kb(pid)),
        f(pss_kb(pid)),
        f(threads(pid))
    )
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // Every shim serving this containerd, the runc shim's too (a task
        // killed but not deleted keeps its shim).
        let needle = self.socket.to_string_lossy().into_owned();
        for pid in procs_matching(|cmd| cmd.contains("containerd-shim") && cmd.contains(&needle)) {
            // SAFETY: kill(2) of shims this containerd started.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        // SAFETY: kill(2) of the containerd we started.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let t0 = Instant::now();
        while self.child.try_wait().ok().flatten().is_none()
            && t0.elapsed() < Duration::from_secs(5)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Leftover mounts (snapshots, rootfs) under our dirs, deepest first.
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let prefix = self.dir.0.to_string_lossy().into_owned();
        let mut ours: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|m| m.starts_with(&prefix))
            .collect();
        ours.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in ours {
            let _ = Command::new("umount").arg("-l").arg(m).status();
        }
        let _ = std::fs::remove_dir_all(
            Path::new("/run/containerd/throttlewatch").join(&self.namespace),
        );
        // The namespace's cgroup parent, which runc never removes: in every
        // mounted hierarchy (v1 controllers, the named systemd one, unified)
        // and at the root of a pure v2 tree. Empty directories only.
        let root = Path::new("/sys/fs/cgroup");
        let _ = std::fs::remove_dir(root.join(&self.namespace));
        for h in std::fs::read_dir(root).into_iter().flatten().flatten() {
            let _ = std::fs::remove_dir(h.path().join(&self.namespace));
        }
    }
}
