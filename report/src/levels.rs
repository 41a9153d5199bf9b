//! Which level's quota froze the container: its own, its pod's, or an
//! ancestor's.

use serde::Serialize;

use crate::model::Container;

/// Which level's quota froze the container: its own, its pod's, or another
/// ancestor's (`throttle.throttled_cgroup_id` against `start.limits_above`).
#[derive(Debug, Clone, Serialize)]
pub struct LevelShare {
    /// `container`, `pod` (kubelet's `pod<uid>` / `…-pod<uid>.slice`) or `ancestor`.
    pub level: &'static str,
    pub cgroup_path: String,
    pub quota_us: Option<u64>,
    pub period_us: u64,
    /// Frozen time (records, per thread) this level's quota caused.
    pub frozen_ns: u64,
    pub share: f64,
}

/// The frozen time by level, most first; empty without records.
pub fn levels(c: &Container) -> Vec<LevelShare> {
    let Some(start) = c.start.as_ref() else {
        return Vec::new();
    };
    let total: u64 = c.frozen_by_group.values().sum();
    if total == 0 {
        return Vec::new();
    }
    let mut out: Vec<LevelShare> = c
        .frozen_by_group
        .iter()
        .map(|(id, ns)| {
            let above = start.limits_above.iter().find(|l| l.cgroup_id == *id);
            let (level, path, quota, period) = match above {
                _ if *id == start.cgroup_id
                    || (above.is_none() && start.limits_above.is_empty()) =>
                {
                    (
                        "container",
                        start.cgroup_path.clone(),
                        start.quota_us,
                        start.period_us,
                    )
                }
                Some(l) => (
                    if is_pod_cgroup(&l.cgroup_path) {
                        "pod"
                    } else {
                        "ancestor"
                    },
                    l.cgroup_path.clone(),
                    Some(l.quota_us),
                    l.period_us,
                ),
                None => ("ancestor", format!("cgroup id {id}"), None, start.period_us),
            };
            LevelShare {
                level,
                cgroup_path: path,
                quota_us: quota,
                period_us: period,
                frozen_ns: *ns,
                share: *ns as f64 / total as f64,
            }
        })
        .collect();
    // Ids that resolve to the same level (the container before and after a
    // log without ids) are one line.
    out.sort_by(|a, b| a.cgroup_path.cmp(&b.cgroup_path));
    out.dedup_by(|later, first| {
        if later.cgroup_path != first.cgroup_path {
            return false;
        }
        first.frozen_ns += later.frozen_ns;
        first.share += later.share;
        true
    });
    out.sort_by_key(|l| std::cmp::Reverse(l.frozen_ns));
    out
}

/// kubelet's pod cgroup names: `pod<uid>` (cgroupfs) or
/// `kubepods-<qos>-pod<uid>.slice` (systemd).
pub fn is_pod_cgroup(path: &str) -> bool {
    let last = path.rsplit('/').next().unwrap_or(path);
    last.starts_with("pod") || (last.contains("-pod") && last.ends_with(".slice"))
}
