//! NUMA nodes, SMT cores, online CPUs and GPUs, read from sysfs and procfs
//! roots given as parameters (fixture trees in tests, `/sys` and `/proc` in
//! production).

use std::collections::BTreeSet;
use std::path::Path;

use serde::Serialize;
use throttlewatch_cgroup::FileError;
use throttlewatch_core::CpuList;

use crate::gpu_devices::{discover_gpus, Gpu};
use crate::ser::{cpulist_str, cpulists_str};
pub(crate) use crate::sysfs::{numbered, read_trim};

pub const NODE_DIR: &str = "devices/system/node";
pub const CPU_DIR: &str = "devices/system/cpu";

pub use crate::sysfs::TopologyError;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NumaNode {
    pub id: u32,
    /// Empty for a memory-only node (CXL memory, some VMs).
    #[serde(serialize_with = "cpulist_str")]
    pub cpus: CpuList,
    /// From `node*/meminfo` `MemTotal`; None when unreadable.
    pub mem_total_kb: Option<u64>,
}

impl NumaNode {
    pub fn has_memory(&self) -> bool {
        !matches!(self.mem_total_kb, Some(0))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Topology {
    #[serde(serialize_with = "cpulist_str")]
    pub online: CpuList,
    pub nodes: Vec<NumaNode>,
    /// Physical cores: SMT sibling groups of online CPUs, ordered by first CPU.
    #[serde(serialize_with = "cpulists_str")]
    pub cores: Vec<CpuList>,
    /// NVIDIA GPUs in PCI bus order; `index` is the position here.
    pub gpus: Vec<Gpu>,
    /// False when sysfs has no node directory and node 0 was assumed.
    pub numa_from_sysfs: bool,
}

impl Topology {
    pub fn discover(sysfs_root: &Path, procfs_root: &Path) -> Result<Topology, TopologyError> {
        let cpu_dir = sysfs_root.join(CPU_DIR);
        let online = read_online(&cpu_dir)?;
        let cores = read_cores(&cpu_dir, &online);
        let node_dir = sysfs_root.join(NODE_DIR);
        let (nodes, numa_from_sysfs) = if node_dir.is_dir() {
            (read_nodes(&node_dir)?, true)
        } else {
            let mem = read_mem_total(&procfs_root.join("meminfo"));
            (
                vec![NumaNode {
                    id: 0,
                    cpus: online.clone(),
                    mem_total_kb: mem,
                }],
                false,
            )
        };
        let gpus = discover_gpus(sysfs_root, procfs_root)?;
        Ok(Topology {
            online,
            nodes,
            cores,
            gpus,
            numa_from_sysfs,
        })
    }

    pub fn node(&self, id: u32) -> Option<&NumaNode> {
        self.nodes.iter().find(|n| n.id == id)
    }

    pub fn node_of(&self, cpu: u32) -> Option<u32> {
        self.nodes
            .iter()
            .find(|n| n.cpus.contains(cpu))
            .map(|n| n.id)
    }

    /// Node ids as a list, e.g. for messages.
    pub fn node_ids(&self) -> CpuList {
        CpuList::from_iter(self.nodes.iter().map(|n| n.id))
    }

    /// The online CPUs of a node.
    pub fn node_cpus(&self, id: u32) -> CpuList {
        self.node(id)
            .map(|n| n.cpus.intersect(&self.online))
            .unwrap_or_default()
    }

    /// The nodes (with memory) that hold any of `cpus`: a cpuset.mems value.
    pub fn mems_for(&self, cpus: &CpuList) -> CpuList {
        let ids = self
            .nodes
            .iter()
            .filter(|n| n.has_memory() && !n.cpus.intersect(cpus).is_empty());
        CpuList::from_iter(ids.map(|n| n.id))
    }

    /// Cores lying wholly inside `set`.
    pub fn whole_cores_in(&self, set: &CpuList) -> Vec<CpuList> {
        self.cores
            .iter()
            .filter(|c| c.is_subset(set))
            .cloned()
            .collect()
    }

    /// Expand `set` to whole cores (every sibling of every CPU it touches).
    pub fn round_up_to_cores(&self, set: &CpuList) -> CpuList {
        let touched = self.cores.iter().filter(|c| !c.intersect(set).is_empty());
        touched.fold(set.clone(), |acc, c| acc.union(c))
    }
}

fn parse_list(path: &Path) -> Result<CpuList, TopologyError> {
    let s = read_trim(path)?;
    CpuList::parse("", &s).map_err(|_| FileError::parse(path, "a CPU list", s).into())
}

fn read_online(cpu_dir: &Path) -> Result<CpuList, TopologyError> {
    let online = cpu_dir.join("online");
    let list = if online.exists() {
        parse_list(&online)?
    } else {
        CpuList::from_iter(numbered(cpu_dir, "cpu")?)
    };
    if list.is_empty() {
        return Err(TopologyError::NoCpus(cpu_dir.into()));
    }
    Ok(list)
}

fn read_cores(cpu_dir: &Path, online: &CpuList) -> Vec<CpuList> {
    let mut groups: BTreeSet<Vec<u32>> = BTreeSet::new();
    for cpu in online.iter() {
        let topo = cpu_dir.join(format!("cpu{cpu}/topology"));
        let siblings = ["thread_siblings_list", "core_cpus_list"]
            .iter()
            .find_map(|f| parse_list(&topo.join(f)).ok())
            .map(|l| l.intersect(online))
            .filter(|l| l.contains(cpu))
            .unwrap_or_else(|| CpuList::from_iter([cpu]));
        groups.insert(siblings.iter().collect());
    }
    // A CPU must sit in one core only, even if sysfs disagrees with itself.
    let mut seen = CpuList::default();
    let mut cores = Vec::new();
    for g in groups {
        let core = CpuList::from_iter(g).difference(&seen);
        if !core.is_empty() {
            seen = seen.union(&core);
            cores.push(core);
        }
    }
    cores.sort_by_key(|c| c.iter().next());
    cores
}

fn read_nodes(node_dir: &Path) -> Result<Vec<NumaNode>, TopologyError> {
    let mut nodes = Vec::new();
    for id in numbered(node_dir, "node")? {
        let dir = node_dir.join(format!("node{id}"));
        let cpulist = dir.join("cpulist");
        let cpus = if cpulist.exists() {
            parse_list(&cpulist)?
        } else {
            CpuList::default()
        };
        nodes.push(NumaNode {
            id,
            cpus,
            mem_total_kb: read_mem_total(&dir.join("meminfo")),
        });
    }
    Ok(nodes)
}

/// `MemTotal:` in kB, from `/proc/meminfo` or a node's `meminfo`
/// ("Node 0 MemTotal:       5334812 kB").
fn read_mem_total(path: &Path) -> Option<u64> {
    let s = std::fs::read_to_string(path).ok()?;
    let line = s.lines().find(|l| l.contains("MemTotal:"))?;
    line.split("MemTotal:")
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
#[path = "topology_tests.rs"]
mod tests;
