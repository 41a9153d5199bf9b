//! The event loop's state: the node-wide probe and one session per watched
//! cgroup (the only per-container map). Each poll drains the kernel's
//! events, hands every session its reading, and returns the outputs that
//! the metrics and the live printer consume.

use std::collections::{HashMap, HashSet};

use throttlewatch_bpf::{ProbeError, ProbeOptions, ThrottleProbe};
use throttlewatch_cgroup::CpuCgroup;
use throttlewatch_core::logfmt::End;
use throttlewatch_core::{ContainerKey, EndReason};

use crate::clock::Clock;
use crate::gpu::GpuSampler;
use crate::output::Output;
use crate::probe_facts::ProbeFacts;
use crate::reading::{map_full, Due, ProbeTotals, Reading};
use crate::session::draft::{Opening, SessionDraft};
use crate::session::Session;
use crate::spec::SessionSpec;
use throttlewatch_core::timing::Phases;

/// Probe options from the configuration.
pub(crate) fn probe_options(cfg: &throttlewatch_core::config::Config) -> ProbeOptions {
    ProbeOptions {
        ringbuf_bytes: cfg.ring_buffer_kib.saturating_mul(1024),
        max_watched: cfg.max_containers.max(1),
        ..Default::default()
    }
}

pub(crate) struct Engine {
    probe: ThrottleProbe,
    facts: ProbeFacts,
    sessions: HashMap<u64, Session>,
    /// The session of each (scope, id): a register or unregister finds its
    /// container without a walk of every session.
    by_key: HashMap<ContainerKey, u64>,
    /// Cgroups past `begin_watch` whose `complete_watch` is still to come
    /// (in the watch map, no session yet).
    pending: HashSet<u64>,
    clock: Clock,
    /// The node-wide lost-event count at the last `LostEvents` output.
    exported_lost: u64,
    /// The node-wide failed-insert counts at the last `LostEvents` output.
    exported_full: throttlewatch_core::logfmt::MapFull,
    /// NVML, where there is a library and a GPU (said once at load).
    gpu: GpuSampler,
}

/// A session that ended: its `end` record (written) and the last outputs.
pub(crate) struct Finished {
    pub end: End,
    pub spec: SessionSpec,
    /// Everything the final drain and the end produced, for every session.
    pub outputs: Vec<Output>,
}

impl Engine {
    /// The probe loaded with `opts`; `gpu`: the node's GPU sampling.
    pub(crate) fn load(opts: &ProbeOptions, gpu: GpuSampler) -> Result<Engine, ProbeError> {
        let probe = ThrottleProbe::load(opts)?;
        let facts = ProbeFacts {
            model: probe.model(),
            description: probe.description(),
            runq: probe.runq_available(),
        };
        Ok(Engine {
            probe,
            facts,
            sessions: HashMap::new(),
            by_key: HashMap::new(),
            pending: HashSet::new(),
            clock: Clock::new(),
            exported_lost: 0,
            exported_full: Default::default(),
            gpu,
        })
    }

    /// The GPU sampling's one line (NVML and its GPUs, or why not).
    pub(crate) fn gpu_status(&self) -> &str {
        self.gpu.status()
    }

    pub(crate) fn probe(&self) -> &ThrottleProbe {
        &self.probe
    }

    /// Start watching a container: open its log, then add its cgroup to the
    /// watch map. Returns the cgroup id.
    pub(crate) fn watch(&mut self, spec: SessionSpec, cgroup: CpuCgroup) -> anyhow::Result<u64> {
        let p = self.begin_watch(
            spec,
            cgroup,
            &mut Phases::start("throttlewatch-agent watch"),
        )?;
        self.complete_watch(p)
    }

