//! A container's cgroup figures → the `Metrics` protobuf containerd's
//! runc shim answers `Stats` with (what `ctr task metrics` and the CRI
//! stats read): cgroup v1's `io.containerd.cgroups.v1.Metrics` where the
//! container's cpuacct is on a v1 hierarchy (also on a hybrid host, as the
//! runc shim's cgroup1 there), cgroup v2's `io.containerd.cgroups.v2.Metrics`
//! on a unified one ([`crate::metrics_v2`]). The runc shim reads the cgroup
//! itself (task/service.go Stats: cgroup1 `Stat(IgnoreNotExist)`, memory.stat
//! in full, memory.oom_control; cgroup2 `Manager.Stat`), running or not, so
//! do we, from the directories noted at create ([`CgroupDirs`]); `runc
//! events --stats` is asked only when those are unknown (runc refuses once
//! init exited: `container … is not running`).

use std::path::{Path, PathBuf};

use throttlewatch_cgroup::hierarchy::controller_dir_from;
use throttlewatch_cgroup::CgroupMode;

use containerd_shim::protos::cgroups::metrics::{
    CPUStat, CPUUsage, MemoryEntry, MemoryOomControl, MemoryStat, Metrics, PidsStat, Throttle,
};
use containerd_shim::protos::protobuf::well_known_types::any::Any;
use containerd_shim::protos::protobuf::{Message, MessageField};
use serde_json::Value;

pub const METRICS_TYPE_URL: &str = "io.containerd.cgroups.v1.Metrics";

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

fn entry(v: &Value) -> MessageField<MemoryEntry> {
    MessageField::some(MemoryEntry {
        usage: u(&v["usage"]),
        max: u(&v["max"]),
        limit: u(&v["limit"]),
        failcnt: u(&v["failcnt"]),
        ..Default::default()
    })
}

pub fn metrics(data: &Value) -> Metrics {
    let cpu = &data["cpu"];
    let usage = CPUUsage {
        total: u(&cpu["usage"]["total"]),
        kernel: u(&cpu["usage"]["kernel"]),
        user: u(&cpu["usage"]["user"]),
        per_cpu: cpu["usage"]["percpu"]
            .as_array()
            .map(|a| a.iter().map(u).collect())
            .unwrap_or_default(),
        ..Default::default()
    };
    let t = &cpu["throttling"];
    let throttling = Throttle {
        periods: u(&t["periods"]),
        throttled_periods: u(&t["throttledPeriods"]),
        throttled_time: u(&t["throttledTime"]),
        ..Default::default()
    };
    let memory = memory_stat(&data["memory"]);
    // memory.oom_control (the CRI's container_oom_events_total), read from
    // the cgroup as the runc shim does; runc events has none.
    let oom = &data["memory_oom_control"];
    let memory_oom_control = match oom.is_object() {
        true => MessageField::some(MemoryOomControl {
            oom_kill_disable: u(&oom["oom_kill_disable"]),
            under_oom: u(&oom["under_oom"]),
            oom_kill: u(&oom["oom_kill"]),
            ..Default::default()
        }),
        false => MessageField::none(),
    };
    Metrics {
        cpu: MessageField::some(CPUStat {
            usage: MessageField::some(usage),
            throttling: MessageField::some(throttling),
            ..Default::default()
        }),
        memory: MessageField::some(memory),
        pids: MessageField::some(PidsStat {
            current: u(&data["pids"]["current"]),
            limit: u(&data["pids"]["limit"]),
            ..Default::default()
        }),
        memory_oom_control,
        ..Default::default()
    }
}

/// memory.stat by its own names (runc's `raw`); what kubelet's working
/// set (usage - total_inactive_file) and the CRI's page-fault and RSS
/// figures read.
fn memory_stat(mem: &Value) -> MemoryStat {
    let r = |k: &str| u(&mem["raw"][k]);
    MemoryStat {
        cache: u(&mem["cache"]),
        rss: r("rss"),
        rss_huge: r("rss_huge"),
        mapped_file: r("mapped_file"),
        dirty: r("dirty"),
        writeback: r("writeback"),
        pg_pg_in: r("pgpgin"),
        pg_pg_out: r("pgpgout"),
        pg_fault: r("pgfault"),
        pg_maj_fault: r("pgmajfault"),
        inactive_anon: r("inactive_anon"),
        active_anon: r("active_anon"),
        inactive_file: r("inactive_file"),
        active_file: r("active_file"),
        unevictable: r("unevictable"),
        hierarchical_memory_limit: r("hierarchical_memory_limit"),
        hierarchical_swap_limit: r("hierarchical_memsw_limit"),
        total_cache: r("total_cache"),
        total_rss: r("total_rss"),
        total_rss_huge: r("total_rss_huge"),
        total_mapped_file: r("total_mapped_file"),
        total_dirty: r("total_dirty"),
        total_writeback: r("total_writeback"),
        total_pg_pg_in: r("total_pgpgin"),
        total_pg_pg_out: r("total_pgpgout"),
        total_pg_fault: r("total_pgfault"),
        total_pg_maj_fault: r("total_pgmajfault"),
        total_inactive_anon: r("total_inactive_anon"),
        total_active_anon: r("total_active_anon"),
        total_inactive_file: r("total_inactive_file"),
        total_active_file: r("total_active_file"),
        total_unevictable: r("total_unevictable"),
        usage: entry(&mem["usage"]),
        swap: entry(&mem["swap"]),
        kernel: entry(&mem["kernel"]),
        kernel_tcp: entry(&mem["kernelTCP"]),
        ..Default::default()
    }
}

