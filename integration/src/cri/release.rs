//! Which containerd a [`CriNode`](super::CriNode) runs: Debian's 1.6
//! (config version 2, the CRI plugin `io.containerd.grpc.v1.cri`) or 2.3.4
//! from `../shared/bin` (config version 4, the CRI split into
//! `io.containerd.cri.v1.images` / `io.containerd.cri.v1.runtime`, its own
//! `ctr` and `containerd-shim-runc-v2`), each on the configuration shape its
//! `containerd config default` prints.

use std::path::{Path, PathBuf};

use super::names::{ALLOWLISTS, PAUSE_IMAGE};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContainerdRelease {
    /// Debian 12's containerd 1.6.20 (on PATH).
    V1_6,
    /// containerd v2.3.4 from `../shared/bin`.
    V2_3,
}

/// Where each release keeps what a node's config needs: the main config
/// with `{placeholders}` filled in by [`ContainerdRelease::config`].
const CONFIG_1_6: &str = r#"version = 2
root = "{root}"
state = "{state}"

[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "{opt}"
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "{pause}"
    # This sandbox forbids the negative oom_score_adj given to pause containers.
    restrict_oom_score_adj = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "{cni}/bin"
      conf_dir = "{cni}/net.d"
"#;

/// 2.3's shape (`containerd config default`: version 4, where the grpc and
/// ttrpc addresses are plugin settings; a top-level `[grpc]` is ignored),
/// NRI on as on a node but on a private socket and plugin dirs (its default
/// socket is node-wide).
const CONFIG_2_3: &str = r#"version = 4
root = "{root}"
state = "{state}"

[plugins]
  [plugins."io.containerd.server.v1.grpc"]
    address = "{sock}"
  [plugins."io.containerd.server.v1.ttrpc"]
    address = "{sock}.ttrpc"
  [plugins."io.containerd.internal.v1.opt"]
    path = "{opt}"
  [plugins."io.containerd.nri.v1.nri"]
    socket_path = "{nri}/nri.sock"
    plugin_path = "{nri}/plugins"
    plugin_config_path = "{nri}/conf.d"
  [plugins."io.containerd.grpc.v1.cri"]
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{pause}"
  [plugins."io.containerd.cri.v1.runtime"]
    # This sandbox forbids the negative oom_score_adj given to pause containers.
    restrict_oom_score_adj = true
    [plugins."io.containerd.cri.v1.runtime".cni]
      bin_dirs = ["{cni}/bin"]
      conf_dir = "{cni}/net.d"
"#;

/// Both releases' default handler, in their runtime plugin (`{plugin}`).
const RUNC: &str = r#"    [plugins."{plugin}".containerd]
      default_runtime_name = "runc"
      [plugins."{plugin}".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."{plugin}".containerd.runtimes.runc.options]
          SystemdCgroup = false
"#;

impl ContainerdRelease {
    pub const ALL: [ContainerdRelease; 2] = [ContainerdRelease::V1_6, ContainerdRelease::V2_3];

    /// "containerd 1.6" / "containerd 2.3.4", for test output.
    pub fn name(self) -> &'static str {
        match self {
            ContainerdRelease::V1_6 => "containerd 1.6",
            ContainerdRelease::V2_3 => "containerd 2.3.4",
        }
    }

    /// "1.6" / "2.3", for file names.
    pub fn tag(self) -> &'static str {
        match self {
            ContainerdRelease::V1_6 => "1.6",
            ContainerdRelease::V2_3 => "2.3",
        }
    }

    pub fn containerd(self) -> PathBuf {
        match self {
            ContainerdRelease::V1_6 => "containerd".into(),
            ContainerdRelease::V2_3 => crate::shared_bin("containerd"),
        }
    }

    /// Its `ctr`.
    pub fn ctr(self) -> PathBuf {
        match self {
            ContainerdRelease::V1_6 => "ctr".into(),
            ContainerdRelease::V2_3 => crate::shared_bin("ctr"),
        }
    }

    /// Directories containerd's PATH needs after the caller's: 2.3.4's own
    /// runc shim (Debian's `containerd-shim-runc-v2` is 1.6's).
    pub fn path_dirs(self) -> Vec<PathBuf> {
        match self {
            ContainerdRelease::V1_6 => vec![],
            ContainerdRelease::V2_3 => {
                let shim = crate::shared_bin("containerd-shim-runc-v2");
                vec![shim.parent().unwrap().to_path_buf()]
            }
        }
    }

    /// The CRI plugin that holds `containerd.runtimes`.
    pub fn runtime_plugin(self) -> &'static str {
        match self {
            ContainerdRelease::V1_6 => "io.containerd.grpc.v1.cri",
            ContainerdRelease::V2_3 => "io.containerd.cri.v1.runtime",
        }
    }

    /// The TOML key path of the runtime handler `name`'s table.
    pub fn handler_table(self, name: &str) -> String {
        format!(
            "plugins.{:?}.containerd.runtimes.{name}",
            self.runtime_plugin()
        )
    }

    /// A runtime handler's table (with our annotation allowlists), as an
    /// operator adds one next to runc; `options` go to its `options` table
    /// (`BinaryName` for the runc shim, say).
    pub fn handler_toml(self, name: &str, runtime_type: &str, options: &[(&str, &str)]) -> String {
        let t = self.handler_table(name);
        let mut s = format!("      [{t}]\n        runtime_type = {runtime_type:?}\n");
        for l in ALLOWLISTS.lines() {
            s += &format!("        {l}\n");
        }
        if !options.is_empty() {
            s += &format!("        [{t}.options]\n");
            for (k, v) in options {
                s += &format!("          {k} = {v:?}\n");
            }
        }
        s
    }

    /// A node's main `config.toml`: root, state, sockets, NRI, CNI dirs
    /// under `dir`; our pause image; `restrict_oom_score_adj` (this sandbox
    /// forbids negative scores); the stream server on a random loopback
    /// port; the default handler `runc` (cgroupfs).
    pub fn config(self, dir: &Path, socket: &Path) -> String {
        let p = |s: &str| dir.join(s).to_string_lossy().into_owned();
        let template = match self {
            ContainerdRelease::V1_6 => CONFIG_1_6,
            ContainerdRelease::V2_3 => CONFIG_2_3,
        };
        (template.to_string() + RUNC)
            .replace("{plugin}", self.runtime_plugin())
            .replace("{root}", &p("root"))
            .replace("{state}", &p("state"))
            .replace("{sock}", &socket.to_string_lossy())
            .replace("{opt}", &p("opt"))
            .replace("{nri}", &p("nri"))
            .replace("{cni}", &p("cni"))
            .replace("{pause}", PAUSE_IMAGE)
    }
}
