//! One watched container: its log, its per-thread aggregates, and the
//! kernel counters it is compared with.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use throttlewatch_bpf::{EpisodeTotals, FreezeEvent};
use throttlewatch_cgroup::{CpuCgroup, CpuStat};
use throttlewatch_core::logfmt::{
    self, CpuStatSnapshot, End, LogWriter, Record, Resume, Start, ThreadSummary, Throttle,
};

use crate::clock::Clock;

/// What is known about a container when watching starts.
#[derive(Debug, Clone, Default)]
pub struct SessionSpec {
    pub container_id: String,
    pub container_name: String,
    pub pid: Option<u32>,
    pub labels: BTreeMap<String, String>,
    pub qos: Option<serde_json::Value>,
    pub threshold_ns: u64,
    pub log_path: PathBuf,
    /// Continue an existing log (agent restart): write `resume`, not `start`,
    /// and keep counting from the original baseline.
    pub resume: Option<Baseline>,
    /// Record the cold-start timeline (containers registered at create).
    pub cold_start: Option<crate::coldstart::ColdStartSpec>,
}

/// What a session needs to survive an agent restart (persisted by the agent).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Baseline {
    pub stat: CpuStat,
    pub local: Option<CpuStat>,
    pub started_unix_ns: u64,
    /// Probe totals written before the restart.
    pub probe_ns: u64,
    pub probe_episodes: u64,
    pub freezes: u64,
    pub frozen_ns: u64,
    /// Kernel throttled time that passed while no agent watched.
    pub unwatched_ns: u64,
}

#[derive(Debug, Clone, Default)]
pub struct ThreadAgg {
    pub comm: String,
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
}

/// Which kernel counter the episode total is compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelSource {
    /// The group holds the quota itself: `cpu.stat` throttled time.
    CpuStat,
    /// The throttling comes from an ancestor: `cpu.stat.local`.
    CpuStatLocal,
    /// Kernels before `cpu.stat.local` (Linux 6.8): the throttling
    /// ancestor's own `cpu.stat` (exact when the group is its only busy child).
    Ancestor,
}

impl KernelSource {
    pub fn as_str(&self) -> &'static str {
        match self {
            KernelSource::CpuStat => "cpu.stat",
            KernelSource::CpuStatLocal => "cpu.stat.local",
            KernelSource::Ancestor => "ancestor cpu.stat",
        }
    }
}

pub struct Session {
    pub spec: SessionSpec,
    pub cgroup: CpuCgroup,
    pub cgroup_id: u64,
    log: Option<LogWriter>,
    threads: HashMap<u32, ThreadAgg>,
    freezes: u64,
    frozen_ns: u64,
    below_threshold: u64,
    baseline: CpuStat,
    baseline_local: Option<CpuStat>,
    /// The last `cpu.stat` (and `.local`) read, with its time (Unix ns): the
    /// `end` of a container whose cgroup is already gone reports these.
    last_read: Option<(CpuStat, Option<CpuStat>, u64)>,
    /// Records the log could not take, and whether that was said.
    unwritten: u64,
    said_unwritten: bool,
    /// With KernelSource::Ancestor: the ancestor holding the quota.
    ancestor: Option<CpuCgroup>,
    baseline_ancestor: CpuStat,
    baseline_episodes: EpisodeTotals,
    baseline_fentry: Option<EpisodeTotals>,
    source: KernelSource,
    started_unix_ns: u64,
    lost_at_start: u64,
    /// Totals carried over from before an agent restart.
    carried: Baseline,
    /// Run-queue latency, where the probe measures it (set by the engine).
    pub runq: Option<crate::runq::RunqTracker>,
    /// The pending cold-start timeline (set by the engine).
    pub cold: Option<crate::coldstart::ColdStartTracker>,
}

pub struct StartInfo<'a> {
    pub model: &'a str,
    pub probe: &'a str,
    pub fentry_now: Option<EpisodeTotals>,
    pub lost_now: u64,
    pub episodes_now: EpisodeTotals,
}

