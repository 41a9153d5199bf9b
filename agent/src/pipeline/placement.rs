//! The machine's NUMA nodes and GPUs and the container's GPUs, for the log's
//! `start` record (what `throttlewatch report` bases a cpuset advice on).
//! Written only where placement can matter: more than one node with CPUs,
//! or any GPU.

use std::path::Path;
use std::sync::OnceLock;

use throttlewatch_core::logfmt::{StartTopology, TopologyGpu, TopologyNode};
use throttlewatch_qos::Topology;

/// The machine's topology, read once per agent (it does not change while
/// the agent runs; CPU hotplug aside).
fn machine() -> Option<&'static Topology> {
    static TOPO: OnceLock<Option<Topology>> = OnceLock::new();
    TOPO.get_or_init(|| Topology::discover(Path::new("/sys"), Path::new("/proc")).ok())
        .as_ref()
}

/// The `start` record's `topology` for a container whose process is `pid`.
pub(crate) fn start_topology(pid: Option<u32>) -> Option<StartTopology> {
    let topo = machine().filter(|t| worth_a_record(t))?;
    // Read only where it is used (the container's GPUs).
    let env = pid.map(process_env).unwrap_or_default();
    from_topology(topo, &env)
}

/// Two NUMA nodes with CPUs, or a GPU: else the record has nothing to say.
fn worth_a_record(topo: &Topology) -> bool {
    let with_cpus = topo.nodes.iter().filter(|n| !n.cpus.is_empty()).count();
    with_cpus >= 2 || !topo.gpus.is_empty()
}

/// `env`: the container process's environment (NVIDIA_VISIBLE_DEVICES).
pub(crate) fn from_topology(topo: &Topology, env: &[String]) -> Option<StartTopology> {
    if !worth_a_record(topo) {
        return None;
    }
    Some(StartTopology {
        nodes: topo
            .nodes
            .iter()
            .map(|n| TopologyNode {
                id: n.id,
                cpus: n.cpus.to_string(),
            })
            .collect(),
        gpus: topo
            .gpus
            .iter()
            .map(|g| TopologyGpu {
                index: g.index,
                numa_node: g.numa_node,
            })
            .collect(),
        container_gpus: throttlewatch_qos::container_gpus(topo, None, env).unwrap_or_default(),
    })
}

fn process_env(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/environ"))
        .map(|b| {
            b.split(|c| *c == 0)
                .filter(|e| !e.is_empty())
                .map(|e| String::from_utf8_lossy(e).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use throttlewatch_core::CpuList;
    use throttlewatch_qos::{Gpu, NumaNode};

    fn two_sockets(gpus: usize) -> Topology {
        let cl = |s: &str| CpuList::parse("cpus", s).unwrap();
        Topology {
            online: cl("0-95"),
            nodes: vec![
                NumaNode {
                    id: 0,
                    cpus: cl("0-23,48-71"),
                    mem_total_kb: Some(1),
                },
                NumaNode {
                    id: 1,
                    cpus: cl("24-47,72-95"),
                    mem_total_kb: Some(1),
                },
            ],
            cores: vec![],
            gpus: (0..gpus)
                .map(|i| Gpu {
                    index: i,
                    pci_address: format!("0000:{:02x}:00.0", i + 1),
                    numa_node: Some(if i < gpus / 2 { 0 } else { 1 }),
                    uuid: None,
                    model: None,
                })
                .collect(),
            numa_from_sysfs: true,
        }
    }

    #[test]
    fn two_sockets_with_gpus_and_the_containers_own() {
        let t = from_topology(
            &two_sockets(8),
            &["PATH=/bin".into(), "NVIDIA_VISIBLE_DEVICES=4,5".into()],
        )
        .unwrap();
        assert_eq!(t.nodes[1].cpus, "24-47,72-95");
        assert_eq!(t.gpus.len(), 8);
        assert_eq!(t.gpus[5].numa_node, Some(1));
        assert_eq!(t.container_gpus, vec![4, 5]);
        // No GPU in the environment: none of them.
        assert!(from_topology(&two_sockets(8), &[])
            .unwrap()
            .container_gpus
            .is_empty());
    }

    #[test]
    fn one_node_without_gpus_writes_nothing() {
        let mut t = two_sockets(0);
        t.nodes.truncate(1);
        assert_eq!(from_topology(&t, &[]), None);
        assert!(from_topology(&two_sockets(0), &[]).is_some(), "two nodes");
    }
}
