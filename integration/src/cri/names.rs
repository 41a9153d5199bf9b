//! The names a CRI node uses: its namespace, images and configuration.

/// The containerd namespace the CRI plugin works in.
pub const NAMESPACE: &str = "k8s.io";
/// The pod sandbox image: busybox `sleep` as pid 1 (containerd stops
/// sandboxes with SIGKILL, so it needs no signal handling).
pub const PAUSE_IMAGE: &str = "docker.io/library/twpause:latest";
/// Where a node keeps containerd's configuration.
pub const ETC_CONTAINERD: &str = "/etc/containerd";
/// containerd 1.6's CRI plugin table (2.x: [`ContainerdRelease::runtime_plugin`]).
pub const CRI_TABLE: &str = "plugins.\"io.containerd.grpc.v1.cri\"";
/// The annotation allowlists a throttlewatch runtime handler needs.
pub const ALLOWLISTS: &str =
    "pod_annotations = [\"throttlewatch.io/*\"]\ncontainer_annotations = [\"throttlewatch.io/*\"]";
