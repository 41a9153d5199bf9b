//! containerd (1.6, or 2.3.4: [`ContainerdRelease`]) with its CRI plugin on,
//! driven the way kubelet drives it:
//! a CRI v1 client (RuntimeService, ImageService) over containerd's unix
//! socket. The node's configuration tree is a scratch directory whose
//! `etc/containerd` is bind-mounted over `/etc/containerd` in a private mount
//! namespace, so absolute `imports` paths (`/etc/containerd/conf.d/*.toml`)
//! resolve to the test's files. Root, state, sockets, the CNI dirs and the
//! pods' cgroup parent are private; the stream server listens on a random
//! loopback port. No CNI here: pods use the host network.

mod crictl;
pub mod kubelet_spec;
mod names;
mod node;
mod pods;
mod release;
pub use crictl::CrictlPod;
pub use names::{ALLOWLISTS, CRI_TABLE, ETC_CONTAINERD, NAMESPACE, PAUSE_IMAGE};
pub use node::{bridge_cni, remove_cgroup_tree, CriNode};
pub use pods::{Pod, CONTAINER_NAME_LABEL, POD_NAMESPACE_LABEL, POD_NAME_LABEL, POD_UID_LABEL};
pub use release::ContainerdRelease;