impl Session {
    /// Open the log and take the kernel baseline. The caller then puts the
    /// cgroup in the watch map.
    pub fn open(
        spec: SessionSpec,
        cgroup: CpuCgroup,
        info: StartInfo<'_>,
    ) -> std::io::Result<Session> {
        let cgroup_id = cgroup.id().map_err(std::io::Error::other)?;
        let limits = cgroup.limits().unwrap_or_default();
        let source = if limits.quota_us.is_some() {
            KernelSource::CpuStat
        } else {
            KernelSource::CpuStatLocal
        };
        let now_stat = cgroup.cpu_stat().unwrap_or_default();
        let now_local = cgroup.cpu_stat_local().ok().flatten();
        let ancestor = if source == KernelSource::CpuStatLocal && now_local.is_none() {
            quota_ancestor(&cgroup)
        } else {
            None
        };
        let source = if ancestor.is_some() {
            KernelSource::Ancestor
        } else {
            source
        };
        let baseline_ancestor = ancestor
            .as_ref()
            .and_then(|a| a.cpu_stat().ok())
            .unwrap_or_default();
        let mut carried = spec.resume.clone().unwrap_or_default();
        let (baseline, baseline_local) = match &spec.resume {
            Some(b) => (b.stat, b.local),
            None => (now_stat, now_local),
        };
        let mut log = LogWriter::open(&spec.log_path, spec.resume.is_some())?;
        let record = if let Some(b) = &spec.resume {
            // Kernel time that passed unwatched: all the kernel counted since
            // the start, less what the probe had counted before the restart.
            let k = match (source, now_local, b.local) {
                (KernelSource::CpuStatLocal, Some(l), Some(bl)) => l.since(&bl).throttled_ns,
                _ => now_stat.since(&b.stat).throttled_ns,
            };
            carried.unwatched_ns = k.saturating_sub(b.probe_ns + b.unwatched_ns) + b.unwatched_ns;
            Record::Resume(Resume {
                container_id: spec.container_id.clone(),
                cgroup_id,
                probe: info.probe.into(),
                unwatched_throttled_ns: carried.unwatched_ns - b.unwatched_ns,
                note: "agent restarted: freezes while no agent ran were not seen; the kernel's time for that gap is unwatched_throttled_ns".into(),
            })
        } else {
            Record::Start(Start {
                container_id: spec.container_id.clone(),
                container_name: spec.container_name.clone(),
                pid: spec.pid,
                cgroup_path: cgroup.rel.clone(),
                cgroup_id,
                cgroup_mode: cgroup.mode.to_string(),
                quota_us: limits.quota_us,
                period_us: limits.period_us,
                burst_us: limits.burst_us,
                cpus: limits.cpus.clone().or_else(|| cgroup.effective_cpus()),
                mems: limits.mems.clone().or_else(|| cgroup.effective_mems()),
                kernel_release: kernel_release(),
                throttle_model: info.model.into(),
                probe: info.probe.into(),
                threshold_ns: spec.threshold_ns,
                labels: spec.labels.clone(),
                qos: spec.qos.clone(),
            })
        };
        log.write(record)?;
        log.flush()?;
        Ok(Session {
            spec,
            cgroup,
            cgroup_id,
            log: Some(log),
            threads: HashMap::new(),
            freezes: 0,
            frozen_ns: 0,
            below_threshold: 0,
            baseline,
            baseline_local,
            last_read: None,
            unwritten: 0,
            said_unwritten: false,
            ancestor,
            baseline_ancestor,
            baseline_episodes: info.episodes_now,
            baseline_fentry: info.fentry_now,
            source,
            started_unix_ns: if carried.started_unix_ns > 0 {
                carried.started_unix_ns
            } else {
                logfmt::now_unix_ns()
            },
            lost_at_start: info.lost_now,
            carried,
            runq: None,
            cold: None,
        })
    }

    /// Account one freeze; returns the record when it is at or above the threshold.
    pub fn on_freeze(&mut self, ev: &FreezeEvent, clock: &Clock) -> Option<Throttle> {
        let ns = ev.frozen_ns();
        self.freezes += 1;
        self.frozen_ns += ns;
        let t = self.threads.entry(ev.tid).or_default();
        if t.comm != ev.comm {
            t.comm = ev.comm.clone();
        }
        t.count += 1;
        t.total_ns += ns;
        t.max_ns = t.max_ns.max(ns);
        if ns < self.spec.threshold_ns {
            self.below_threshold += 1;
            return None;
        }
        let rec = Throttle {
            tid: ev.tid,
            pid: ev.tgid,
            comm: ev.comm.clone(),
            cpu: ev.cpu_out,
            cpu_in: ev.cpu_in,
            start_ns: clock.to_unix_ns(ev.start_ns),
            frozen_ns: ns,
            cgroup_id: ev.cgroup_id,
            throttled_cgroup_id: ev.throttled_cgroup_id,
            throttled_level: ev.throttled_level,
            queued: ev.queued,
        };
        self.write(Record::Throttle(rec.clone()));
        Some(rec)
    }

