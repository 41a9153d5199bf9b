//! Prometheus metrics (prometheus-client), labelled per container with the
//! Kubernetes names where the OCI annotations carry them.

use std::collections::BTreeMap;
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContainerLabels {
    pub container_id: LabelValue,
    pub container_name: LabelValue,
    pub namespace: LabelValue,
    pub pod: LabelValue,
    pub container: LabelValue,
}

/// A label value that a container chose (its id, names, annotations),
/// escaped as the exposition formats require: prometheus-client 0.22 writes
/// `String` values raw, so a pod named `x"} 1\nforged{a="b` would add a
/// series. `\` → `\\`, `"` → `\"`, line feed → `\n` (text format 0.0.4
/// and OpenMetrics alike); other characters pass as they are (the agent
/// decodes requests lossily, so the value is valid UTF-8).
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct LabelValue(pub String);

impl LabelValue {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for LabelValue {
    fn from(s: &str) -> Self {
        LabelValue(s.into())
    }
}

impl prometheus_client::encoding::EncodeLabelValue for LabelValue {
    fn encode(
        &self,
        encoder: &mut prometheus_client::encoding::LabelValueEncoder,
    ) -> Result<(), std::fmt::Error> {
        use std::fmt::Write;
        let s = self.0.as_str();
        let mut from = 0;
        for (i, c) in s.char_indices() {
            let esc = match c {
                '\\' => "\\\\",
                '"' => "\\\"",
                '\n' => "\\n",
                _ => continue,
            };
            encoder.write_str(&s[from..i])?;
            encoder.write_str(esc)?;
            from = i + 1;
        }
        encoder.write_str(&s[from..])
    }
}

/// Annotation keys that name the Kubernetes objects (kubelet/dockershim and CRI containerd).
const NAMESPACE_KEYS: [&str; 2] = [
    "io.kubernetes.pod.namespace",
    "io.kubernetes.cri.sandbox-namespace",
];
const POD_KEYS: [&str; 2] = ["io.kubernetes.pod.name", "io.kubernetes.cri.sandbox-name"];
const CONTAINER_KEYS: [&str; 2] = [
    "io.kubernetes.container.name",
    "io.kubernetes.cri.container-name",
];

impl ContainerLabels {
    pub fn new(id: &str, name: &str, annotations: &BTreeMap<String, String>) -> ContainerLabels {
        let pick = |keys: &[&str]| {
            LabelValue(
                keys.iter()
                    .find_map(|k| annotations.get(*k))
                    .cloned()
                    .unwrap_or_default(),
            )
        };
        ContainerLabels {
            container_id: id.into(),
            container_name: name.into(),
            namespace: pick(&NAMESPACE_KEYS),
            pod: pick(&POD_KEYS),
            container: pick(&CONTAINER_KEYS),
        }
    }

    /// The label subset written into the log's `start` record.
    pub fn as_map(&self) -> BTreeMap<String, String> {
        [
            ("k8s_namespace", &self.namespace),
            ("k8s_pod", &self.pod),
            ("k8s_container", &self.container),
        ]
        .into_iter()
        .filter(|(_, v)| !v.0.is_empty())
        .map(|(k, v)| (k.to_string(), v.0.clone()))
        .collect()
    }
}

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

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("throttlewatch");
        let freeze_seconds = Family::<ContainerLabels, Histogram>::new_with_constructor(
            freeze_histogram as fn() -> Histogram,
        );
        let m = Metrics {
            freeze_seconds: freeze_seconds.clone(),
            throttled_seconds: FCounter::default(),
            kernel_throttled_seconds: FCounter::default(),
            periods: FCounter::default(),
            throttled_periods: FCounter::default(),
            bursts: FCounter::default(),
            burst_seconds: FCounter::default(),
            lost_events: Counter::default(),
            watched: Gauge::default(),
            runq_waits: FCounter::default(),
            runq_wait_seconds: FCounter::default(),
            runq_p50_seconds: FGauge::default(),
            runq_p99_seconds: FGauge::default(),
            runq_max_seconds: FGauge::default(),
            runq_preemptions: Family::default(),
            cold_start_seconds: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "freeze_duration_seconds",
            "Per-thread throttle freezes (switched out throttled until switched back in)",
            freeze_seconds,
        );
        registry.register(
            "throttled_seconds",
            "Throttled time seen by the probe ((cgroup, CPU) episodes)",
            m.throttled_seconds.clone(),
        );
        registry.register(
            "kernel_throttled_seconds",
            "Throttled time by the kernel's cpu.stat",
            m.kernel_throttled_seconds.clone(),
        );
        registry.register(
            "periods",
            "CFS bandwidth periods (cpu.stat nr_periods)",
            m.periods.clone(),
        );
        registry.register(
            "throttled_periods",
            "Periods in which the group was throttled (cpu.stat nr_throttled)",
            m.throttled_periods.clone(),
        );
        registry.register(
            "bursts",
            "Periods in which burst was used (cpu.stat nr_bursts)",
            m.bursts.clone(),
        );
        registry.register(
            "burst_seconds",
            "Time spent over quota thanks to burst",
            m.burst_seconds.clone(),
        );
        registry.register(
            "lost_events",
            "Events the kernel could not deliver (ring buffer full), node-wide",
            m.lost_events.clone(),
        );
        registry.register(
            "watched_containers",
            "Containers being watched",
            m.watched.clone(),
        );
        registry.register("runq_waits", "Run-queue waits of watched threads (wakeup or preemption to switch-in; freezes excluded)", m.runq_waits.clone());
        registry.register(
            "runq_wait_seconds",
            "Time watched threads waited in the run queue (freezes excluded)",
            m.runq_wait_seconds.clone(),
        );
        registry.register(
            "runq_latency_p50_seconds",
            "Run-queue latency p50 over the last snapshot interval",
            m.runq_p50_seconds.clone(),
        );
        registry.register(
            "runq_latency_p99_seconds",
            "Run-queue latency p99 over the last snapshot interval",
            m.runq_p99_seconds.clone(),
        );
        registry.register(
            "runq_latency_max_seconds",
            "Longest run-queue wait over the last snapshot interval",
            m.runq_max_seconds.clone(),
        );
        registry.register(
            "runq_preemptions",
            "Watched threads switched out runnable, by kind of preemptor (same, other, host)",
            m.runq_preemptions.clone(),
        );
        registry.register(
            "cold_start_seconds",
            "Cold-start stages, seconds after the runtime's create, by stage",
            m.cold_start_seconds.clone(),
        );
        Metrics { registry, ..m }
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
        for k in crate::coldstart::STAGES {
            self.cold_start_seconds.remove(&KindLabels::new(l, k));
        }
    }

    /// Export one interval's `runq` record.
    pub fn observe_runq(&self, l: &ContainerLabels, r: &throttlewatch_core::logfmt::Runq) {
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
    pub fn observe_cold_start(
        &self,
        l: &ContainerLabels,
        c: &throttlewatch_core::logfmt::ColdStart,
    ) {
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
