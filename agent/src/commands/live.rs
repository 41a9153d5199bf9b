//! Live throttle events and the end summary on stderr.

use std::io::Write;
use std::time::Duration;

use throttlewatch_core::logfmt::{End, Throttle};
use throttlewatch_core::printable::printable;
use throttlewatch_core::units::format_duration;

use throttlewatch_core::EndReason;

use crate::engine::Engine;
use crate::output::Output;
use crate::reading::Due;

pub(crate) struct LivePrinter {
    pub json: bool,
    pub quiet: bool,
    started_unix_ns: u64,
}

impl LivePrinter {
    pub(crate) fn new(json: bool, quiet: bool) -> LivePrinter {
        LivePrinter {
            json,
            quiet,
            started_unix_ns: throttlewatch_core::logfmt::now_unix_ns(),
        }
    }

    /// Print what the terminal shows of a poll's outputs: the freezes that were logged.
    pub(crate) fn outputs(&self, outputs: &[Output]) {
        for o in outputs {
            if let Output::Freeze {
                container,
                record: Some(t),
                ..
            } = o
            {
                self.freeze(container.container_id.as_str(), t);
            }
        }
    }

    pub(crate) fn freeze(&self, container: &str, t: &Throttle) {
        if self.quiet {
            return;
        }
        let mut err = std::io::stderr().lock();
        if self.json {
            let mut v = serde_json::to_value(t).unwrap_or_default();
            v["type"] = "throttle".into();
            v["container_id"] = container.into();
            let _ = writeln!(err, "{v}");
        } else {
            let at = t.start_ns.saturating_sub(self.started_unix_ns) as f64 / 1e9;
            let _ = writeln!(
                err,
                "[{at:9.3}s] frozen {:>10}  tid {:<7} {:<16} cpu {}{}",
                format_duration(Duration::from_nanos(t.frozen_ns)),
                t.tid,
                printable(&t.comm),
                t.cpu,
                if t.cpu_in != t.cpu {
                    format!("->{}", t.cpu_in)
                } else {
                    String::new()
                },
            );
        }
    }

    pub(crate) fn summary(&self, what: &str, end: &End, log: &std::path::Path) {
        let mut err = std::io::stderr().lock();
        if self.json {
            let mut v = serde_json::to_value(end).unwrap_or_default();
            v["type"] = "end".into();
            v["log"] = log.display().to_string().into();
            let _ = writeln!(err, "{v}");
            return;
        }
        let d = |ns: u64| format_duration(Duration::from_nanos(ns));
        let _ = writeln!(
            err,
            "throttlewatch: {what} after {}: throttled {} in {} of {} periods ({} episodes); kernel {} says {} (error {:.2}%)",
            d(end.duration_ns),
            d(end.probe_throttled_ns),
            end.nr_throttled,
            end.nr_periods,
            end.probe_episodes,
            end.kernel_source,
            d(end.kernel_throttled_ns),
            end.fidelity_error() * 100.0,
        );
        if end.nr_bursts > 0 {
            let _ = writeln!(
                err,
                "  burst used {} times, {} in all",
                end.nr_bursts,
                d(end.burst_ns)
            );
        }
        if !end.top_threads.is_empty() {
            let _ = writeln!(
                err,
                "  {:<8} {:<16} {:>7} {:>12} {:>12}",
                "tid", "comm", "freezes", "frozen", "longest"
            );
            for t in &end.top_threads {
                let _ = writeln!(
                    err,
                    "  {:<8} {:<16} {:>7} {:>12} {:>12}",
                    t.tid,
                    printable(&t.comm),
                    t.count,
                    d(t.total_frozen_ns),
                    d(t.max_frozen_ns)
                );
            }
        }
        if end.lost_events > 0 {
            let _ = writeln!(
                err,
                "  {} events lost (totals above are unaffected)",
                end.lost_events
            );
        }
        let _ = writeln!(err, "  log: {}", log.display());
    }
}

/// The loop body `run` and `watch` share: drain the ring buffer onto the
/// terminal, snapshot and flush the logs on schedule, sleep until the next poll.
pub(crate) struct LiveLoop {
    pub printer: LivePrinter,
    snap_every: std::time::Duration,
    last_snap: std::time::Instant,
    poll: std::time::Duration,
}

impl LiveLoop {
    pub(crate) fn new(
        cfg: &throttlewatch_core::config::Config,
        out: &crate::cli::OutputArgs,
    ) -> LiveLoop {
        LiveLoop {
            printer: LivePrinter::new(out.json, out.quiet),
            snap_every: std::time::Duration::from_secs(cfg.snapshot_interval_s.max(1)),
            last_snap: std::time::Instant::now(),
            poll: cfg.poll_interval(),
        }
    }

    /// One poll: the events, and the snapshot when it is due.
    pub(crate) fn poll(&mut self, engine: &mut Engine) {
        let due = if self.last_snap.elapsed() >= self.snap_every {
            self.last_snap = std::time::Instant::now();
            Due::Snapshot
        } else {
            Due::Events
        };
        self.printer.outputs(&engine.poll(due));
    }

    pub(crate) fn sleep(&self) {
        std::thread::sleep(self.poll);
    }

    /// The last snapshot, the end of the watch, and its summary on the terminal.
    pub(crate) fn finish(
        &self,
        engine: &mut Engine,
        id: u64,
        reason: EndReason,
        exit_code: Option<i32>,
        what: &str,
    ) -> Option<throttlewatch_core::logfmt::End> {
        self.printer.outputs(&engine.poll(Due::Snapshot));
        let f = engine.finish(id, reason, exit_code)?;
        self.printer.outputs(&f.outputs);
        self.printer.summary(what, &f.end, &f.spec.log_path);
        Some(f.end)
    }
}
