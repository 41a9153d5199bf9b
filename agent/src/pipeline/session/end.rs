//! A session's end: the last counters (read, as the group's last task left
//! them, or the last reading, said so), the `end` record, the log closed.

use throttlewatch_core::logfmt::{self, End, Record};
use throttlewatch_core::EndReason;

use super::Session;
use crate::kernel_counters::{CgroupReading, OomKills};
use crate::output::Output;
use crate::reading::ProbeTotals;

/// The cold start's note when watching ends before it is complete.
const COLD_START_CUT_SHORT: &str = "watching ended before the entrypoint had its CPU target";

impl Session {
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
}
