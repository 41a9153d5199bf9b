//! `throttlewatch report` on the wake-up chains of a real run: the periodic
//! four-stage pipeline of tests/data/chain.py (a timer wakes tw-src, a pipe
//! tw-pipe, a unix socket tw-sock, a futex tw-futex) under the real agent,
//! then `report --json`, the terminal, `--svg` and the HTML page in
//! Chromium: the graph has the three hops with a wake-up per round, and the
//! critical path runs tw-src .. tw-futex (docs/report.md, "Wake-up chains").

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;
use throttlewatch_integration::{assert_ok, bin, cpu_lock, python3, report_json, Scratch};

const STAGES: [&str; 4] = ["tw-src", "tw-pipe", "tw-sock", "tw-futex"];

fn chain() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/chain.py")
}

/// `throttlewatch run FLAGS -- python3 chain.py ARGS`: the log and the
/// stages' tids (chain.py's line).
fn run(d: &Scratch, name: &str, flags: &[&str], args: &[&str]) -> (PathBuf, HashMap<String, u64>) {
    let log = d.0.join(format!("{name}.jsonl"));
    // At the top priority: a stage that falls a period behind (the
    // machine busy) finds its byte there, without a wake-up.
    let out = Command::new("nice")
        .args(["-n", "-20", "timeout", "-s", "KILL", "120"])
        .arg(bin("throttlewatch"))
        .args(["run", "-q", "--log", log.to_str().unwrap()])
        .args(flags)
        .arg("--")
        .arg(python3())
        .arg(chain())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_ok(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no line from chain.py: {stdout}"));
    let v: Value = serde_json::from_str(line).unwrap();
    let tids = v["tids"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, t)| (k.clone(), t.as_u64().unwrap()))
        .collect();
    (log, tids)
}

/// The report's edge from `waker`'s tid to `wakee`'s.
fn edge<'a>(w: &'a Value, tids: &HashMap<String, u64>, waker: &str, wakee: &str) -> &'a Value {
    w["edges"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["waker"]["tid"] == tids[waker] && e["wakee"]["tid"] == tids[wakee])
        .unwrap_or_else(|| panic!("no edge {waker} -> {wakee}: {w:#}"))
}

/// The critical path's threads in order (the interrupts left out).
fn path_threads(w: &Value) -> Vec<u64> {
    let p = &w["critical_path"];
    let edges = w["edges"].as_array().unwrap();
    let hops: Vec<&Value> = p["hops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| &edges[h["edge"].as_u64().unwrap() as usize])
        .collect();
    let mut tids: Vec<u64> = hops
        .iter()
        .filter(|e| e["waker"]["kind"] != "interrupt")
        .map(|e| e["waker"]["tid"].as_u64().unwrap())
        .collect();
    tids.extend(hops.last().map(|e| e["wakee"]["tid"].as_u64().unwrap()));
    tids
}

/// The graph's three hops, a wake-up each per round (±2 %, at least one
/// wake-up; `exact: false`: threads sharing the GIL, whose hand-offs may
/// add some: at least the rounds, at most three a round), and the
/// critical path along the stages.
fn check_chain(w: &Value, tids: &HashMap<String, u64>, rounds: u64, exact: bool) {
    let slack = (rounds / 50).max(1);
    for hop in STAGES.windows(2) {
        let e = edge(w, tids, hop[0], hop[1]);
        let n = e["count"].as_u64().unwrap();
        eprintln!("{} -> {}: {n} wake-ups, {rounds} rounds", hop[0], hop[1]);
        let ok = match exact {
            true => n.abs_diff(rounds) <= slack,
            false => n + slack >= rounds && n <= 3 * rounds,
        };
        assert!(
            ok,
            "{} -> {}: {n} wake-ups in {rounds} rounds",
            hop[0], hop[1]
        );
    }
    let stages: Vec<u64> = STAGES.iter().map(|s| tids[*s]).collect();
    assert_eq!(path_threads(w), stages, "{:#}", w["critical_path"]);
    // The report counts rounds from the hops' wake-ups (threads: the
    // lock's extra hand-offs add some).
    let r = w["critical_path"]["rounds"].as_u64().unwrap();
    let ok = match exact {
        true => r.abs_diff(rounds) <= slack,
        false => r + slack >= rounds && 2 * r <= 3 * rounds,
    };
    assert!(ok, "rounds {r} of {rounds}");
}

/// `chromium --headless`: (the DOM after load, the page's console messages).
fn chromium(page: &Path, extra: &[&str]) -> (String, Vec<String>) {
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .args(extra)
        .arg("--dump-dom")
        .arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        .output()
        .expect("chromium (scripts/setup.sh --test installs it)");
    assert_ok(&out);
    let console = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.contains(":CONSOLE"))
        .map(str::to_string)
        .collect();
    (String::from_utf8_lossy(&out.stdout).to_string(), console)
}

