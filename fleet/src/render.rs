//! The fleet answer as a terminal table (ranked by throttled time), CSV,
//! JSON, and a self-contained HTML page: a sortable table and each
//! workload's throttled time over the window.

use std::fmt::Write;

use serde::Serialize;

use crate::aggregate::Workload;

#[cfg(test)]
mod tests {
    #[test]
    fn a_wrapped_patch_is_the_same_json() {
        let cmd = r#"kubectl -n shop patch deployment web --type=strategic -p '{"spec":{"template":{"spec":{"containers":[{"name":"app","resources":{"limits":{"cpu":"0.7"}}}]}}}}'"#;
        let w = super::wrap_patch(cmd, 30);
        assert!(
            w.lines().count() > 2 && w.lines().all(|l| l.len() <= 80),
            "{w}"
        );
        let json = w.split_once(" -p '").unwrap().1.trim_end_matches('\'');
        let v: serde_json::Value = serde_json::from_str(&json.replace('\n', "")).unwrap();
        assert_eq!(
            v["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"],
            "0.7"
        );
        let v2: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(v, v2, "the newlines are JSON whitespace");
    }
}

#[derive(Debug, Serialize)]
pub struct Answer {
    pub prometheus: String,
    pub window_seconds: u64,
    pub end_unix: f64,
    /// `kube-state-metrics` where every workload's owner came from it,
    /// `pod-name` where none did, `mixed` otherwise.
    pub owner_source: String,
    pub queries: usize,
    pub workloads: Vec<Workload>,
}

fn secs(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}s")
    } else if v >= 1.0 {
        format!("{v:.1}s")
    } else {
        format!("{:.0}ms", v * 1e3)
    }
}

fn opt_ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{:.1}ms", v * 1e3))
}

/// The dominant cause of the runnable time and its share.
fn cause(w: &Workload) -> String {
    let total: f64 = w.runnable_waiting_seconds.values().sum();
    w.runnable_waiting_seconds
        .iter()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .filter(|_| total > 0.0)
        .map_or("-".into(), |(c, s)| {
            format!("{c} {:.0}%", s / total * 100.0)
        })
}

pub fn table(a: &Answer) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "throttlewatch fleet: {} workload(s) from {} over {}s (owners: {})",
        a.workloads.len(),
        a.prometheus,
        a.window_seconds,
        a.owner_source
    );
    let _ = writeln!(
        s,
        "{:<3} {:<30} {:>4} {:>5} {:>9} {:>5} {:>8} {:>8}",
        "#", "namespace/workload/container", "repl", "nodes", "throttled", "thr%", "p50", "p99",
    );
    for (i, w) in a.workloads.iter().enumerate() {
        let name = format!("{}/{}/{}", w.namespace, w.workload, w.container);
        let _ = writeln!(
            s,
            "{:<3} {:<30} {:>4} {:>5} {:>9} {:>5} {:>8} {:>8}",
            i + 1,
            name,
            w.replicas,
            w.nodes,
            secs(w.throttled_seconds),
            w.throttled_period_share
                .map_or("-".into(), |v| format!("{:.0}%", v * 100.0)),
            opt_ms(w.freeze_p50_seconds),
            opt_ms(w.freeze_p99_seconds),
        );
        let _ = writeln!(
            s,
            "      {} {}; runnable time: {}; spread {}: {}",
            w.kind,
            w.workload,
            cause(w),
            w.spread.verdict,
            w.spread.detail
        );
        if !w.contention_nodes.is_empty() {
            let _ = writeln!(
                s,
                "      the host, not the limit, costs it time on: {}",
                w.contention_nodes.join(", ")
            );
        }
        for r in &w.recommendations {
            let pred = r.predicted_throttled_seconds.map_or(String::new(), |p| {
                format!(
                    " -> predicted throttled {} (was {})",
                    secs(p),
                    secs(r.observed_throttled_seconds)
                )
            });
            let _ = writeln!(s, "      * {}={}{pred}", r.key, r.value);
            let _ = writeln!(s, "        {}", r.rule);
            let _ = writeln!(s, "{}", wrap_patch(&r.kubectl_patch, 72));
        }
    }
    s
}

/// A patch command over lines of at most `width` (+ indent) that a shell
/// still takes whole: the JSON inside its single quotes is broken after
/// commas (JSON allows the newlines), the command before it at spaces.
fn wrap_patch(cmd: &str, width: usize) -> String {
    let Some((head, json)) = cmd.split_once(" -p '") else {
        return format!("        {cmd}");
    };
    let mut lines = vec![format!("        {head} -p '")];
    let mut cur = String::new();
    for (i, part) in json.split_inclusive(',').enumerate() {
        if i > 0 && cur.len() + part.len() > width {
            lines.push(format!("          {cur}"));
            cur.clear();
        }
        cur.push_str(part);
    }
    lines.push(format!("          {cur}"));
    lines.join("\n")
}

fn csv_field(v: &str) -> String {
    if v.contains([',', '"', '\n']) {
        format!("\"{}\"", v.replace('"', "\"\""))
    } else {
        v.to_string()
    }
}

