//! One watched container and the only writer of its log. The engine feeds
//! it one typed reading per poll (kernel events, probe totals); it writes
//! the records and hands back what happened as outputs.

use std::io;

use throttlewatch_bpf::{ColdStartEvent, Event, FreezeEvent, ThrottleModel};
use throttlewatch_cgroup::{CpuCgroup, CpuLimits, CpuStat};
use throttlewatch_core::logfmt::{self, CpuStatSnapshot, End, LogWriter, Record, Runq};

use throttlewatch_core::EndReason;

use crate::budget::LogBudget;
use crate::clock::Clock;
use crate::coldstart::ColdStartTracker;
use crate::freezes::FreezeTally;
use crate::gpu::GpuSeries;
use crate::kernel_counters::{CgroupReading, KernelCounters, OomKills};
use crate::output::Output;
use crate::reading::{ProbeTotals, Reading};
use crate::records::{resume_record, start_record, throttle_record, MAX_PROCESSES};
use crate::runq::RunqTracker;
use crate::spec::{Baseline, SessionSpec};
use crate::threadcpu::ThreadCpuTally;

/// What the log's `start` and `resume` records say about the probe.
#[derive(Debug, Clone)]
pub(crate) struct ProbeFacts {
    pub model: ThrottleModel,
    /// "tp_btf", "raw_tp", with "+fentry" when the fentry view loaded.
    pub description: String,
    /// Run-queue latency is measured.
    pub runq: bool,
}

/// How a session begins, from the engine.
pub(crate) struct Opening<'a> {
    pub facts: &'a ProbeFacts,
    /// The probe follows the container's cold start.
    pub cold_start_armed: bool,
}

/// The cold start's note when watching ends before it is complete.
const COLD_START_CUT_SHORT: &str = "watching ended before the entrypoint had its CPU target";

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

/// A session whose kernel baselines are taken but whose log is not open
/// yet: the engine puts the cgroup in the watch map in between, so that the
/// agent can answer the hook before the log, the `start` record (with its
/// topology) and the state file are written.
pub(crate) struct SessionDraft {
    spec: SessionSpec,
    cgroup: CpuCgroup,
    cgroup_id: u64,
    limits: CpuLimits,
    kernel: KernelCounters,
    carried: Baseline,
    /// The kernel's throttled time that passed unwatched (resume only).
    gap_ns: u64,
    facts: ProbeFacts,
    totals: ProbeTotals,
    cold_start_armed: bool,
    started_unix_ns: u64,
}

impl SessionDraft {
    pub(crate) fn cgroup_id(&self) -> u64 {
        self.cgroup_id
    }

    /// Open the log and write `start` (or `resume`).
    pub(crate) fn open(self) -> io::Result<Session> {
        let mut p = self;
        p.cgroup.read_cpuset(&mut p.limits);
        let record = match &p.spec.resume {
            Some(_) => Record::Resume(resume_record(&p.spec, p.cgroup_id, &p.facts, p.gap_ns)),
            None => Record::Start(start_record(
                &p.spec,
                &p.cgroup,
                p.cgroup_id,
                &p.limits,
                &p.facts,
            )),
        };
        // A container's new lifetime (docker start, a re-created id): the
        // earlier lifetime's log is kept whole beside it, never truncated.
        if p.spec.resume.is_none() && p.spec.register.is_some() {
            if let Some(kept) = logfmt::rotate::keep_earlier_lifetime(&p.spec.log_path)? {
                tracing::info!(log = %p.spec.log_path.display(), kept = %kept.display(), "a new lifetime: the earlier log kept");
            }
        }
        let mut log = LogWriter::open_with(
            &p.spec.log_path,
            p.spec.resume.is_some(),
            p.spec.log.rotation,
        )?;
        log.write(record.clone())?;
        log.flush()?;
        let mono = p.totals.mono_ns;
        let budget = LogBudget::new(&p.spec.log, mono, logfmt::now_unix_ns());
        let cold = p
            .spec
            .cold_start
            .clone()
            .filter(|_| p.cold_start_armed)
            .map(|c| ColdStartTracker::new(c, mono));
        let spec_pid = p.spec.pid;
        let gpu = GpuSeries::of(&record, spec_pid, p.started_unix_ns);
        Ok(Session {
            gpu,
            started_unix_ns: p.started_unix_ns,
            runq: p
                .facts
                .runq
                .then(|| RunqTracker::new(Default::default(), mono)),
            wakes: Vec::new(),
            spec: p.spec,
            cgroup: p.cgroup,
            cgroup_id: p.cgroup_id,
            log,
            tally: FreezeTally::default(),
            budget,
            kernel: p.kernel,
            at_start: p.totals,
            now: p.totals,
            carried: p.carried,
            cold,
            thread_cpu: ThreadCpuTally::default(),
            last_read: None,
            processes: Default::default(),
            unwritten: 0,
            said_unwritten: false,
            exported_kernel: None,
            exported_probe_ns: 0,
            oom: OomKills::of(spec_pid),
        })
    }
}

