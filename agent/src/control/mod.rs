//! The dynamic CPU controller (docs/control.md): for each container that
//! asks for `cpu-control: auto` on a node whose `[control]` enables it,
//! one [`policy::ControlPolicy`] fed with the probe's throttled time every poll.
//!
//! Writes go to the cgroup (v1 `cpu.cfs_quota_us`/`cpu.cfs_burst_us`, v2
//! `cpu.max`/`cpu.max.burst`) through the cgroup crate. Before each write the
//! originals and the values about to be written are journalled in
//! `<state_dir>/control/` so that an agent killed mid-way finds them and
//! restores the originals at its restart. Values in the cgroup that the
//! controller did not write are an operator's update: they win and become
//! the new originals.

pub(crate) mod journal;
pub(crate) mod node;
pub(crate) mod policy;

use std::collections::HashMap;

use throttlewatch_bpf::EpisodeTotals;
use throttlewatch_cgroup::{CgroupError, CpuCgroup, CpuStat};
use throttlewatch_core::control_config::ControlConfig;
use throttlewatch_core::logfmt::control::{Bandwidth, Control, ControlSignal};
use throttlewatch_core::protocol::Register;
use throttlewatch_core::ContainerKey;
use throttlewatch_qos::Key;

use crate::clock::Clock;
use crate::engine::Engine;
use crate::output::Output;
use journal::{Journal, Journalled};
use node::NodeSignal;
use policy::{ControlPolicy, Interval, Settings};

/// Why the originals go back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Release {
    ContainerEnd,
    AgentStop,
}

impl Release {
    fn as_str(self) -> &'static str {
        match self {
            Release::ContainerEnd => "container_end",
            Release::AgentStop => "agent_stop",
        }
    }
}

/// Whether the container asked for control: the hook's parsed request
/// (`qos.request.cpu_control`, which a class preset fills and the node's
/// policy may have refused) where the hook sent one, else the annotation
/// itself (a registration without the hook's QoS summary).
pub(crate) fn requested(r: &Register) -> bool {
    if let Some(req) = r.qos.as_ref().and_then(|q| q.get("request")) {
        return req.get("cpu_control").and_then(|v| v.as_str()) == Some("auto");
    }
    r.annotations
        .get(&Key::CpuControl.annotation())
        .and_then(|v| throttlewatch_qos::CpuControl::parse(v))
        == Some(throttlewatch_qos::CpuControl::Auto)
}

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
struct PodQuota {
    group: CpuCgroup,
    original_quota_us: u64,
    period_us: u64,
    /// What the controller last wrote (the original until it writes).
    written_quota_us: u64,
}

