//! `runc events --stats` JSON → containerd's cgroup v1 `Metrics` protobuf
//! (what `ctr task metrics` and the CRI stats read).

use containerd_shim::protos::cgroups::metrics::{
    CPUStat, CPUUsage, MemoryEntry, MemoryStat, Metrics, PidsStat, Throttle,
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
    let mem = &data["memory"];
    let memory = MemoryStat {
        cache: u(&mem["cache"]),
        usage: entry(&mem["usage"]),
        swap: entry(&mem["swap"]),
        kernel: entry(&mem["kernel"]),
        kernel_tcp: entry(&mem["kernelTCP"]),
        ..Default::default()
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
        ..Default::default()
    }
}

pub fn metrics_any(data: &Value) -> Result<Any, String> {
    let value = metrics(data).write_to_bytes().map_err(|e| e.to_string())?;
    Ok(Any {
        type_url: METRICS_TYPE_URL.into(),
        value,
        ..Default::default()
    })
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
        let any = metrics_any(&data).unwrap();
        assert_eq!(Metrics::parse_from_bytes(&any.value).unwrap(), m);
    }
}
