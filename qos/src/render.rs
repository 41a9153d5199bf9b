//! Text for `throttlewatch topology` and for explaining a plan.

use std::fmt::Write;

use throttlewatch_core::CpuList;

use crate::plan::Plan;
use crate::topology::Topology;

pub fn render_text(topo: &Topology) -> String {
    let mut s = String::new();
    let smt = topo.cores.iter().map(CpuList::len).max().unwrap_or(1);
    let _ = writeln!(
        s,
        "CPUs online: {} ({} CPUs, {} cores, {} thread(s) per core)",
        topo.online,
        topo.online.len(),
        topo.cores.len(),
        smt
    );
    let source = if topo.numa_from_sysfs {
        ""
    } else {
        " (no NUMA information in sysfs: one node assumed)"
    };
    let _ = writeln!(s, "NUMA nodes: {}{source}", topo.nodes.len());
    for n in &topo.nodes {
        let mem = match n.mem_total_kb {
            Some(kb) => format!("{:.1} GiB", kb as f64 / (1024.0 * 1024.0)),
            None => "unknown".into(),
        };
        let cpus = if n.cpus.is_empty() {
            "none (memory only)".to_string()
        } else {
            n.cpus.to_string()
        };
        let gpus: Vec<String> = topo
            .gpus
            .iter()
            .filter(|g| g.numa_node == Some(n.id))
            .map(|g| g.index.to_string())
            .collect();
        let gpus = if gpus.is_empty() {
            String::new()
        } else {
            format!("  GPUs {}", gpus.join(","))
        };
        let _ = writeln!(s, "  node {}: CPUs {cpus}  memory {mem}{gpus}", n.id);
    }
    if topo.gpus.is_empty() {
        let _ = writeln!(s, "GPUs: none");
    } else {
        let _ = writeln!(s, "GPUs: {}", topo.gpus.len());
    }
    for g in &topo.gpus {
        let node = g.numa_node.map_or("unknown".to_string(), |n| n.to_string());
        let uuid = g.uuid.as_deref().unwrap_or("(no driver information)");
        let model = g
            .model
            .as_deref()
            .map(|m| format!("  {m}"))
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "  GPU {}: {}  NUMA node {node}  {uuid}{model}",
            g.index, g.pci_address
        );
    }
    s
}

/// A plan in words: what will be written, why, and what was refused.
pub fn render_plan(plan: &Plan) -> String {
    let mut s = String::new();
    let or_unchanged = |v: Option<String>| v.unwrap_or_else(|| "unchanged".into());
    let _ = writeln!(
        s,
        "burst: {}",
        or_unchanged(plan.burst_us.map(|us| format!("{us}us")))
    );
    let excl = if plan.exclusive { " (exclusive)" } else { "" };
    let _ = writeln!(
        s,
        "cpuset.cpus: {}{excl}",
        or_unchanged(plan.cpus.as_ref().map(|c| c.to_string()))
    );
    let _ = writeln!(
        s,
        "cpuset.mems: {}",
        or_unchanged(plan.mems.as_ref().map(|c| c.to_string()))
    );
    for n in &plan.notes {
        let _ = writeln!(s, "  because: {n}");
    }
    for r in &plan.refused {
        let _ = writeln!(s, "  refused: {r}");
    }
    s
}

impl Plan {
    /// See [`render_plan`].
    pub fn explain(&self) -> String {
        render_plan(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    #[test]
    fn topology_text() {
        let t = render_text(&fixtures::training_node().topology());
        assert!(
            t.contains("CPUs online: 0-95 (96 CPUs, 48 cores, 2 thread(s) per core)"),
            "{t}"
        );
        assert!(
            t.contains("node 1: CPUs 24-47,72-95  memory 1007.1 GiB  GPUs 4,5,6,7"),
            "{t}"
        );
        assert!(
            t.contains("GPU 7: 0000:bd:00.0  NUMA node 1  GPU-8f6e1b2a-0007"),
            "{t}"
        );
        let t = render_text(&fixtures::memory_only_node().topology());
        assert!(t.contains("node 2: CPUs none (memory only)"), "{t}");
        let t = render_text(&fixtures::single_node_vm().topology());
        assert!(
            t.contains("one node assumed") && t.contains("GPUs: none"),
            "{t}"
        );
    }
}
