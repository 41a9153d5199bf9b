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
#[path = "metrics_v2_tests.rs"]
mod tests;
