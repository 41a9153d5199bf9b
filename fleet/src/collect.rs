//! What Prometheus holds of each replica (namespace, pod, container) over
//! the window, read with bounded queries: one namespace at a time, and the
//! window cut into chunks of at most a day (`window::chunks`), so that no
//! query touches more than a day of one namespace's series; increases of
//! adjacent chunks add up. A 5,000-node Prometheus thus answers many small
//! queries instead of one that reads a week of every series.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use serde_json::Value;

use crate::hist::Hist;
use crate::owner::{KsmOwners, Owner};
use crate::prom::{label, value, Client, PromError};
use crate::window;

/// Each workload's throttled CPU-seconds per second over the window: (t, v).
pub type Timeline = Vec<(f64, f64)>;

/// One replica's figures over the window.
#[derive(Debug, Clone, Default)]
pub struct Replica {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    /// The `node` label (the PodMonitor's relabelling), else `instance`.
    pub node: String,
    pub throttled_s: f64,
    pub periods: f64,
    pub throttled_periods: f64,
    /// `runnable_waiting_seconds` by cause.
    pub waiting: BTreeMap<String, f64>,
    pub freezes: Hist,
    /// The agent's advice for it, the latest in the window.
    pub advice: Option<ReplicaAdvice>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaAdvice {
    pub key: String,
    pub value: String,
    pub number: f64,
    pub throttled_ratio: Option<f64>,
}

pub type Key = (String, String, String);

/// The queries' scope: namespaces (empty: every one that has series),
/// extra label matchers, the window's end and length.
pub struct Scope {
    pub namespaces: Vec<String>,
    pub matchers: Vec<String>,
    pub end: f64,
    pub window: Duration,
    pub chunk: Duration,
}

impl Scope {
    fn selector(&self, ns: &str, extra: &str) -> String {
        let mut m = vec![format!("namespace=\"{}\"", escape(ns))];
        m.extend(self.matchers.iter().cloned());
        if !extra.is_empty() {
            m.push(extra.to_string());
        }
        format!("{{{}}}", m.join(", "))
    }
}

/// A label value inside a PromQL string literal.
pub fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

const BY: &str = "namespace, pod, container, node, instance";

fn key_of(s: &Value) -> Key {
    (
        label(s, "namespace").to_string(),
        label(s, "pod").to_string(),
        label(s, "container").to_string(),
    )
}

/// Every query this module sends goes through here (the progress line).
pub struct Reader<'a> {
    pub client: &'a Client,
    pub progress: &'a mut dyn FnMut(),
}