/// Metrics that protobuf could not encode for their `Any`.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct MarshalError(#[from] containerd_shim::protos::protobuf::Error);

/// `m` in an `Any` as containerd's typeurl.MarshalAny wraps it: the
/// message's full name as the type URL, no prefix.
pub fn to_any(type_url: &str, m: &impl Message) -> Result<Any, MarshalError> {
    let value = m.write_to_bytes()?;
    Ok(Any {
        type_url: type_url.into(),
        value,
        ..Default::default()
    })
}

/// `runc events --stats` figures (the fallback when the cgroup is unknown)
/// in the type of the node's cgroup version.
pub fn metrics_any(data: &Value, v2: bool) -> Result<Any, MarshalError> {
    match v2 {
        true => to_any(
            crate::metrics_v2::METRICS_TYPE_URL,
            &crate::metrics_v2::from_runc_events(data),
        ),
        false => to_any(METRICS_TYPE_URL, &metrics(data)),
    }
}

/// A container's cgroup directories, noted while its init runs.
#[derive(Debug, Clone, Default)]
pub struct CgroupDirs {
    pub v2: bool,
    pub cpu: Option<PathBuf>,
    pub cpuacct: Option<PathBuf>,
    pub memory: Option<PathBuf>,
    pub pids: Option<PathBuf>,
}

impl CgroupDirs {
    /// One read of the process's cgroup list and of mountinfo for all four.
    pub fn of_pid(pid: u32) -> CgroupDirs {
        let read = |p: String| std::fs::read_to_string(p).unwrap_or_default();
        let (pc, mi) = (
            read(format!("/proc/{pid}/cgroup")),
            read("/proc/self/mountinfo".into()),
        );
        let dir = |c| controller_dir_from(&pc, &mi, c);
        let acct = dir("cpuacct");
        // Unknown cpuacct: the node's version (runc events' fallback answer).
        let v2 = match &acct {
            Some((_, m)) => *m == CgroupMode::V2,
            None => Path::new("/sys/fs/cgroup/cgroup.controllers").exists(),
        };
        CgroupDirs {
            v2,
            cpu: dir("cpu").map(|d| d.0),
            cpuacct: acct.map(|d| d.0),
            memory: dir("memory").map(|d| d.0),
            pids: dir("pids").map(|d| d.0),
        }
    }

    /// The task's metrics as the runc shim answers `Stats` on this cgroup
    /// version, in their `Any`; None when the cgroup is unknown or gone.
    pub fn metrics_any(&self) -> Option<Result<Any, MarshalError>> {
        let acct = self.cpuacct.as_deref()?;
        if !acct.exists() {
            return None;
        }
        Some(match self.v2 {
            true => to_any(
                crate::metrics_v2::METRICS_TYPE_URL,
                &crate::metrics_v2::read(acct, crate::metrics_v2::hugepage_sizes()),
            ),
            false => to_any(METRICS_TYPE_URL, &metrics(&self.read_v1(acct))),
        })
    }

    fn read_v1(&self, acct: &Path) -> Value {
        // USER_HZ is 100 on every Linux ABI; runc converts the same way.
        let ticks = kv(acct, "cpuacct.stat");
        let tick_ns = |k: &str| ticks.get(k).copied().unwrap_or(0) * 10_000_000;
        let cpu = kv_opt(self.cpu.as_deref(), "cpu.stat");
        let percpu: Vec<u64> = read(acct, "cpuacct.usage_percpu")
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect();
        let mem = self.memory.as_deref();
        let m = |f: &str| mem.map_or(0, |d| num(d, f));
        let mstat = kv_opt(mem, "memory.stat");
        let entry = |p: &str| {
            serde_json::json!({
                "usage": m(&format!("{p}usage_in_bytes")),
                "max": m(&format!("{p}max_usage_in_bytes")),
                "limit": m(&format!("{p}limit_in_bytes")),
                "failcnt": m(&format!("{p}failcnt")),
            })
        };
        serde_json::json!({
            "cpu": {
                "usage": {"total": num(acct, "cpuacct.usage"), "percpu": percpu,
                          "kernel": tick_ns("system"), "user": tick_ns("user")},
                "throttling": {"periods": cpu.get("nr_periods"),
                               "throttledPeriods": cpu.get("nr_throttled"),
                               "throttledTime": cpu.get("throttled_time")},
            },
            "memory": {
                "cache": mstat.get("cache"),
                "usage": entry("memory."),
                "swap": entry("memory.memsw."),
                "kernel": entry("memory.kmem."),
                "kernelTCP": entry("memory.kmem.tcp."),
                "raw": mstat,
            },
            "memory_oom_control": kv_opt(mem, "memory.oom_control"),
            "pids": self.pids_json(),
        })
    }

