//! The annotation keys and their environment-variable twins: named once here
//! and used everywhere (parser, refusals, the runtime wrapper's create stamp,
//! the agent's cold-start target, documentation tests).

use std::time::Duration;

use serde::Serialize;

/// Every annotation key lies under this prefix.
pub const PREFIX: &str = "throttlewatch.io/";
/// The environment-variable channel (Docker 20.10 has no `--annotation`).
pub const ENV_PREFIX: &str = "THROTTLEWATCH_";
/// Longest value accepted for any key.
pub const MAX_VALUE_BYTES: usize = 256;
/// Longest duration accepted for `threshold` and `cpu-burst`.
pub const MAX_DURATION: Duration = Duration::from_secs(10);
/// Highest CPU or NUMA-node id (the kernel's CPU-list format, see `CpuList`).
pub const MAX_CPU_COUNT: u32 = crate::cpulist::MAX_ID + 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Key {
    Watch,
    Threshold,
    CpuBurst,
    QosClass,
    Cpuset,
    CpusetExclusive,
    CpusetCpus,
    Gpus,
    /// Dynamic CPU burst and quota by the agent (`auto`, `off`).
    CpuControl,
    /// Not QoS: a create time, Unix ns, that earlier versions stamped into
    /// the spec; accepted and ignored (the create time now travels outside it).
    CreatedUnixNs,
    /// Not QoS: the CPU that completes a cold start, for the agent (a duration).
    ColdStartCpu,
    /// Not QoS: the container's series in `/metrics`, for the agent (`basic`, `full`).
    MetricsDetail,
}

impl Key {
    /// The QoS keys: what `throttlewatch_qos::parse_request` reads, each with an
    /// environment-variable twin.
    pub const QOS: [Key; 9] = [
        Key::Watch,
        Key::Threshold,
        Key::CpuBurst,
        Key::QosClass,
        Key::Cpuset,
        Key::CpusetExclusive,
        Key::CpusetCpus,
        Key::Gpus,
        Key::CpuControl,
    ];
    /// Every key under [`PREFIX`].
    pub const ALL: [Key; 12] = [
        Key::Watch,
        Key::Threshold,
        Key::CpuBurst,
        Key::QosClass,
        Key::Cpuset,
        Key::CpusetExclusive,
        Key::CpusetCpus,
        Key::Gpus,
        Key::CpuControl,
        Key::CreatedUnixNs,
        Key::ColdStartCpu,
        Key::MetricsDetail,
    ];

    /// Whether the key is a QoS setting (else it is read by the agent or
    /// written by the wrapper, and QoS parsing passes over it).
    pub fn is_qos(self) -> bool {
        Key::QOS.contains(&self)
    }

    /// The name after the prefix, e.g. `cpu-burst`.
    pub fn name(self) -> &'static str {
        match self {
            Key::Watch => "watch",
            Key::Threshold => "threshold",
            Key::CpuBurst => "cpu-burst",
            Key::QosClass => "qos-class",
            Key::Cpuset => "cpuset",
            Key::CpusetExclusive => "cpuset-exclusive",
            Key::CpusetCpus => "cpuset-cpus",
            Key::Gpus => "gpus",
            Key::CpuControl => "cpu-control",
            Key::CreatedUnixNs => "created-unix-ns",
            Key::ColdStartCpu => "cold-start-cpu",
            Key::MetricsDetail => "metrics-detail",
        }
    }

    /// The full annotation key, e.g. `throttlewatch.io/cpu-burst`.
    pub fn annotation(self) -> String {
        format!("{PREFIX}{}", self.name())
    }

    /// The environment variable, e.g. `THROTTLEWATCH_CPU_BURST` (QoS keys only).
    pub fn env(self) -> Option<&'static str> {
        Some(match self {
            Key::Watch => "THROTTLEWATCH_WATCH",
            Key::Threshold => "THROTTLEWATCH_THRESHOLD",
            Key::CpuBurst => "THROTTLEWATCH_CPU_BURST",
            Key::QosClass => "THROTTLEWATCH_QOS_CLASS",
            Key::Cpuset => "THROTTLEWATCH_CPUSET",
            Key::CpusetExclusive => "THROTTLEWATCH_CPUSET_EXCLUSIVE",
            Key::CpusetCpus => "THROTTLEWATCH_CPUSET_CPUS",
            Key::Gpus => "THROTTLEWATCH_GPUS",
            Key::CpuControl => "THROTTLEWATCH_CPU_CONTROL",
            Key::CreatedUnixNs | Key::ColdStartCpu | Key::MetricsDetail => return None,
        })
    }

    /// What a refusal says is accepted.
    pub fn accepted(self) -> &'static str {
        match self {
            Key::Watch | Key::CpusetExclusive => "expected true or false",
            Key::Threshold => "expected a duration from 0 to 10s such as 1ms (a bare number is microseconds)",
            Key::CpuBurst => "expected a duration such as 20ms or a percentage of the quota such as 50%",
            Key::QosClass => "expected one of latency-critical, burstable, best-effort",
            Key::Cpuset => {
                "expected a CPU list such as 0-3,8, numa:N, gpu-local or auto, optionally followed by ,exclusive"
            }
            Key::CpusetCpus => "expected a whole number of CPUs from 1 to the CPUs of the machine",
            Key::Gpus => "expected all, none, or a comma-separated list of GPU indices or UUIDs such as 0,1 or GPU-8f6e…",
            Key::CpuControl => "expected auto or off",
            Key::CreatedUnixNs => "expected a Unix time in nanoseconds",
            Key::ColdStartCpu => "expected a duration such as 10ms",
            Key::MetricsDetail => crate::metrics_detail::MetricsDetail::ACCEPTED,
        }
    }

    pub fn from_name(name: &str) -> Option<Key> {
        Key::ALL.into_iter().find(|k| k.name() == name)
    }

    pub fn from_env(var: &str) -> Option<Key> {
        Key::QOS.into_iter().find(|k| k.env() == Some(var))
    }
}

/// Keys honoured from annotations only: an image's ENV can set a variable,
/// and a cpuset from it would let an image place itself.
pub const ANNOTATION_ONLY: [Key; 3] = [Key::Cpuset, Key::CpusetExclusive, Key::CpusetCpus];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_env_matches_name() {
        for k in Key::ALL {
            assert_eq!(Key::from_name(k.name()), Some(k));
            assert!(k.annotation().starts_with(PREFIX));
            assert_eq!(k.env().is_some(), k.is_qos(), "{k:?}");
        }
        for k in Key::QOS {
            let env = k.env().unwrap();
            assert_eq!(Key::from_env(env), Some(k));
            let derived = format!("{ENV_PREFIX}{}", k.name().to_uppercase().replace('-', "_"));
            assert_eq!(env, derived);
        }
    }

    #[test]
    fn every_key_is_documented() {
        let doc = include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/annotations.md"
        ));
        for k in Key::QOS {
            assert!(
                doc.contains(&format!("| `{}` | `{}` |", k.name(), k.env().unwrap())),
                "{} is not in the key table",
                k.name()
            );
        }
        for k in Key::ALL
            .into_iter()
            .filter(|k| !k.is_qos() && *k != Key::CreatedUnixNs)
        {
            assert!(
                doc.contains(&format!("| `{}` | ", k.name())),
                "{} is not in the agent's key table",
                k.name()
            );
        }
    }
}
