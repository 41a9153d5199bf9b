//! What a container asks for, parsed from its annotations and environment.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Serialize, Serializer};

use crate::keys::{Key, ENV_PREFIX, MAX_VALUE_BYTES, PREFIX};
use crate::policy::{Policy, PolicyError};
use crate::refusal::Refusal;
use crate::values::{self, GpuDevices, ValueError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum QosClass {
    LatencyCritical,
    Burstable,
    BestEffort,
}

impl QosClass {
    pub fn parse(s: &str) -> Option<QosClass> {
        match s.trim() {
            "latency-critical" => Some(QosClass::LatencyCritical),
            "burstable" => Some(QosClass::Burstable),
            "best-effort" => Some(QosClass::BestEffort),
            _ => None,
        }
    }
}

/// `cpu-control`: whether the agent may move the container's burst and
/// quota (docs/control.md; the node's `[control]` must enable it too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CpuControl {
    Off,
    Auto,
}

impl CpuControl {
    pub fn parse(s: &str) -> Option<CpuControl> {
        match s.trim() {
            "auto" => Some(CpuControl::Auto),
            "off" => Some(CpuControl::Off),
            _ => None,
        }
    }
}

pub use crate::targets::{BurstSpec, CpusetTarget};

impl Serialize for CpusetTarget {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The `gpus` key, with where it came from (for refusals).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuSelection {
    pub key: String,
    pub value: String,
    pub devices: GpuDevices,
}

/// Where a value came from: an annotation key, an environment variable, or
/// a qos-class preset (`preset: true`, `key` is then the qos-class key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Origin {
    pub key: String,
    pub value: String,
    pub preset: bool,
}

