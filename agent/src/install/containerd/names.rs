//! The names containerd's configuration uses for what we add.

/// containerd's main configuration file (as containerd sees it).
pub(crate) const MAIN: &str = "/etc/containerd/config.toml";
/// The CRI plugin of config version 2 (containerd 1.5–1.7).
pub(crate) const PLUGIN_V2: &str = "io.containerd.grpc.v1.cri";
/// The CRI runtime plugin of config versions 3 and 4 (containerd 2.x).
pub(crate) const PLUGIN_V3: &str = "io.containerd.cri.v1.runtime";
/// Served by `containerd-shim-throttlewatch-v2` from containerd's PATH.
pub(crate) const RUNTIME_TYPE: &str = "io.containerd.throttlewatch.v2";
/// containerd's own runc shim: the `runc` we add when we create the runtimes table.
pub(crate) const RUNC_TYPE: &str = "io.containerd.runc.v2";
/// The annotations the CRI plugin passes from pods and containers to the OCI spec.
pub(crate) const ANNOTATIONS: &str = "throttlewatch.io/*";
/// containerd's `default_runtime_name` when the file does not set one.
pub(crate) const DEFAULT_RUNTIME: &str = "runc";
