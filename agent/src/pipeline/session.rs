//! One watched container and the only writer of its log. The engine feeds
//! it one typed reading per poll (kernel events, probe totals); it writes
//! the records and hands back what happened as outputs. It opens in
//! `session/draft.rs` and ends in `session/end.rs`.

use std::io;

use throttlewatch_bpf::{ColdStartEvent, Event, FreezeEvent};
use throttlewatch_cgroup::{CpuCgroup, CpuStat};
use throttlewatch_core::logfmt::{self, CpuStatSnapshot, LogWriter, Record, Runq};

use crate::budget::LogBudget;
use crate::clock::Clock;
use crate::coldstart::ColdStartTracker;
use crate::freezes::FreezeTally;
use crate::gpu::GpuSeries;
use crate::kernel_counters::{CgroupReading, KernelCounters, OomKills};
use crate::output::Output;
use crate::reading::{ProbeTotals, Reading};
use crate::records::{throttle_record, MAX_PROCESSES};
use crate::runq::RunqTracker;
use crate::spec::{Baseline, SessionSpec};
use crate::threadcpu::ThreadCpuTally;

/// Its opening (`SessionDraft`) and its end (`finish`, the `end` record).
pub(crate) mod draft;
mod end;

pub(crate) struct Session {
    pub spec: SessionSpec,
    pub cgroup: CpuCgroup,
    pub cgroup_id: u64,
    log: LogWriter,
    tally: FreezeTally,
    /// The log's byte budget and the freezes it folded this interval.
    budget: LogBudget,
    kernel: KernelCounters,
    /// The probe's totals when watching began, and the latest ones.
    at_start: ProbeTotals,
    now: ProbeTotals,
    started_unix_ns: u64,
    /// Totals carried over from before an agent restart.
    carried: Baseline,
    runq: Option<RunqTracker>,
    /// The kernel's wake-up edges of the cgroup, as of the last snapshot.
    wakes: Vec<throttlewatch_bpf::WakeEdgeTotals>,
    cold: Option<ColdStartTracker>,
    /// Per-thread CPU of the threads that exited (tp_btf probe).
    thread_cpu: ThreadCpuTally,
    /// The last reading of the cgroup's counters, with its time (Unix ns):
    /// the `end` of a container whose cgroup is already gone reports it.
    last_read: Option<(CgroupReading, u64)>,
    /// The last read differed from the one before: read at the next tick.
    counters_moving: bool,
    /// Events came since the last reading with totals.
    events_since_tick: bool,
    /// Processes with a `process` record (at most MAX_PROCESSES).
    processes: std::collections::HashSet<u32>,
    /// Records the log could not take, and whether that was said.
    unwritten: u64,
    said_unwritten: bool,
    /// What the last `Counters` output covered.
    exported_kernel: Option<CpuStat>,
    exported_probe_ns: u64,
    /// The container's memory cgroup, its OOM kills when watching began and
    /// the latest count read (kept for a cgroup removed before the end).
    oom: Option<OomKills>,
    /// The container's GPUs' samples until the next `cpu_stat`.
    gpu: GpuSeries,
}

impl Session {
    /// Take one reading: write its records, push what happened onto `out`.
    /// The cgroup's counters are read only when they may have moved
    /// ([`Session::counters_due`]); a container with no news costs the
    /// probe's lookups and nothing else.
    pub(crate) fn feed(&mut self, r: Reading, clock: &Clock, out: &mut Vec<Output>) {
        self.events_since_tick |= !r.events.is_empty();
        for ev in r.events {
            match ev {
                Event::Freeze(f) => self.on_freeze(&f, clock, out),
                Event::ColdStart(c) => self.on_cold_start(&c, clock, out),
                Event::ThreadCpu(t) => self.thread_cpu.on_exit(&t),
            }
        }
        let Some(totals) = r.totals else { return };
        let due = r.snapshot || self.counters_due(&totals);
        self.events_since_tick = false;
        self.now = totals;
        self.wakes = r.wakes.unwrap_or_else(|| std::mem::take(&mut self.wakes));
        if let Some((at, g)) = r.gpu {
            self.gpu.add_out(at, &g, &self.spec.labels, out);
        }
        if due {
            let cg = self.read_counters(out);
            if r.snapshot {
                self.snapshot(&cg, out);
            }
        }
        if let Err(e) = self.log.flush() {
            self.say_unwritten(&e);
        }
    }

