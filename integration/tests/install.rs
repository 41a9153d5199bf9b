//! `throttlewatch install|uninstall` checked against the real engines: for
//! each fixture (Debian's containerd 1.6 `config default`; the same with
//! SystemdCgroup and an nvidia runtime; a config whose drop-in holds the CRI
//! table; no config at all) the real binary installs into a temporary etc
//! tree, the real containerd 1.6 starts on exactly those files — in a private
//! mount namespace with the tree bound over /etc/containerd, so absolute
//! imports resolve, with its own root, state and sockets — and its CRI plugin
//! must load (`ctr plugins ls`: ok) with runc, the other runtimes and ours in
//! `containerd config dump`. Uninstall must give the files back byte for byte.
//! The same for dockerd 20.10 and a daemon.json with an nvidia runtime.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use throttlewatch_integration::daemons::{stop_child, unmount_below, DOCKER_API_VERSION};
use throttlewatch_integration::{bin, Scratch};

const CRI: &str = "io.containerd.grpc.v1.cri";

fn fixtures(engine: &str, name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(engine)
        .join(name)
}

fn text(o: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// Every file under `dir` with its bytes.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                out.push((e.path(), std::fs::read(e.path()).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// The real `throttlewatch` binary, `install|uninstall ENGINE --etc-root ROOT`.
fn throttlewatch(verb: &str, engine: &str, root: &Path, extra: &[&str]) -> Output {
    let o = Command::new(bin("throttlewatch"))
        .args([verb, engine, "--etc-root"])
        .arg(root)
        .args(extra)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "throttlewatch {verb} {engine}: {}",
        text(&o)
    );
    o
}

/// `sh -c SCRIPT` in a private mount namespace where `etc` is bound over
/// /etc/containerd (the host's stays untouched); `$1…` are `args`.
fn in_private_etc(etc: &Path, script: &str, args: &[&Path]) -> Command {
    std::fs::create_dir_all("/etc/containerd").unwrap();
    let mut c = Command::new("unshare");
    c.args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!("mount --bind \"$0\" /etc/containerd && {script}"))
        .arg(etc)
        .args(args);
    c
}

/// The real containerd on the installed configuration; killed by PID on drop.
struct Containerd {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
}

