//! A cgroup v2 directory → containerd's cgroup v2 `Metrics`
//! (`io.containerd.cgroups.v2.Metrics`, containerd/cgroups
//! cgroup2/stats/metrics.proto), field for field what the runc shim's
//! `cgroup2.Manager.Stat()` answers (containerd/cgroups v3.1.3, which
//! containerd 2.3.4's containerd-shim-runc-v2 is built with;
//! cgroup2/manager.go StatFiltered(StatAll), cgroup2/utils.go):
//! - pids, cpu, memory, io and rdma always present (empty when their files
//!   are missing), memory_events only when memory.events has lines, one
//!   hugetlb entry per page size of /sys/kernel/mm/hugepages;
//! - a file's `max` is u64::MAX (getStatFileContentUint64), a missing file 0,
//!   a negative number 0;
//! - PSI (`*.pressure`) present when the file reads, absent when not
//!   (`psi=0` kernels: EOPNOTSUPP).
//!
//! The message type is the one containerd-shim-protos 0.12 generates from
//! its vendored copy of that proto, which predates cgroups v3.1.3's
//! memory.stat split counters `workingset_{refault,activate}_{anon,file}`
//! (fields 39-42); those go in as unknown varint fields, which is the same
//! wire form as the Go message's (proto3: zero left out).

use std::collections::HashMap;
use std::path::Path;
use std::sync::OnceLock;

use containerd_shim::protos::cgroups_v2::metrics::{
    CPUStat, HugeTlbStat, IOEntry, IOStat, MemoryEvents, MemoryStat, Metrics, PSIData, PSIStats,
    PidsStat, RdmaEntry, RdmaStat,
};
use containerd_shim::protos::protobuf::MessageField;
use serde_json::Value;

pub const METRICS_TYPE_URL: &str = "io.containerd.cgroups.v2.Metrics";

/// memory.stat counters the vendored proto lacks: (name, field number).
pub const SPLIT_WORKINGSET: [(&str, u32); 4] = [
    ("workingset_refault_anon", 39),
    ("workingset_refault_file", 40),
    ("workingset_activate_anon", 41),
    ("workingset_activate_file", 42),
];

