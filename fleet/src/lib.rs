//! `throttlewatch fleet`: which workloads of a fleet are throttled, why, and
//! what each should get, read from the Prometheus HTTP API that scrapes the
//! agents (docs/fleet.md). A workload is namespace + owner + container
//! name; its recommendation aggregates the agents' per-replica advice,
//! which is the node report's (aggregate.rs).

pub mod aggregate;
pub mod collect;
pub mod hist;
pub mod owner;
pub mod patch;
pub mod prom;
pub mod render;
pub mod window;

pub use collect::Timeline;

use std::collections::HashSet;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

#[derive(Debug, Clone, Args)]
pub struct FleetArgs {
    /// The Prometheus HTTP API's root: http(s)://host:port (Thanos Query, Mimir's
    /// /prometheus prefix and VictoriaMetrics answer the same API).
    #[arg(long, value_name = "URL")]
    pub prometheus: String,
    /// How far back to look, e.g. 30m, 6h, 7d, 2w.
    #[arg(long, default_value = "7d")]
    pub window: String,
    /// The window's end: Unix seconds, or `now`.
    #[arg(long, default_value = "now")]
    pub end: String,
    /// Only these namespaces (repeatable); default: every namespace with series.
    #[arg(long = "namespace", short = 'n', value_name = "NS")]
    pub namespaces: Vec<String>,
    /// Only the workload of this name (or KIND/NAME, e.g. Deployment/web).
    #[arg(long)]
    pub workload: Option<String>,
    /// A label matcher on the series, e.g. node=gpu-7, qos_class!="", pod=~"web-.*" (repeatable).
    #[arg(long = "selector", short = 'l', value_name = "MATCHER")]
    pub selectors: Vec<String>,
    /// Only the N most throttled workloads.
    #[arg(long, value_name = "N")]
    pub top: Option<usize>,
    /// One JSON document on stdout.
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// CSV on stdout, one row per workload.
    #[arg(long)]
    pub csv: bool,
    /// Also write a sortable HTML page with each workload's throttling over the window.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Send `Authorization: Bearer <the file's content>`.
    #[arg(long, value_name = "FILE", conflicts_with = "basic_auth")]
    pub bearer_token_file: Option<PathBuf>,
    /// Basic auth as USER, the password read from --password-file.
    #[arg(long, value_name = "USER")]
    pub basic_auth: Option<String>,
    #[arg(long, value_name = "FILE", requires = "basic_auth")]
    pub password_file: Option<PathBuf>,
    /// PEM certificates to trust for an https:// URL (else the web's roots).
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// Print each query to stderr (with its evaluation time) as it is sent.
    #[arg(long)]
    pub show_queries: bool,
    /// Seconds each request may take.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// A bad argument: the flag, the value and what is accepted.
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Prom(#[from] prom::PromError),
    /// The API answered, with nothing of throttlewatch in the scope.
    #[error("{0}")]
    Empty(String),
    #[error("{path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl FleetError {
    pub fn is_usage(&self) -> bool {
        matches!(self, FleetError::Usage(_))
    }
}

/// A label matcher as PromQL takes it, from `name op value` (value quoted or not).
pub fn matcher(m: &str) -> Result<String, FleetError> {
    let bad = |why: &str| {
        FleetError::Usage(format!(
            "--selector {m:?}: {why}; expected NAME=VALUE, NAME!=VALUE, NAME=~REGEX or NAME!~REGEX with NAME a label name"
        ))
    };
    let at = m.find(['=', '!']).ok_or_else(|| bad("no operator"))?;
    let (name, rest) = m.split_at(at);
    let name = name.trim();
    let op = ["!~", "=~", "!=", "="]
        .into_iter()
        .find(|o| rest.starts_with(o))
        .ok_or_else(|| bad("no operator"))?;
    let ok_name = !name.is_empty()
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !ok_name || name.starts_with("__") {
        return Err(bad("not a label name"));
    }
    let v = rest[op.len()..].trim();
    let v = v
        .strip_prefix('"')
        .and_then(|x| x.strip_suffix('"'))
        .unwrap_or(v);
    if v.len() > 1024 {
        return Err(bad("value longer than 1024 bytes"));
    }
    Ok(format!("{name}{op}\"{}\"", collect::escape(v)))
}

fn validate(a: &FleetArgs) -> Result<(collect::Scope, prom::Access), FleetError> {
    let u = a.prometheus.trim();
    let host = u
        .strip_prefix("http://")
        .or_else(|| u.strip_prefix("https://"))
        .map(|r| r.split('/').next().unwrap_or(""));
    if host.is_none_or(|h| h.is_empty()) {
        return Err(FleetError::Usage(format!(
            "--prometheus {u:?}: expected an http:// or https:// URL of the Prometheus API, e.g. http://prometheus:9090"
        )));
    }
    let window = window::parse("--window", &a.window).map_err(FleetError::Usage)?;
    let end = match a.end.as_str() {
        "now" => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64()),
        v => v
            .parse::<f64>()
            .ok()
            .filter(|t| *t > 0.0 && t.is_finite())
            .ok_or_else(|| {
                FleetError::Usage(format!(
                    "--end {v:?}: expected Unix seconds (e.g. 1765000000) or now"
                ))
            })?,
    };
    for ns in &a.namespaces {
        let ok = !ns.is_empty()
            && ns.len() <= 63
            && ns
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !ns.starts_with('-')
            && !ns.ends_with('-');
        if !ok {
            return Err(FleetError::Usage(format!(
                "--namespace {ns:?}: expected a Kubernetes namespace name (lower-case letters, digits and '-', at most 63)"
            )));
        }
    }
    if a.top == Some(0) {
        return Err(FleetError::Usage(
            "--top 0: expected a number of workloads from 1".into(),
        ));
    }
    if a.timeout == 0 {
        return Err(FleetError::Usage(
            "--timeout 0: expected seconds from 1".into(),
        ));
    }
    let matchers = a
        .selectors
        .iter()
        .map(|m| matcher(m))
        .collect::<Result<_, _>>()?;
    Ok((
        collect::Scope {
            namespaces: a.namespaces.clone(),
            matchers,
            end,
            window,
            chunk: Duration::from_secs(86_400),
        },
        prom::Access {
            url: u.to_string(),
            bearer_token_file: a.bearer_token_file.clone(),
            basic_user: a.basic_auth.clone(),
            basic_password_file: a.password_file.clone(),
            ca_file: a.ca_file.clone(),
            timeout: Duration::from_secs(a.timeout),
            show_queries: a.show_queries,
        },
    ))
}

