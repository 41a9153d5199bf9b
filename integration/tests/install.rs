//! `throttlewatch install|uninstall` checked against the real engines: for
//! each fixture (Debian's containerd 1.6 `config default`; the same with
//! SystemdCgroup and an nvidia runtime; a config whose drop-in holds the CRI
//! table; no config at all) the real binary installs into a temporary etc
//! tree, the real containerd 1.6 starts on exactly those files — in a private
//! mount namespace with the tree bound over /etc/containerd, so absolute
//! imports resolve, with its own root, state and sockets — and its CRI plugin
//! must load (`ctr plugins ls`: ok) with runc, the other runtimes and ours in
//! `containerd config dump`. Uninstall must give the files back byte for byte.
//! containerd 1.7's default config goes the same way; 2.0's (version 3) is
//! installed, parsed and uninstalled byte for byte (no 2.x runs here).
//! The same for dockerd 20.10 and a daemon.json with an nvidia runtime.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use throttlewatch_integration::daemons::stop_child;
use throttlewatch_integration::private_dockerd::PrivateDockerd;
use throttlewatch_integration::trees::{copy_tree, snapshot};
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
    ctr: PathBuf,
}

impl Containerd {
    fn start(etc: &Path, dir: &Path) -> Containerd {
        Containerd::start_bin(Path::new("containerd"), Path::new("ctr"), etc, dir)
    }