    /// The kernel half of [`Engine::watch`]: the cgroup in the watch map
    /// (its freezes are counted from here on), then the baselines, no log yet.
    /// Finish with [`Engine::complete_watch`] before the next poll (events
    /// drained without a session are not kept).
    pub(crate) fn begin_watch(
        &mut self,
        spec: SessionSpec,
        cgroup: CpuCgroup,
        t: &mut Phases,
    ) -> anyhow::Result<SessionDraft> {
        let id = cgroup.id()?;
        if self.sessions.contains_key(&id) || self.pending.contains(&id) {
            anyhow::bail!("cgroup {} (id {id}) is already watched", cgroup.rel);
        }
        let cold_start_armed = match spec.cold_start.as_ref().filter(|_| spec.resume.is_none()) {
            None => false,
            Some(c) => self
                .probe
                .arm_cold_start(id, c.cpu_target_ns)
                .unwrap_or_else(|e| {
                    tracing::warn!("cold start of {}: {e}", spec.container_id());
                    false
                }),
        };
        let opening = Opening {
            facts: &self.facts,
            cold_start_armed,
        };
        let procs = cgroup
            .cpu_dir
            .join(throttlewatch_cgroup::files::CGROUP_PROCS);
        let probe = &self.probe;
        // The baselines once the cgroup is watched (SessionDraft::prepare).
        let prepared = SessionDraft::prepare(spec, cgroup, opening, || {
            probe
                .watch_group(id, &procs)
                .map_err(std::io::Error::other)?;
            t.mark("watch_map");
            Ok(ProbeTotals::read(probe, id, map_full(probe)))
        })
        .map_err(anyhow::Error::from);
        t.mark("baselines");
        match &prepared {
            Ok(_) => {
                self.pending.insert(id);
            }
            Err(_) => self.probe.cold_start_finished(id),
        }
        prepared
    }

    /// The log half of [`Engine::watch`]: the log opened with its `start`
    /// (or `resume`) record. On failure the cgroup leaves the watch map.
    pub(crate) fn complete_watch(&mut self, p: SessionDraft) -> anyhow::Result<u64> {
        let id = p.cgroup_id();
        self.pending.remove(&id);
        match p.open() {
            Ok(s) => {
                self.by_key.insert(s.spec.key(), id);
                self.sessions.insert(id, s);
                Ok(id)
            }
            Err(e) => {
                let _ = self.probe.unwatch(id);
                self.probe.cold_start_finished(id);
                Err(e.into())
            }
        }
    }

    /// Drain the kernel's events into the sessions; from `Due::Tick` on,
    /// every session also reads the totals (all of them at a snapshot; at a
    /// tick those of a quiet session only in part, `ProbeTotals::read_after`).
    pub(crate) fn poll(&mut self, due: Due) -> Vec<Output> {
        self.poll_reading(due, due == Due::Snapshot)
    }

    /// [`Engine::poll`]; `every_total`: read all of the probe's totals.
    fn poll_reading(&mut self, due: Due, every_total: bool) -> Vec<Output> {
        let mut readings: HashMap<u64, Reading> = HashMap::new();
        for ev in self.probe.poll() {
            let id = ev.cgroup_id();
            if self.sessions.contains_key(&id) {
                readings.entry(id).or_default().events.push(ev);
            }
        }
        let mut out = vec![];
        if due >= Due::Tick {
            let full = map_full(&self.probe);
            let gpu = self.read_gpus();
            let mut wakes = match due {
                Due::Snapshot => self.wake_edges_by_cgroup(),
                _ => HashMap::new(),
            };
            for (id, s) in self.sessions.iter() {
                let r = readings.entry(*id).or_default();
                let news = every_total || !r.events.is_empty() || s.events_since_tick();
                r.totals = Some(ProbeTotals::read_after(
                    &self.probe,
                    s.cgroup_id,
                    full,
                    s.totals(),
                    news,
                ));
                r.snapshot = due == Due::Snapshot;
                if r.snapshot {
                    r.wakes = Some(wakes.remove(id).unwrap_or_default());
                }
                r.gpu = gpu.clone();
            }
            let lost = self.probe.lost_events();
            let count = lost.saturating_sub(std::mem::replace(&mut self.exported_lost, lost));
            let map_full = full.since(&std::mem::replace(&mut self.exported_full, full));
            out.push(Output::LostEvents { count, map_full });
        }
        for (id, r) in readings {
            let s = self
                .sessions
                .get_mut(&id)
                .expect("readings are for sessions");
            let before = out.len();
            s.feed(r, &self.clock, &mut out);
            if out[before..]
                .iter()
                .any(|o| matches!(o, Output::ColdStart { .. }))
            {
                self.probe.cold_start_finished(id);
            }
        }
        if due == Due::Snapshot {
            self.probe.next_runq_interval();
        }
        out
    }

