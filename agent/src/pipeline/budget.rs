//! A container log's byte budget: a token bucket in bytes. A `throttle`
//! record is written while the bucket holds more than a reserve; past it the
//! freeze is folded into its thread's summary for the snapshot interval.
//! At the interval's end the summaries take the bucket down to empty (most
//! frozen threads first); the threads left without a line share one summary
//! (`tid` 0). So a log grows at most by the rate, plus the burst, plus a few
//! records per interval (`cpu_stat`, `runq`, that last summary) whatever
//! the container's thread count. The `end` totals never depend on it.

use std::collections::HashMap;

use throttlewatch_core::config::Config;
use throttlewatch_core::logfmt::{Rotation, Throttle, ThrottleSummary};

/// The limits of one container's log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LogLimits {
    /// Bytes per second of records; 0: no budget (every freeze a record).
    pub bytes_per_s: u64,
    pub burst_bytes: u64,
    pub rotation: Rotation,
    /// `process` records carry the command line.
    pub cmdline: bool,
}

impl LogLimits {
    pub(crate) fn from_config(cfg: &Config) -> LogLimits {
        LogLimits {
            bytes_per_s: cfg.log_budget_bytes_per_s,
            burst_bytes: cfg.log_budget_burst_bytes,
            rotation: cfg.log_rotation(),
            cmdline: cfg.log_cmdline,
        }
    }
}

const NS_PER_S: i128 = 1_000_000_000;

/// Bytes that refill at `rate` per second up to `burst`; kept in byte·ns so
/// that refills of a few nanoseconds are not lost to rounding.
#[derive(Debug, Clone)]
pub(crate) struct TokenBucket {
    rate: i128,
    cap: i128,
    tokens: i128,
    last_ns: u64,
}

impl TokenBucket {
    /// A full bucket at `now_ns` (CLOCK_MONOTONIC).
    pub(crate) fn new(bytes_per_s: u64, burst_bytes: u64, now_ns: u64) -> TokenBucket {
        let cap = burst_bytes as i128 * NS_PER_S;
        TokenBucket {
            rate: bytes_per_s as i128,
            cap,
            tokens: cap,
            last_ns: now_ns,
        }
    }

    /// Bytes in the bucket at `now_ns` (negative: charged past empty).
    /// A time before the last one (events of another CPU) refills nothing.
    pub(crate) fn available(&mut self, now_ns: u64) -> i64 {
        if now_ns > self.last_ns {
            let add = self.rate * (now_ns - self.last_ns) as i128;
            self.tokens = (self.tokens + add).min(self.cap);
            self.last_ns = now_ns;
        }
        (self.tokens / NS_PER_S) as i64
    }

    /// Take `bytes` (written already: the bucket may go below empty).
    pub(crate) fn charge(&mut self, bytes: usize) {
        self.tokens -= bytes as i128 * NS_PER_S;
    }
}

/// One thread's folded freezes in the current interval.
#[derive(Debug, Clone, Default)]
struct Folded {
    pid: u32,
    comm: String,
    freezes: u64,
    frozen_ns: u64,
    max_ns: u64,
    queued: u64,
}

/// The summary of the threads the budget left no line for.
pub(crate) const OTHER_THREADS: &str = "(other threads)";

/// The budget of one log and the freezes it folded.
#[derive(Debug)]
pub(crate) struct LogBudget {
    bucket: Option<TokenBucket>,
    /// Bytes `throttle` records leave in the bucket for the summaries.
    reserve: i64,
    folded: HashMap<u32, Folded>,
    interval_start_unix_ns: u64,
    /// Freezes folded since watching began.
    pub folded_total: u64,
}

impl LogBudget {
    pub(crate) fn new(limits: &LogLimits, now_ns: u64, now_unix_ns: u64) -> LogBudget {
        let bucket = (limits.bytes_per_s > 0)
            .then(|| TokenBucket::new(limits.bytes_per_s, limits.burst_bytes, now_ns));
        LogBudget {
            bucket,
            reserve: (limits.burst_bytes / 4) as i64,
            folded: HashMap::new(),
            interval_start_unix_ns: now_unix_ns,
            folded_total: 0,
        }
    }

