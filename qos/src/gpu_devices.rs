//! NVIDIA GPUs as PCI sysfs and `/proc/driver/nvidia` show them.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use crate::sysfs::{read_trim, TopologyError};

pub const PCI_DEVICES: &str = "bus/pci/devices";
pub const NVIDIA_GPUS: &str = "driver/nvidia/gpus";
pub const NVIDIA_VENDOR: u32 = 0x10de;
/// PCI class codes (class << 8 | subclass): VGA controller and 3D controller.
pub const GPU_CLASSES: [u32; 2] = [0x0300, 0x0302];
pub const VISIBLE_DEVICES_ENV: &str = "NVIDIA_VISIBLE_DEVICES";

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Gpu {
    /// Position in PCI bus order: the index NVML and NVIDIA_VISIBLE_DEVICES use.
    pub index: usize,
    /// e.g. `0000:3b:00.0`.
    pub pci_address: String,
    /// None when sysfs says -1 (unknown).
    pub numa_node: Option<u32>,
    /// From `/proc/driver/nvidia/gpus/<addr>/information`, when the driver is loaded.
    pub uuid: Option<String>,
    pub model: Option<String>,
}

pub(crate) fn discover_gpus(
    sysfs_root: &Path,
    procfs_root: &Path,
) -> Result<Vec<Gpu>, TopologyError> {
    let dir = sysfs_root.join(PCI_DEVICES);
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return Ok(Vec::new());
    };
    let mut addrs: Vec<String> = rd
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    addrs.sort_by_key(|a| normalise_bus_id(a));
    let info = read_driver_info(&procfs_root.join(NVIDIA_GPUS));
    let mut gpus = Vec::new();
    for addr in addrs {
        let dev = dir.join(&addr);
        let hex = |f: &str| {
            read_trim(&dev.join(f))
                .ok()
                .and_then(|s| u32::from_str_radix(s.trim_start_matches("0x"), 16).ok())
        };
        if hex("vendor") != Some(NVIDIA_VENDOR)
            || !hex("class").is_some_and(|c| GPU_CLASSES.contains(&(c >> 8)))
        {
            continue;
        }
        let numa_node = read_trim(&dev.join("numa_node"))
            .ok()
            .and_then(|s| s.parse::<i64>().ok());
        let (uuid, model) = info
            .get(&normalise_bus_id(&addr))
            .cloned()
            .unwrap_or_default();
        gpus.push(Gpu {
            index: gpus.len(),
            pci_address: addr,
            numa_node: numa_node.filter(|n| *n >= 0).map(|n| n as u32),
            uuid,
            model,
        });
    }
    Ok(gpus)
}

/// "0000:3B:00.0" and "00000000:3b:00.0" name the same device.
pub(crate) fn normalise_bus_id(s: &str) -> String {
    let s = s.trim().to_ascii_lowercase();
    match s.split_once(':') {
        Some((dom, rest)) if dom.len() > 4 => format!("{}:{rest}", &dom[dom.len() - 4..]),
        _ => s,
    }
}

/// Bus id → (UUID, model) from the driver's `information` files.
fn read_driver_info(dir: &Path) -> BTreeMap<String, (Option<String>, Option<String>)> {
    let mut out = BTreeMap::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let Ok(text) = std::fs::read_to_string(e.path().join("information")) else {
            continue;
        };
        let field = |name: &str| {
            text.lines()
                .find_map(|l| {
                    l.split_once(':')
                        .filter(|(k, _)| k.trim() == name)
                        .map(|(_, v)| v.trim().to_string())
                })
                .filter(|v| !v.is_empty())
        };
        let bus =
            field("Bus Location").unwrap_or_else(|| e.file_name().to_string_lossy().into_owned());
        out.insert(normalise_bus_id(&bus), (field("GPU UUID"), field("Model")));
    }
    out
}
