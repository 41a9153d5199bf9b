use std::path::Path;

use super::*;
use crate::fixtures::{self, uuid, Fixture, TRAINING_GPU_ADDRS};

fn list(s: &str) -> CpuList {
    CpuList::parse("", s).unwrap()
}

#[test]
fn training_node() {
    let t = fixtures::training_node().topology();
    assert_eq!(t.online, list("0-95"));
    assert!(t.numa_from_sysfs);
    assert_eq!(t.nodes.len(), 2);
    assert_eq!(t.nodes[1].cpus, list("24-47,72-95"));
    assert_eq!(t.nodes[0].mem_total_kb, Some(1_056_000_000));
    assert_eq!(t.cores.len(), 48);
    assert_eq!(t.cores[5], list("5,53"));
    assert_eq!(
        t.gpus.len(),
        8,
        "audio, NVSwitch and NIC functions are not GPUs"
    );
    for (i, g) in t.gpus.iter().enumerate() {
        assert_eq!(g.index, i);
        assert_eq!(g.pci_address, TRAINING_GPU_ADDRS[i]);
        assert_eq!(g.numa_node, Some(if i < 4 { 0 } else { 1 }));
        assert_eq!(g.uuid.as_deref(), Some(uuid(i).as_str()));
        assert_eq!(g.model.as_deref(), Some("NVIDIA H100 80GB HBM3"));
    }
    assert_eq!(t.mems_for(&list("0,30")), list("0-1"));
    assert_eq!(t.round_up_to_cores(&list("1,2")), list("1-2,49-50"));
    assert_eq!(
        t.whole_cores_in(&list("0-2,48-49")),
        vec![list("0,48"), list("1,49")]
    );
    let json = serde_json::to_value(&t).unwrap();
    assert_eq!(json["nodes"][0]["cpus"], "0-23,48-71");
    assert_eq!(json["cores"][0], "0,48");
}

#[test]
fn vm_without_node_directory_is_one_node() {
    let t = fixtures::single_node_vm().topology();
    assert!(!t.numa_from_sysfs);
    assert_eq!(
        t.nodes,
        vec![NumaNode {
            id: 0,
            cpus: list("0-3"),
            mem_total_kb: Some(8_000_000)
        }]
    );
    assert_eq!(t.cores, vec![list("0-1"), list("2-3")]);
    assert!(t.gpus.is_empty());
}

#[test]
fn unknown_gpu_nodes_and_no_driver() {
    let t = fixtures::unknown_numa_gpus().topology();
    assert_eq!(t.gpus.len(), 2);
    assert!(t
        .gpus
        .iter()
        .all(|g| g.numa_node.is_none() && g.uuid.is_none()));
    assert_eq!(t.cores.len(), 16);
}

#[test]
fn memory_only_node_is_kept() {
    let t = fixtures::memory_only_node().topology();
    assert_eq!(t.nodes.len(), 4);
    let n2 = t.node(2).unwrap();
    assert!(n2.cpus.is_empty() && n2.has_memory());
    assert!(!t.node(3).unwrap().has_memory());
    assert_eq!(
        t.mems_for(&list("0-23")),
        list("0-1"),
        "node 3 has no memory to give"
    );
}

#[test]
fn missing_siblings_fall_back_to_one_cpu_per_core_and_offline_cpus_are_left_out() {
    let f = Fixture::new();
    f.sys_file("devices/system/cpu/online", "0-2,4\n");
    f.sys_file(
        "devices/system/cpu/cpu0/topology/thread_siblings_list",
        "0,3\n",
    ); // 3 is offline
    let t = f.topology();
    assert_eq!(t.cores, vec![list("0"), list("1"), list("2"), list("4")]);
    assert_eq!(t.nodes[0].cpus, list("0-2,4"));
}

#[test]
fn broken_trees_are_errors_that_name_the_path() {
    let f = Fixture::new();
    let e = Topology::discover(&f.sys, &f.proc).unwrap_err();
    assert!(matches!(e, TopologyError::NoCpus(_)), "{e}");
    f.sys_file("devices/system/cpu/online", "zero\n");
    let e = Topology::discover(&f.sys, &f.proc).unwrap_err().to_string();
    assert!(
        e.contains("devices/system/cpu/online") && e.contains("zero"),
        "{e}"
    );
    f.sys_file("devices/system/cpu/online", "0\n");
    f.sys_file("devices/system/node/node0/cpulist", "x\n");
    let e = Topology::discover(&f.sys, &f.proc).unwrap_err().to_string();
    assert!(e.contains("node0/cpulist"), "{e}");
}

#[test]
fn this_machine() {
    let t = Topology::discover(Path::new("/sys"), Path::new("/proc")).unwrap();
    assert!(!t.nodes.is_empty());
    assert!(!t.online.is_empty());
    for cpu in t.online.iter() {
        assert!(t.node_of(cpu).is_some(), "CPU {cpu} is in no node: {t:?}");
        assert_eq!(
            t.cores.iter().filter(|c| c.contains(cpu)).count(),
            1,
            "CPU {cpu}"
        );
    }
    assert!(crate::render_text(&t).contains("CPUs online"));
}