    /// Whether a `throttle` record may be written at `now_ns`; if not, the
    /// caller folds it.
    pub(crate) fn admits(&mut self, now_ns: u64) -> bool {
        let reserve = self.reserve;
        self.bucket
            .as_mut()
            .is_none_or(|b| b.available(now_ns) > reserve)
    }

    /// Bytes written (any record: they all come out of the same budget).
    pub(crate) fn charge(&mut self, bytes: usize) {
        if let Some(b) = self.bucket.as_mut() {
            b.charge(bytes);
        }
    }

    /// A freeze the budget did not take as a record.
    pub(crate) fn fold(&mut self, t: &Throttle) {
        self.folded_total += 1;
        let f = self.folded.entry(t.tid).or_default();
        if f.comm != t.comm {
            f.comm = t.comm.clone();
        }
        f.pid = t.pid;
        f.freezes += 1;
        f.frozen_ns += t.frozen_ns;
        f.max_ns = f.max_ns.max(t.frozen_ns);
        f.queued += t.queued as u64;
    }

    /// End the interval: hand `write` the summaries of the folded freezes,
    /// most frozen thread first, while the bucket has bytes, then one for
    /// the rest. `write` returns the bytes it wrote.
    pub(crate) fn summaries(
        &mut self,
        now_ns: u64,
        now_unix_ns: u64,
        cgroup_id: u64,
        mut write: impl FnMut(ThrottleSummary) -> usize,
    ) {
        let start = std::mem::replace(&mut self.interval_start_unix_ns, now_unix_ns);
        if self.folded.is_empty() {
            return;
        }
        let mut threads: Vec<(u32, Folded)> = self.folded.drain().collect();
        threads.sort_by(|a, b| b.1.frozen_ns.cmp(&a.1.frozen_ns).then(a.0.cmp(&b.0)));
        let blank = ThrottleSummary {
            cgroup_id,
            interval_start_ns: start,
            interval_end_ns: now_unix_ns,
            ..Default::default()
        };
        let mut rest = ThrottleSummary {
            comm: OTHER_THREADS.into(),
            ..blank.clone()
        };
        for (tid, f) in threads {
            let room = self.bucket.as_mut().is_none_or(|b| b.available(now_ns) > 0);
            if room {
                let n = write(ThrottleSummary {
                    tid,
                    pid: f.pid,
                    comm: f.comm,
                    threads: 1,
                    freezes: f.freezes,
                    frozen_ns: f.frozen_ns,
                    max_frozen_ns: f.max_ns,
                    queued: f.queued,
                    ..blank.clone()
                });
                self.charge(n);
                continue;
            }
            rest.threads += 1;
            rest.freezes += f.freezes;
            rest.frozen_ns += f.frozen_ns;
            rest.max_frozen_ns = rest.max_frozen_ns.max(f.max_ns);
            rest.queued += f.queued;
        }
        if rest.threads > 0 {
            let n = write(rest);
            self.charge(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn bucket_refills_at_the_rate_up_to_the_burst() {
        let mut b = TokenBucket::new(1000, 4000, 0);
        assert_eq!(b.available(0), 4000);
        b.charge(4000);
        assert_eq!(b.available(0), 0);
        assert_eq!(b.available(S / 2), 500);
        // Nanosecond steps add up (no rounding loss).
        for i in 1..=1000 {
            b.available(S / 2 + i * 1000);
        }
        assert_eq!(b.available(S / 2 + 1_000_000), 501);
        assert_eq!(b.available(100 * S), 4000, "capped at the burst");
        // Time going backwards (another CPU's event) adds nothing.
        b.charge(4500);
        assert_eq!(b.available(S), -500);
        assert_eq!(b.available(100 * S + S), 500);
    }

    fn thr(tid: u32, ns: u64) -> Throttle {
        Throttle {
            tid,
            pid: 1,
            comm: format!("t{tid}"),
            frozen_ns: ns,
            ..Default::default()
        }
    }

    fn limits(rate: u64, burst: u64) -> LogLimits {
        LogLimits {
            bytes_per_s: rate,
            burst_bytes: burst,
            rotation: Rotation::NONE,
            cmdline: false,
        }
    }

    /// Records of 250 bytes, 1000 a second from 50 threads for 10 s, against
    /// 10 KB/s: what is written stays within rate × time + burst + one
    /// summary, and records plus summaries account for every freeze.
    #[test]
    fn folding_keeps_the_rate_and_every_freeze() {
        let mut b = LogBudget::new(&limits(10_000, 20_000), 0, 0);
        let (mut written, mut records, mut recorded_ns) = (0usize, 0u64, 0u64);
        let mut summaries: Vec<ThrottleSummary> = vec![];
        let (mut freezes, mut frozen) = (0u64, 0u64);
        for ms in 0..10_000u64 {
            let now = ms * 1_000_000;
            let t = thr((ms % 50) as u32, 1000 + ms);
            freezes += 1;
            frozen += t.frozen_ns;
            if b.admits(now) {
                b.charge(250);
                written += 250;
                records += 1;
                recorded_ns += t.frozen_ns;
            } else {
                b.fold(&t);
            }
            if ms % 1000 == 999 {
                b.summaries(now, now, 7, |s| {
                    summaries.push(s);
                    written += 270;
                    270
                });
            }
        }
        let bound = 10 * 10_000 + 20_000 + 10 * 270;
        assert!(written <= bound, "{written} > {bound}");
        assert!(written >= 10 * 10_000, "the budget is used: {written}");
        let folded: u64 = summaries.iter().map(|s| s.freezes).sum();
        let folded_ns: u64 = summaries.iter().map(|s| s.frozen_ns).sum();
        assert_eq!(records + folded, freezes);
        assert_eq!(recorded_ns + folded_ns, frozen);
        assert_eq!(b.folded_total, folded);
        // Threads without a line of their own are in one `tid` 0 summary.
        let rest: Vec<_> = summaries.iter().filter(|s| s.tid == 0).collect();
        assert!(!rest.is_empty() && rest.len() <= 10);
        assert!(rest
            .iter()
            .all(|s| s.threads > 1 && s.comm == OTHER_THREADS));
        let own = summaries.iter().filter(|s| s.tid != 0).count();
        assert!(own > 0, "the reserve leaves room for per-thread lines");
    }

    #[test]
    fn summaries_put_the_most_frozen_thread_first() {
        let mut b = LogBudget::new(&limits(1, 4096), 0, 10);
        b.charge(4096);
        for (tid, ns) in [(1, 5), (2, 50), (2, 70), (3, 20)] {
            assert!(!b.admits(0));
            b.fold(&thr(tid, ns));
        }
        // Room for exactly one line: the rest share one summary.
        let mut got = vec![];
        b.available_for_test(1);
        b.summaries(0, 99, 7, |s| {
            got.push(s);
            100
        });
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(
            (
                got[0].tid,
                got[0].freezes,
                got[0].frozen_ns,
                got[0].max_frozen_ns
            ),
            (2, 2, 120, 70)
        );
        assert_eq!((got[0].interval_start_ns, got[0].interval_end_ns), (10, 99));
        assert_eq!(
            (got[1].tid, got[1].threads, got[1].freezes, got[1].frozen_ns),
            (0, 2, 2, 25)
        );
        // The next interval starts where this one ended, with nothing folded.
        b.summaries(0, 200, 7, |_| panic!("nothing folded"));
    }

    #[test]
    fn no_budget_takes_every_record() {
        let mut b = LogBudget::new(&limits(0, 0), 0, 0);
        for _ in 0..100_000 {
            assert!(b.admits(0));
            b.charge(1_000_000);
        }
    }

    impl LogBudget {
        /// Set the bucket to `bytes`.
        fn available_for_test(&mut self, bytes: i64) {
            let b = self.bucket.as_mut().unwrap();
            b.tokens = bytes as i128 * NS_PER_S;
        }
    }
}
