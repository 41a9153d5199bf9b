//! The rootfs mounts of `create`: containerd's mounts into `<bundle>/rootfs`.

use std::path::Path;

use crate::error::{Error, Result};

/// Mount the rootfs containerd sent into `<bundle>/rootfs`; whether any was mounted.
pub(crate) fn mount_rootfs(
    bundle: &Path,
    mounts: &[containerd_shim::protos::api::Mount],
) -> Result<bool> {
    let rootfs = bundle.join("rootfs");
    for m in mounts {
        containerd_shim::mount::mount_rootfs(Some(&m.type_), Some(&m.source), &m.options, &rootfs)
            .map_err(|e| Error::Internal(format!("mount rootfs: {e}")))?;
    }
    Ok(!mounts.is_empty())
}

pub(crate) fn unmount_rootfs(bundle: &Path, mounted: bool) {
    if mounted {
        let _ = containerd_shim::mount::umount_recursive(bundle.join("rootfs").to_str(), 0);
    }
}
