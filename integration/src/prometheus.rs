//! A private Prometheus for the tests (Debian's `prometheus` 2.42) and the
//! shipped dashboard and rules read as the tests read them: the dashboard's
//! targets with Grafana's variables set, its `label_values` variables, and
//! the rule count promtool reports.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::daemons::stop_child;
use crate::Scratch;

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// configs/grafana/throttlewatch.json, parsed.
pub fn dashboard() -> Value {
    let p = repo().join("configs/grafana/throttlewatch.json");
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

pub const RULES: &str = "configs/prometheus/throttlewatch-rules.yml";
pub const RULES_TEST: &str = "configs/prometheus/rules_test.yml";

/// A free loopback port (bound, read, released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `%`-encoding of a query-string value.
pub fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// GET over HTTP/1.0 (no chunked answer); the body.
pub fn http_get(port: u16, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split_once("\r\n\r\n")
        .map(|x| x.1.to_string())
        .unwrap_or_default()
}

/// A private Prometheus on a free port: temp config and storage, scrape and
/// rule evaluation every second. Killed (by its PID) on drop.
pub struct Prometheus {
    child: Child,
    port: u16,
    _dir: Scratch,
}

/// How the private Prometheus stores histograms: as classic `_bucket`
/// series (Prometheus 2.x's default), or native histograms
/// (`--enable-feature=native-histograms`: it then asks for the protobuf
/// exposition in its `Accept` header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Histograms {
    Classic,
    Native,
}

impl Prometheus {
    pub fn start(agent_port: u16, rule_files: &[PathBuf]) -> Prometheus {
        Self::start_with(agent_port, rule_files, Histograms::Classic)
    }

    pub fn start_with(agent_port: u16, rule_files: &[PathBuf], mode: Histograms) -> Prometheus {
        Self::start_nodes(&[(agent_port, "")], rule_files, mode)
    }