/// The text of `<figure ... id="ID" ...>` .. `</figure>`.
fn figure<'a>(dom: &'a str, id: &str) -> &'a str {
    let at = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no figure {id}"));
    let end = at + dom[at..].find("</figure>").unwrap();
    &dom[at..end]
}

#[test]
fn processes_chain_in_json_terminal_svg_and_the_page() {
    let _l = cpu_lock();
    let d = Scratch::new("wakeups-report");
    // 50 ms a round: on a busy machine a 20 ms period let stages fall a
    // round behind (their byte already there: no wake-up).
    let (log, tids) = run(
        &d,
        "processes",
        &["--cpus", "0.5"],
        &["processes", "100", "50", "2"],
    );
    let w = report_json(&log, &[])["containers"][0]["wakeups"].clone();
    assert_eq!(w["source"], "end", "{w:#}");
    assert!(w["edges"].as_array().unwrap().len() <= 32);
    check_chain(&w, &tids, 100, true);

    let out = Command::new(bin("throttlewatch"))
        .args(["report", log.to_str().unwrap(), "--svg"])
        .arg(d.0.join("svg"))
        .arg("--html")
        .arg(d.0.join("report.html"))
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    assert_ok(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    let section = &text[text.find("Wake-up chains").expect("no wake-up section")..];
    eprintln!(
        "{}",
        &section[..section.find("\n\n").unwrap_or(section.len())]
    );
    // Rows are wrapped to 80 columns in a pipe: match in the joined text.
    let flat = throttlewatch_integration::squash(section);
    let line = &flat[flat
        .find("critical path per round")
        .expect("no critical path line")..];
    assert!(
        line.contains("tw-src -> tw-pipe -> tw-sock -> tw-futex"),
        "{line}"
    );
    for hop in STAGES.windows(2) {
        let pat = format!(
            "* {}/{} -> {}/{} ",
            hop[0], tids[hop[0]], hop[1], tids[hop[1]]
        );
        assert!(flat.contains(&pat), "{pat} not in {section}");
    }
    let svg = std::fs::read_to_string(d.0.join("svg/wakeups.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("class=\"edge critical\""));

    let page = d.0.join("report.html");
    let shot = d.0.join("report.png");
    let (dom, console) = chromium(
        &page,
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1300,2600",
        ],
    );
    assert!(console.is_empty(), "console messages: {console:?}");
    assert!(dom.contains("<h3>Wake-up chains</h3>"), "no panel");
    let fig = figure(&dom, "c0-wakeups");
    // The interrupt's hop and the three of the stages.
    assert!(fig.matches("class=\"edge critical\"").count() >= 3, "{fig}");
    assert_eq!(fig.matches("<ellipse").count(), 1, "one interrupt node");
    for s in STAGES {
        assert!(fig.contains(&format!(">{s}</text>")), "{s} not drawn");
    }
    let png = std::fs::read(&shot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "screenshot: {} bytes",
        png.len()
    );
    if let Ok(keep) = std::env::var("TW_KEEP_SCREENSHOT") {
        std::fs::copy(&shot, keep).unwrap();
    }
}

/// Threads of one process under 0.1 CPUs: 16 ms of work a round, frozen in
/// most rounds, the period (200 ms) long enough that no stage falls
/// behind; `switch_s`: the GIL's switch interval (None: Python's 5 ms).
fn threads_under_a_quota(tag: &str, switch_s: Option<&str>) {
    let _l = cpu_lock();
    let d = Scratch::new(&format!("wakeups-report-threads-{tag}"));
    let mut args = vec!["threads", "40", "200", "4"];
    args.extend(switch_s);
    let (log, tids) = run(&d, "threads", &["--cpus", "0.1"], &args);
    let w = report_json(&log, &[])["containers"][0]["wakeups"].clone();
    // Threads share the GIL: tw-sock's semaphore (a condition variable)
    // may wake tw-futex more than once a round.
    check_chain(&w, &tids, 40, false);
    let p = &w["critical_path"];
    let frozen = p["frozen_per_round_ns"].as_u64().unwrap();
    assert!(frozen > 0, "no hop frozen: {p:#}");
    let s = p["sentence"].as_str().unwrap();
    eprintln!("GIL switch interval {} s: {s}", switch_s.unwrap_or("0.005"));
    assert!(s.contains("frozen by the limit ("), "{s}");
}

/// A 1 s GIL switch interval: the threads hand the GIL over only at their
/// blocking calls, each hop one wake-up a round.
#[test]
fn threads_chain_under_a_quota_that_freezes_it() {
    threads_under_a_quota("1s", Some("1"));
}

/// Python's own 5 ms: every thread's timed GIL wait is ended by the timer,
/// an `interrupt -> stage` edge into each stage (fc17: interrupt -> tw-pipe,
/// 78 wake-ups in 40 rounds) that once made the report's path take a
/// shortcut past tw-src; the path is the longest chain of pipeline hops
/// (report/src/wakeups_path.rs), so it still runs through every stage.
#[test]
fn threads_chain_at_pythons_own_gil_interval() {
    threads_under_a_quota("5ms", None);
}