impl Session {
    /// Read the cgroup's limits, have `watch` put the cgroup in the watch
    /// map and read the probe's totals, then take the kernel's baseline
    /// right after them. Nothing is written: the log opens with
    /// [`SessionDraft::open`]. Both baselines come once the watch has begun,
    /// side by side: the kernel's taken before the watch, a throttle
    /// episode that ended in between was in neither view (the kernel
    /// counted it after its baseline, the probe never saw it). Under the
    /// VM lane's emulated CPU the two were 10-50 ms apart, and one restart
    /// in five lost a timer run's unthrottles (~190 ms, 1-2 % of the
    /// container's throttled time) from `probe + unwatched`.
    pub(crate) fn prepare(
        spec: SessionSpec,
        cgroup: CpuCgroup,
        o: Opening<'_>,
        watch: impl FnOnce() -> io::Result<ProbeTotals>,
    ) -> io::Result<SessionDraft> {
        let cgroup_id = cgroup.id().map_err(io::Error::other)?;
        // The cpuset only when the record is written (`open`): the start
        // waits for this.
        let limits = cgroup.bandwidth().unwrap_or_default();
        let totals = watch()?;
        let now = CgroupReading::read(&cgroup);
        let kernel = KernelCounters::open(
            &cgroup,
            limits.quota_us.is_some(),
            &now,
            spec.resume.as_ref(),
        );
        let mut carried = spec.resume.clone().unwrap_or_default();
        let mut gap_ns = 0;
        if let Some(b) = &spec.resume {
            // Kernel time that passed unwatched: all the kernel counted
            // since the start, less what the probe had counted before.
            let k = kernel.own_throttled_ns(&now);
            carried.unwatched_ns = k.saturating_sub(b.probe_ns + b.unwatched_ns) + b.unwatched_ns;
            gap_ns = carried.unwatched_ns - b.unwatched_ns;
        }
        let started_unix_ns = match carried.started_unix_ns {
            0 => logfmt::now_unix_ns(),
            t => t,
        };
        Ok(SessionDraft {
            spec,
            cgroup,
            cgroup_id,
            limits,
            kernel,
            carried,
            gap_ns,
            facts: o.facts.clone(),
            totals,
            cold_start_armed: o.cold_start_armed,
            started_unix_ns,
        })
    }

    /// Take one reading: write its records, push what happened onto `out`.
    pub(crate) fn feed(&mut self, r: Reading, clock: &Clock, out: &mut Vec<Output>) {
        for ev in r.events {
            match ev {
                Event::Freeze(f) => self.on_freeze(&f, clock, out),
                Event::ColdStart(c) => self.on_cold_start(&c, clock, out),
                Event::ThreadCpu(t) => self.thread_cpu.on_exit(&t),
            }
        }
        let Some(totals) = r.totals else { return };
        self.now = totals;
        self.wakes = r.wakes.unwrap_or_else(|| std::mem::take(&mut self.wakes));
        if let Some((at, g)) = r.gpu {
            self.gpu.add_out(at, &g, &self.spec.labels, out);
        }
        let cg = CgroupReading::read(&self.cgroup);
        if cg.stat.is_some() {
            self.last_read = Some((cg, logfmt::now_unix_ns()));
            if let Some(o) = &mut self.oom {
                o.refresh();
            }
        }
        self.export_counters(&cg, out);
        if r.snapshot {
            self.snapshot(&cg, out);
        }
        if let Err(e) = self.log.flush() {
            self.say_unwritten(&e);
        }
    }

    /// Stop: write what is known of a pending cold start, then `end`; flush
    /// and sync. `totals`: the probe's, read after the last drain.
    /// `at_exit`: the kernel's counters at the group's last task exit, for a
    /// cgroup removed before its `cpu.stat` could be read.
    pub(crate) fn finish(
        mut self,
        (totals, wakes): (ProbeTotals, Vec<throttlewatch_bpf::WakeEdgeTotals>),
        at_exit: Option<throttlewatch_bpf::ExitBandwidth>,
        reason: EndReason,
        exit_code: Option<i32>,
        out: &mut Vec<Output>,
    ) -> End {
        self.now = totals;
        self.wakes = wakes;
        if let Some(rec) = self
            .cold
            .as_mut()
            .and_then(|t| t.finish(COLD_START_CUT_SHORT))
        {
            self.write_cold_start(rec, out);
        }
        self.write_summaries();
        let reading = self.end_reading(at_exit);
        self.export_rest(&reading.0, out);
        let end = self.end_record(reason, exit_code, &reading);
        let path = self.spec.log_path.clone();
        if let Err(e) = self
            .log
            .write(Record::End(end.clone()))
            .and_then(|_| self.log.finish())
        {
            tracing::warn!("{}: finishing log: {e}", path.display());
        }
        end
    }