impl Containerd {
    fn start(etc: &Path, dir: &Path) -> Containerd {
        std::fs::create_dir_all(dir).unwrap();
        let (root, state, socket, log) = (
            dir.join("root"),
            dir.join("state"),
            dir.join("c.sock"),
            dir.join("containerd.log"),
        );
        let out = std::fs::File::create(&log).unwrap();
        // `unshare` and `sh` exec: the PID we get is containerd's.
        let child = in_private_etc(
            etc,
            "exec containerd --config /etc/containerd/config.toml --root \"$1\" --state \"$2\" --address \"$3\"",
            &[&root, &state, &socket],
        )
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("unshare, containerd (apt-get install containerd)");
        let mut c = Containerd { child, socket, log };
        let t0 = Instant::now();
        while !c.ctr(&["version"]).status.success() {
            if let Ok(Some(st)) = c.child.try_wait() {
                panic!("containerd exited ({st}): {}", c.log());
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "containerd did not come up: {}",
                c.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        c
    }

    fn ctr(&self, args: &[&str]) -> Output {
        Command::new("ctr")
            .arg("-a")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The status column of the CRI plugin in `ctr plugins ls`.
    fn cri_status(&self) -> String {
        let o = self.ctr(&["plugins", "ls"]);
        assert!(o.status.success(), "ctr plugins ls: {}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        out.lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|f| f.len() >= 4 && f[0] == "io.containerd.grpc.v1" && f[1] == "cri")
            .map(|f| f[3].to_string())
            .unwrap_or_else(|| panic!("no cri plugin in:\n{out}"))
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        stop_child(&mut self.child, Duration::from_secs(5));
    }
}

/// `containerd config dump` of the configuration under `etc`.
fn config_dump(etc: &Path) -> String {
    let o = in_private_etc(
        etc,
        "exec containerd --config /etc/containerd/config.toml config dump",
        &[],
    )
    .output()
    .unwrap();
    assert!(o.status.success(), "containerd config dump: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The `key = value` lines of `[header]` in a dump (up to the next header).
fn section(dump: &str, header: &str) -> Option<Vec<String>> {
    let want = format!("[{header}]");
    let mut lines = dump.lines().skip_while(|l| l.trim() != want);
    lines.next()?;
    Some(
        lines
            .take_while(|l| !l.trim_start().starts_with('['))
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect(),
    )
}

fn runtime(dump: &str, name: &str) -> Option<Vec<String>> {
    section(
        dump,
        &format!("plugins.\"{CRI}\".containerd.runtimes.{name}"),
    )
}

fn options(dump: &str, name: &str) -> Vec<String> {
    section(
        dump,
        &format!("plugins.\"{CRI}\".containerd.runtimes.{name}.options"),
    )
    .unwrap_or_default()
}

fn has(lines: &[String], line: &str) -> bool {
    lines.iter().any(|l| l == line)
}

/// Install into a copy of `fixture` (None: no configuration at all), start
/// containerd on it, check the CRI plugin and the runtimes, uninstall.
fn install_then_containerd(fixture: Option<&str>, systemd: bool, nvidia: bool) {
    let dir = Scratch::new("install");
    let root = dir.0.join("fsroot");
    let etc = root.join("etc/containerd");
    match fixture {
        Some(f) => copy_tree(&fixtures("containerd", f), &etc),
        None => std::fs::create_dir_all(root.join("etc")).unwrap(),
    }
    let before = snapshot(&root);

    let dry = throttlewatch("install", "containerd", &root, &["--dry-run"]);
    let shown = String::from_utf8_lossy(&dry.stdout);
    assert!(
        shown.contains("runtime_type = \"io.containerd.throttlewatch.v2\"")
            && shown.contains("(dry run: nothing written)"),
        "{}",
        text(&dry)
    );
    assert_eq!(snapshot(&root), before, "--dry-run wrote something");

    throttlewatch("install", "containerd", &root, &[]);
    let again = throttlewatch("install", "containerd", &root, &[]);
    assert!(
        String::from_utf8_lossy(&again.stdout).contains("already installed"),
        "{}",
        text(&again)
    );

    let dump = config_dump(&etc);
    let runc = runtime(&dump, "runc").unwrap_or_else(|| panic!("no runc in the dump:\n{dump}"));
    assert!(
        has(&runc, "runtime_type = \"io.containerd.runc.v2\""),
        "{runc:?}"
    );
    // SystemdCgroup where the fixture had it; containerd's default (false) elsewhere.
    let runc_options = options(&dump, "runc");
    assert_eq!(
        has(&runc_options, "SystemdCgroup = true"),
        systemd,
        "{runc_options:?}"
    );
    if nvidia {
        let nv =
            runtime(&dump, "nvidia").unwrap_or_else(|| panic!("no nvidia in the dump:\n{dump}"));
        assert!(
            has(&nv, "runtime_type = \"io.containerd.runc.v2\""),
            "{nv:?}"
        );
        let o = options(&dump, "nvidia");
        assert!(
            has(&o, "BinaryName = \"/usr/bin/nvidia-container-runtime\""),
            "{o:?}"
        );
        assert!(has(&o, "SystemdCgroup = true"), "{o:?}");
    }
    let ours = runtime(&dump, "throttlewatch")
        .unwrap_or_else(|| panic!("no throttlewatch in the dump:\n{dump}"));
    assert!(
        has(&ours, "runtime_type = \"io.containerd.throttlewatch.v2\""),
        "{ours:?}"
    );
    assert!(
        has(&ours, "pod_annotations = [\"throttlewatch.io/*\"]"),
        "{ours:?}"
    );
    assert!(
        has(&ours, "container_annotations = [\"throttlewatch.io/*\"]"),
        "{ours:?}"
    );
    let ctd = section(&dump, &format!("plugins.\"{CRI}\".containerd")).unwrap();
    assert!(has(&ctd, "default_runtime_name = \"runc\""), "{ctd:?}");

    let c = Containerd::start(&etc, &dir.0);
    assert_eq!(c.cri_status(), "ok", "containerd log:\n{}", c.log());
    drop(c);

    throttlewatch("uninstall", "containerd", &root, &[]);
    assert_eq!(
        snapshot(&root),
        before,
        "uninstall must give every file back byte for byte"
    );
}

#[test]
fn debian_default_config() {
    install_then_containerd(Some("debian-1.6-default"), false, false);
}

#[test]
fn systemd_cgroup_and_nvidia_runtime() {
    install_then_containerd(Some("systemd-nvidia"), true, true);
}

#[test]
fn config_importing_drop_ins() {
    install_then_containerd(Some("imports"), true, true);
}

#[test]
fn no_config_at_all() {
    install_then_containerd(None, false, false);
}

/// The failure of issue 17, reproduced with the real containerd, then repaired:
/// a drop-in with only our runtime (what older versions wrote) takes the CRI
/// plugin down; install moves it aside and the plugin loads again.
#[test]
fn an_older_drop_in_breaks_cri_and_install_repairs_it() {
    let dir = Scratch::new("install-legacy");
    let root = dir.0.join("fsroot");
    let etc = root.join("etc/containerd");
    copy_tree(&fixtures("containerd", "imports"), &etc);
    std::fs::write(
        etc.join("conf.d/throttlewatch.toml"),
        "version = 2\n\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.throttlewatch]\n  \
         runtime_type = \"io.containerd.throttlewatch.v2\"\n  pod_annotations = [\"throttlewatch.io/*\"]\n  \
         container_annotations = [\"throttlewatch.io/*\"]\n",
    )
    .unwrap();
    let c = Containerd::start(&etc, &dir.0.join("before"));
    assert_eq!(c.cri_status(), "error", "containerd log:\n{}", c.log());
    assert!(
        c.log().contains("no corresponding runtime configured"),
        "{}",
        c.log()
    );
    drop(c);
    let o = throttlewatch("install", "containerd", &root, &[]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("moved aside"),
        "{}",
        text(&o)
    );
    let c = Containerd::start(&etc, &dir.0.join("after"));
    assert_eq!(c.cri_status(), "ok", "containerd log:\n{}", c.log());
    let dump = config_dump(&etc);
    assert!(
        runtime(&dump, "runc").is_some() && runtime(&dump, "throttlewatch").is_some(),
        "{dump}"
    );
}

/// dockerd on `daemon_json` with private data-root, exec-root, pidfile and
/// socket (as flags: the installed file stays as it is); on drop it and its
/// containerd are stopped by PID and its mounts below `dir` detached.
struct PrivateDockerd {
    child: Child,
    dir: PathBuf,
}

impl PrivateDockerd {
    fn start(daemon_json: &Path, dir: &Path) -> PrivateDockerd {
        let log = std::fs::File::create(dir.join("dockerd.log")).unwrap();
        let child = Command::new("dockerd")
            .arg("--config-file")
            .arg(daemon_json)
            .arg("--data-root")
            .arg(dir.join("data"))
            .arg("--exec-root")
            .arg(dir.join("x"))
            .arg("--pidfile")
            .arg(dir.join("d.pid"))
            .arg("-H")
            .arg(format!("unix://{}", dir.join("d.sock").display()))
            .args([
                "--iptables=false",
                "--ip6tables=false",
                "--ip-masq=false",
                "--ip-forward=false",
            ])
            .args(["--bridge=none", "--storage-driver=vfs"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("dockerd (apt-get install docker.io)");
        PrivateDockerd {
            child,
            dir: dir.to_path_buf(),
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("dockerd.log")).unwrap_or_default()
    }

    /// `docker info`'s runtimes, once dockerd answers; then dockerd is stopped.
    fn runtimes(mut self) -> String {
        let t0 = Instant::now();
        loop {
            let o = Command::new("docker")
                .env("DOCKER_API_VERSION", DOCKER_API_VERSION)
                .arg("-H")
                .arg(format!("unix://{}", self.dir.join("d.sock").display()))
                .args(["info", "--format", "{{json .Runtimes}}"])
                .output()
                .unwrap();
            if o.status.success() {
                return String::from_utf8_lossy(&o.stdout).into_owned();
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("dockerd exited ({st}): {}", self.log());
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "dockerd did not answer: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for PrivateDockerd {
    fn drop(&mut self) {
        let containerd: Option<i32> =
            std::fs::read_to_string(self.dir.join("x/containerd/containerd.pid"))
                .ok()
                .and_then(|s| s.trim().parse().ok());
        stop_child(&mut self.child, Duration::from_secs(20));
        if let Some(pid) = containerd {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        unmount_below(&self.dir);
    }
}

/// Install into a daemon.json with an nvidia runtime; the real dockerd lists
/// both runtimes (and runc); uninstall gives the file back byte for byte.
#[test]
fn dockerd_keeps_nvidia_and_gets_throttlewatch() {
    let dir = Scratch(PathBuf::from(format!("/tmp/twi{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let root = dir.0.join("r");
    let daemon_json = root.join("etc/docker/daemon.json");
    copy_tree(&fixtures("docker", "nvidia"), daemon_json.parent().unwrap());
    let before = snapshot(&root);
    throttlewatch("install", "docker", &root, &["--bin-dir", "/opt/tw/bin"]);

    let d = PrivateDockerd::start(&daemon_json, &dir.0);
    let info = d.runtimes();
    let runtimes: serde_json::Value =
        serde_json::from_str(&info).unwrap_or_else(|e| panic!("{e}: {info}"));
    assert_eq!(
        runtimes["throttlewatch"]["path"], "/opt/tw/bin/throttlewatch-runtime",
        "{info}"
    );
    assert_eq!(
        runtimes["nvidia"]["path"], "nvidia-container-runtime",
        "{info}"
    );
    assert!(runtimes.get("runc").is_some(), "{info}");

    throttlewatch("uninstall", "docker", &root, &[]);
    assert_eq!(
        snapshot(&root),
        before,
        "uninstall must give daemon.json back byte for byte"
    );
}