impl Origin {
    fn new(key: &str, value: &str) -> Origin {
        Origin {
            key: key.into(),
            value: value.into(),
            preset: false,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct QosRequest {
    pub watch: Option<bool>,
    pub threshold_us: Option<u64>,
    pub qos_class: Option<QosClass>,
    /// Explicit, or from the qos-class preset.
    pub burst: Option<BurstSpec>,
    /// Explicit, or from the preset; `auto` when only `cpuset-exclusive` or
    /// `cpuset-cpus` was given.
    pub cpuset: Option<CpusetTarget>,
    pub exclusive: bool,
    pub cpuset_cpus: Option<u32>,
    pub gpus: Option<GpuSelection>,
    /// Explicit, or `auto` from the latency-critical preset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_control: Option<CpuControl>,
    /// The policy's burst cap (percent of the quota, ≤ 100).
    pub burst_cap_percent: u32,
    pub origins: BTreeMap<Key, Origin>,
    /// How presets and policy shaped the request.
    pub notes: Vec<String>,
}

impl QosRequest {
    pub fn threshold(&self) -> Option<Duration> {
        self.threshold_us.map(Duration::from_micros)
    }

    /// A refusal naming the key and value the setting came from.
    pub fn refusal(&self, key: Key, reason: impl fmt::Display) -> Refusal {
        match self.origins.get(&key) {
            Some(o) => Refusal::new(o.key.clone(), &o.value, reason).about(key),
            None => Refusal::new(key.annotation(), "", reason).about(key),
        }
    }

    /// Whether the setting came from a qos-class preset rather than its own key.
    pub fn from_preset(&self, key: Key) -> bool {
        self.origins.get(&key).is_some_and(|o| o.preset)
    }
}

/// Parse the annotations and the OCI environment ("KEY=VALUE"). Annotations
/// win over the environment; in the environment the last entry wins. Every
/// bad value is refused on its own and the rest still applies.
pub fn parse_request(
    annotations: &BTreeMap<String, String>,
    env: &[String],
    policy: &Policy,
) -> (QosRequest, Vec<Refusal>) {
    let mut refused = Vec::new();
    let (mut raw, env_refused) = from_env(env, policy, &mut refused);
    raw.extend(from_annotations(annotations, &mut refused));
    // Environment keys the policy keeps from it are refused unless an
    // annotation sets the same key (the annotation wins anyway).
    for (k, r) in env_refused {
        if raw.get(&k).is_none_or(|o| o.key.starts_with(ENV_PREFIX)) {
            refused.push(r);
        }
    }
    let mut req = QosRequest {
        burst_cap_percent: policy.burst_cap_percent(),
        ..Default::default()
    };
    let mut ex = Exclusive::default();
    for (key, origin) in raw {
        let v = origin.value.as_str();
        let r = if !policy.allows(key) {
            Err(PolicyError::NotAllowed.into())
        } else if v.len() > MAX_VALUE_BYTES {
            refused.push(Refusal::too_long(origin.key, v).about(key));
            continue;
        } else {
            parse_value(key, &origin, policy, &mut req, &mut ex)
        };
        match r {
            Ok(()) => {
                req.origins.insert(key, origin);
            }
            Err(reason) => refused.push(Refusal::new(origin.key, v, reason).about(key)),
        }
    }
    let exclusive_key = settle_exclusive(&mut req, &ex, policy, &mut refused);
    apply_preset(&mut req, policy);
    default_cpuset(&mut req, exclusive_key);
    (req, refused)
}

/// `THROTTLEWATCH_*` entries of the environment; unknown ones are refused,
/// and those the policy does not take from the environment are returned
/// apart, refused.
fn from_env(
    env: &[String],
    policy: &Policy,
    refused: &mut Vec<Refusal>,
) -> (BTreeMap<Key, Origin>, BTreeMap<Key, Refusal>) {
    let mut raw = BTreeMap::new();
    let mut kept_out = BTreeMap::new();
    for (var, value) in env.iter().filter_map(|e| e.split_once('=')) {
        if !var.starts_with(ENV_PREFIX) {
            continue;
        }
        match Key::from_env(var).map(|k| (k, policy.env_allows(k))) {
            Some((k, Err(why))) => {
                kept_out.insert(k, Refusal::new(var, value, why).about(k));
            }
            Some((k, Ok(()))) => {
                raw.insert(k, Origin::new(var, value));
            }
            None => refused.push(unknown(var, value, true)),
        }
    }
    (raw, kept_out)
}

/// `throttlewatch.io/*` annotations that are QoS keys; unknown ones are
/// refused, the keys that are not QoS (the create stamp, the cold-start
/// target) are passed over.
fn from_annotations(
    annotations: &BTreeMap<String, String>,
    refused: &mut Vec<Refusal>,
) -> BTreeMap<Key, Origin> {
    let mut raw = BTreeMap::new();
    for (name, value) in annotations {
        let Some(short) = name.strip_prefix(PREFIX) else {
            continue;
        };
        match Key::from_name(short) {
            Some(k) if k.is_qos() => {
                raw.insert(k, Origin::new(name, value));
            }
            Some(_) => {}
            None => refused.push(unknown(name, value, false)),
        }
    }
    raw
}

/// The two ways of asking for exclusive cores, while parsing.
#[derive(Default)]
struct Exclusive {
    /// `cpuset: ...,exclusive`.
    suffix: bool,
    /// `cpuset-exclusive`, when given.
    explicit: Option<bool>,
}

/// Why one key's value was refused: its form, or the policy.
#[derive(Debug, thiserror::Error)]
enum KeyRefused {
    #[error(transparent)]
    Value(#[from] ValueError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
}

/// One key's value into the request.
fn parse_value(
    key: Key,
    origin: &Origin,
    policy: &Policy,
    req: &mut QosRequest,
    ex: &mut Exclusive,
) -> Result<(), KeyRefused> {
    let v = origin.value.as_str();
    let not_accepted = || ValueError::NotAccepted(key);
    match key {
        Key::Watch => req.watch = Some(values::parse_bool(key, v)?),
        Key::Threshold => req.threshold_us = Some(parse_threshold(v, policy)?),
        Key::CpuBurst => req.burst = Some(values::parse_burst(v, req.burst_cap_percent)?),
        Key::QosClass => req.qos_class = Some(QosClass::parse(v).ok_or_else(not_accepted)?),
        Key::Cpuset => {
            let (target, suffix) = values::parse_cpuset(v)?;
            req.cpuset = Some(target);
            ex.suffix = suffix;
        }
        Key::CpusetExclusive => ex.explicit = Some(values::parse_bool(key, v)?),
        Key::CpusetCpus => req.cpuset_cpus = Some(values::parse_count(v)?),
        Key::Gpus => {
            req.gpus = Some(GpuSelection {
                key: origin.key.clone(),
                value: v.into(),
                devices: values::parse_gpus(v)?,
            })
        }
        Key::CpuControl => req.cpu_control = Some(CpuControl::parse(v).ok_or_else(not_accepted)?),
        Key::CreatedUnixNs | Key::ColdStartCpu | Key::MetricsDetail => {} // not QoS: never collected
    }
    Ok(())
}

/// `threshold`: a duration, never below the node's.
fn parse_threshold(v: &str, policy: &Policy) -> Result<u64, KeyRefused> {
    let d = values::parse_bounded_duration(Key::Threshold, v)?;
    if d < policy.min_threshold_us {
        return Err(PolicyError::BelowNodeThreshold {
            min_us: policy.min_threshold_us,
        }
        .into());
    }
    Ok(d)
}

/// `cpuset-exclusive`, when given, wins over the ",exclusive" suffix; the
/// policy may refuse it. Returns the key the choice came from.
fn settle_exclusive(
    req: &mut QosRequest,
    ex: &Exclusive,
    policy: &Policy,
    refused: &mut Vec<Refusal>,
) -> Key {
    let key = if ex.explicit.is_some() {
        Key::CpusetExclusive
    } else {
        Key::Cpuset
    };
    let exclusive = ex.explicit.unwrap_or(ex.suffix);
    if exclusive && !policy.allow_exclusive {
        refused.push(req.refusal(key, PolicyError::ExclusiveNotAllowed));
    } else {
        req.exclusive = exclusive;
    }
    key
}

/// Exclusive cores or a CPU count without a cpuset: the cpuset is `auto`.
fn default_cpuset(req: &mut QosRequest, exclusive_key: Key) {
    if req.cpuset.is_some() || !(req.exclusive || req.cpuset_cpus.is_some()) {
        return;
    }
    let by = if req.exclusive {
        exclusive_key
    } else {
        Key::CpusetCpus
    };
    if let Some(o) = req.origins.get(&by).cloned() {
        req.origins.insert(Key::Cpuset, o);
    }
    req.notes.push(format!(
        "{} without {}: cpuset auto",
        by.annotation(),
        Key::Cpuset.annotation()
    ));
    req.cpuset = Some(CpusetTarget::Auto);
}

fn unknown(name: &str, value: &str, env: bool) -> Refusal {
    let known: Vec<&str> = Key::QOS
        .iter()
        .filter_map(|k| if env { k.env() } else { Some(k.name()) })
        .collect();
    let what = if env {
        "environment variable"
    } else {
        "annotation key"
    };
    Refusal::new(
        name,
        value,
        format!("unknown {what}; known: {}", known.join(", ")),
    )
}

/// Fill what the qos-class implies and the container did not set itself.
/// See docs/annotations.md for the table.
fn apply_preset(req: &mut QosRequest, policy: &Policy) {
    let Some(class) = req.qos_class else { return };
    let Some(origin) = req.origins.get(&Key::QosClass).cloned() else {
        return;
    };
    let name = &origin.value;
    let preset = Origin {
        preset: true,
        ..origin.clone()
    };
    let (burst, cpuset) = match class {
        QosClass::LatencyCritical => (Some(100), true),
        QosClass::Burstable => (Some(50), false),
        QosClass::BestEffort => (None, false),
    };
    if class == QosClass::LatencyCritical && req.cpu_control.is_none() {
        if policy.allows(Key::CpuControl) {
            req.cpu_control = Some(CpuControl::Auto);
            req.origins.insert(Key::CpuControl, preset.clone());
        } else {
            req.notes.push(format!(
                "qos-class {name}: cpu-control not applied (not allowed by policy)"
            ));
        }
    }
    if let Some(pct) = burst.filter(|_| req.burst.is_none()) {
        if !policy.allows(Key::CpuBurst) {
            req.notes.push(format!(
                "qos-class {name}: cpu-burst not applied (not allowed by policy)"
            ));
        } else {
            let cap = req.burst_cap_percent;
            if pct > cap {
                req.notes.push(format!(
                    "qos-class {name}: burst {pct}% lowered to the policy maximum {cap}%"
                ));
            }
            req.burst = Some(BurstSpec::Percent(pct.min(cap)));
            req.origins.insert(Key::CpuBurst, preset.clone());
        }
    }
    if cpuset {
        if origin.key.starts_with(ENV_PREFIX) {
            req.notes.push(format!(
                "qos-class {name} from the environment: cpuset not applied (cpusets come from annotations only)"
            ));
            return;
        }
        if !policy.allows(Key::Cpuset) {
            req.notes.push(format!(
                "qos-class {name}: cpuset not applied (not allowed by policy)"
            ));
            return;
        }
        if req.cpuset.is_none() {
            req.cpuset = Some(CpusetTarget::Auto);
            req.origins.insert(Key::Cpuset, preset.clone());
        }
        if !req.exclusive && !req.origins.contains_key(&Key::CpusetExclusive) {
            if policy.allow_exclusive {
                req.exclusive = true;
                req.origins.insert(Key::CpusetExclusive, preset);
            } else {
                req.notes.push(format!(
                    "qos-class {name}: cpuset shared, not exclusive (not allowed by policy)"
                ));
            }
        }
    }
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