    /// Append a record (runq, cold_start) to the log, if still open.
    pub fn write(&mut self, rec: Record) {
        if let Some(Err(e)) = self.log.as_mut().map(|l| l.write(rec)) {
            self.unwritten += 1;
            self.say_unwritten(&e);
        }
    }

    pub fn flush(&mut self) {
        if let Some(Err(e)) = self.log.as_mut().map(|l| l.flush()) {
            self.say_unwritten(&e);
        }
    }

    /// A write that failed (a full disk): said once per container, then
    /// only counted (`end.unwritten_records`); the agent goes on.
    fn say_unwritten(&mut self, e: &std::io::Error) {
        if !self.said_unwritten {
            self.said_unwritten = true;
            eprintln!(
                "throttlewatch agent: {}: writing the log: {e}; records that do not fit are counted in end.unwritten_records, not reported again",
                self.spec.log_path.display()
            );
        }
    }

    pub fn kernel_throttled_ns(&self, now: &CpuStat, local: Option<&CpuStat>) -> u64 {
        match (self.source, local, self.baseline_local.as_ref()) {
            (KernelSource::CpuStatLocal, Some(l), Some(b)) => l.since(b).throttled_ns,
            (KernelSource::Ancestor, _, _) => {
                let a = self
                    .ancestor
                    .as_ref()
                    .and_then(|a| a.cpu_stat().ok())
                    .unwrap_or(self.baseline_ancestor);
                a.since(&self.baseline_ancestor).throttled_ns
            }
            _ => now.since(&self.baseline).throttled_ns,
        }
    }

    pub fn source(&self) -> KernelSource {
        if self.source == KernelSource::CpuStatLocal && self.baseline_local.is_none() {
            KernelSource::CpuStat
        } else {
            self.source
        }
    }

    /// Write a `cpu_stat` snapshot of the kernel counters.
    pub fn snapshot(&mut self, episodes: EpisodeTotals) {
        let Ok(s) = self.cgroup.cpu_stat() else {
            return;
        };
        let local = self.cgroup.cpu_stat_local().ok().flatten();
        self.last_read = Some((s, local, logfmt::now_unix_ns()));
        let rec = CpuStatSnapshot {
            nr_periods: s.nr_periods,
            nr_throttled: s.nr_throttled,
            throttled_ns: s.throttled_ns,
            nr_bursts: s.nr_bursts,
            burst_ns: s.burst_ns,
            local_throttled_ns: local.map(|l| l.throttled_ns),
            probe_throttled_ns: self.probe_ns(episodes),
        };
        self.write(Record::CpuStat(rec));
    }

    pub fn threads(&self) -> &HashMap<u32, ThreadAgg> {
        &self.threads
    }

