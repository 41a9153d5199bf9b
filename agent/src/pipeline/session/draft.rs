//! A session's opening: the kernel baselines taken once the cgroup is in
//! the watch map, then the log opened with its `start` (or `resume`).

use std::io;

use throttlewatch_cgroup::{CpuCgroup, CpuLimits};
use throttlewatch_core::logfmt::{self, LogWriter, Record};

use super::Session;
use crate::budget::LogBudget;
use crate::coldstart::ColdStartTracker;
use crate::freezes::FreezeTally;
use crate::gpu::GpuSeries;
use crate::kernel_counters::{CgroupReading, KernelCounters, OomKills};
use crate::probe_facts::ProbeFacts;
use crate::reading::ProbeTotals;
use crate::records::{resume_record, start_record};
use crate::runq::RunqTracker;
use crate::spec::{Baseline, SessionSpec};
use crate::threadcpu::ThreadCpuTally;

/// How a session begins, from the engine.
pub(crate) struct Opening<'a> {
    pub facts: &'a ProbeFacts,
    /// The probe follows the container's cold start.
    pub cold_start_armed: bool,
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
            counters_moving: false,
            events_since_tick: false,
            processes: Default::default(),
            unwritten: 0,
            said_unwritten: false,
            exported_kernel: None,
            exported_probe_ns: 0,
            oom: OomKills::of(spec_pid),
        })
    }

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
}
