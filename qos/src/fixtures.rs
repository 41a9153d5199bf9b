//! Sysfs/procfs trees of real machine shapes, built in temporary directories
//! for the tests.

use std::path::{Path, PathBuf};

use crate::topology::Topology;

pub struct Fixture {
    _dir: tempfile::TempDir,
    pub sys: PathBuf,
    pub proc: PathBuf,
}

pub const TRAINING_GPU_ADDRS: [&str; 8] = [
    "0000:07:00.0",
    "0000:0f:00.0",
    "0000:47:00.0",
    "0000:4e:00.0",
    "0000:87:00.0",
    "0000:90:00.0",
    "0000:b7:00.0",
    "0000:bd:00.0",
];

pub fn uuid(i: usize) -> String {
    format!("GPU-8f6e1b2a-{i:04x}-4c1d-9e3f-00000000000{i}")
}

impl Fixture {
    pub fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path().join("sys");
        let proc = dir.path().join("proc");
        std::fs::create_dir_all(sys.join("devices/system/cpu")).unwrap();
        std::fs::create_dir_all(&proc).unwrap();
        Fixture {
            _dir: dir,
            sys,
            proc,
        }
    }

    pub fn topology(&self) -> Topology {
        Topology::discover(&self.sys, &self.proc).unwrap()
    }

    fn write(root: &Path, rel: &str, content: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }

    pub fn sys_file(&self, rel: &str, content: &str) {
        Self::write(&self.sys, rel, content);
    }

    pub fn proc_file(&self, rel: &str, content: &str) {
        Self::write(&self.proc, rel, content);
    }

    /// Online CPUs and their SMT sibling groups.
    pub fn cpus(&self, online: &str, cores: &[Vec<u32>]) {
        self.sys_file("devices/system/cpu/online", &format!("{online}\n"));
        for core in cores {
            let list = core
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",");
            for cpu in core {
                self.sys_file(
                    &format!("devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"),
                    &format!("{list}\n"),
                );
            }
        }
    }

    pub fn node(&self, id: u32, cpulist: &str, mem_kb: u64) {
        self.sys_file(
            &format!("devices/system/node/node{id}/cpulist"),
            &format!("{cpulist}\n"),
        );
        let meminfo = format!(
            "Node {id} MemTotal:       {mem_kb} kB\nNode {id} MemFree:        {mem_kb} kB\n"
        );
        self.sys_file(&format!("devices/system/node/node{id}/meminfo"), &meminfo);
    }

    pub fn pci(&self, addr: &str, vendor: u32, class: u32, numa: i32) {
        self.sys_file(
            &format!("bus/pci/devices/{addr}/vendor"),
            &format!("0x{vendor:04x}\n"),
        );
        self.sys_file(
            &format!("bus/pci/devices/{addr}/class"),
            &format!("0x{class:06x}\n"),
        );
        self.sys_file(
            &format!("bus/pci/devices/{addr}/numa_node"),
            &format!("{numa}\n"),
        );
    }

    pub fn nvidia_info(&self, addr: &str, uuid: &str) {
        let text = format!(
            "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 250\nGPU UUID: \t {uuid}\nVideo BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t {addr}\nDevice Minor: \t 0\nGPU Excluded:\t No\n"
        );
        self.proc_file(&format!("driver/nvidia/gpus/{addr}/information"), &text);
    }
}

/// Cores (i, i + n) for i in 0..n: the usual x86 SMT numbering.
fn smt_pairs(n: u32) -> Vec<Vec<u32>> {
    (0..n).map(|i| vec![i, i + n]).collect()
}

/// 2 sockets × 24 cores × 2 SMT = 96 CPUs; GPUs 0–3 on node 0, 4–7 on node 1,
/// plus PCI functions that are not GPUs (NVIDIA audio, NVSwitch, a NIC).
pub fn training_node() -> Fixture {
    let f = Fixture::new();
    f.cpus("0-95", &smt_pairs(48));
    f.node(0, "0-23,48-71", 1_056_000_000);
    f.node(1, "24-47,72-95", 1_056_000_000);
    for (i, addr) in TRAINING_GPU_ADDRS.iter().enumerate() {
        f.pci(
            addr,
            0x10de,
            if i % 2 == 0 { 0x030200 } else { 0x030000 },
            if i < 4 { 0 } else { 1 },
        );
        f.nvidia_info(addr, &uuid(i));
    }
    f.pci("0000:07:00.1", 0x10de, 0x040300, 0); // HDMI audio function of a GPU
    f.pci("0000:c5:00.0", 0x10de, 0x068000, 1); // NVSwitch bridge
    f.pci("0000:00:00.0", 0x8086, 0x060000, 0);
    f.pci("0000:17:00.0", 0x15b3, 0x020700, 0); // InfiniBand NIC
    f
}

/// A 4-vCPU VM (2 cores × 2 SMT) with no `devices/system/node`.
pub fn single_node_vm() -> Fixture {
    let f = Fixture::new();
    f.cpus("0-3", &[vec![0, 1], vec![2, 3]]);
    f.proc_file(
        "meminfo",
        "MemTotal:        8000000 kB\nMemFree:         4000000 kB\n",
    );
    f.pci("0000:00:01.0", 0x1af4, 0x020000, -1);
    f
}

/// 2 nodes × 8 CPUs without SMT; two GPUs whose numa_node is -1 (common in VMs and
/// single-root-complex servers); no NVIDIA driver in procfs.
pub fn unknown_numa_gpus() -> Fixture {
    let f = Fixture::new();
    let cores: Vec<Vec<u32>> = (0..16).map(|c| vec![c]).collect();
    f.cpus("0-15", &cores);
    f.node(0, "0-7", 64_000_000);
    f.node(1, "8-15", 64_000_000);
    f.pci("0000:3b:00.0", 0x10de, 0x030200, -1);
    f.pci("0000:af:00.0", 0x10de, 0x030200, -1);
    f
}

/// Nodes 0 and 1 with 8 CPUs each (4 cores × 2 SMT), node 2 with memory and no
/// CPUs (CXL expander), node 3 with CPUs and no memory.
pub fn memory_only_node() -> Fixture {
    let f = Fixture::new();
    let cores: Vec<Vec<u32>> = (0..12).map(|i| vec![i, i + 12]).collect();
    f.cpus("0-23", &cores);
    f.node(0, "0-3,12-15", 32_000_000);
    f.node(1, "4-7,16-19", 32_000_000);
    f.node(2, "", 128_000_000);
    f.node(3, "8-11,20-23", 0);
    f
}
