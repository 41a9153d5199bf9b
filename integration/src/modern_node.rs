//! A containerd 2.3.4 node set up the way nodes are set up now (issue 31):
//! the configuration is containerd 2.3.4's own `containerd config default`
//! (version 4) with a node's usual line edits (here: private root, state,
//! sockets, NRI socket and dirs, CNI dirs, our pause image, and the
//! `restrict_oom_score_adj` this sandbox needs), then passed through
//! `throttlewatch install containerd`. containerd 2.3.4, its `ctr` and
//! `containerd-shim-runc-v2` (../shared/bin, static) come from
//! [`CriNode::new_on`], our shim first in its PATH. Pods get a bridge
//! network with host-local IPAM from the distribution's CNI plugins, inside
//! containerd's own network namespace (`CriNode::isolate`). The VM lane
//! runs it on pure cgroup v2 (Linux 6.1, dequeue-based throttling); it runs
//! on the dev machine's hybrid layout too.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::bin;
use crate::cri::{ContainerdRelease, CriNode, PAUSE_IMAGE};
use crate::daemons::PrivateConfig;

/// Where the distribution's CNI plugins are (Debian `containernetworking-plugins`).
pub const CNI_BIN: &str = "/usr/lib/cni";
/// The bridge network's subnet.
pub const POD_SUBNET: &str = "10.98.0.0/16";
/// Our runtime handler, as the installer names it.
pub const HANDLER: &str = "throttlewatch";
/// The CRI runtime plugin of config version 4, as the default writes its table names.
const RUNTIME_TABLE: &str = "plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes";

/// `containerd config default` of containerd 2.3.4.
pub fn default_config() -> String {
    let o = Command::new(ContainerdRelease::V2_3.containerd())
        .args(["config", "default"])
        .stdin(Stdio::null())
        .output()
        .expect("containerd config default");
    assert!(
        o.status.success(),
        "containerd config default: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(
        text.starts_with("version = 4\n"),
        "containerd 2.3.4's default config is not version 4:\n{text}"
    );
    text
}

/// `text` with each `(from, to)` line replaced; every `from` must be a
/// whole line of `text` exactly once (a default that changed fails here,
/// not later in containerd).
pub fn edit_lines(text: &str, edits: &[(&str, String)]) -> String {
    let mut out: Vec<String> = text.lines().map(str::to_string).collect();
    for (from, to) in edits {
        let hits: Vec<usize> = (0..out.len()).filter(|&i| out[i] == *from).collect();
        assert_eq!(
            hits.len(),
            1,
            "{from:?}: expected once in containerd's default config, found {} times:\n{text}",
            hits.len()
        );
        out[hits[0]] = to.clone();
    }
    let mut s = out.join("\n");
    s.push('\n');
    s
}

/// A containerd 2.3.4 CRI node (not started): the default configuration
/// made private, `throttlewatch install containerd` run on it, a bridge
/// CNI network, containerd isolated in its own mount, network and IPC
/// namespaces. Shims, wrapper and hook get `tw`'s configuration.
pub fn containerd_2_node(tw: &PrivateConfig) -> CriNode {
    for p in ["bridge", "host-local", "loopback"] {
        assert!(
            Path::new(CNI_BIN).join(p).exists(),
            "{CNI_BIN}/{p} is missing: apt-get install containernetworking-plugins"
        );
    }
    let ours = bin("containerd-shim-throttlewatch-v2")
        .parent()
        .unwrap()
        .to_path_buf();
    // containerd 2.3.4, its ctr and runc shim; our shim first in its PATH.
    let mut node = CriNode::new_on(
        ContainerdRelease::V2_3,
        "",
        std::slice::from_ref(&ours),
        &[("THROTTLEWATCH_CONFIG", tw.path.to_str().unwrap())],
    );
    let p = |s: &str| node.dir.0.join(s).to_string_lossy().into_owned();
    let sock = node.socket.to_string_lossy().into_owned();
    let q = |s: &str| format!("'{s}'");
    let config = edit_lines(
        &default_config(),
        &[
            (
                "root = '/var/lib/containerd'",
                format!("root = {}", q(&p("root"))),
            ),
            (
                "state = '/run/containerd'",
                format!("state = {}", q(&p("state"))),
            ),
            (
                "    address = '/run/containerd/containerd.sock'",
                format!("    address = {}", q(&sock)),
            ),
            (
                "    address = '/run/containerd/containerd.sock.ttrpc'",
                format!("    address = {}", q(&format!("{sock}.ttrpc"))),
            ),
            (
                "    path = '/opt/containerd'",
                format!("    path = {}", q(&p("opt"))),
            ),
            // NRI on, as on a node, on a private socket and plugin dirs.
            (
                "    socket_path = '/var/run/nri/nri.sock'",
                format!("    socket_path = {}", q(&p("nri/nri.sock"))),
            ),
            (
                "    plugin_path = '/opt/nri/plugins'",
                format!("    plugin_path = {}", q(&p("nri/plugins"))),
            ),
            (
                "    plugin_config_path = '/etc/nri/conf.d'",
                format!("    plugin_config_path = {}", q(&p("nri/conf.d"))),
            ),
            (
                "      sandbox = 'registry.k8s.io/pause:3.10.2'",
                format!("      sandbox = {}", q(PAUSE_IMAGE)),
            ),
            // This sandbox forbids the negative oom_score_adj of pause containers.
            (
                "    restrict_oom_score_adj = false",
                "    restrict_oom_score_adj = true".into(),
            ),
            (
                "      bin_dirs = ['/opt/cni/bin']",
                format!("      bin_dirs = [{}]", q(CNI_BIN)),
            ),
            (
                "      conf_dir = '/etc/cni/net.d'",
                format!("      conf_dir = {}", q(&p("cni/net.d"))),
            ),
        ],
    );
    std::fs::write(node.config_path(), &config).unwrap();
    crate::cri::bridge_cni(&node.dir.0.join("cni"), "tw-node", POD_SUBNET);
    install(&node, tw, &ours);
    node.isolate();
    node
}

/// `throttlewatch install containerd` on the node's tree (the guest's own
/// configuration file in the VM lane): our handler added, runc kept.
fn install(node: &CriNode, tw: &PrivateConfig, bin_dir: &Path) {
    let before = std::fs::read_to_string(node.config_path()).unwrap();
    let out = Command::new(bin("throttlewatch"))
        .args(["install", "containerd", "--config"])
        .arg(&tw.path)
        .arg("--etc-root")
        .arg(&node.etc_root)
        .arg("--bin-dir")
        .arg(bin_dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let after = std::fs::read_to_string(node.config_path()).unwrap();
    assert!(
        out.status.success(),
        "throttlewatch install containerd: {}{}\n{after}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for h in ["runc", HANDLER] {
        let table = format!("[{RUNTIME_TABLE}.{h}]");
        assert!(
            after.contains(&table),
            "{table} missing after the install:\n{after}"
        );
    }
    let mut kept = after.lines();
    for line in before.lines() {
        assert!(
            kept.any(|l| l == line),
            "the install changed or reordered {line:?}:\n{after}"
        );
    }
}

/// The throttlewatch log files (`*.jsonl`) under `dir`.
pub fn logs_in(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect()
}