    fn pids_json(&self) -> Value {
        let Some(d) = self.pids.as_deref() else {
            return Value::Null;
        };
        let limit = match read(d, "pids.max").trim() {
            "max" => 0,
            v => v.parse().unwrap_or(0),
        };
        serde_json::json!({"current": num(d, "pids.current"), "limit": limit})
    }
}

fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file)).unwrap_or_default()
}

fn num(dir: &Path, file: &str) -> u64 {
    read(dir, file).trim().parse().unwrap_or(0)
}

/// `key value` lines.
fn kv(dir: &Path, file: &str) -> std::collections::HashMap<String, u64> {
    read(dir, file)
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

fn kv_opt(dir: Option<&Path>, file: &str) -> std::collections::HashMap<String, u64> {
    dir.map(|d| kv(d, file)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runc_stats_are_mapped() {
        let data = serde_json::json!({
            "cpu": {"usage": {"total": 5, "percpu": [2, 3], "kernel": 1, "user": 4},
                    "throttling": {"periods": 10, "throttledPeriods": 7, "throttledTime": 123}},
            "memory": {"usage": {"usage": 4096, "limit": 8192}},
            "pids": {"current": 2}
        });
        let m = metrics(&data);
        assert_eq!(m.cpu.throttling.throttled_time, 123);
        assert_eq!(m.cpu.throttling.throttled_periods, 7);
        assert_eq!(m.cpu.usage.per_cpu, vec![2, 3]);
        assert_eq!(m.memory.usage.limit, 8192);
        assert_eq!(m.pids.current, 2);
        assert!(m.memory_oom_control.is_none(), "runc events has none");
        let any = metrics_any(&data, false).unwrap();
        assert_eq!(any.type_url, "io.containerd.cgroups.v1.Metrics");
        assert_eq!(Metrics::parse_from_bytes(&any.value).unwrap(), m);
    }

    #[test]
    fn a_v1_cgroup_tree_reads_like_runc_events() {
        let d = std::env::temp_dir().join(format!("tw-metrics-{}", std::process::id()));
        let (cpu, mem, pids) = (d.join("cpu"), d.join("memory"), d.join("pids"));
        for (dir, files) in [
            (
                &cpu,
                &[
                    ("cpuacct.usage", "900\n"),
                    ("cpuacct.usage_percpu", "400 500 \n"),
                    ("cpuacct.stat", "user 3\nsystem 1\n"),
                    (
                        "cpu.stat",
                        "nr_periods 10\nnr_throttled 7\nthrottled_time 123\n",
                    ),
                ][..],
            ),
            (
                &mem,
                &[
                    ("memory.usage_in_bytes", "4096\n"),
                    ("memory.limit_in_bytes", "8192\n"),
                    (
                        "memory.stat",
                        "cache 11\nrss 22\npgfault 33\nhierarchical_memsw_limit 44\n\
                         total_inactive_file 55\n",
                    ),
                    (
                        "memory.oom_control",
                        "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
                    ),
                ][..],
            ),
            (&pids, &[("pids.current", "2\n"), ("pids.max", "max\n")][..]),
        ] {
            std::fs::create_dir_all(dir).unwrap();
            for (f, v) in files {
                std::fs::write(dir.join(f), v).unwrap();
            }
        }
        let dirs = CgroupDirs {
            v2: false,
            cpu: Some(cpu.clone()),
            cpuacct: Some(cpu),
            memory: Some(mem),
            pids: Some(pids),
        };
        let any = dirs.metrics_any().unwrap().unwrap();
        let _ = std::fs::remove_dir_all(&d);
        assert_eq!(any.type_url, "io.containerd.cgroups.v1.Metrics");
        let m = Metrics::parse_from_bytes(&any.value).unwrap();
        assert_eq!(m.cpu.usage.total, 900);
        assert_eq!(m.cpu.usage.per_cpu, vec![400, 500]);
        assert_eq!(m.cpu.usage.user, 30_000_000);
        assert_eq!(m.cpu.throttling.throttled_periods, 7);
        assert_eq!(m.cpu.throttling.throttled_time, 123);
        assert_eq!(m.memory.usage.limit, 8192);
        assert_eq!(m.memory.cache, 11);
        let ms = &m.memory;
        assert_eq!(
            (ms.rss, ms.pg_fault, ms.hierarchical_swap_limit),
            (22, 33, 44)
        );
        assert_eq!(ms.total_inactive_file, 55);
        assert_eq!(m.memory_oom_control.oom_kill, 3);
        assert_eq!((m.pids.current, m.pids.limit), (2, 0));
        assert!(CgroupDirs::default().metrics_any().is_none());
    }
}