    /// Scraping several agents, each target labelled `node` as the
    /// PodMonitor's relabelling does (`__meta_kubernetes_pod_node_name`;
    /// "" leaves the label out), with `honor_labels` as documented.
    pub fn start_nodes(
        agents: &[(u16, &str)],
        rule_files: &[PathBuf],
        mode: Histograms,
    ) -> Prometheus {
        let dir = Scratch::new("prom");
        let port = free_port();
        let rules: String = rule_files
            .iter()
            .map(|p| format!("  - {:?}\n", p.display().to_string()))
            .collect();
        let targets: String = agents
            .iter()
            .map(|(p, node)| {
                let labels = if node.is_empty() {
                    String::new()
                } else {
                    format!("        labels: {{node: {node:?}}}\n")
                };
                format!("      - targets: ['127.0.0.1:{p}']\n{labels}")
            })
            .collect();
        let config = dir.0.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 rule_files:\n{rules}\
                 scrape_configs:\n  - job_name: throttlewatch\n    honor_labels: true\n    static_configs:\n{targets}"
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.0.join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.0.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .args((mode == Histograms::Native).then_some("--enable-feature=native-histograms"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("prometheus (Debian package prometheus; scripts/setup.sh --test)");
        let mut p = Prometheus {
            child,
            port,
            _dir: dir,
        };
        let t = Instant::now();
        while !std::net::TcpStream::connect(("127.0.0.1", port))
            .is_ok_and(|_| http_get(port, "/-/ready").contains("Ready"))
        {
            if let Ok(Some(st)) = p.child.try_wait() {
                panic!("prometheus exited ({st}): {}", p.log());
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "prometheus not ready: {}",
                p.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        p
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.0.join("prometheus.log")).unwrap_or_default()
    }

    /// An API call's `data` (status must be success).
    pub fn api(&self, path: &str) -> Value {
        let body = http_get(self.port, path);
        let v: Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"));
        assert_eq!(v["status"], "success", "{path}: {v}");
        v["data"].clone()
    }

    /// The server's own figure `name` (e.g. `prometheus_tsdb_head_series`)
    /// from its /metrics.
    pub fn own_metric(&self, name: &str) -> f64 {
        let body = http_get(self.port, "/metrics");
        body.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in Prometheus' /metrics"))
    }

    /// `http://127.0.0.1:PORT`, the API's root.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The server's process id (for its RSS).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// An instant query's result vector.
    pub fn query(&self, q: &str) -> Vec<Value> {
        let d = self.api(&format!("/api/v1/query?query={}", enc(q)));
        d["result"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        stop_child(&mut self.child, Duration::from_secs(10));
    }
}

/// Every target of every panel (rows' nested panels too): (panel, target).
pub fn targets(d: &Value) -> Vec<(&Value, &Value)> {
    let mut out = vec![];
    let mut panels: Vec<&Value> = d["panels"].as_array().unwrap().iter().collect();
    while let Some(p) = panels.pop() {
        panels.extend(p["panels"].as_array().into_iter().flatten());
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push((p, t));
        }
    }
    out
}

/// A dashboard expression with Grafana's variables as this test sets them.
pub fn expand(expr: &str, ns: &str) -> String {
    expr.replace("$namespace", ns)
        .replace("$pod", ".*")
        .replace("$container", ".*")
        .replace("$__rate_interval", "5s")
        .replace("$__range", "2m")
}

/// `label_values(SELECTOR, LABEL)` of a query variable.
pub fn label_values(q: &str) -> (String, String) {
    let inner = q
        .strip_prefix("label_values(")
        .and_then(|s| s.strip_suffix(')'))
        .unwrap_or_else(|| panic!("variable query {q:?}: expected label_values(selector, label)"));
    let (sel, label) = inner.rsplit_once(',').unwrap();
    (sel.trim().to_string(), label.trim().to_string())
}

/// A sample's value; a native histogram's (`"histogram"`) is its count.
pub fn num(v: &Value) -> f64 {
    if let Some(h) = v.get("histogram") {
        return h[1]["count"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no count: {v}"));
    }
    v["value"][1]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no value: {v}"))
}

/// A native-histogram sample's buckets: (lower, upper, count), as the
/// HTTP API gives them (`[boundary rule, lower, upper, count]`).
pub fn native_buckets(v: &Value) -> Vec<(f64, f64, f64)> {
    let f = |x: &Value| x.as_str().and_then(|s| s.parse::<f64>().ok()).unwrap();
    v["histogram"][1]["buckets"]
        .as_array()
        .map(|b| b.iter().map(|b| (f(&b[1]), f(&b[2]), f(&b[3]))).collect())
        .unwrap_or_default()
}

/// The sample of `result` whose `label` is `value`.
pub fn sample<'a>(result: &'a [Value], label: &str, value: &str) -> Option<&'a Value> {
    result.iter().find(|r| r["metric"][label] == value)
}

/// Rules in a rules file, as promtool counts them.
pub fn count_rules(file: &Path) -> usize {
    let o = Command::new("promtool")
        .args(["check", "rules"])
        .arg(file)
        .output()
        .expect("promtool (Debian package prometheus)");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "promtool check rules: {out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out.split_whitespace()
        .collect::<Vec<_>>()
        .windows(3)
        .find(|w| w[0] == "SUCCESS:" && w[2] == "rules")
        .and_then(|w| w[1].parse().ok())
        .unwrap_or_else(|| panic!("promtool check rules said {out}"))
}

/// Every target's data over the run (range queries at 1 s steps; instant
/// targets as queried), keyed `title/refId`, for scripts/render-dashboard.py.
pub fn dump_panels(prom: &Prometheus, d: &Value, ns: &str, began: f64, path: &Path) {
    let end = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let mut out = serde_json::Map::new();
    for (p, t) in targets(d) {
        let q = expand(t["expr"].as_str().unwrap(), ns);
        let data = if t["instant"] == true {
            prom.api(&format!("/api/v1/query?query={}", enc(&q)))
        } else {
            prom.api(&format!(
                "/api/v1/query_range?query={}&start={began:.3}&end={end:.3}&step=1",
                enc(&q)
            ))
        };
        let key = format!(
            "{}/{}",
            p["title"].as_str().unwrap(),
            t["refId"].as_str().unwrap()
        );
        out.insert(key, data);
    }
    std::fs::write(path, serde_json::to_string(&out).unwrap()).unwrap();
}
