//! Prometheus metrics (prometheus-client), labelled per container with the
//! Kubernetes names where the OCI annotations carry them.

use std::sync::Mutex;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use throttlewatch_core::metrics_detail::MetricsDetail;

use crate::histograms::Log2Histogram;

pub(crate) use super::metric_labels::*;

type FGauge = Family<GpuLabels, Gauge<f64, AtomicU64>>;

pub(crate) const PREEMPTORS: [&str; 3] = ["same", "other", "host"];
/// The `by` label of the wake-up counters (the log's waker kinds, and the
/// edges an interval record did not list).
pub(crate) const WAKERS: [&str; 5] = ["same", "other", "host", "interrupt", "unlisted"];

type FCounter = Family<ContainerLabels, Counter<f64, AtomicU64>>;

pub(crate) struct Metrics {
    pub registry: Registry,
    /// Per-thread freezes, one observation per throttle event.
    pub freeze_seconds: Family<ContainerLabels, Log2Histogram>,
    /// Run-queue waits, from the kernel's log2 histogram deltas.
    pub runq_latency: Family<ContainerLabels, Log2Histogram>,
    pub throttled_seconds: FCounter,
    pub kernel_throttled_seconds: FCounter,
    pub periods: FCounter,
    pub throttled_periods: FCounter,
    pub bursts: FCounter,
    pub burst_seconds: FCounter,
    /// Changes the dynamic CPU controller made (docs/control.md).
    pub control_changes: FCounter,
    /// Preemptions of watched threads, by `by`: same, other (container), host.
    pub runq_preemptions: Family<PreemptLabels, Counter<f64, AtomicU64>>,
    /// Wake-ups of watched threads by the waker's kind (same, other,
    /// host, interrupt, unlisted), their wake -> run time and the frozen
    /// time in the work they started (issue 36; no per-thread labels).
    pub wakeups: Family<PreemptLabels, Counter<f64, AtomicU64>>,
    pub wakeup_wait_seconds: Family<PreemptLabels, Counter<f64, AtomicU64>>,
    pub wakeup_frozen_seconds: Family<PreemptLabels, Counter<f64, AtomicU64>>,
    /// Runnable time not running, by cause (summed over threads).
    pub runnable_waiting_seconds: Family<WaitLabels, Counter<f64, AtomicU64>>,
    /// Cold-start stages, seconds after the runtime's create.
    pub cold_start_seconds: Family<StageLabels, Histogram>,
    pub lost_events: Counter,
    /// Inserts a full kernel map refused, node-wide, by `map` (end.map_full).
    pub map_full: Family<MapLabels, Counter>,
    pub watched: Gauge,
    /// NVML's utilisation of each GPU a container uses, 0-1, at the last tick.
    pub gpu_utilization: FGauge,
    /// Device memory in use on each GPU a container uses, at the last tick.
    pub gpu_memory_used: FGauge,
    /// The share of SMs busy on each GPU a container uses (GPM), 0-1.
    pub gpu_sm_active: FGauge,
    /// The GPUs each container's series are kept for (to remove them).
    gpus_of: Mutex<HashMap<ContainerLabels, Vec<usize>>>,
    /// The node's idle CPU time (`/proc/stat` idle + iowait), read at each scrape.
    pub node_idle_seconds: Counter<f64, AtomicU64>,
    pub node_cpus: Gauge,
    node_idle_read: Mutex<f64>,
    /// Ended containers and when their series go.
    retiring: Mutex<HashMap<ContainerLabels, Instant>>,
    /// Registered containers no scrape has seen yet, and their outputs
    /// kept back until one has ([`Metrics::observe`]).
    unscraped: Mutex<HashMap<ContainerLabels, Held>>,
    /// Each container's advice (advice.rs) and its predicted effect; the
    /// advice each has now, to remove its series when it changes.
    pub recommended: Family<AdviceLabels, Gauge<f64, AtomicU64>>,
    pub recommended_ratio: Family<KeyLabels, Gauge<f64, AtomicU64>>,
    advice_of: Mutex<HashMap<ContainerLabels, crate::daemon::exported_advice::Advice>>,
    /// The node's `metrics_detail`, and the containers whose annotation
    /// asked for another level.
    detail: MetricsDetail,
    detail_of: Mutex<HashMap<ContainerLabels, MetricsDetail>>,
}

