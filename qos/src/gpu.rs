//! NVIDIA GPUs from PCI sysfs and `/proc/driver/nvidia`, and which of them a
//! container sees (NVIDIA_VISIBLE_DEVICES or the `gpus` key).

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::Serialize;

use crate::refusal::Refusal;
use crate::request::GpuSelection;
use crate::topology::{read_trim, Topology, TopologyError};
use crate::values::{parse_gpus, GpuDevices};

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
fn normalise_bus_id(s: &str) -> String {
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

/// The GPU indices a container sees: the `gpus` key when given, otherwise
/// NVIDIA_VISIBLE_DEVICES from its environment (last entry wins; unset: none).
pub fn container_gpus(
    topo: &Topology,
    request_gpus: Option<&GpuSelection>,
    env: &[String],
) -> Result<Vec<usize>, Refusal> {
    let (key, value, devices) = match request_gpus {
        Some(sel) => (sel.key.clone(), sel.value.clone(), sel.devices.clone()),
        None => {
            let prefix = format!("{VISIBLE_DEVICES_ENV}=");
            let Some(v) = env.iter().rev().find_map(|e| e.strip_prefix(&prefix)) else {
                return Ok(Vec::new());
            };
            let d = parse_gpus(v).map_err(|r| Refusal::new(VISIBLE_DEVICES_ENV, v, r))?;
            (VISIBLE_DEVICES_ENV.to_string(), v.to_string(), d)
        }
    };
    let items = match devices {
        GpuDevices::All => return Ok((0..topo.gpus.len()).collect()),
        GpuDevices::None => return Ok(Vec::new()),
        GpuDevices::List(items) => items,
    };
    let mut out = Vec::new();
    for item in &items {
        let i = resolve(topo, item).map_err(|reason| Refusal::new(key.clone(), &value, reason))?;
        if !out.contains(&i) {
            out.push(i);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// Why a GPU the container names is not one of this machine's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum GpuError {
    #[error("MIG device {0} cannot be mapped to its GPU; name the GPU by index or UUID")]
    Mig(String),
    #[error("no GPU has UUID {uuid}; {have}")]
    NoSuchUuid { uuid: String, have: MachineGpus },
    #[error("GPU {index} does not exist; {have}")]
    NoSuchIndex { index: String, have: MachineGpus },
}

/// How many NVIDIA GPUs this machine has, in words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MachineGpus(usize);

impl fmt::Display for MachineGpus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            0 => f.write_str("this machine has no NVIDIA GPUs"),
            1 => f.write_str("this machine has GPU 0"),
            n => write!(f, "this machine has GPUs 0-{}", n - 1),
        }
    }
}

fn resolve(topo: &Topology, item: &str) -> Result<usize, GpuError> {
    let have = MachineGpus(topo.gpus.len());
    let upper = item.to_ascii_uppercase();
    if upper.starts_with("MIG-") {
        return Err(GpuError::Mig(item.to_string()));
    }
    if upper.starts_with("GPU-") {
        return topo
            .gpus
            .iter()
            .find(|g| {
                g.uuid
                    .as_deref()
                    .is_some_and(|u| u.eq_ignore_ascii_case(item))
            })
            .map(|g| g.index)
            .ok_or_else(|| GpuError::NoSuchUuid {
                uuid: item.to_string(),
                have,
            });
    }
    let index = item.split(':').next().unwrap_or(item);
    match index.parse::<usize>() {
        Ok(i) if i < topo.gpus.len() => Ok(i),
        _ => Err(GpuError::NoSuchIndex {
            index: index.to_string(),
            have,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{self, uuid};

    fn env(v: &str) -> Vec<String> {
        vec!["PATH=/bin".into(), format!("{VISIBLE_DEVICES_ENV}={v}")]
    }

    #[test]
    fn visible_devices_forms() {
        let t = fixtures::training_node().topology();
        assert_eq!(container_gpus(&t, None, &[]), Ok(vec![]));
        assert_eq!(container_gpus(&t, None, &env("all")), Ok((0..8).collect()));
        assert_eq!(container_gpus(&t, None, &env("none")), Ok(vec![]));
        assert_eq!(container_gpus(&t, None, &env("void")), Ok(vec![]));
        assert_eq!(container_gpus(&t, None, &env("5,1,1")), Ok(vec![1, 5]));
        assert_eq!(container_gpus(&t, None, &env("2:1")), Ok(vec![2]));
        assert_eq!(
            container_gpus(&t, None, &env(&uuid(6).to_lowercase())),
            Ok(vec![6])
        );
    }

    #[test]
    fn missing_gpus_are_refused_by_name() {
        let t = fixtures::training_node().topology();
        let r = container_gpus(&t, None, &env("0,9")).unwrap_err();
        assert_eq!(r.key, VISIBLE_DEVICES_ENV);
        assert_eq!(r.value, "0,9");
        assert!(
            r.reason
                .contains("GPU 9 does not exist; this machine has GPUs 0-7"),
            "{r}"
        );
        let r = container_gpus(&t, None, &env("GPU-00000000-dead")).unwrap_err();
        assert!(
            r.reason.contains("no GPU has UUID GPU-00000000-dead"),
            "{r}"
        );
        let r = container_gpus(&t, None, &env("MIG-abc")).unwrap_err();
        assert!(r.reason.contains("MIG device"), "{r}");
        let r = container_gpus(&t, None, &env("first")).unwrap_err();
        assert!(r.reason.contains("neither a GPU index nor a UUID"), "{r}");
        let vm = fixtures::single_node_vm().topology();
        let r = container_gpus(&vm, None, &env("0")).unwrap_err();
        assert!(r.reason.contains("no NVIDIA GPUs"), "{r}");
        assert_eq!(container_gpus(&vm, None, &env("all")), Ok(vec![]));
    }

    #[test]
    fn the_gpus_key_wins_over_the_environment() {
        let t = fixtures::training_node().topology();
        let sel = GpuSelection {
            key: "throttlewatch.io/gpus".into(),
            value: "7".into(),
            devices: parse_gpus("7").unwrap(),
        };
        assert_eq!(container_gpus(&t, Some(&sel), &env("0")), Ok(vec![7]));
        let sel = GpuSelection {
            key: "throttlewatch.io/gpus".into(),
            value: "8".into(),
            devices: parse_gpus("8").unwrap(),
        };
        assert_eq!(
            container_gpus(&t, Some(&sel), &env("0")).unwrap_err().key,
            "throttlewatch.io/gpus"
        );
    }

    #[test]
    fn machine_gpus_in_words() {
        assert_eq!(
            MachineGpus(0).to_string(),
            "this machine has no NVIDIA GPUs"
        );
        assert_eq!(MachineGpus(1).to_string(), "this machine has GPU 0");
        assert_eq!(MachineGpus(8).to_string(), "this machine has GPUs 0-7");
    }

    #[test]
    fn bus_ids_normalise() {
        assert_eq!(normalise_bus_id("00000000:3B:00.0"), "0000:3b:00.0");
        assert_eq!(normalise_bus_id("0000:3b:00.0"), "0000:3b:00.0");
    }
}
