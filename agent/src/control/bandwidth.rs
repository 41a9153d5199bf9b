//! Writing a container's CFS bandwidth, and the quota of the pod above it
//! that follows the container's.

use throttlewatch_cgroup::{CgroupError, CpuCgroup};
use throttlewatch_core::logfmt::control::Bandwidth;

use super::journal;

/// The bandwidth in the cgroup; None without a quota or when unreadable.
/// Without a burst file, burst reads 0 and is never written.
pub(crate) fn read_bandwidth(cg: &CpuCgroup) -> Option<(Bandwidth, bool)> {
    let l = cg.bandwidth().ok()?;
    Some((
        Bandwidth {
            quota_us: l.quota_us?,
            period_us: l.period_us,
            burst_us: l.burst_us.unwrap_or(0),
        },
        l.burst_us.is_some(),
    ))
}

/// Write `after` over `before`: the quota (and period) only when they
/// change, then the burst (the cgroup crate clears burst before a quota
/// write, since the kernel refuses a burst above the quota).
pub(crate) fn write_bandwidth(
    cg: &CpuCgroup,
    before: Bandwidth,
    after: Bandwidth,
    has_burst: bool,
) -> Result<(), CgroupError> {
    let quota_changed = (before.quota_us, before.period_us) != (after.quota_us, after.period_us);
    if quota_changed {
        cg.set_quota(Some(after.quota_us), after.period_us)?;
    }
    if has_burst && (quota_changed || before.burst_us != after.burst_us) {
        cg.set_burst(after.burst_us)?;
    }
    Ok(())
}

/// Every value the cgroup can hold while [`write_bandwidth`] moves it from
/// `before` to `after`: the ends, and, when the quota changes, both quotas
/// with the burst at 0 (the cgroup crate clears the burst before a quota
/// write). An agent killed between two of those file writes finds one of
/// them at its restart, and must know it for its own.
pub(crate) fn states_between(
    before: Bandwidth,
    after: Bandwidth,
    has_burst: bool,
) -> Vec<Bandwidth> {
    let mut v = vec![before];
    let quota_changed = (before.quota_us, before.period_us) != (after.quota_us, after.period_us);
    if has_burst && quota_changed {
        for b in [before, after] {
            v.push(Bandwidth { burst_us: 0, ..b });
        }
    }
    v.push(after);
    v.dedup();
    v
}

/// The nearest ancestor with a quota (a kubelet pod cgroup: the sum of its
/// containers' limits), whose quota follows the container's: raised by
/// what the container's is raised, back with it. Without it a raise only
/// moves the throttling up to the pod.
pub(super) struct PodQuota {
    pub(super) group: CpuCgroup,
    pub(super) original_quota_us: u64,
    pub(super) period_us: u64,
    /// What the controller last wrote (the original until it writes).
    pub(super) written_quota_us: u64,
}

impl PodQuota {
    pub(super) fn of(cg: &CpuCgroup) -> Option<PodQuota> {
        let (group, l) = cg.limited_ancestors().into_iter().next()?;
        let q = l.quota_us?;
        Some(PodQuota {
            group,
            original_quota_us: q,
            period_us: l.period_us,
            written_quota_us: q,
        })
    }

    /// The pod a dead agent journalled, if it is still `cg`'s nearest
    /// ancestor with a quota; what it holds now counts as ours.
    pub(super) fn journalled_for(cg: &CpuCgroup, p: &journal::JournalledPod) -> Option<PodQuota> {
        let group = cg.limited_ancestors().into_iter().next()?.0;
        (group.rel == p.cgroup_path).then(|| PodQuota {
            written_quota_us: group
                .bandwidth()
                .ok()
                .and_then(|l| l.quota_us)
                .unwrap_or(p.original_quota_us),
            group,
            original_quota_us: p.original_quota_us,
            period_us: p.period_us,
        })
    }

    pub(super) fn journalled(&self) -> journal::JournalledPod {
        journal::JournalledPod {
            cgroup_path: self.group.rel.clone(),
            original_quota_us: self.original_quota_us,
            period_us: self.period_us,
        }
    }

    /// The pod's quota for the container at `after` (its original `orig`):
    /// the pod's original plus the container's raise, in the pod's period.
    pub(super) fn target(&self, orig: Bandwidth, after: Bandwidth) -> u64 {
        let rate = |b: Bandwidth| b.quota_us as f64 / b.period_us.max(1) as f64;
        let raise = ((rate(after) - rate(orig)) * self.period_us as f64).round() as i64;
        (self.original_quota_us as i64 + raise).max(1000) as u64
    }

    /// A pod quota the controller did not write (kubelet's resize, an
    /// operator) becomes the new original, less the raise in effect.
    pub(super) fn adopt(&mut self) {
        let Ok(l) = self.group.bandwidth() else {
            return;
        };
        let Some(now) = l.quota_us else { return };
        if now != self.written_quota_us {
            let raise = self.written_quota_us as i64 - self.original_quota_us as i64;
            self.original_quota_us = (now as i64 - raise).max(1000) as u64;
            self.written_quota_us = now;
        }
    }

    pub(super) fn write(&mut self, quota_us: u64) -> Result<(), CgroupError> {
        if quota_us != self.written_quota_us {
            self.group.set_quota_only(quota_us, self.period_us)?;
            self.written_quota_us = quota_us;
        }
        Ok(())
    }
}

/// The container's bandwidth from `before` to `after`, the pod's quota
/// with it: a raise writes the pod first, a cut the container first, so
/// the pod's quota is never below what its containers may use.
pub(super) fn write_both(
    cg: &CpuCgroup,
    pod: Option<&mut PodQuota>,
    orig: Bandwidth,
    before: Bandwidth,
    after: Bandwidth,
    has_burst: bool,
) -> Result<(), CgroupError> {
    let Some(pod) = pod else {
        return write_bandwidth(cg, before, after, has_burst);
    };
    pod.adopt();
    let target = pod.target(orig, after);
    if target >= pod.written_quota_us {
        pod.write(target)?;
        write_bandwidth(cg, before, after, has_burst)
    } else {
        write_bandwidth(cg, before, after, has_burst)?;
        pod.write(target)
    }
}
