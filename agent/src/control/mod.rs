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

mod bandwidth;
pub(crate) mod journal;
pub(crate) mod node;
pub(crate) mod policy;

use std::collections::HashMap;

use throttlewatch_bpf::EpisodeTotals;
use throttlewatch_cgroup::{CpuCgroup, CpuStat};
use throttlewatch_core::control_config::ControlConfig;
use throttlewatch_core::logfmt::control::{Bandwidth, Control, ControlSignal};
use throttlewatch_core::protocol::Register;
use throttlewatch_core::ContainerKey;
use throttlewatch_qos::Key;

use crate::clock::Clock;
use crate::engine::Engine;
use crate::output::Output;
pub(crate) use bandwidth::{read_bandwidth, states_between, write_bandwidth};
use bandwidth::{write_both, PodQuota};
use journal::{Journal, Journalled};
use node::NodeSignal;
use policy::{Change, ControlPolicy, Interval, Pressure, Settings};

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
            let (rec, after) = self.resume(key, cg, &prev, now, has_burst, control);
            records.extend(rec);
            now = after;
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

    /// What a dead agent journalled for this cgroup: its writes undone (the
    /// originals back, the pod's quota too), or, where the cgroup holds a
    /// value it never wrote, an operator's update adopted. The record, and
    /// the bandwidth the cgroup holds after.
    fn resume(
        &self,
        key: &ContainerKey,
        cg: &CpuCgroup,
        prev: &Journalled,
        now: Bandwidth,
        has_burst: bool,
        control: bool,
    ) -> (Option<Control>, Bandwidth) {
        if !prev.written.contains(&now) {
            // Changed while no agent ran: an operator's update.
            let rec = record(
                "adopt",
                "operator_update",
                prev.original,
                now,
                now,
                Default::default(),
            );
            return (Some(rec), now);
        }
        if now == prev.original {
            return (None, now);
        }
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
                let o = prev.original;
                (
                    Some(record("restore", cause, now, o, o, Default::default())),
                    o,
                )
            }
            Err(e) => {
                tracing::warn!("{key}: restoring the original bandwidth: {e}");
                (None, now)
            }
        }
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
            let rec = poll_one(&self.journal, *id, g, totals, mono, &pressure);
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

/// One controlled container's poll: its interval read, an operator's update
/// adopted or the policy's decision written; the `control` record.
fn poll_one(
    journal: &Journal,
    id: u64,
    g: &mut Controlled,
    totals: EpisodeTotals,
    mono: u64,
    pressure: &Pressure,
) -> Option<Control> {
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
        return None; // the first reading is the baseline
    }
    // Gone, or the quota removed: nothing to control.
    let (now, has_burst) = read_bandwidth(&g.cgroup)?;
    g.has_burst = has_burst;
    if now != g.policy.current() {
        let before = g.policy.current();
        g.policy.adopt(now, mono);
        let original = g.policy.original();
        return Some(record(
            "adopt",
            "operator_update",
            before,
            now,
            original,
            Default::default(),
        ));
    }
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
    let c = g.policy.step(&iv, pressure)?;
    apply_change(journal, id, g, c)
}

/// The policy's change journalled, then written (the pod's quota with it),
/// unless an operator wrote the cgroup since this tick's read.
fn apply_change(journal: &Journal, id: u64, g: &mut Controlled, c: Change) -> Option<Control> {
    let original = g.policy.original();
    journal.save(
        &g.key,
        &Journalled {
            cgroup_id: id,
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
    let written = write_both(
        &g.cgroup,
        g.pod.as_mut(),
        original,
        c.before,
        c.after,
        g.has_burst,
    );
    match written {
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
