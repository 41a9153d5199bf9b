//! The event loop's state: the node-wide probe and the sessions it feeds.

use std::collections::HashMap;

use throttlewatch_bpf::{Event, ProbeError, ProbeOptions, ThrottleProbe};
use throttlewatch_cgroup::CpuCgroup;
use throttlewatch_core::logfmt::{ColdStart, End, Record, Runq, Throttle};

use crate::clock::Clock;
use crate::coldstart::ColdStartTracker;
use crate::runq::RunqTracker;
use crate::session::{Session, SessionSpec, StartInfo};

/// Probe options from the configuration.
pub fn probe_options(cfg: &throttlewatch_core::config::Config) -> ProbeOptions {
    ProbeOptions {
        ringbuf_bytes: cfg.ring_buffer_kib.saturating_mul(1024),
        max_watched: cfg.max_containers.max(1),
        ..Default::default()
    }
}

pub struct Engine {
    probe: ThrottleProbe,
    sessions: HashMap<u64, Session>,
    clock: Clock,
    /// Cold-start records written since the last `take_cold_starts` (metrics).
    cold_starts: Vec<(u64, ColdStart)>,
}

impl Engine {
    pub fn load(opts: &ProbeOptions) -> Result<Engine, ProbeError> {
        Ok(Engine {
            probe: ThrottleProbe::load(opts)?,
            sessions: HashMap::new(),
            clock: Clock::new(),
            cold_starts: vec![],
        })
    }

    pub fn probe(&self) -> &ThrottleProbe {
        &self.probe
    }

    /// Start watching a container: open its log, then add its cgroup to the
    /// watch map. Returns the cgroup id.
    pub fn watch(&mut self, spec: SessionSpec, cgroup: CpuCgroup) -> anyhow::Result<u64> {
        let id = cgroup.id()?;
        if self.sessions.contains_key(&id) {
            anyhow::bail!("cgroup {} (id {id}) is already watched", cgroup.rel);
        }
        let desc = self.probe.description();
        let info = StartInfo {
            model: self.probe.model().as_str(),
            probe: &desc,
            fentry_now: self.probe.fentry_totals(id),
            lost_now: self.probe.lost_events(),
            episodes_now: self.probe.episode_totals(id),
        };
        let cold = spec.cold_start.clone().filter(|_| spec.resume.is_none());
        let mut s = Session::open(spec, cgroup, info)?;
        self.probe.watch(id)?;
        let mono = Clock::monotonic_ns();
        s.runq = self
            .probe
            .runq_totals(id)
            .map(|t| RunqTracker::new(t, mono));
        if let Some(c) = cold {
            match self.probe.arm_cold_start(id, c.cpu_target_ns) {
                Ok(true) => s.cold = Some(ColdStartTracker::new(c, mono)),
                Ok(false) => {}
                Err(e) => tracing::warn!("cold start of {}: {e}", s.spec.container_id),
            }
        }
        self.sessions.insert(id, s);
        Ok(id)
    }

    /// Drain the ring buffer into the sessions; `live` sees every freeze
    /// (its duration) and the record written for it, if any.
    pub fn pump(&mut self, live: &mut dyn FnMut(&Session, u64, Option<&Throttle>)) -> usize {
        let events = self.probe.poll();
        let n = events.len();
        for ev in events {
            match ev {
                Event::Freeze(f) => {
                    if let Some(s) = self.sessions.get_mut(&f.cgroup_id) {
                        let rec = s.on_freeze(&f, &self.clock);
                        live(s, f.frozen_ns(), rec.as_ref());
                    }
                }
                Event::ColdStart(c) => {
                    let Some(s) = self.sessions.get_mut(&c.cgroup_id) else {
                        continue;
                    };
                    let Some(rec) = s.cold.as_mut().and_then(|t| t.on_event(&c, &self.clock))
                    else {
                        continue;
                    };
                    self.cold_starts.push((c.cgroup_id, rec.clone()));
                    s.write(Record::ColdStart(rec));
                    self.probe.cold_start_finished(c.cgroup_id);
                }
                Event::Episode(_) => {}
            }
        }
        n
    }