impl PodQuota {
    fn of(cg: &CpuCgroup) -> Option<PodQuota> {
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
    fn journalled_for(cg: &CpuCgroup, p: &journal::JournalledPod) -> Option<PodQuota> {
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

    fn journalled(&self) -> journal::JournalledPod {
        journal::JournalledPod {
            cgroup_path: self.group.rel.clone(),
            original_quota_us: self.original_quota_us,
            period_us: self.period_us,
        }
    }

    /// The pod's quota for the container at `after` (its original `orig`):
    /// the pod's original plus the container's raise, in the pod's period.
    fn target(&self, orig: Bandwidth, after: Bandwidth) -> u64 {
        let rate = |b: Bandwidth| b.quota_us as f64 / b.period_us.max(1) as f64;
        let raise = ((rate(after) - rate(orig)) * self.period_us as f64).round() as i64;
        (self.original_quota_us as i64 + raise).max(1000) as u64
    }

    /// A pod quota the controller did not write (kubelet's resize, an
    /// operator) becomes the new original, less the raise in effect.
    fn adopt(&mut self) {
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

    fn write(&mut self, quota_us: u64) -> Result<(), CgroupError> {
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
fn write_both(
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

struct Controlled {
    key: ContainerKey,
    cgroup: CpuCgroup,
    pod: Option<PodQuota>,
    policy: ControlPolicy,
    has_burst: bool,
    last: EpisodeTotals,
    last_mono: u64,
    /// CPU used by the group at the last poll (ns; 0: unreadable).
    last_used: u64,
    /// `cpu.stat` at the last poll (None: unreadable).
    last_stat: Option<CpuStat>,
}

/// Every controlled container of the agent.
pub(crate) struct Controls {
    settings: Option<Settings>,
    groups: HashMap<u64, Controlled>,
    node: NodeSignal,
    journal: Journal,
}

impl Controls {
    pub(crate) fn new(cfg: &ControlConfig, state_dir: &std::path::Path) -> Controls {
        Controls {
            settings: cfg.enabled.then(|| Settings::from_config(cfg)),
            groups: HashMap::new(),
            node: NodeSignal::new(&cfg.pressure_psi_file),
            journal: Journal::new(state_dir),
        }
    }

    /// A container just watched (registered, or resumed after a restart):
    /// put back what a previous agent left, then control it if it asked
    /// and the node allows. Returns the records for its log.
    pub(crate) fn attach(
        &mut self,
        id: u64,
        key: &ContainerKey,
        cg: &CpuCgroup,
        wants: bool,
        mono_ns: u64,
    ) -> Vec<Control> {
        let mut records = vec![];
        let control = wants && self.settings.is_some();
        let journalled = self.journal.load(key);
        if journalled.is_none() && !control {
            // Nothing a previous agent left, nothing to control: no cgroup
            // reads on the register path (one failed open).
            return records;
        }
        let Some((mut now, has_burst)) = read_bandwidth(cg) else {
            self.journal.remove(key);
            return records;
        };
        if let Some(prev) = journalled.filter(|j| j.cgroup_id == id) {
            if prev.written.contains(&now) {
                if now != prev.original {
                    let cause = if control {
                        "agent_restart"
                    } else {
                        "control_off"
                    };
                    // Killed again mid-restore: the next restart knows these too.
                    let mut written = prev.written.clone();
                    written.extend(states_between(now, prev.original, has_burst));
                    self.journal.save(
                        key,
                        &Journalled {
                            written,
                            ..prev.clone()
                        },
                    );
                    // The pod's quota the dead agent raised goes back too.
                    let mut pod = prev
                        .pod
                        .as_ref()
                        .and_then(|p| PodQuota::journalled_for(cg, p));
                    let restored = match pod.as_mut() {
                        Some(p) => {
                            let r = write_bandwidth(cg, now, prev.original, has_burst);
                            r.and_then(|()| p.write(p.original_quota_us))
                        }
                        None => write_bandwidth(cg, now, prev.original, has_burst),
                    };
                    match restored {
                        Ok(()) => {
                            records.push(record(
                                "restore",
                                cause,
                                now,
                                prev.original,
                                prev.original,
                                Default::default(),
                            ));
                            now = prev.original;
                        }
                        Err(e) => tracing::warn!("{key}: restoring the original bandwidth: {e}"),
                    }
                }
            } else {
                // Changed while no agent ran: an operator's update.
                records.push(record(
                    "adopt",
                    "operator_update",
                    prev.original,
                    now,
                    now,
                    Default::default(),
                ));
            }
        }
        self.journal.remove(key);
        if !control {
            return records;
        }
        let s = self.settings.clone().expect("control is enabled");
        self.groups.insert(
            id,
            Controlled {
                key: key.clone(),
                cgroup: cg.clone(),
                pod: PodQuota::of(cg),
                policy: ControlPolicy::new(s, now, mono_ns),
                has_burst,
                last: EpisodeTotals::default(),
                last_mono: 0,
                last_used: 0,
                last_stat: None,
            },
        );
        records
    }

    /// One poll: every controlled container's interval, its decision, the
    /// write and its `control` record. Returns the outputs for the metrics.
    pub(crate) fn poll(&mut self, engine: &mut Engine) -> Vec<Output> {
        if self.groups.is_empty() {
            return vec![];
        }
        let pressure = self.node.read();
        let mono = Clock::monotonic_ns();
        let mut out = vec![];
        for (id, g) in self.groups.iter_mut() {
            let totals = engine.probe().episode_totals(*id);
            let prev = std::mem::replace(&mut g.last, totals);
            let prev_mono = std::mem::replace(&mut g.last_mono, mono);
            let used_now = g.cgroup.usage_ns().map_or(0, |(ns, _)| ns);
            let prev_used = std::mem::replace(&mut g.last_used, used_now);
            let stat_now = g.cgroup.cpu_stat().ok();
            let prev_stat = std::mem::replace(&mut g.last_stat, stat_now);
            let periods = match (stat_now, prev_stat) {
                (Some(n), Some(p)) => n.since(&p),
                _ => CpuStat::default(),
            };
            if prev_mono == 0 {
                continue; // the first reading is the baseline
            }
            let Some((now, has_burst)) = read_bandwidth(&g.cgroup) else {
                continue; // gone, or the quota removed: nothing to control
            };
            g.has_burst = has_burst;
            let rec = if now != g.policy.current() {
                let before = g.policy.current();
                g.policy.adopt(now, mono);
                Some(record(
                    "adopt",
                    "operator_update",
                    before,
                    now,
                    g.policy.original(),
                    Default::default(),
                ))
            } else {
                let iv = Interval {
                    now_ns: mono,
                    length_ns: mono.saturating_sub(prev_mono),
                    throttled_ns: totals.total_ns.saturating_sub(prev.total_ns),
                    episodes: totals.count.saturating_sub(prev.count),
                    used_ns: match prev_used {
                        0 => 0,
                        p => used_now.saturating_sub(p),
                    },
                    throttled_periods: periods.nr_throttled,
                    active_periods: periods.nr_periods,
                };
                g.policy.step(&iv, &pressure).and_then(|c| {
                    let original = g.policy.original();
                    self.journal.save(
                        &g.key,
                        &Journalled {
                            cgroup_id: *id,
                            original,
                            written: states_between(c.before, c.after, g.has_burst),
                            pod: g.pod.as_ref().map(PodQuota::journalled),
                        },
                    );
                    // An operator's update since this tick's read wins (adopted next tick).
                    if read_bandwidth(&g.cgroup).map(|(b, _)| b) != Some(c.before) {
                        g.policy.undo(&c);
                        return None;
                    }
                    match write_both(
                        &g.cgroup,
                        g.pod.as_mut(),
                        original,
                        c.before,
                        c.after,
                        g.has_burst,
                    ) {
                        Ok(()) => Some(record(
                            c.action(),
                            c.cause.as_str(),
                            c.before,
                            c.after,
                            original,
                            c.signal,
                        )),
                        Err(e) => {
                            tracing::warn!("{}: writing the bandwidth: {e}", g.key);
                            g.policy.undo(&c);
                            None
                        }
                    }
                })
            };
            if let Some(rec) = rec {
                if let Some(s) = engine.session_mut(*id) {
                    s.write_control(rec.clone());
                    out.push(Output::Control {
                        container: s.spec.labels.clone(),
                        record: rec,
                    });
                }
            }
        }
        out
    }

    /// Stop controlling: the originals back where the cgroup still holds
    /// what the controller wrote (an operator's later value stays).
    pub(crate) fn release(&mut self, id: u64, why: Release) -> Option<Control> {
        let mut g = self.groups.remove(&id)?;
        // The container gone (its runtime removed the cgroup), or its values
        // an operator's (or the original): the pod's raise, if any, goes
        // back all the same.
        let pod_back = |g: &mut Controlled| {
            if let Some(p) = g.pod.as_mut() {
                p.adopt();
                if let Err(e) = p.write(p.original_quota_us) {
                    tracing::warn!("{}: restoring the pod's quota: {e}", g.key);
                }
            }
        };
        let Some((now, has_burst)) = read_bandwidth(&g.cgroup) else {
            pod_back(&mut g);
            self.journal.remove(&g.key);
            return None;
        };
        let original = g.policy.original();
        if now != g.policy.current() || now == original {
            pod_back(&mut g);
            self.journal.remove(&g.key);
            return None;
        }
        // Killed mid-restore: the restart finishes it.
        self.journal.save(
            &g.key,
            &Journalled {
                cgroup_id: id,
                original,
                written: states_between(now, original, has_burst),
                pod: g.pod.as_ref().map(PodQuota::journalled),
            },
        );
        let done = write_both(
            &g.cgroup,
            g.pod.as_mut(),
            original,
            now,
            original,
            has_burst,
        );
        self.journal.remove(&g.key);
        match done {
            Ok(()) => Some(record(
                "restore",
                why.as_str(),
                now,
                original,
                original,
                Default::default(),
            )),
            Err(e) => {
                tracing::warn!("{}: restoring the original bandwidth: {e}", g.key);
                None
            }
        }
    }

    /// A container that ended while no agent ran: nothing to restore.
    pub(crate) fn forget(&self, key: &ContainerKey) {
        self.journal.remove(key);
    }

    pub(crate) fn ids(&self) -> Vec<u64> {
        self.groups.keys().copied().collect()
    }
}

fn record(
    action: &str,
    cause: &str,
    before: Bandwidth,
    after: Bandwidth,
    original: Bandwidth,
    signal: ControlSignal,
) -> Control {
    Control {
        action: action.into(),
        cause: cause.into(),
        before,
        after,
        original,
        signal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_a_write_passes_through_is_known() {
        let bw = |quota_us, burst_us| Bandwidth {
            quota_us,
            period_us: 100_000,
            burst_us,
        };
        // A quota raise clears the burst first, then writes the quota, then the burst.
        assert_eq!(
            states_between(bw(60_000, 50_000), bw(80_000, 50_000), true),
            vec![
                bw(60_000, 50_000),
                bw(60_000, 0),
                bw(80_000, 0),
                bw(80_000, 50_000)
            ]
        );
        // Burst only: one write.
        assert_eq!(
            states_between(bw(50_000, 0), bw(50_000, 10_000), true),
            vec![bw(50_000, 0), bw(50_000, 10_000)]
        );
        // No burst file: the quota write is the only one.
        assert_eq!(
            states_between(bw(50_000, 0), bw(60_000, 0), false),
            vec![bw(50_000, 0), bw(60_000, 0)]
        );
    }

    #[test]
    fn the_hooks_request_wins_over_the_raw_annotation() {
        let mut r = Register::default();
        r.annotations
            .insert("throttlewatch.io/cpu-control".into(), "auto".into());
        assert!(requested(&r), "no QoS summary: the annotation");
        // The hook refused it (policy): its request has no cpu_control.
        r.qos = Some(serde_json::json!({"request": {"burst_cap_percent": 100}}));
        assert!(!requested(&r));
        r.annotations.clear();
        r.qos = Some(serde_json::json!({"request": {"cpu_control": "auto"}}));
        assert!(requested(&r), "a preset fills it");
        r.annotations
            .insert("throttlewatch.io/cpu-control".into(), "bogus".into());
        r.qos = None;
        assert!(!requested(&r));
    }
}