pub fn csv(a: &Answer) -> String {
    let mut s = String::from(
        "rank,namespace,workload,kind,container,replicas,nodes,throttled_seconds,throttled_period_share,freeze_p50_seconds,freeze_p99_seconds,cause,spread,contention_nodes,key,value,predicted_throttled_seconds\n",
    );
    let f = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.6}"));
    for (i, w) in a.workloads.iter().enumerate() {
        let r = w.recommendations.first();
        let row = [
            (i + 1).to_string(),
            w.namespace.clone(),
            w.workload.clone(),
            w.kind.clone(),
            w.container.clone(),
            w.replicas.to_string(),
            w.nodes.to_string(),
            format!("{:.6}", w.throttled_seconds),
            f(w.throttled_period_share),
            f(w.freeze_p50_seconds),
            f(w.freeze_p99_seconds),
            cause(w),
            w.spread.verdict.to_string(),
            w.contention_nodes.join(" "),
            r.map_or(String::new(), |r| r.key.clone()),
            r.map_or(String::new(), |r| r.value.clone()),
            f(r.and_then(|r| r.predicted_throttled_seconds)),
        ];
        let row: Vec<String> = row.iter().map(|v| csv_field(v)).collect();
        s.push_str(&row.join(","));
        s.push('\n');
    }
    s
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A line of throttled CPU-seconds per second over the window.
fn spark(points: &[(f64, f64)]) -> String {
    if points.len() < 2 {
        return String::from("<svg width=\"240\" height=\"40\"></svg>");
    }
    let (t0, t1) = (points[0].0, points[points.len() - 1].0);
    let max = points.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-9);
    let xy: Vec<String> = points
        .iter()
        .map(|(t, v)| {
            format!(
                "{:.1},{:.1}",
                (t - t0) / (t1 - t0).max(1e-9) * 238.0 + 1.0,
                39.0 - v / max * 37.0
            )
        })
        .collect();
    format!(
        "<svg width=\"240\" height=\"40\"><title>max {max:.3} CPU-s/s frozen</title><polyline fill=\"none\" stroke=\"#c0392b\" points=\"{}\"/></svg>",
        xy.join(" ")
    )
}

pub fn html(a: &Answer, timelines: &[Vec<(f64, f64)>]) -> String {
    let mut rows = String::new();
    for (i, w) in a.workloads.iter().enumerate() {
        let r = w.recommendations.first();
        let _ = writeln!(
            rows,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td data-v=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td></tr>",
            i + 1,
            esc(&w.namespace),
            esc(&w.workload),
            esc(&w.kind),
            esc(&w.container),
            w.replicas,
            w.nodes,
            w.throttled_seconds,
            secs(w.throttled_seconds),
            w.throttled_period_share.map_or("-".into(), |v| format!("{:.1}%", v * 100.0)),
            opt_ms(w.freeze_p50_seconds),
            opt_ms(w.freeze_p99_seconds),
            esc(&cause(w)),
            esc(&format!("{}: {}", w.spread.verdict, w.spread.detail)),
            esc(&r.map_or(String::new(), |r| format!("{}={}  {}", r.key, r.value, r.kubectl_patch))),
            spark(timelines.get(i).map_or(&[][..], |t| &t[..])),
        );
    }
    format!(
        r#"<!doctype html><html><head><meta charset="utf-8"><title>throttlewatch fleet</title>
<style>body{{font:13px sans-serif;margin:1em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:3px 6px;vertical-align:top}}th{{cursor:pointer;background:#eee}}code{{font-size:11px;word-break:break-all}}</style></head><body>
<h1>throttlewatch fleet</h1><p>{} workload(s) from {} over {} s, owners from {}. Click a column to sort.</p>
<table id="t"><thead><tr><th>#</th><th>namespace</th><th>workload</th><th>kind</th><th>container</th><th>replicas</th><th>nodes</th><th>throttled</th><th>periods throttled</th><th>freeze p50</th><th>freeze p99</th><th>cause</th><th>spread</th><th>recommendation</th><th>frozen over the window</th></tr></thead><tbody>
{rows}</tbody></table>
<script>
document.querySelectorAll('#t th').forEach((th, i) => th.onclick = () => {{
  const tb = document.querySelector('#t tbody'), rows = [...tb.rows];
  const key = r => {{ const c = r.cells[i]; const v = c.dataset.v ?? c.textContent; const n = parseFloat(v); return isNaN(n) ? v : n; }};
  const dir = th.dataset.dir = th.dataset.dir === 'a' ? 'd' : 'a';
  rows.sort((a, b) => {{ const x = key(a), y = key(b); return (x > y ? 1 : x < y ? -1 : 0) * (dir === 'a' ? 1 : -1); }});
  rows.forEach(r => tb.appendChild(r));
}});
</script></body></html>
"#,
        a.workloads.len(),
        esc(&a.prometheus),
        a.window_seconds,
        esc(&a.owner_source)
    )
}