    /// `containerd` (a path, or a name on PATH) on the configuration under
    /// `etc`, in a mount namespace that also has a private /run/nri (NRI's
    /// default socket is there) and /run/containerd.
    fn start_bin(containerd: &Path, ctr: &Path, etc: &Path, dir: &Path) -> Containerd {
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
            "mkdir -p /run/nri /run/containerd && mount -t tmpfs tmpfs /run/nri && \
             mount -t tmpfs tmpfs /run/containerd && \
             exec \"$4\" --config /etc/containerd/config.toml --root \"$1\" --state \"$2\" --address \"$3\"",
            &[&root, &state, &socket, containerd],
        )
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("unshare, containerd (apt-get install containerd)");
        let mut c = Containerd {
            child,
            socket,
            log,
            ctr: ctr.to_path_buf(),
        };
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
        Command::new(&self.ctr)
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
        self.plugin_status("io.containerd.grpc.v1", "cri")
    }

    /// The status column of plugin `kind` `id` in `ctr plugins ls`.
    fn plugin_status(&self, kind: &str, id: &str) -> String {
        let o = self.ctr(&["plugins", "ls"]);
        assert!(o.status.success(), "ctr plugins ls: {}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        out.lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|f| f.len() >= 4 && f[0] == kind && f[1] == id)
            .map(|f| f[3].to_string())
            .unwrap_or_else(|| panic!("no {kind} {id} plugin in:\n{out}"))
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

/// containerd 1.7's `config default` (config version 2, `sandbox_mode`,
/// NRI, transfer service): containerd 1.6 ignores the keys it does not know,
/// so the real CRI plugin loads it here too.
#[test]
fn containerd_1_7_default_config() {
    install_then_containerd(Some("containerd-1.7-default"), false, false);
}

/// containerd 2.0's `config default` (config version 3, single-quoted keys,
/// the runtimes under `io.containerd.cri.v1.runtime`). No containerd 2.x runs
/// here: the installed file is parsed and checked, and uninstall must give it
/// back byte for byte.
#[test]
fn containerd_2_0_default_config_version_3() {
    const V3: &str = "io.containerd.cri.v1.runtime";
    let dir = Scratch::new("install-v3");
    let root = dir.0.join("fsroot");
    let etc = root.join("etc/containerd");
    copy_tree(&fixtures("containerd", "containerd-2.0-default"), &etc);
    let before = snapshot(&root);
    let original = std::fs::read_to_string(etc.join("config.toml")).unwrap();
    throttlewatch("install", "containerd", &root, &[]);
    let installed = std::fs::read_to_string(etc.join("config.toml")).unwrap();
    let doc: toml::Table = toml::from_str(&installed).unwrap();
    let runtimes = &doc["plugins"][V3]["containerd"]["runtimes"];
    let ours = &runtimes["throttlewatch"];
    assert_eq!(
        ours["runtime_type"].as_str(),
        Some("io.containerd.throttlewatch.v2")
    );
    for k in ["pod_annotations", "container_annotations"] {
        assert_eq!(
            ours[k].as_array().unwrap()[0].as_str(),
            Some("throttlewatch.io/*")
        );
    }
    assert_eq!(
        runtimes["runc"]["sandboxer"].as_str(),
        Some("podsandbox"),
        "runc kept"
    );
    assert!(
        doc["plugins"]["io.containerd.grpc.v1.cri"]
            .get("containerd")
            .is_none(),
        "nothing added to the v2 plugin's table"
    );
    // Only lines added: every original line is still there, in order.
    let mut kept = installed.lines();
    for line in original.lines() {
        assert!(
            kept.any(|l| l == line),
            "line {line:?} changed:\n{installed}"
        );
    }
    throttlewatch("uninstall", "containerd", &root, &[]);
    assert_eq!(
        snapshot(&root),
        before,
        "uninstall must give config.toml back byte for byte"
    );
}

/// containerd 2.3's own `config default` (config version 4), generated by
/// the real containerd 2.3.4 of ../shared/bin: installed, then containerd
/// 2.3.4 runs on the result. Its CRI plugins load, and its `config dump`
/// (its own parse, after its migrations) has runc with its options and ours;
/// uninstall gives the file back byte for byte.
#[test]
fn containerd_2_3_default_config_version_4() {
    const V3: &str = "io.containerd.cri.v1.runtime";
    let containerd = throttlewatch_integration::shared_bin("containerd");
    let ctr = throttlewatch_integration::shared_bin("ctr");
    let dir = Scratch::new("install-v4");
    let root = dir.0.join("fsroot");
    let etc = root.join("etc/containerd");
    std::fs::create_dir_all(&etc).unwrap();
    let o = Command::new(&containerd)
        .args(["config", "default"])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "containerd config default: {}",
        text(&o)
    );
    let original = String::from_utf8(o.stdout).unwrap();
    assert!(
        original.starts_with("version = 4\n"),
        "containerd 2.3.4's default config: {original}"
    );
    std::fs::write(etc.join("config.toml"), &original).unwrap();
    let before = snapshot(&root);

    throttlewatch("install", "containerd", &root, &[]);
    let installed = std::fs::read_to_string(etc.join("config.toml")).unwrap();
    let mut kept = installed.lines();
    for line in original.lines() {
        assert!(
            kept.any(|l| l == line),
            "line {line:?} changed:\n{installed}"
        );
    }

    let o = in_private_etc(
        &etc,
        "exec \"$1\" --config /etc/containerd/config.toml config dump",
        &[&containerd],
    )
    .output()
    .unwrap();
    assert!(
        o.status.success(),
        "containerd 2.3.4 config dump: {}",
        text(&o)
    );
    let dump: toml::Table = toml::from_str(&String::from_utf8_lossy(&o.stdout))
        .unwrap_or_else(|e| panic!("config dump is not TOML ({e}): {}", text(&o)));
    let ctd = &dump["plugins"][V3]["containerd"];
    assert_eq!(ctd["default_runtime_name"].as_str(), Some("runc"), "{ctd}");
    let runc = &ctd["runtimes"]["runc"];
    assert_eq!(
        runc["runtime_type"].as_str(),
        Some("io.containerd.runc.v2"),
        "{runc}"
    );
    assert!(
        runc.get("options").is_some_and(|o| o.is_table()),
        "runc keeps its options: {runc}"
    );
    let ours = &ctd["runtimes"]["throttlewatch"];
    assert_eq!(
        ours["runtime_type"].as_str(),
        Some("io.containerd.throttlewatch.v2"),
        "{ours}"
    );
    for k in ["pod_annotations", "container_annotations"] {
        assert_eq!(
            ours[k]
                .as_array()
                .map(|a| a.iter().filter_map(|v| v.as_str()).collect::<Vec<_>>()),
            Some(vec!["throttlewatch.io/*"]),
            "{k}: {ours}"
        );
    }

    let c = Containerd::start_bin(&containerd, &ctr, &etc, &dir.0);
    for (kind, id) in [
        ("io.containerd.cri.v1", "runtime"),
        ("io.containerd.cri.v1", "images"),
        ("io.containerd.grpc.v1", "cri"),
    ] {
        assert_eq!(
            c.plugin_status(kind, id),
            "ok",
            "{kind} {id}; containerd 2.3.4 log:\n{}",
            c.log()
        );
    }
    drop(c);

    throttlewatch("uninstall", "containerd", &root, &[]);
    assert_eq!(
        snapshot(&root),
        before,
        "uninstall must give config.toml back byte for byte"
    );
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

    let mut d = PrivateDockerd::start(&daemon_json, &dir.0);
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