/// Cold-start bounds: 5 ms … 30 s.
fn cold_start_histogram() -> Histogram {
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    ])
}

/// A metric registered under `name`.
fn reg<M: prometheus_client::registry::Metric + Default + Clone>(
    r: &mut Registry,
    name: &str,
    help: &str,
) -> M {
    let m = M::default();
    r.register(name, help, m.clone());
    m
}

impl Metrics {
    /// At the default detail (`basic`).
    #[cfg(test)]
    pub(crate) fn new() -> Metrics {
        Self::with_detail(MetricsDetail::Basic)
    }

    /// Registration order is the exposition order. A family whose series
    /// a level leaves out is still registered: it has no series, and costs
    /// Prometheus nothing.
    pub(crate) fn with_detail(detail: MetricsDetail) -> Metrics {
        let mut r = Registry::with_prefix("throttlewatch");
        let cold_start_seconds = Family::<StageLabels, Histogram>::new_with_constructor(
            cold_start_histogram as fn() -> Histogram,
        );
        Metrics {
            freeze_seconds: reg(&mut r, "freeze_duration_seconds", "Per-thread throttle freezes: switched out throttled until switched back in (le: powers of two of ns)"),
            runq_latency: reg(&mut r, "runq_latency_seconds", "Run-queue waits of watched threads, wakeup or preemption to switch-in, freezes excluded (le: the kernel's log2 slots)"),
            throttled_seconds: reg(&mut r, "throttled_seconds", "Throttled time seen by the probe ((cgroup, CPU) episodes, as cpu.stat counts)"),
            kernel_throttled_seconds: reg(&mut r, "kernel_throttled_seconds", "Throttled time by the kernel's cpu.stat throttled_time"),
            periods: reg(&mut r, "periods", "CFS bandwidth periods with runnable threads (cpu.stat nr_periods)"),
            throttled_periods: reg(&mut r, "throttled_periods", "Periods in which the group was throttled (cpu.stat nr_throttled)"),
            bursts: reg(&mut r, "bursts", "Periods in which burst was used (cpu.stat nr_bursts)"),
            burst_seconds: reg(&mut r, "burst_seconds", "Time spent over quota thanks to burst (cpu.stat burst_time)"),
            control_changes: reg(&mut r, "control_changes", "Bandwidth changes by the dynamic CPU controller (raise, lower, restore, adopt: the log's control records)"),
            wakeups: reg(&mut r, "wakeups", "Wake-ups of watched threads, by who woke them (by: same, other, host, interrupt; unlisted past the per-interval edges)"),
            wakeup_wait_seconds: reg(&mut r, "wakeup_wait_seconds", "Wake-up to switch-in time of watched threads, summed, by who woke them"),
            wakeup_frozen_seconds: reg(&mut r, "wakeup_frozen_seconds", "Time watched threads were frozen by the quota in the work a wake-up started, by who woke them"),
            runq_preemptions: reg(&mut r, "runq_preemptions", "Watched threads switched out runnable, by who preempted them (same, other, host)"),
            runnable_waiting_seconds: reg(&mut r, "runnable_waiting_seconds", "Time watched threads were runnable without running, summed over threads, by cause: frozen by the container's own quota (own_limit) or an ancestor's such as its pod's (ancestor_limit); waiting for a CPU held by its own threads, other containers or the host (run-queue waits split by who preempted; docs/report.md)"),
            cold_start_seconds: {
                r.register("cold_start_seconds", "Cold-start stages, seconds after the runtime's create, by namespace, class and stage", cold_start_seconds.clone());
                cold_start_seconds
            },
            lost_events: reg(&mut r, "lost_events", "Events the kernel could not deliver (ring buffer full), node-wide"),
            map_full: reg(&mut r, "map_full", "Inserts the probe's kernel maps refused because they were full, node-wide, by map (episodes, frozen_by_tid, bandwidth_timers): raise max_containers"),
            watched: reg(&mut r, "watched_containers", "Containers being watched"),
            gpu_utilization: reg(&mut r, "gpu_utilization_ratio", "Utilisation of a GPU the container uses (NVML: share of the last sample window a kernel ran), 0-1, by gpu index"),
            gpu_memory_used: reg(&mut r, "gpu_memory_used_bytes", "Device memory in use on a GPU the container uses (NVML), by gpu index"),
            gpu_sm_active: reg(&mut r, "gpu_sm_active_ratio", "Share of the SMs busy on a GPU the container uses since its previous reading (NVML GPM, Hopper and later; absent without), 0-1, by gpu index"),
            gpus_of: Mutex::new(HashMap::new()),
            recommended: reg(&mut r, "recommended", "The container's advice: its node report's first recommendation a fleet can apply (key: the setting, value: as the report writes it); the gauge is the value as a number (CPUs, seconds of burst) or 1"),
            recommended_ratio: reg(&mut r, "recommended_throttled_ratio", "The throttled time the report's replay predicts with the recommended setting, over the observed (0-1), by key"),
            advice_of: Mutex::new(HashMap::new()),
            unscraped: Mutex::new(HashMap::new()),
            node_idle_seconds: reg(&mut r, "node_idle_cpu_seconds", "Idle CPU time of the node (/proc/stat idle + iowait, all CPUs)"),
            node_cpus: reg(&mut r, "node_cpus", "CPUs online on the node"),
            node_idle_read: Mutex::new(0.0),
            retiring: Mutex::new(HashMap::new()),
            detail,
            detail_of: Mutex::new(HashMap::new()),
            registry: r,
        }
    }