    /// The kernel's wake-up edges of the watched cgroups, read once per
    /// snapshot for every session. Edges whose wakee thread is gone can no
    /// longer grow: they leave the kernel's map (sessions keep their
    /// figures), so that a container's thread churn does not fill it.
    fn wake_edges_by_cgroup(&mut self) -> HashMap<u64, Vec<throttlewatch_bpf::WakeEdgeTotals>> {
        let mut by: HashMap<u64, Vec<throttlewatch_bpf::WakeEdgeTotals>> = HashMap::new();
        let mut gone = HashSet::new();
        for e in self.probe.wake_edges() {
            let tid = e.key.wakee_tid;
            if !std::path::Path::new(&format!("/proc/{tid}")).exists() {
                gone.insert(e.key);
            }
            by.entry(e.key.cgroup_id).or_default().push(e);
        }
        if !gone.is_empty() {
            self.probe.remove_wake_edges(|k| gone.contains(k));
        }
        by
    }

    /// Every GPU a session uses, read once (None: no NVML or no such GPU).
    fn read_gpus(
        &mut self,
    ) -> Option<(
        u64,
        std::sync::Arc<std::collections::BTreeMap<usize, crate::gpu::GpuReading>>,
    )> {
        if !self.gpu.available() {
            return None;
        }
        let wanted = self
            .sessions
            .values()
            .flat_map(|s| s.gpus().iter().copied());
        let got = self.gpu.read(wanted.collect::<Vec<_>>());
        (!got.is_empty()).then(|| {
            (
                throttlewatch_core::logfmt::now_unix_ns(),
                std::sync::Arc::new(got),
            )
        })
    }

    /// Drain and flush the logs without ending sessions (agent stopping
    /// while containers run); the totals are read for the last persist.
    pub(crate) fn suspend(&mut self) {
        self.poll_reading(Due::Tick, true);
        for s in self.sessions.values_mut() {
            s.suspend();
        }
    }

    pub(crate) fn session(&self, id: u64) -> Option<&Session> {
        self.sessions.get(&id)
    }

    pub(crate) fn session_mut(&mut self, id: u64) -> Option<&mut Session> {
        self.sessions.get_mut(&id)
    }

    pub(crate) fn sessions(&self) -> impl Iterator<Item = (&u64, &Session)> {
        self.sessions.iter()
    }

    /// Containers watched: sessions and those between `begin_watch` and
    /// `complete_watch` (in the kernel's watch map already).
    pub(crate) fn watching(&self) -> usize {
        self.sessions.len() + self.pending.len()
    }

    /// The session of a container, by (scope, id).
    pub(crate) fn find(&self, key: &ContainerKey) -> Option<u64> {
        self.by_key.get(key).copied()
    }

    /// Stop watching: final drain, `end` record, log closed, watch-map entry removed.
    pub(crate) fn finish(
        &mut self,
        id: u64,
        reason: EndReason,
        exit_code: Option<i32>,
    ) -> Option<Finished> {
        let mut outputs = self.poll(Due::Events);
        let mut s = self.sessions.remove(&id)?;
        let key = s.spec.key();
        if self.by_key.get(&key) == Some(&id) {
            self.by_key.remove(&key);
        }
        s.cold_start_progress(self.probe.cold_start_split(id));
        let spec = s.spec.clone();
        let totals = ProbeTotals::read(&self.probe, id, map_full(&self.probe));
        let mut wakes = self.probe.wake_edges();
        wakes.retain(|e| e.key.cgroup_id == id);
        let at_exit = self.probe.exit_bandwidth(id);
        let end = s.finish((totals, wakes), at_exit, reason, exit_code, &mut outputs);
        self.probe.cold_start_finished(id);
        let _ = self.probe.unwatch(id);
        Some(Finished { end, spec, outputs })
    }
}
