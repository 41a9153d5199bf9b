//! The event loop's state: the node-wide probe and the sessions it feeds.

use std::collections::HashMap;

use throttlewatch_bpf::{Event, ProbeError, ProbeOptions, ThrottleProbe};
use throttlewatch_cgroup::CpuCgroup;
use throttlewatch_core::logfmt::{End, Throttle};

use crate::clock::Clock;
use crate::session::{Session, SessionSpec, StartInfo};

pub struct Engine {
    probe: ThrottleProbe,
    sessions: HashMap<u64, Session>,
    clock: Clock,
}

impl Engine {
    pub fn load(opts: &ProbeOptions) -> Result<Engine, ProbeError> {
        Ok(Engine { probe: ThrottleProbe::load(opts)?, sessions: HashMap::new(), clock: Clock::new() })
    }

    pub fn probe(&self) -> &ThrottleProbe {
        &self.probe
    }

    /// Start watching a container: open its log, then add its cgroup to the
    /// watch map. Returns the cgroup id.
    pub fn watch(&mut self, spec: SessionSpec, cgroup: CpuCgroup) -> anyhow::Result<u64> {
        let desc = self.probe.description();
        let info = StartInfo {
            model: self.probe.model().as_str(),
            probe: &desc,
            fentry_now: None,
            lost_now: self.probe.lost_events(),
            episodes_now: throttlewatch_bpf::EpisodeTotals::default(),
        };
        let id = cgroup.id()?;
        if self.sessions.contains_key(&id) {
            anyhow::bail!("cgroup {} (id {id}) is already watched", cgroup.rel);
        }
        let mut info = info;
        info.episodes_now = self.probe.episode_totals(id);
        info.fentry_now = self.probe.fentry_totals(id);
        let s = Session::open(spec, cgroup, info)?;
        self.probe.watch(id)?;
        self.sessions.insert(id, s);
        Ok(id)
    }

    /// Drain the ring buffer into the sessions; `live` sees every freeze
    /// (its duration) and the record written for it, if any.
    pub fn pump(&mut self, live: &mut dyn FnMut(&Session, u64, Option<&Throttle>)) -> usize {
        let events = self.probe.poll();
        let n = events.len();
        for ev in events {
            if let Event::Freeze(f) = ev {
                if let Some(s) = self.sessions.get_mut(&f.cgroup_id) {
                    let rec = s.on_freeze(&f, &self.clock);
                    live(s, f.frozen_ns(), rec.as_ref());
                }
            }
        }
        n
    }

    pub fn flush_all(&mut self) {
        for s in self.sessions.values_mut() {
            s.flush();
        }
    }

    pub fn snapshot_all(&mut self) {
        for (id, s) in self.sessions.iter_mut() {
            s.snapshot(self.probe.episode_totals(*id));
        }
    }

    /// Persistable state of every session.
    pub fn baselines(&self) -> Vec<(u64, crate::session::Baseline)> {
        self.sessions.iter().map(|(id, s)| (*id, s.baseline(self.probe.episode_totals(*id)))).collect()
    }

    /// Flush logs without ending sessions (agent stopping while containers run).
    pub fn suspend(&mut self) {
        self.pump(&mut |_, _, _| {});
        self.flush_all();
    }

    pub fn session(&self, id: u64) -> Option<&Session> {
        self.sessions.get(&id)
    }

    pub fn sessions(&self) -> impl Iterator<Item = (&u64, &Session)> {
        self.sessions.iter()
    }

    pub fn find(&self, container_id: &str) -> Option<u64> {
        self.sessions.iter().find(|(_, s)| s.spec.container_id == container_id).map(|(id, _)| *id)
    }

    /// The `end` record as it would be now, without ending.
    pub fn summary(&self, id: u64, reason: &str) -> Option<End> {
        let s = self.sessions.get(&id)?;
        Some(s.summary(reason, None, self.probe.episode_totals(id), self.probe.lost_events(), self.probe.fentry_totals(id)))
    }

    /// Stop watching: final drain, `end` record, log closed, watch-map entry removed.
    pub fn finish(&mut self, id: u64, reason: &str, exit_code: Option<i32>) -> Option<(End, Session)> {
        self.pump(&mut |_, _, _| {});
        let mut s = self.sessions.remove(&id)?;
        let end = s.summary(
            reason,
            exit_code,
            self.probe.episode_totals(id),
            self.probe.lost_events(),
            self.probe.fentry_totals(id),
        );
        if let Err(e) = s.finish(&end) {
            tracing::warn!("{}: finishing log: {e}", s.spec.log_path.display());
        }
        let _ = self.probe.unwatch(id);
        Some((end, s))
    }

    /// End every session (agent shutdown).
    pub fn finish_all(&mut self, reason: &str) -> Vec<(End, Session)> {
        let ids: Vec<u64> = self.sessions.keys().copied().collect();
        ids.into_iter().filter_map(|id| self.finish(id, reason, None)).collect()
    }
}