/// A progress line on stderr while the queries run (a terminal only).
struct Progress<'a> {
    /// Known once the namespaces are: set by [`answer`].
    total: &'a std::cell::Cell<usize>,
    done: usize,
    tty: bool,
}

impl Progress<'_> {
    fn tick(&mut self) {
        self.done += 1;
        if self.tty {
            let total = self.total.get().max(self.done);
            let f = (self.done as f64 / total.max(1) as f64).min(1.0);
            let n = (f * 30.0) as usize;
            eprint!(
                "\r  [{}{}] {}/{} queries",
                "#".repeat(n),
                " ".repeat(30 - n),
                self.done,
                total
            );
        }
    }
    fn finish(&self) {
        if self.tty {
            eprint!("\r\x1b[2K");
        }
    }
}

/// The answer, and the HTML page's timelines when asked for.
pub fn answer(a: &FleetArgs) -> Result<(render::Answer, Vec<Timeline>), FleetError> {
    let (scope, access) = validate(a)?;
    let client = prom::Client::new(&access)?;
    let total = std::cell::Cell::new(0);
    let mut p = Progress {
        total: &total,
        done: 0,
        tty: std::io::stderr().is_terminal(),
    };
    let mut tick = || p.tick();
    let mut r = collect::Reader {
        client: &client,
        progress: &mut tick,
    };
    let namespaces = r.namespaces(&scope)?;
    let per_ns = collect::Reader::queries_per_namespace(&scope) + usize::from(a.html.is_some());
    let discovery = if a.namespaces.is_empty() {
        window::chunks(scope.end, scope.window, scope.chunk).len()
    } else {
        0
    };
    total.set(discovery + namespaces.len() * per_ns);
    let mut replicas = Vec::new();
    let mut ksm = owner::KsmOwners::default();
    let mut timelines: Vec<(collect::Key, Timeline)> = Vec::new();
    for ns in &namespaces {
        replicas.extend(r.replicas(&scope, ns)?.into_values());
        r.owners(&scope, ns, &mut ksm)?;
        if a.html.is_some() {
            timelines.extend(r.timeline(&scope, ns)?);
        }
    }
    let _ = r;
    p.finish();
    let queries_done = p.done;
    if replicas.is_empty() {
        return Err(FleetError::Empty(format!(
            "{}: no throttlewatch series over the {} before {:.0}{}{}: is Prometheus scraping the agents (docs/metrics.md), and the window right?",
            client.url(),
            a.window,
            scope.end,
            if a.namespaces.is_empty() { String::new() } else { format!(" in {}", a.namespaces.join(", ")) },
            if a.selectors.is_empty() { String::new() } else { format!(" matching {}", a.selectors.join(", ")) },
        )));
    }
    let mut ws = aggregate::workloads(replicas, &ksm, scope.window.as_secs_f64());
    select(&mut ws, a)?;
    let sources: HashSet<_> = ws.iter().map(|w| w.owner_source).collect();
    let owner_source = match (sources.len(), sources.iter().next()) {
        (1, Some(owner::OwnerSource::KubeStateMetrics)) => "kube-state-metrics",
        (1, _) => "pod-name",
        _ => "mixed",
    };
    let lines = workload_lines(&ws, &timelines);
    Ok((
        render::Answer {
            prometheus: client.url().to_string(),
            window_seconds: scope.window.as_secs(),
            end_unix: scope.end,
            owner_source: owner_source.into(),
            queries: queries_done,
            workloads: ws,
        },
        lines,
    ))
}