    /// Whether this tick reads `cpu.stat`: the group's threads were seen to
    /// run since the last tick (events in any poll, a run-queue wait ended, a throttle
    /// episode began, ended or is open), or the last read found the counters
    /// moving (a bandwidth timer runs a period or two after the group last
    /// ran), or the probe cannot tell (no run-queue view), or nothing was
    /// read yet. Otherwise the counters are as last read, and the snapshot
    /// reads them anyway (every `snapshot_interval_s`).
    fn counters_due(&self, totals: &ProbeTotals) -> bool {
        self.events_since_tick
            || self.counters_moving
            || self.last_read.is_none()
            || totals.activity_since(&self.now).unwrap_or(true)
    }

    /// Read the cgroup's counters (and its OOM kills) and export what moved.
    fn read_counters(&mut self, out: &mut Vec<Output>) -> CgroupReading {
        let cg = CgroupReading::read(&self.cgroup);
        if cg.stat.is_some() {
            self.counters_moving = self.last_read.is_none_or(|(last, _)| last != cg);
            self.last_read = Some((cg, logfmt::now_unix_ns()));
            if let Some(o) = &mut self.oom {
                o.refresh();
            }
        }
        self.export_counters(&cg, out);
        cg
    }

    /// The state to persist so a restarted agent can resume this session
    /// (as of the last reading with totals).
    pub(crate) fn baseline(&self) -> Baseline {
        let (stat, local) = self.kernel.base();
        Baseline {
            stat,
            local,
            started_unix_ns: self.started_unix_ns,
            probe_ns: self.probe_ns(),
            probe_episodes: self.probe_episodes(),
            freezes: self.tally.freezes + self.carried.freezes,
            frozen_ns: self.tally.frozen_ns + self.carried.frozen_ns,
            unwatched_ns: self.carried.unwatched_ns,
        }
    }

    /// A change of the dynamic CPU controller (`crate::control`).
    pub(crate) fn write_control(&mut self, rec: logfmt::Control) {
        self.write(Record::Control(rec));
    }

    /// A freeze: counted; a `throttle` record when at or above the
    /// threshold and within the byte budget, else folded into its thread's
    /// summary for the interval.
    fn on_freeze(&mut self, ev: &FreezeEvent, clock: &Clock, out: &mut Vec<Output>) {
        if ev.tgid != 0 && self.processes.len() < MAX_PROCESSES && self.processes.insert(ev.tgid) {
            let p = crate::procinfo::read(
                std::path::Path::new("/proc"),
                ev.tgid,
                self.spec.log.cmdline,
            );
            self.write(Record::Process(p));
        }
        let mut record = self
            .tally
            .add(ev, self.spec.threshold_ns)
            .then(|| throttle_record(ev, clock));
        if let Some(rec) = record.take_if(|_| !self.budget.admits(ev.end_ns)) {
            self.budget.fold(&rec);
        }
        if let Some(rec) = &record {
            self.write(Record::Throttle(rec.clone()));
        }
        out.push(Output::Freeze {
            container: self.spec.labels.clone(),
            frozen_ns: ev.frozen_ns(),
            record,
        });
    }

    /// A pending cold start's split so far (the kernel's), for the record
    /// written when watching ends before its CPU target.
    pub(crate) fn cold_start_progress(&mut self, split: Option<throttlewatch_bpf::ExecToCpu>) {
        if let Some(t) = self.cold.as_mut() {
            t.progress(split);
        }
    }

    fn on_cold_start(&mut self, ev: &ColdStartEvent, clock: &Clock, out: &mut Vec<Output>) {
        if let Some(rec) = self.cold.as_mut().and_then(|t| t.on_event(ev, clock)) {
            self.write_cold_start(rec, out);
        }
    }

    fn write_cold_start(&mut self, record: logfmt::ColdStart, out: &mut Vec<Output>) {
        self.write(Record::ColdStart(record.clone()));
        out.push(Output::ColdStart {
            container: self.spec.labels.clone(),
            record,
        });
    }

    /// The kernel counters and the probe's time since the last export.
    /// The first export covers the time since the kernel baseline (the
    /// register), as the `end` record counts it.
    fn export_counters(&mut self, cg: &CgroupReading, out: &mut Vec<Output>) {
        if cg.stat.is_none() {
            return;
        }
        let now = self.kernel.delta(cg);
        let prev = self.exported_kernel.replace(now).unwrap_or_default();
        let probe = self.now.episodes.total_ns;
        let before = std::mem::replace(&mut self.exported_probe_ns, probe);
        let (kernel, probe_throttled_ns) = (now.since(&prev), probe.saturating_sub(before));
        // No news, no output: the metrics keep what they have.
        if kernel == CpuStat::default() && probe_throttled_ns == 0 {
            return;
        }
        out.push(Output::Counters {
            container: self.spec.labels.clone(),
            kernel,
            probe_throttled_ns,
        });
    }

