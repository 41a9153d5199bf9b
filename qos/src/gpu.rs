//! NVIDIA GPUs from PCI sysfs and `/proc/driver/nvidia`, and which of them a
//! container sees (NVIDIA_VISIBLE_DEVICES or the `gpus` key).

use std::fmt;

use crate::refusal::Refusal;
use crate::request::GpuSelection;
use crate::topology::Topology;
use crate::values::{parse_gpus, GpuDevices};

pub use crate::gpu_devices::{
    Gpu, GPU_CLASSES, NVIDIA_GPUS, NVIDIA_VENDOR, PCI_DEVICES, VISIBLE_DEVICES_ENV,
};

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
    use crate::gpu_devices::normalise_bus_id;

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