    /// The `end` record's content at this moment.
    pub fn summary(
        &self,
        reason: &str,
        exit_code: Option<i32>,
        episodes: EpisodeTotals,
        lost_now: u64,
        fentry: Option<EpisodeTotals>,
    ) -> End {
        // A cgroup removed before the end (runc and Podman remove it before
        // poststop): the last reading, said so; never a figure not read.
        let (now, local, kernel_stale) = match self.cgroup.cpu_stat() {
            Ok(s) => (s, self.cgroup.cpu_stat_local().ok().flatten(), None),
            Err(e) => {
                let (s, l, at) = self.last_read.unwrap_or((
                    self.baseline,
                    self.baseline_local,
                    self.started_unix_ns,
                ));
                let ago_ms = logfmt::now_unix_ns().saturating_sub(at) / 1_000_000;
                (
                    s,
                    l,
                    Some(format!(
                        "cpu.stat unreadable at the end ({e}): kernel figures are from the last reading, {ago_ms} ms before"
                    )),
                )
            }
        };
        let d = now.since(&self.baseline);
        let mut top: Vec<ThreadSummary> = self
            .threads
            .iter()
            .map(|(tid, a)| ThreadSummary {
                tid: *tid,
                comm: a.comm.clone(),
                count: a.count,
                total_frozen_ns: a.total_ns,
                max_frozen_ns: a.max_ns,
            })
            .collect();
        top.sort_by(|a, b| {
            b.total_frozen_ns
                .cmp(&a.total_frozen_ns)
                .then(a.tid.cmp(&b.tid))
        });
        top.truncate(10);
        End {
            reason: reason.into(),
            duration_ns: logfmt::now_unix_ns().saturating_sub(self.started_unix_ns),
            exit_code,
            top_threads: top,
            threads: self.threads.len() as u64,
            freezes: self.freezes + self.carried.freezes,
            frozen_ns: self.frozen_ns + self.carried.frozen_ns,
            probe_throttled_ns: self.probe_ns(episodes),
            probe_episodes: episodes.count.saturating_sub(self.baseline_episodes.count)
                + self.carried.probe_episodes,
            unwatched_throttled_ns: self.carried.unwatched_ns,
            fentry_throttled_ns: fentry
                .zip(self.baseline_fentry)
                .map(|(now, base)| now.total_ns.saturating_sub(base.total_ns))
                // The fentry view keys episodes by the throttled run-queue's
                // own group: a group throttled by an ancestor's quota is not
                // in it (absent, not 0).
                .filter(|_| self.spec.resume.is_none() && self.source == KernelSource::CpuStat),
            kernel_throttled_ns: self.kernel_throttled_ns(&now, local.as_ref()),
            kernel_source: self.source().as_str().into(),
            kernel_stale,
            unwritten_records: self.unwritten,
            nr_periods: d.nr_periods,
            nr_throttled: d.nr_throttled,
            nr_bursts: d.nr_bursts,
            burst_ns: d.burst_ns,
            lost_events: lost_now.saturating_sub(self.lost_at_start),
            below_threshold: self.below_threshold,
            runq: None, // the engine fills it from the probe
        }
    }

    fn probe_ns(&self, episodes: EpisodeTotals) -> u64 {
        episodes
            .total_ns
            .saturating_sub(self.baseline_episodes.total_ns)
            + self.carried.probe_ns
    }

    /// The state to persist so a restarted agent can resume this session.
    pub fn baseline(&self, episodes: EpisodeTotals) -> Baseline {
        Baseline {
            stat: self.baseline,
            local: self.baseline_local,
            started_unix_ns: self.started_unix_ns,
            probe_ns: self.probe_ns(episodes),
            probe_episodes: episodes.count.saturating_sub(self.baseline_episodes.count)
                + self.carried.probe_episodes,
            freezes: self.freezes + self.carried.freezes,
            frozen_ns: self.frozen_ns + self.carried.frozen_ns,
            unwatched_ns: self.carried.unwatched_ns,
        }
    }

    /// Write the `end` record, flush and sync. Safe to call once; later calls do nothing.
    pub fn finish(&mut self, end: &End) -> std::io::Result<()> {
        if let Some(mut log) = self.log.take() {
            log.write(Record::End(end.clone()))?;
            log.finish()?;
        }
        Ok(())
    }

    pub fn is_finished(&self) -> bool {
        self.log.is_none()
    }
}

/// The nearest ancestor that holds a quota (walking up the cpu hierarchy).
fn quota_ancestor(g: &CpuCgroup) -> Option<CpuCgroup> {
    let mut dir = g.cpu_dir.clone();
    let mut rel = g.rel.clone();
    while dir.pop() {
        rel = rel.rsplit_once('/').map(|(p, _)| p.to_string())?;
        let a = CpuCgroup {
            mode: g.mode,
            rel: rel.clone(),
            cpu_dir: dir.clone(),
            cpuset_dir: None,
            extra_dirs: vec![],
        };
        match a.limits() {
            Ok(l) if l.quota_us.is_some() => return Some(a),
            Ok(_) => continue,
            Err(_) => return None,
        }
    }
    None
}

pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Convenience for callers that only have the log module.
pub use logfmt::log_file_name;