    /// A container's own level (its `throttlewatch.io/metrics-detail`),
    /// kept until its series are forgotten.
    pub(crate) fn set_detail(&self, l: &ContainerLabels, d: MetricsDetail) {
        if let Ok(mut m) = self.detail_of.lock() {
            if d == self.detail {
                m.remove(l);
            } else {
                m.insert(l.clone(), d);
            }
        }
    }

    /// Whether a container gets the `full` series.
    fn full(&self, l: &ContainerLabels) -> bool {
        let d = self
            .detail_of
            .lock()
            .ok()
            .and_then(|m| m.get(l).copied())
            .unwrap_or(self.detail);
        d == MetricsDetail::Full
    }

    /// Remove a container's series now.
    pub(crate) fn forget(&self, l: &ContainerLabels) {
        let gpus = self.gpus_of.lock().ok().and_then(|mut g| g.remove(l));
        for gpu in gpus.unwrap_or_default() {
            let k = GpuLabels::new(l, gpu);
            self.gpu_utilization.remove(&k);
            self.gpu_memory_used.remove(&k);
            self.gpu_sm_active.remove(&k);
        }
        for f in [
            &self.throttled_seconds,
            &self.kernel_throttled_seconds,
            &self.periods,
            &self.throttled_periods,
            &self.bursts,
            &self.burst_seconds,
            &self.control_changes,
        ] {
            f.remove(l);
        }
        self.freeze_seconds.remove(l);
        self.runq_latency.remove(l);
        for by in PREEMPTORS {
            self.runq_preemptions.remove(&PreemptLabels::new(l, by));
        }
        for by in WAKERS {
            let k = PreemptLabels::new(l, by);
            self.wakeups.remove(&k);
            self.wakeup_wait_seconds.remove(&k);
            self.wakeup_frozen_seconds.remove(&k);
        }
        for cause in WAIT_CAUSES {
            self.runnable_waiting_seconds
                .remove(&WaitLabels::new(l, cause));
        }
        if let Ok(mut m) = self.detail_of.lock() {
            m.remove(l);
        }
        if let Ok(mut u) = self.unscraped.lock() {
            u.remove(l);
        }
        self.set_advice(l, None);
    }

    /// A container's advice now (None: none). Ignored for a container whose
    /// series are gone (a reading that finished after its grace period).
    pub(crate) fn set_advice(
        &self,
        l: &ContainerLabels,
        a: Option<&crate::daemon::exported_advice::Advice>,
    ) {
        let Ok(mut of) = self.advice_of.lock() else {
            return;
        };
        if of.get(l) == a {
            return;
        }
        if let Some(old) = of.remove(l) {
            self.recommended.remove(&AdviceLabels::new(l, &old));
            self.recommended_ratio.remove(&KeyLabels::new(l, &old.key));
        }
        let Some(a) = a else {
            return;
        };
        if self.periods.get(l).is_none() && self.runq_latency.get(l).is_none() {
            return;
        }
        self.recommended
            .get_or_create(&AdviceLabels::new(l, a))
            .set(a.number);
        if let Some(r) = a.throttled_ratio {
            self.recommended_ratio
                .get_or_create(&KeyLabels::new(l, &a.key))
                .set(r);
        }
        of.insert(l.clone(), a.clone());
    }

