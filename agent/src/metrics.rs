//! Prometheus metrics (prometheus-client), labelled per container with the
//! Kubernetes names where the OCI annotations carry them.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

pub use crate::labels::{ContainerLabels, LabelValue};
use crate::output::Output;

/// A container and one of a few fixed kinds (`by` of a preemption, `stage` of a cold start).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: LabelValue,
    #[prometheus(flatten)]
    pub container: ContainerLabels,
}

impl KindLabels {
    pub fn new(container: &ContainerLabels, kind: &str) -> KindLabels {
        KindLabels {
            container: container.clone(),
            kind: kind.into(),
        }
    }
}

type FCounter = Family<ContainerLabels, Counter<f64, AtomicU64>>;
type FGauge = Family<ContainerLabels, Gauge<f64, AtomicU64>>;

pub struct Metrics {
    pub registry: Registry,
    pub freeze_seconds: Family<ContainerLabels, Histogram>,
    pub throttled_seconds: FCounter,
    pub kernel_throttled_seconds: FCounter,
    pub periods: FCounter,
    pub throttled_periods: FCounter,
    pub bursts: FCounter,
    pub burst_seconds: FCounter,
    pub lost_events: Counter,
    pub watched: Gauge,
    /// Run-queue latency: waits, their sum, and p50/p99/max of the last interval.
    pub runq_waits: FCounter,
    pub runq_wait_seconds: FCounter,
    pub runq_p50_seconds: FGauge,
    pub runq_p99_seconds: FGauge,
    pub runq_max_seconds: FGauge,
    /// Preemptions of watched threads, by `kind`: same, other (container), host.
    pub runq_preemptions: Family<KindLabels, Counter<f64, AtomicU64>>,
    /// Cold-start stages, seconds after the runtime's create, by `kind` (stage).
    pub cold_start_seconds: Family<KindLabels, Gauge<f64, AtomicU64>>,
}