/// The cgroup at `dir`, as `Manager.Stat()` reads it.
pub fn read(dir: &Path, hugepage_sizes: &[String]) -> Metrics {
    let memory_events = kv(dir, "memory.events")
        .filter(|e| !e.is_empty())
        .map(|e| MemoryEvents {
            low: get(&e, "low"),
            high: get(&e, "high"),
            max: get(&e, "max"),
            oom: get(&e, "oom"),
            oom_kill: get(&e, "oom_kill"),
            oom_group_kill: get(&e, "oom_group_kill"),
            ..Default::default()
        });
    Metrics {
        pids: MessageField::some(PidsStat {
            current: file_u64(dir, "pids.current"),
            limit: file_u64(dir, "pids.max"),
            ..Default::default()
        }),
        cpu: MessageField::some(cpu(
            &kv(dir, "cpu.stat").unwrap_or_default(),
            psi(dir, "cpu"),
        )),
        memory: MessageField::some(memory(
            &kv(dir, "memory.stat").unwrap_or_default(),
            |f| file_u64(dir, f),
            psi(dir, "memory"),
            true,
        )),
        memory_events: memory_events.into(),
        io: MessageField::some(IOStat {
            usage: io_stat(&read_file(dir, "io.stat").unwrap_or_default()),
            psi: psi(dir, "io"),
            ..Default::default()
        }),
        rdma: MessageField::some(RdmaStat {
            current: rdma(&read_file(dir, "rdma.current").unwrap_or_default()),
            limit: rdma(&read_file(dir, "rdma.max").unwrap_or_default()),
            ..Default::default()
        }),
        hugetlb: hugepage_sizes
            .iter()
            .map(|size| HugeTlbStat {
                max: file_u64(dir, &format!("hugetlb.{size}.max")),
                current: file_u64(dir, &format!("hugetlb.{size}.current")),
                pagesize: size.clone(),
                failcnt: kv(dir, &format!("hugetlb.{size}.events")).map_or(0, |e| get(&e, "max")),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

fn cpu(s: &HashMap<String, u64>, psi: MessageField<PSIStats>) -> CPUStat {
    CPUStat {
        usage_usec: get(s, "usage_usec"),
        user_usec: get(s, "user_usec"),
        system_usec: get(s, "system_usec"),
        nr_periods: get(s, "nr_periods"),
        nr_throttled: get(s, "nr_throttled"),
        throttled_usec: get(s, "throttled_usec"),
        nr_bursts: get(s, "nr_bursts"),
        burst_usec: get(s, "burst_usec"),
        psi,
        ..Default::default()
    }
}

/// memory.stat by its names, the figures of `file` (memory.current …).
/// `split`: the four split workingset counters as unknown fields.
fn memory(
    s: &HashMap<String, u64>,
    file: impl Fn(&str) -> u64,
    psi: MessageField<PSIStats>,
    split: bool,
) -> MemoryStat {
    let g = |k: &str| get(s, k);
    let mut m = MemoryStat {
        anon: g("anon"),
        file: g("file"),
        kernel_stack: g("kernel_stack"),
        slab: g("slab"),
        sock: g("sock"),
        shmem: g("shmem"),
        file_mapped: g("file_mapped"),
        file_dirty: g("file_dirty"),
        file_writeback: g("file_writeback"),
        anon_thp: g("anon_thp"),
        inactive_anon: g("inactive_anon"),
        active_anon: g("active_anon"),
        inactive_file: g("inactive_file"),
        active_file: g("active_file"),
        unevictable: g("unevictable"),
        slab_reclaimable: g("slab_reclaimable"),
        slab_unreclaimable: g("slab_unreclaimable"),
        pgfault: g("pgfault"),
        pgmajfault: g("pgmajfault"),
        workingset_refault: g("workingset_refault"),
        workingset_activate: g("workingset_activate"),
        workingset_nodereclaim: g("workingset_nodereclaim"),
        pgrefill: g("pgrefill"),
        pgscan: g("pgscan"),
        pgsteal: g("pgsteal"),
        pgactivate: g("pgactivate"),
        pgdeactivate: g("pgdeactivate"),
        pglazyfree: g("pglazyfree"),
        pglazyfreed: g("pglazyfreed"),
        thp_fault_alloc: g("thp_fault_alloc"),
        thp_collapse_alloc: g("thp_collapse_alloc"),
        usage: file("memory.current"),
        usage_limit: file("memory.max"),
        max_usage: file("memory.peak"),
        swap_usage: file("memory.swap.current"),
        swap_limit: file("memory.swap.max"),
        swap_max_usage: file("memory.swap.peak"),
        psi,
        ..Default::default()
    };
    if split {
        let unknown = m.special_fields.mut_unknown_fields();
        for (name, number) in SPLIT_WORKINGSET {
            match g(name) {
                0 => {}
                v => unknown.add_varint(number, v),
            }
        }
    }
    m
}

/// `runc events --stats` figures (cgroup unknown) in the v2 type: what
/// runc reports of cpu.stat (in ns), memory.stat (`raw`), memory.current,
/// memory.max and pids; the rest is zero or absent.
pub fn from_runc_events(data: &Value) -> Metrics {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let (cpu_j, mem) = (&data["cpu"], &data["memory"]);
    let raw: HashMap<String, u64> = mem["raw"]
        .as_object()
        .map(|o| o.iter().map(|(k, v)| (k.clone(), n(v))).collect())
        .unwrap_or_default();
    let mut cpu_kv = HashMap::new();
    for (k, v) in [
        ("usage_usec", &cpu_j["usage"]["total"]),
        ("user_usec", &cpu_j["usage"]["user"]),
        ("system_usec", &cpu_j["usage"]["kernel"]),
        ("throttled_usec", &cpu_j["throttling"]["throttledTime"]),
    ] {
        cpu_kv.insert(k.to_string(), n(v) / 1000);
    }
    cpu_kv.insert("nr_periods".into(), n(&cpu_j["throttling"]["periods"]));
    cpu_kv.insert(
        "nr_throttled".into(),
        n(&cpu_j["throttling"]["throttledPeriods"]),
    );
    let file = |f: &str| match f {
        "memory.current" => n(&mem["usage"]["usage"]),
        "memory.max" => n(&mem["usage"]["limit"]),
        "memory.peak" => n(&mem["usage"]["max"]),
        _ => 0,
    };
    Metrics {
        pids: MessageField::some(PidsStat {
            current: n(&data["pids"]["current"]),
            limit: n(&data["pids"]["limit"]),
            ..Default::default()
        }),
        cpu: MessageField::some(cpu(&cpu_kv, MessageField::none())),
        memory: MessageField::some(memory(&raw, file, MessageField::none(), true)),
        io: MessageField::some(IOStat::default()),
        rdma: MessageField::some(RdmaStat::default()),
        ..Default::default()
    }
}

/// The page sizes of /sys/kernel/mm/hugepages as cgroup v2 names them
/// (`hugepages-2048kB` → `2MB`), in directory order, read once.
pub fn hugepage_sizes() -> &'static [String] {
    static SIZES: OnceLock<Vec<String>> = OnceLock::new();
    SIZES.get_or_init(|| {
        let names = std::fs::read_dir("/sys/kernel/mm/hugepages")
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        hugepage_sizes_from(&names)
    })
}

pub fn hugepage_sizes_from(names: &[String]) -> Vec<String> {
    names
        .iter()
        .filter_map(|f| {
            let kb: u64 = f
                .strip_prefix("hugepages-")?
                .strip_suffix("kB")?
                .parse()
                .ok()?;
            Some(match kb {
                k if k >= 1 << 20 => format!("{}GB", k >> 20),
                k if k >= 1 << 10 => format!("{}MB", k >> 10),
                k => format!("{k}KB"),
            })
        })
        .collect()
}

fn get(m: &HashMap<String, u64>, k: &str) -> u64 {
    m.get(k).copied().unwrap_or(0)
}

fn read_file(dir: &Path, f: &str) -> Option<String> {
    std::fs::read_to_string(dir.join(f)).ok()
}

/// A number as cgroups' parseUint reads it: a negative one is 0.
fn parse_u64(s: &str) -> Option<u64> {
    s.parse()
        .ok()
        .or_else(|| s.parse::<i128>().ok().filter(|v| *v < 0).map(|_| 0))
}

/// getStatFileContentUint64: `max` is u64::MAX, missing or unparsable 0.
fn file_u64(dir: &Path, f: &str) -> u64 {
    match read_file(dir, f).as_deref().map(str::trim) {
        Some("max") => u64::MAX,
        Some(v) => parse_u64(v).unwrap_or(0),
        None => 0,
    }
}

/// `key value` lines; None when the file does not read.
fn kv(dir: &Path, f: &str) -> Option<HashMap<String, u64>> {
    let text = read_file(dir, f)?;
    Some(
        text.lines()
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                let (k, v) = (w.next()?, w.next()?);
                Some((k.to_string(), parse_u64(v)?))
            })
            .collect(),
    )
}

/// `some avg10=… avg60=… avg300=… total=…` / `full …`; None when the file
/// does not read or a figure does not parse (getStatPSIFromFile).
fn psi(dir: &Path, controller: &str) -> MessageField<PSIStats> {
    let parse = |text: String| -> Option<PSIStats> {
        let mut p = PSIStats::default();
        for line in text.lines() {
            let mut w = line.split_whitespace();
            let slot = match w.next() {
                Some("some") => &mut p.some,
                Some("full") => &mut p.full,
                _ => continue,
            };
            let mut d = PSIData::default();
            for f in w {
                let (k, v) = f.split_once('=')?;
                match k {
                    "avg10" => d.avg10 = v.parse().ok()?,
                    "avg60" => d.avg60 = v.parse().ok()?,
                    "avg300" => d.avg300 = v.parse().ok()?,
                    "total" => d.total = v.parse().ok()?,
                    _ => {}
                }
            }
            *slot = MessageField::some(d);
        }
        Some(p)
    };
    read_file(dir, &format!("{controller}.pressure"))
        .and_then(parse)
        .into()
}

/// io.stat: `MAJ:MIN rbytes=… wbytes=… rios=… wios=… dbytes=… dios=…`.
fn io_stat(text: &str) -> Vec<IOEntry> {
    let mut out = Vec::new();
    for line in text.split('\n') {
        let parts: Vec<&str> = line.split(' ').collect();
        if parts.len() < 2 {
            continue;
        }
        let Some((maj, min)) = parts[0].split_once(':') else {
            continue;
        };
        let (Ok(major), Ok(minor)) = (maj.parse(), min.parse()) else {
            return out;
        };
        let mut e = IOEntry {
            major,
            minor,
            ..Default::default()
        };
        for kv in &parts[1..] {
            let Some((k, v)) = kv.split_once('=') else {
                continue;
            };
            let Ok(v) = v.parse() else { continue };
            match k {
                "rbytes" => e.rbytes = v,
                "wbytes" => e.wbytes = v,
                "rios" => e.rios = v,
                "wios" => e.wios = v,
                _ => {}
            }
        }
        out.push(e);
    }
    out
}

/// rdma.current / rdma.max: `DEVICE hca_handle=N hca_object=N` (`max` is
/// u32::MAX).
fn rdma(text: &str) -> Vec<RdmaEntry> {
    text.lines()
        .filter_map(|l| {
            let p: Vec<&str> = l.split_whitespace().collect();
            if p.len() != 3 {
                return None;
            }
            let mut e = RdmaEntry {
                device: p[0].to_string(),
                ..Default::default()
            };
            for f in &p[1..] {
                let Some((k, v)) = f.split_once('=') else {
                    continue;
                };
                let Some(v) = (match v {
                    "max" => Some(u32::MAX),
                    v => v.parse().ok(),
                }) else {
                    continue;
                };
                match k {
                    "hca_handle" => e.hca_handles = v,
                    "hca_object" => e.hca_objects = v,
                    _ => {}
                }
            }
            Some(e)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::CgroupDirs;
    use containerd_shim::protos::protobuf::{Message, UnknownValueRef};

    /// A container's cgroup as a 6.x kernel shows it (figures from a
    /// Debian 13 guest's pod container, some changed to be told apart).
    const MEMORY_STAT: &str = "anon 3518464\nfile 16707584\nkernel 1212416\n\
kernel_stack 65536\npagetables 143360\nsec_pagetables 0\npercpu 1440\nsock 4096\n\
vmalloc 8192\nshmem 12288\nzswap 0\nzswapped 0\nfile_mapped 6299648\nfile_dirty 8192\n\
file_writeback 4096\nswapcached 0\nanon_thp 2097152\nfile_thp 0\nshmem_thp 0\n\
inactive_anon 3510272\nactive_anon 20480\ninactive_file 12845056\nactive_file 3850240\n\
unevictable 16384\nslab_reclaimable 713400\nslab_unreclaimable 210544\nslab 923944\n\
workingset_refault_anon 11\nworkingset_refault_file 22\nworkingset_activate_anon 33\n\
workingset_activate_file 44\nworkingset_restore_anon 0\nworkingset_restore_file 0\n\
workingset_nodereclaim 55\npgdemote_kswapd 0\npgdemote_direct 0\npgdemote_khugepaged 0\n\
pgscan 66\npgsteal 77\npgscan_kswapd 0\npgscan_direct 66\npgscan_khugepaged 0\n\
pgsteal_kswapd 0\npgsteal_direct 77\npgsteal_khugepaged 0\npgfault 5331\npgmajfault 31\n\
pgrefill 88\npgactivate 917\npgdeactivate 99\npglazyfree 5\npglazyfreed 4\nzswpin 0\n\
zswpout 0\nzswpwb 0\nthp_fault_alloc 3\nthp_collapse_alloc 2\nthp_swpout 0\n\
thp_swpout_fallback 0\n";

    fn fixture(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("tw-metrics-v2-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        for (f, v) in [
            (
                "cgroup.controllers",
                "cpuset cpu io memory hugetlb pids rdma misc\n",
            ),
            (
                "cpu.stat",
                "usage_usec 812345\nuser_usec 700000\nsystem_usec 112345\n\
                 core_sched.force_idle_usec 0\nnr_periods 120\nnr_throttled 37\n\
                 throttled_usec 1523456\nnr_bursts 2\nburst_usec 4000\n",
            ),
            (
                "cpu.pressure",
                "some avg10=1.50 avg60=0.75 avg300=0.20 total=1523000\n\
                 full avg10=0.50 avg60=0.25 avg300=0.10 total=900000\n",
            ),
            ("memory.current", "21553152\n"),
            ("memory.max", "134217728\n"),
            ("memory.peak", "25165824\n"),
            ("memory.swap.current", "0\n"),
            ("memory.swap.max", "max\n"),
            ("memory.swap.peak", "0\n"),
            ("memory.stat", MEMORY_STAT),
            (
                "memory.events",
                "low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n",
            ),
            (
                "memory.pressure",
                "some avg10=0.00 avg60=0.00 avg300=0.00 total=42\n\
                 full avg10=0.00 avg60=0.00 avg300=0.00 total=40\n",
            ),
            (
                "io.stat",
                "254:0 rbytes=1208320 wbytes=8192 rios=67 wios=2 dbytes=0 dios=0\n\
                 7:3 rbytes=4096 wbytes=0 rios=1 wios=0 dbytes=0 dios=0\n",
            ),
            ("pids.current", "3\n"),
            ("pids.max", "max\n"),
            ("hugetlb.2MB.current", "0\n"),
            ("hugetlb.2MB.max", "max\n"),
            ("hugetlb.2MB.events", "max 4\n"),
            ("hugetlb.1GB.current", "1073741824\n"),
            ("hugetlb.1GB.max", "2147483648\n"),
            ("hugetlb.1GB.events", "max 0\n"),
            ("rdma.current", "mlx5_0 hca_handle=2 hca_object=2000\n"),
            ("rdma.max", "mlx5_0 hca_handle=max hca_object=4000\n"),
        ] {
            std::fs::write(d.join(f), v).unwrap();
        }
        d
    }

    fn unknown(m: &MemoryStat, number: u32) -> Option<u64> {
        match m.special_fields.unknown_fields().get(number)? {
            UnknownValueRef::Varint(v) => Some(v),
            _ => None,
        }
    }

    #[test]
    fn a_v2_cgroup_tree_reads_like_the_runc_shims_manager_stat() {
        let d = fixture("full");
        let sizes = hugepage_sizes_from(&["hugepages-2048kB".into(), "hugepages-1048576kB".into()]);
        assert_eq!(sizes, ["2MB", "1GB"]);
        let any = crate::metrics::to_any(METRICS_TYPE_URL, &read(&d, &sizes)).unwrap();
        let _ = std::fs::remove_dir_all(&d);
        assert_eq!(any.type_url, "io.containerd.cgroups.v2.Metrics");
        let m = Metrics::parse_from_bytes(&any.value).unwrap();

        assert_eq!((m.pids.current, m.pids.limit), (3, u64::MAX));
        let c = &m.cpu;
        assert_eq!(
            (c.usage_usec, c.user_usec, c.system_usec),
            (812345, 700000, 112345)
        );
        assert_eq!(
            (c.nr_periods, c.nr_throttled, c.throttled_usec),
            (120, 37, 1523456)
        );
        assert_eq!((c.nr_bursts, c.burst_usec), (2, 4000));
        assert_eq!((c.psi.some.avg10, c.psi.some.total), (1.5, 1523000));
        assert_eq!((c.psi.full.avg300, c.psi.full.total), (0.1, 900000));

        let ms = &m.memory;
        // What kubelet's working set reads: usage - inactive_file.
        assert_eq!(
            (ms.usage, ms.inactive_file, ms.active_file),
            (21553152, 12845056, 3850240)
        );
        assert_eq!(
            (ms.usage_limit, ms.max_usage, ms.swap_usage, ms.swap_limit),
            (134217728, 25165824, 0, u64::MAX)
        );
        assert_eq!(
            (ms.anon, ms.file, ms.kernel_stack),
            (3518464, 16707584, 65536)
        );
        assert_eq!((ms.slab, ms.sock, ms.shmem), (923944, 4096, 12288));
        assert_eq!(
            (
                ms.file_mapped,
                ms.file_dirty,
                ms.file_writeback,
                ms.anon_thp
            ),
            (6299648, 8192, 4096, 2097152)
        );
        assert_eq!(
            (ms.inactive_anon, ms.active_anon, ms.unevictable),
            (3510272, 20480, 16384)
        );
        assert_eq!(
            (ms.slab_reclaimable, ms.slab_unreclaimable),
            (713400, 210544)
        );
        assert_eq!((ms.pgfault, ms.pgmajfault), (5331, 31));
        // The kernel split these (5.9); the old names read 0, as in Go.
        assert_eq!((ms.workingset_refault, ms.workingset_activate), (0, 0));
        assert_eq!(ms.workingset_nodereclaim, 55);
        assert_eq!(
            (
                ms.pgrefill,
                ms.pgscan,
                ms.pgsteal,
                ms.pgactivate,
                ms.pgdeactivate
            ),
            (88, 66, 77, 917, 99)
        );
        assert_eq!((ms.pglazyfree, ms.pglazyfreed), (5, 4));
        assert_eq!((ms.thp_fault_alloc, ms.thp_collapse_alloc), (3, 2));
        assert_eq!(ms.psi.some.total, 42);
        let split: Vec<_> = SPLIT_WORKINGSET
            .iter()
            .map(|(_, n)| unknown(ms, *n))
            .collect();
        assert_eq!(split, [Some(11), Some(22), Some(33), Some(44)]);

        let e = &m.memory_events;
        assert_eq!(
            (e.low, e.high, e.max, e.oom, e.oom_kill, e.oom_group_kill),
            (0, 0, 12, 2, 1, 0)
        );

        let io = &m.io.usage;
        assert_eq!(io.len(), 2);
        assert_eq!(
            (
                io[0].major,
                io[0].minor,
                io[0].rbytes,
                io[0].wbytes,
                io[0].rios,
                io[0].wios
            ),
            (254, 0, 1208320, 8192, 67, 2)
        );
        assert_eq!((io[1].major, io[1].minor, io[1].rbytes), (7, 3, 4096));
        assert!(m.io.psi.is_none(), "no io.pressure in the tree");

        let h: Vec<_> = m
            .hugetlb
            .iter()
            .map(|h| (h.pagesize.as_str(), h.current, h.max, h.failcnt))
            .collect();
        assert_eq!(
            h,
            [("2MB", 0, u64::MAX, 4), ("1GB", 1073741824, 2147483648, 0)]
        );
        let r = &m.rdma;
        assert_eq!(
            (
                r.current[0].device.as_str(),
                r.current[0].hca_handles,
                r.current[0].hca_objects
            ),
            ("mlx5_0", 2, 2000)
        );
        assert_eq!(
            (r.limit[0].hca_handles, r.limit[0].hca_objects),
            (u32::MAX, 4000)
        );
        assert!(m.network.is_empty());
    }

    #[test]
    fn an_empty_v2_cgroup_answers_as_manager_stat_does() {
        // A directory with none of the files (no controller enabled):
        // Stat still answers pids, cpu, memory, io and rdma, all zero.
        let d = std::env::temp_dir().join(format!("tw-metrics-v2-bare-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let m = read(&d, &["2MB".into()]);
        let _ = std::fs::remove_dir_all(&d);
        assert!(m.pids.is_some() && m.cpu.is_some() && m.memory.is_some());
        assert!(m.io.is_some() && m.rdma.is_some());
        assert_eq!(m.cpu.usage_usec, 0);
        assert!(m.cpu.psi.is_none());
        assert!(m.memory_events.is_none(), "memory.events missing");
        assert!(m
            .memory
            .special_fields
            .unknown_fields()
            .iter()
            .next()
            .is_none());
        assert_eq!(m.hugetlb.len(), 1);
        assert_eq!(
            (m.hugetlb[0].max, m.hugetlb[0].pagesize.as_str()),
            (0, "2MB")
        );
    }

    #[test]
    fn the_shim_answers_v2_metrics_for_a_v2_cgroup() {
        let d = fixture("dirs");
        let dirs = CgroupDirs {
            v2: true,
            cpu: Some(d.clone()),
            cpuacct: Some(d.clone()),
            memory: Some(d.clone()),
            pids: Some(d.clone()),
        };
        let any = dirs.metrics_any().unwrap().unwrap();
        let _ = std::fs::remove_dir_all(&d);
        assert!(dirs.metrics_any().is_none(), "cgroup gone");
        assert_eq!(any.type_url, METRICS_TYPE_URL);
        let m = Metrics::parse_from_bytes(&any.value).unwrap();
        assert_eq!(m.memory.inactive_file, 12845056);
        assert_eq!(m.cpu.throttled_usec, 1523456);
        assert_eq!(m.memory_events.oom_kill, 1);
        assert_eq!(m.hugetlb.len(), hugepage_sizes().len());
    }

    #[test]
    fn runc_events_on_v2_answer_the_v2_type() {
        let data = serde_json::json!({
            "cpu": {"usage": {"total": 5_000_000, "kernel": 1_000_000, "user": 4_000_000},
                    "throttling": {"periods": 10, "throttledPeriods": 7, "throttledTime": 123_000}},
            "memory": {"usage": {"usage": 4096, "limit": 8192},
                       "raw": {"inactive_file": 1024, "pgfault": 9, "workingset_refault_file": 3}},
            "pids": {"current": 2}
        });
        let any = crate::metrics::metrics_any(&data, true).unwrap();
        assert_eq!(any.type_url, METRICS_TYPE_URL);
        let m = Metrics::parse_from_bytes(&any.value).unwrap();
        assert_eq!(
            (m.cpu.usage_usec, m.cpu.system_usec, m.cpu.user_usec),
            (5000, 1000, 4000)
        );
        assert_eq!((m.cpu.nr_throttled, m.cpu.throttled_usec), (7, 123));
        assert_eq!((m.memory.usage, m.memory.usage_limit), (4096, 8192));
        assert_eq!((m.memory.inactive_file, m.memory.pgfault), (1024, 9));
        assert_eq!(unknown(&m.memory, 40), Some(3));
        assert_eq!(m.pids.current, 2);
    }
}