impl Reader<'_> {
    fn q(&mut self, q: &str, at: f64) -> Result<Vec<Value>, PromError> {
        (self.progress)();
        self.client.query(q, at)
    }

    /// The namespaces with throttlewatch series in the window.
    pub fn namespaces(&mut self, s: &Scope) -> Result<Vec<String>, PromError> {
        if !s.namespaces.is_empty() {
            return Ok(s.namespaces.clone());
        }
        let mut out = BTreeSet::new();
        let m = if s.matchers.is_empty() {
            String::new()
        } else {
            format!("{{{}}}", s.matchers.join(", "))
        };
        for (at, len) in window::chunks(s.end, s.window, s.chunk) {
            let q = format!(
                "count by (namespace) (count_over_time(throttlewatch_periods_total{m}[{}]))",
                window::promql(len)
            );
            for r in self.q(&q, at)? {
                out.insert(label(&r, "namespace").to_string());
            }
        }
        Ok(out.into_iter().collect())
    }

    /// The number of queries [`Reader::replicas`] sends for one namespace.
    pub fn queries_per_namespace(s: &Scope) -> usize {
        window::chunks(s.end, s.window, s.chunk).len() * 10 + 3
    }

    /// Every replica of one namespace.
    pub fn replicas(&mut self, s: &Scope, ns: &str) -> Result<HashMap<Key, Replica>, PromError> {
        let mut out: HashMap<Key, Replica> = HashMap::new();
        let sel = |extra: &str| s.selector(ns, extra);
        for (at, len) in window::chunks(s.end, s.window, s.chunk) {
            let r = window::promql(len);
            let inc = |metric: &str| grown(metric, &sel(""), &r, BY);
            for (metric, field) in [
                ("throttlewatch_kernel_throttled_seconds_total", 0),
                ("throttlewatch_periods_total", 1),
                ("throttlewatch_throttled_periods_total", 2),
            ] {
                for v in self.q(&inc(metric), at)? {
                    let e = entry(&mut out, &v);
                    let x = value(&v);
                    match field {
                        0 => e.throttled_s += x,
                        1 => e.periods += x,
                        _ => e.throttled_periods += x,
                    }
                }
            }
            let q = grown(
                "throttlewatch_runnable_waiting_seconds_total",
                &sel(""),
                &r,
                &format!("{BY}, cause"),
            );
            for v in self.q(&q, at)? {
                let cause = label(&v, "cause").to_string();
                *entry(&mut out, &v).waiting.entry(cause).or_default() += value(&v);
            }
            // The freeze histogram, classic or native, whichever is stored.
            let q = format!(
                "sum by (namespace, pod, container, le) (increase(throttlewatch_freeze_duration_seconds_bucket{}[{r}]))",
                sel("")
            );
            for v in self.q(&q, at)? {
                if let Some(e) = out.get_mut(&key_of(&v)) {
                    e.freezes.add_classic(label(&v, "le"), value(&v));
                }
            }
            let q = format!(
                "sum by (namespace, pod, container) (increase(throttlewatch_freeze_duration_seconds{}[{r}]))",
                sel("")
            );
            for v in self.q(&q, at)? {
                if let Some(e) = out.get_mut(&key_of(&v)) {
                    e.freezes.add_native(&v);
                }
            }
            self.advice(&mut out, &sel(""), len, at)?;
        }
        Ok(out)
    }

    /// The latest advice of each replica that has none yet (chunks come
    /// newest first).
    fn advice(
        &mut self,
        out: &mut HashMap<Key, Replica>,
        sel: &str,
        len: Duration,
        at: f64,
    ) -> Result<(), PromError> {
        let r = window::promql(len);
        // When a container's advice changed, the old series went stale and
        // a new one began: the one seen last is the advice. A subquery at a
        // step of at most 1,440 points per series in a chunk tells when.
        let step = window::promql(Duration::from_secs((len.as_secs() / 1440).max(1)));
        let when = |m: &str| format!("last_over_time(timestamp({m}{sel})[{r}:{step}])");
        let rec = self.q(
            &format!("last_over_time(throttlewatch_recommended{sel}[{r}])"),
            at,
        )?;
        let rec_at = self.q(&when("throttlewatch_recommended"), at)?;
        let ratio = self.q(
            &format!("last_over_time(throttlewatch_recommended_throttled_ratio{sel}[{r}])"),
            at,
        )?;
        let ratio_at = self.q(&when("throttlewatch_recommended_throttled_ratio"), at)?;
        let same = |a: &Value, b: &Value, labels: &[&str]| {
            key_of(a) == key_of(b) && labels.iter().all(|l| label(a, l) == label(b, l))
        };
        let seen = |of: &[Value], v: &Value, labels: &[&str]| {
            of.iter().find(|t| same(t, v, labels)).map_or(0.0, value)
        };
        let mut latest: HashMap<Key, (f64, &Value)> = HashMap::new();
        for v in &rec {
            let t = seen(&rec_at, v, &["key", "value"]);
            let e = latest.entry(key_of(v)).or_insert((t, v));
            if t > e.0 {
                *e = (t, v);
            }
        }
        for (k, (_, v)) in latest {
            let Some(e) = out.get_mut(&k).filter(|e| e.advice.is_none()) else {
                continue;
            };
            let key = label(v, "key").to_string();
            let throttled_ratio = ratio
                .iter()
                .filter(|x| key_of(x) == k && label(x, "key") == key)
                .max_by(|a, b| {
                    seen(&ratio_at, a, &["key"]).total_cmp(&seen(&ratio_at, b, &["key"]))
                })
                .map(value);
            e.advice = Some(ReplicaAdvice {
                value: label(v, "value").to_string(),
                number: value(v),
                key,
                throttled_ratio,
            });
        }
        Ok(())
    }

    /// kube-state-metrics' owners of one namespace's pods, when Prometheus has them.
    pub fn owners(&mut self, s: &Scope, ns: &str, into: &mut KsmOwners) -> Result<(), PromError> {
        let r = window::promql(s.window.min(s.chunk));
        let n = format!("{{namespace=\"{}\"}}", escape(ns));
        for v in self.q(
            &format!("max by (namespace, pod, owner_kind, owner_name) (max_over_time(kube_pod_owner{n}[{r}]))"),
            s.end,
        )? {
            into.pods.insert(
                (ns.to_string(), label(&v, "pod").to_string()),
                Owner {
                    kind: label(&v, "owner_kind").to_string(),
                    name: label(&v, "owner_name").to_string(),
                },
            );
        }
        for (metric, set_label, kind) in [
            ("kube_replicaset_owner", "replicaset", "ReplicaSet"),
            ("kube_job_owner", "job_name", "Job"),
        ] {
            for v in self.q(
                &format!("max by (namespace, {set_label}, owner_kind, owner_name) (max_over_time({metric}{n}[{r}]))"),
                s.end,
            )? {
                into.sets.insert(
                    (ns.to_string(), kind.to_string(), label(&v, set_label).to_string()),
                    Owner {
                        kind: label(&v, "owner_kind").to_string(),
                        name: label(&v, "owner_name").to_string(),
                    },
                );
            }
        }
        Ok(())
    }

    /// Throttled seconds per second of each replica over the window, for
    /// the HTML page's lines: (key, [(t, value)]).
    pub fn timeline(&mut self, s: &Scope, ns: &str) -> Result<Vec<(Key, Timeline)>, PromError> {
        let w = s.window.as_secs_f64();
        let step = (w / 120.0).max(1.0);
        let range = window::promql(Duration::from_secs_f64((step * 2.0).max(5.0)));
        let q = format!(
            "sum by (namespace, pod, container) (rate(throttlewatch_kernel_throttled_seconds_total{}[{range}]))",
            s.selector(ns, "")
        );
        (self.progress)();
        let m = self.client.query_range(&q, s.end - w, s.end, step)?;
        Ok(m.iter()
            .map(|v| {
                let pts = v["values"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|p| Some((p[0].as_f64()?, p[1].as_str()?.parse().ok()?)))
                    .collect();
                (key_of(v), pts)
            })
            .collect())
    }
}

/// How much a counter grew over `[r]`, summed `by`: the last sample less
/// the first for a series that did not reset, `increase()` for one that
/// did (an agent's restart). Not `increase()` throughout: its
/// extrapolation to the window's edges adds up to a scrape interval's worth
/// at each, 5 % of a short container's throttled time in the fleet test;
/// a container's first sample is 0 (the agent holds a new container's
/// values back until a scrape has seen it, docs/metrics.md), so last − first
/// is all of it.
fn grown(metric: &str, sel: &str, r: &str, by: &str) -> String {
    format!(
        "sum by ({by}) ((max_over_time({metric}{sel}[{r}]) - min_over_time({metric}{sel}[{r}])) \
         unless resets({metric}{sel}[{r}]) > 0 or increase({metric}{sel}[{r}]))"
    )
}

fn entry<'a>(out: &'a mut HashMap<Key, Replica>, v: &Value) -> &'a mut Replica {
    let k = key_of(v);
    out.entry(k.clone()).or_insert_with(|| {
        let node = match label(v, "node") {
            "" => label(v, "instance"),
            n => n,
        };
        Replica {
            namespace: k.0,
            pod: k.1,
            container: k.2,
            node: node.to_string(),
            ..Default::default()
        }
    })
}