    /// A container ended: its series stay `grace` longer (so a scrape sees
    /// the last increments), then [`Metrics::sweep`] removes them.
    pub(crate) fn retire(&self, l: &ContainerLabels, grace: Duration, now: Instant) {
        if grace.is_zero() {
            self.forget(l);
            return;
        }
        if let Ok(mut r) = self.retiring.lock() {
            r.insert(l.clone(), now + grace);
        }
    }

    /// A container registered, or watched again (a restarted agent
    /// resuming it, which keeps its series). Its cpu.stat counters exist
    /// from here at 0, and its first scrape sees them so ([`Metrics::observe`]):
    /// the counters' growth over its life is all of it. The histograms are
    /// not made here: at 21 classic series each an idle container would
    /// cost 42 (their quantiles do not need the first observation counted).
    pub(crate) fn keep(&self, l: &ContainerLabels) {
        if let Ok(mut r) = self.retiring.lock() {
            r.remove(l);
        }
        if self.periods.get(l).is_none() {
            if let Ok(mut u) = self.unscraped.lock() {
                u.insert(l.clone(), Held::default());
            }
        }
        for f in [
            &self.kernel_throttled_seconds,
            &self.periods,
            &self.throttled_periods,
            &self.burst_seconds,
        ] {
            let _ = f.get_or_create(l);
        }
    }

    /// Remove the series whose grace period is over; returns how many containers.
    pub(crate) fn sweep(&self, now: Instant) -> usize {
        let due: Vec<ContainerLabels> = match self.retiring.lock() {
            Ok(mut r) => {
                let due: Vec<_> = r
                    .iter()
                    .filter(|(_, at)| **at <= now)
                    .map(|(l, _)| l.clone())
                    .collect();
                for l in &due {
                    r.remove(l);
                }
                due
            }
            Err(_) => vec![],
        };
        for l in &due {
            self.forget(l);
        }
        due.len()
    }

    /// Node-wide CPU figures, read when scraped.
    fn sample_node(&self) {
        let Some((idle, cpus)) = read_proc_stat() else {
            return;
        };
        self.node_cpus.set(cpus as i64);
        if let Ok(mut last) = self.node_idle_read.lock() {
            if idle > *last {
                self.node_idle_seconds.inc_by(idle - *last);
                *last = idle;
            }
        }
    }

    /// OpenMetrics text (what the agent served before protobuf, and what
    /// a scraper that asks for nothing in particular gets).
    pub(crate) fn encode(&self) -> String {
        self.sample_node();
        let mut s = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut s, &self.registry);
        self.scraped();
        s
    }

    /// Prometheus text format 0.0.4 (`text/plain`).
    pub(crate) fn encode_prometheus_text(&self) -> String {
        self.sample_node();
        let mut s = String::new();
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut s, &self.registry);
        self.scraped();
        s
    }

    /// Length-delimited `io.prometheus.client.MetricFamily` messages: the
    /// protobuf exposition, the one that carries native histograms.
    pub(crate) fn encode_protobuf(&self) -> Vec<u8> {
        self.sample_node();
        let b = prometheus_client::encoding::prometheus_protobuf::encode_to_vec(&self.registry)
            .unwrap_or_default();
        self.scraped();
        b
    }
}

/// `/proc/stat`: idle + iowait seconds over all CPUs, and the CPU count.
fn read_proc_stat() -> Option<(f64, usize)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    parse_proc_stat(&text, clock_ticks())
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

fn parse_proc_stat(text: &str, ticks: f64) -> Option<(f64, usize)> {
    let mut lines = text.lines();
    let all: Vec<f64> = lines
        .next()?
        .strip_prefix("cpu ")?
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    let idle = all.get(3)? + all.get(4).copied().unwrap_or(0.0);
    let cpus = lines
        .take_while(|l| l.starts_with("cpu"))
        .filter(|l| l[3..].starts_with(|c: char| c.is_ascii_digit()))
        .count();
    Some((idle / ticks, cpus))
}

#[path = "metrics_feed.rs"]
mod feed;
#[path = "metrics_held.rs"]
mod held;
use held::Held;
#[cfg(test)]
pub(crate) use held::HELD_AT_MOST;

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "metrics_budget_tests.rs"]
mod budget_tests;