/// `--workload` and `--top`: the workloads asked for.
fn select(ws: &mut Vec<aggregate::Workload>, a: &FleetArgs) -> Result<(), FleetError> {
    if let Some(w) = &a.workload {
        ws.retain(|x| x.workload == *w || format!("{}/{}", x.kind, x.workload) == *w);
        if ws.is_empty() {
            return Err(FleetError::Empty(format!(
                "--workload {w:?}: no such workload with throttlewatch series in the window"
            )));
        }
    }
    if let Some(n) = a.top {
        ws.truncate(n);
    }
    Ok(())
}

/// Each workload's timeline: its replicas' timelines summed at each instant.
fn workload_lines(
    ws: &[aggregate::Workload],
    timelines: &[(collect::Key, Timeline)],
) -> Vec<Timeline> {
    ws.iter()
        .map(|w| {
            let mut sum: std::collections::BTreeMap<i64, f64> = Default::default();
            for ((ns, pod, c), pts) in timelines {
                let ours = *ns == w.namespace
                    && *c == w.container
                    && w.spread.per_replica.iter().any(|r| r.pod == *pod);
                if ours {
                    for (t, v) in pts {
                        *sum.entry((*t * 1000.0) as i64).or_default() += v;
                    }
                }
            }
            sum.into_iter()
                .map(|(t, v)| (t as f64 / 1000.0, v))
                .collect()
        })
        .collect()
}

/// `throttlewatch fleet`: the answer in the format asked for; the text to print.
pub fn run(a: &FleetArgs) -> Result<String, FleetError> {
    let (ans, lines) = answer(a)?;
    if let Some(f) = &a.html {
        std::fs::write(f, render::html(&ans, &lines)).map_err(|source| FleetError::Write {
            path: f.clone(),
            source,
        })?;
    }
    Ok(if a.json {
        serde_json::to_string_pretty(&ans).unwrap_or_default() + "\n"
    } else if a.csv {
        render::csv(&ans)
    } else {
        let st = throttlewatch_report::render_terminal::fit::width();
        throttlewatch_report::render_terminal::fit::fit(&render::table(&ans), st)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matchers_are_checked_and_escaped() {
        assert_eq!(matcher("node=gpu-7").unwrap(), "node=\"gpu-7\"");
        assert_eq!(matcher("pod=~\"web-.*\"").unwrap(), "pod=~\"web-.*\"");
        assert_eq!(matcher("qos_class!=").unwrap(), "qos_class!=\"\"");
        assert_eq!(matcher("a!~x\"y").unwrap(), "a!~\"x\\\"y\"");
        for bad in ["node", "=x", "1node=x", "__name__=x", "no de=x"] {
            let e = matcher(bad).unwrap_err().to_string();
            assert!(
                e.contains("--selector") && e.contains("expected"),
                "{bad}: {e}"
            );
        }
    }
}