fn freeze_histogram() -> Histogram {
    Histogram::new(
        [
            0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
        ]
        .into_iter(),
    )
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
    /// Registration order is the exposition order.
    pub fn new() -> Metrics {
        let mut r = Registry::with_prefix("throttlewatch");
        let freeze_seconds = Family::<ContainerLabels, Histogram>::new_with_constructor(
            freeze_histogram as fn() -> Histogram,
        );
        r.register(
            "freeze_duration_seconds",
            "Per-thread throttle freezes (switched out throttled until switched back in)",
            freeze_seconds.clone(),
        );
        Metrics {
            freeze_seconds,
            throttled_seconds: reg(&mut r, "throttled_seconds", "Throttled time seen by the probe ((cgroup, CPU) episodes)"),
            kernel_throttled_seconds: reg(&mut r, "kernel_throttled_seconds", "Throttled time by the kernel's cpu.stat"),
            periods: reg(&mut r, "periods", "CFS bandwidth periods (cpu.stat nr_periods)"),
            throttled_periods: reg(&mut r, "throttled_periods", "Periods in which the group was throttled (cpu.stat nr_throttled)"),
            bursts: reg(&mut r, "bursts", "Periods in which burst was used (cpu.stat nr_bursts)"),
            burst_seconds: reg(&mut r, "burst_seconds", "Time spent over quota thanks to burst"),
            lost_events: reg(&mut r, "lost_events", "Events the kernel could not deliver (ring buffer full), node-wide"),
            watched: reg(&mut r, "watched_containers", "Containers being watched"),
            runq_waits: reg(&mut r, "runq_waits", "Run-queue waits of watched threads (wakeup or preemption to switch-in; freezes excluded)"),
            runq_wait_seconds: reg(&mut r, "runq_wait_seconds", "Time watched threads waited in the run queue (freezes excluded)"),
            runq_p50_seconds: reg(&mut r, "runq_latency_p50_seconds", "Run-queue latency p50 over the last snapshot interval"),
            runq_p99_seconds: reg(&mut r, "runq_latency_p99_seconds", "Run-queue latency p99 over the last snapshot interval"),
            runq_max_seconds: reg(&mut r, "runq_latency_max_seconds", "Longest run-queue wait over the last snapshot interval"),
            runq_preemptions: reg(&mut r, "runq_preemptions", "Watched threads switched out runnable, by kind of preemptor (same, other, host)"),
            cold_start_seconds: reg(&mut r, "cold_start_seconds", "Cold-start stages, seconds after the runtime's create, by stage"),
            registry: r,
        }
    }

    /// The one way metrics are fed: what the engine's poll returned.
    pub fn observe(&self, o: &Output) {
        match o {
            Output::Freeze {
                container,
                frozen_ns,
                ..
            } => self
                .freeze_seconds
                .get_or_create(container)
                .observe(*frozen_ns as f64 / 1e9),
            Output::ColdStart { container, record } => self.observe_cold_start(container, record),
            Output::Runq { container, record } => self.observe_runq(container, record),
            Output::Counters {
                container,
                kernel,
                probe_throttled_ns,
            } => self.observe_counters(container, kernel, *probe_throttled_ns),
            Output::LostEvents { count } => {
                self.lost_events.inc_by(*count);
            }
        }
    }

    fn observe_counters(
        &self,
        l: &ContainerLabels,
        d: &throttlewatch_cgroup::CpuStat,
        probe_ns: u64,
    ) {
        let secs = |ns: u64| ns as f64 / 1e9;
        self.kernel_throttled_seconds
            .get_or_create(l)
            .inc_by(secs(d.throttled_ns));
        self.periods.get_or_create(l).inc_by(d.nr_periods as f64);
        self.throttled_periods
            .get_or_create(l)
            .inc_by(d.nr_throttled as f64);
        self.bursts.get_or_create(l).inc_by(d.nr_bursts as f64);
        self.burst_seconds.get_or_create(l).inc_by(secs(d.burst_ns));
        self.throttled_seconds
            .get_or_create(l)
            .inc_by(secs(probe_ns));
    }

    pub fn forget(&self, l: &ContainerLabels) {
        for f in [
            &self.throttled_seconds,
            &self.kernel_throttled_seconds,
            &self.periods,
            &self.throttled_periods,
            &self.bursts,
            &self.burst_seconds,
        ] {
            f.remove(l);
        }
        self.freeze_seconds.remove(l);
        for f in [&self.runq_waits, &self.runq_wait_seconds] {
            f.remove(l);
        }
        for f in [
            &self.runq_p50_seconds,
            &self.runq_p99_seconds,
            &self.runq_max_seconds,
        ] {
            f.remove(l);
        }
        for k in ["same", "other", "host"] {
            self.runq_preemptions.remove(&KindLabels::new(l, k));
        }
        for k in crate::coldstart::Stage::ALL {
            self.cold_start_seconds
                .remove(&KindLabels::new(l, k.name()));
        }
    }

    /// Export one interval's `runq` record.
    fn observe_runq(&self, l: &ContainerLabels, r: &throttlewatch_core::logfmt::Runq) {
        self.runq_waits.get_or_create(l).inc_by(r.count as f64);
        self.runq_wait_seconds
            .get_or_create(l)
            .inc_by(r.total_ns as f64 / 1e9);
        self.runq_p50_seconds
            .get_or_create(l)
            .set(r.p50_ns.unwrap_or(0) as f64 / 1e9);
        self.runq_p99_seconds
            .get_or_create(l)
            .set(r.p99_ns.unwrap_or(0) as f64 / 1e9);
        self.runq_max_seconds
            .get_or_create(l)
            .set(r.max_ns as f64 / 1e9);
        for (k, n) in [
            ("same", r.preempted_by_same),
            ("other", r.preempted_by_other),
            ("host", r.preempted_by_host),
        ] {
            self.runq_preemptions
                .get_or_create(&KindLabels::new(l, k))
                .inc_by(n as f64);
        }
    }

    /// Export a `cold_start` record.
    fn observe_cold_start(&self, l: &ContainerLabels, c: &throttlewatch_core::logfmt::ColdStart) {
        for s in &c.stages {
            if let Some(d) = s.since_create_ns {
                self.cold_start_seconds
                    .get_or_create(&KindLabels::new(l, &s.stage))
                    .set(d as f64 / 1e9);
            }
        }
    }

    pub fn encode(&self) -> String {
        let mut s = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut s, &self.registry);
        s
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// The most of a request the metrics server reads (line and headers).
pub const MAX_REQUEST_BYTES: u64 = 8 * 1024;

/// Serve GET /metrics on `addr` in a background thread.
pub fn serve(addr: &str, metrics: Arc<Mutex<Metrics>>) -> std::io::Result<std::net::SocketAddr> {
    let l = TcpListener::bind(addr)?;
    let local = l.local_addr()?;
    std::thread::Builder::new().name("metrics".into()).spawn(move || {
        for conn in l.incoming() {
            let Some(conn) = crate::daemon::accepted(conn, "metrics") else {
                continue;
            };
            let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(2)));
            // A client that never reads its answer cannot hold the server.
            let _ = conn.set_write_timeout(Some(std::time::Duration::from_secs(2)));
            // The request line and headers together: at most MAX_REQUEST_BYTES.
            let mut r = BufReader::new(std::io::Read::take(&conn, MAX_REQUEST_BYTES));
            let mut first = String::new();
            if r.read_line(&mut first).is_err() {
                continue;
            }
            loop {
                let mut h = String::new();
                if r.read_line(&mut h).map(|n| n == 0).unwrap_or(true) || h == "\r\n" || h == "\n" {
                    break;
                }
            }
            let (status, ctype, body) = if first.starts_with("GET /metrics") {
                let body = metrics.lock().map(|m| m.encode()).unwrap_or_default();
                ("200 OK", "application/openmetrics-text; version=1.0.0; charset=utf-8", body)
            } else {
                ("404 Not Found", "text/plain", "try /metrics\n".to_string())
            };
            let mut w = &conn;
            let _ = write!(w, "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
        }
    })?;
    Ok(local)
}