    /// The counters at the end. A cgroup removed before the end (runc and
    /// Podman remove it before poststop): the last reading, said so; never
    /// a figure not read.
    /// The kernel's counters as the group's last task left them (the probe
    /// reads them at its exit) are its final `cpu.stat` when the group holds
    /// its own quota: then nothing is stale.
    fn end_reading(
        &self,
        at_exit: Option<throttlewatch_bpf::ExitBandwidth>,
    ) -> (CgroupReading, Option<String>) {
        let now = CgroupReading::read(&self.cgroup);
        if now.stat.is_some() {
            return (now, None);
        }
        if let (Some(b), true) = (at_exit, self.kernel.own_quota()) {
            return (CgroupReading::at_exit(b), None);
        }
        let (last, at) = self
            .last_read
            .unwrap_or((CgroupReading::default(), self.started_unix_ns));
        let ago_ms = logfmt::now_unix_ns().saturating_sub(at) / 1_000_000;
        let why = format!(
            "cpu.stat unreadable at the end (the cgroup is gone): kernel figures are from the last reading, {ago_ms} ms before"
        );
        (last, Some(why))
    }

    /// The `end` record: the one place it is built.
    fn end_record(
        &self,
        reason: EndReason,
        exit_code: Option<i32>,
        (cg, kernel_stale): &(CgroupReading, Option<String>),
    ) -> End {
        let d = self.kernel.delta(cg);
        let oom_kills = self.oom.as_ref().map_or(0, OomKills::since_start);
        End {
            oom_kills,
            reason: reason.as_str().into(),
            duration_ns: logfmt::now_unix_ns().saturating_sub(self.started_unix_ns),
            exit_code,
            top_threads: self.tally.top(),
            threads: self.tally.threads(),
            freezes: self.tally.freezes + self.carried.freezes,
            frozen_ns: self.tally.frozen_ns + self.carried.frozen_ns,
            probe_throttled_ns: self.probe_ns(),
            probe_episodes: self.probe_episodes(),
            unwatched_throttled_ns: self.carried.unwatched_ns,
            fentry_throttled_ns: self.fentry_ns(),
            kernel_throttled_ns: self.kernel.throttled_ns(cg),
            kernel_source: self.kernel.source().as_str().into(),
            kernel_stale: kernel_stale.clone(),
            unwritten_records: self.unwritten,
            nr_periods: d.nr_periods,
            nr_throttled: d.nr_throttled,
            nr_bursts: d.nr_bursts,
            burst_ns: d.burst_ns,
            lost_events: self
                .now
                .lost_events
                .saturating_sub(self.at_start.lost_events),
            below_threshold: self.tally.below_threshold,
            folded_freezes: self.budget.folded_total,
            rotations: self.log.rotations(),
            runq: self.runq_total(),
            thread_cpu: self.runq.as_ref().map(|_| {
                let most_frozen: Vec<u32> = self.tally.top().iter().map(|t| t.tid).collect();
                self.thread_cpu
                    .summary(&self.cgroup, |tid| self.tally.frozen_of(tid), &most_frozen)
            }),
            map_full: Some(self.now.map_full.since(&self.at_start.map_full)),
        }
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
        out.push(Output::Counters {
            container: self.spec.labels.clone(),
            kernel: now.since(&prev),
            probe_throttled_ns: probe.saturating_sub(before),
        });
    }

    /// What the metrics have not had yet: the counters since the last tick
    /// and the run-queue waits since the last snapshot (a container shorter
    /// than `snapshot_interval_s` has no other). No record is written: `end`
    /// holds the totals.
    fn export_rest(&mut self, cg: &CgroupReading, out: &mut Vec<Output>) {
        self.export_counters(cg, out);
        if let (Some(t), Some(now)) = (self.runq.as_mut(), self.now.runq) {
            let slots = t.slots_since_last(&now);
            let record = t.interval(now, self.now.mono_ns, &self.wakes);
            out.push(Output::Runq {
                container: self.spec.labels.clone(),
                record,
                slots,
            });
        }
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