    /// Cold-start records written since the last call.
    pub fn take_cold_starts(&mut self) -> Vec<(u64, ColdStart)> {
        std::mem::take(&mut self.cold_starts)
    }

    /// Write what is known of a cold start that is still pending.
    fn flush_cold_start(probe: &ThrottleProbe, id: u64, s: &mut Session, why: &str) {
        if let Some(rec) = s.cold.as_mut().and_then(|t| t.finish(why)) {
            s.write(Record::ColdStart(rec));
        }
        probe.cold_start_finished(id);
    }

    pub fn flush_all(&mut self) {
        for s in self.sessions.values_mut() {
            s.flush();
        }
    }

    /// `cpu_stat` and `runq` records for every session; returns the `runq` ones.
    pub fn snapshot_all(&mut self) -> Vec<(u64, Runq)> {
        let mono = Clock::monotonic_ns();
        let mut out = vec![];
        for (id, s) in self.sessions.iter_mut() {
            s.snapshot(self.probe.episode_totals(*id));
            if let (Some(t), Some(now)) = (s.runq.as_mut(), self.probe.runq_totals(*id)) {
                let rec = t.interval(now, mono);
                out.push((*id, rec.clone()));
                s.write(Record::Runq(rec));
            }
            if s.cold.as_ref().is_some_and(|c| c.expired(mono)) {
                let why = format!(
                    "not complete {}s after the hook",
                    crate::coldstart::GIVE_UP_AFTER.as_secs()
                );
                Self::flush_cold_start(&self.probe, *id, s, &why);
            }
        }
        self.probe.next_runq_interval();
        out
    }

    /// Run-queue latency over the whole watch of a session.
    fn runq_total(&self, id: u64, s: &Session) -> Option<Runq> {
        let now = self.probe.runq_totals(id)?;
        Some(s.runq.as_ref()?.total(now, Clock::monotonic_ns()))
    }

    /// Persistable state of every session.
    pub fn baselines(&self) -> Vec<(u64, crate::session::Baseline)> {
        self.sessions
            .iter()
            .map(|(id, s)| (*id, s.baseline(self.probe.episode_totals(*id))))
            .collect()
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
        self.sessions
            .iter()
            .find(|(_, s)| s.spec.container_id == container_id)
            .map(|(id, _)| *id)
    }

    /// The `end` record as it would be now, without ending.
    pub fn summary(&self, id: u64, reason: &str) -> Option<End> {
        let s = self.sessions.get(&id)?;
        let mut end = s.summary(
            reason,
            None,
            self.probe.episode_totals(id),
            self.probe.lost_events(),
            self.probe.fentry_totals(id),
        );
        end.runq = self.runq_total(id, s);
        Some(end)
    }

    /// Stop watching: final drain, `end` record, log closed, watch-map entry removed.
    pub fn finish(
        &mut self,
        id: u64,
        reason: &str,
        exit_code: Option<i32>,
    ) -> Option<(End, Session)> {
        self.pump(&mut |_, _, _| {});
        let mut s = self.sessions.remove(&id)?;
        Self::flush_cold_start(
            &self.probe,
            id,
            &mut s,
            "watching ended before the entrypoint had its CPU target",
        );
        let runq = self.runq_total(id, &s);
        let mut end = s.summary(
            reason,
            exit_code,
            self.probe.episode_totals(id),
            self.probe.lost_events(),
            self.probe.fentry_totals(id),
        );
        end.runq = runq;
        if let Err(e) = s.finish(&end) {
            tracing::warn!("{}: finishing log: {e}", s.spec.log_path.display());
        }
        let _ = self.probe.unwatch(id);
        Some((end, s))
    }

    /// End every session (agent shutdown).
    pub fn finish_all(&mut self, reason: &str) -> Vec<(End, Session)> {
        let ids: Vec<u64> = self.sessions.keys().copied().collect();
        ids.into_iter()
            .filter_map(|id| self.finish(id, reason, None))
            .collect()
    }
}