    /// `throttle_summary`, `cpu_stat` and `runq` records; give up on a cold
    /// start that is overdue.
    fn snapshot(&mut self, cg: &CgroupReading, out: &mut Vec<Output>) {
        self.write_summaries();
        let (gpu, gpu_samples_dropped) = self.gpu.take();
        if let Some(s) = cg.stat {
            self.write(Record::CpuStat(CpuStatSnapshot {
                nr_periods: s.nr_periods,
                nr_throttled: s.nr_throttled,
                throttled_ns: s.throttled_ns,
                nr_bursts: s.nr_bursts,
                burst_ns: s.burst_ns,
                local_throttled_ns: cg.local.map(|l| l.throttled_ns),
                probe_throttled_ns: self.probe_ns(),
                gpu,
                gpu_samples_dropped,
            }));
        }
        if let (Some(t), Some(now)) = (self.runq.as_mut(), self.now.runq) {
            let slots = t.slots_since_last(&now);
            let record = t.interval(now, self.now.mono_ns, &self.wakes);
            self.write(Record::Runq(record.clone()));
            out.push(Output::Runq {
                container: self.spec.labels.clone(),
                record,
                slots,
            });
        }
        if self
            .cold
            .as_ref()
            .is_some_and(|c| c.expired(self.now.mono_ns))
        {
            let why = format!(
                "not complete {}s after the hook",
                crate::coldstart::GIVE_UP_AFTER.as_secs()
            );
            if let Some(rec) = self.cold.as_mut().and_then(|t| t.finish(&why)) {
                self.write_cold_start(rec, out);
            }
        }
    }

    /// Write one record, out of the byte budget; the bytes of its line
    /// (0: not written).
    fn write(&mut self, rec: Record) -> usize {
        match self.log.write(rec) {
            Ok(n) => {
                self.budget.charge(n);
                n
            }
            Err(e) => {
                self.unwritten += 1;
                self.say_unwritten(&e);
                0
            }
        }
    }

    /// The interval's `throttle_summary` records (freezes past the budget,
    /// which charges them itself: it is out of `self` meanwhile).
    fn write_summaries(&mut self) {
        let unlimited = LogBudget::new(&Default::default(), 0, 0);
        let mut budget = std::mem::replace(&mut self.budget, unlimited);
        budget.summaries(
            self.now.mono_ns,
            logfmt::now_unix_ns(),
            self.cgroup_id,
            |s| self.write(Record::ThrottleSummary(s)),
        );
        self.budget = budget;
    }

    /// Before the agent stops while the container runs: the folded freezes
    /// go to the log (the restarted agent counts from the persisted totals).
    pub(crate) fn suspend(&mut self) {
        self.write_summaries();
        if let Err(e) = self.log.flush() {
            self.say_unwritten(&e);
        }
    }

    /// A write that failed (a full disk): said once per container, then
    /// only counted (`end.unwritten_records`); the agent goes on.
    fn say_unwritten(&mut self, e: &io::Error) {
        if !self.said_unwritten {
            self.said_unwritten = true;
            eprintln!(
                "throttlewatch agent: {}: writing the log: {e}; records that do not fit are counted in end.unwritten_records, not reported again",
                self.spec.log_path.display()
            );
        }
    }

    /// The probe's totals as of the last tick.
    pub(crate) fn totals(&self) -> &ProbeTotals {
        &self.now
    }

    /// Events came since the last tick (the probe's totals may have moved).
    pub(crate) fn events_since_tick(&self) -> bool {
        self.events_since_tick
    }

    /// The container's GPUs (`start.topology.container_gpus`).
    pub(crate) fn gpus(&self) -> &[usize] {
        self.gpu.gpus()
    }

    fn probe_ns(&self) -> u64 {
        let (now, start) = (self.now.episodes, self.at_start.episodes);
        now.total_ns.saturating_sub(start.total_ns) + self.carried.probe_ns
    }

    fn probe_episodes(&self) -> u64 {
        let (now, start) = (self.now.episodes, self.at_start.episodes);
        now.count.saturating_sub(start.count) + self.carried.probe_episodes
    }

    /// The fentry view keys episodes by the throttled run-queue's own group:
    /// a group throttled by an ancestor's quota is not in it (absent, not 0).
    fn fentry_ns(&self) -> Option<u64> {
        let (now, start) = (self.now.fentry?, self.at_start.fentry?);
        (self.spec.resume.is_none() && self.kernel.own_quota())
            .then(|| now.total_ns.saturating_sub(start.total_ns))
    }

    /// Run-queue latency over the whole watch.
    fn runq_total(&self) -> Option<Runq> {
        Some(self.runq.as_ref()?.total(self.now.runq?, self.now.mono_ns))
    }
}
