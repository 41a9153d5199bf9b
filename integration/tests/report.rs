//! `throttlewatch report` against real throttling: a workload is run and
//! reported, the recommended (or asked-about) quota and burst are applied to
//! the same workload, and the throttled time the kernel measures is compared
//! with the one the report predicted (docs/report.md).

use std::process::{Command, Stdio};

use serde_json::Value;
use throttlewatch_integration::{bin, cpu_lock, of_type, read_log, Scratch};

/// `throttlewatch run FLAGS -- tw-burn ARGS`; the kernel's throttled time (ns) from the log.
fn run(d: &Scratch, name: &str, flags: &[&str], burn: &[&str]) -> (std::path::PathBuf, f64) {
    let log = d.0.join(format!("{name}.jsonl"));
    let out = Command::new(bin("throttlewatch"))
        .args(["run", "-q", "--log", log.to_str().unwrap()])
        .args(flags)
        .arg("--")
        .arg(bin("tw-burn"))
        .args(burn)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = read_log(&log);
    let end = of_type(&lines, "end")[0];
    (log, end["kernel_throttled_ns"].as_f64().unwrap())
}

fn report(log: &std::path::Path, extra: &[&str]) -> Value {
    let out = Command::new(bin("throttlewatch"))
        .args(["report", "--json", log.to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["containers"][0].clone()
}

fn recommendation<'a>(r: &'a Value, kind: &str) -> Option<&'a Value> {
    r["recommendations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["kind"] == kind)
}

/// Two busy threads on one CPU under 0.05 CPUs: throttled in every period.
/// One CPU and a small quota keep the prediction robust to other load on the machine.
const BUSY: &[&str] = &["--threads", "2", "--pin", "packed", "--ms", "2500"];

#[test]
fn quota_predictions_match_the_kernel() {
    let _l = cpu_lock();
    let d = Scratch::new("report-quota");
    let (log, observed) = run(&d, "before", &["--cpus", "0.05"], BUSY);
    assert!(
        observed > 1e9,
        "the workload was not throttled: {observed} ns"
    );
    let r = report(&log, &["--what-if", "cpus=0.15"]);
    assert_eq!(r["kernel_throttled_ns"].as_f64().unwrap(), observed);
    // A group busy in every period leaves no quota unused: burst cannot help.
    assert!(recommendation(&r, "cpu-burst").is_none(), "{r:#}");

    // What if the quota were three times as large?
    let predicted = r["what_if"]["predicted_throttled_ns"].as_f64().unwrap();
    let (_, measured) = run(&d, "what-if", &["--cpus", "0.15"], BUSY);
    let err = (measured - predicted).abs() / predicted;
    eprintln!(
        "what-if cpus=0.15: observed {:.0} ms, predicted {:.0} ms, measured {:.0} ms, error {:.1} %",
        observed / 1e6,
        predicted / 1e6,
        measured / 1e6,
        err * 100.0
    );
    assert!(measured < observed, "throttling did not fall");
    assert!(err <= 0.25, "prediction error {:.1} % > 25 %", err * 100.0);

    // The recommended limit, applied.
    let q = recommendation(&r, "quota").expect("a quota recommendation");
    let flag = q["run_flag"].as_str().unwrap();
    let cpus = flag.strip_prefix("--cpus ").unwrap();
    let predicted = q["predicted_throttled_ns"].as_f64().unwrap();
    let (_, measured) = run(&d, "recommended", &["--cpus", cpus], BUSY);
    let err = (measured - predicted).abs() / observed;
    eprintln!(
        "recommended {flag}: observed {:.0} ms, predicted {:.0} ms, measured {:.0} ms, error {:.1} % of the observed",
        observed / 1e6,
        predicted / 1e6,
        measured / 1e6,
        err * 100.0
    );
    assert!(measured < observed / 2.0, "throttling did not fall by half");
    assert!(
        err <= 0.25,
        "prediction off by {:.1} % of the observed",
        err * 100.0
    );
}

#[test]
fn burst_recommendation_absorbs_spikes() {
    let _l = cpu_lock();
    let d = Scratch::new("report-burst");
    // Spikes of 2 x 60 ms on one CPU every 400 ms under 0.2 CPUs: each overruns
    // the quota, and the periods between leave it unused.
    let spiky = &[
        "--threads",
        "2",
        "--pin",
        "packed",
        "--spin",
        "60",
        "--sleep",
        "340",
        "--ms",
        "4000",
    ];
    let (log, observed) = run(&d, "before", &["--cpus", "0.2"], spiky);
    assert!(
        observed > 20e6,
        "the workload was not throttled: {observed} ns"
    );
    let r = report(&log, &[]);
    let b = recommendation(&r, "cpu-burst").expect("a burst recommendation");
    assert_eq!(b["key"], "throttlewatch.io/cpu-burst");
    let flag = b["run_flag"].as_str().unwrap();
    let burst = flag.strip_prefix("--burst ").unwrap();
    let predicted = b["predicted_throttled_ns"].as_f64().unwrap();
    let (_, measured) = run(&d, "burst", &["--cpus", "0.2", "--burst", burst], spiky);
    let err = (measured - predicted).abs() / observed;
    eprintln!(
        "recommended {flag}: observed {:.1} ms, predicted {:.1} ms, measured {:.1} ms, error {:.1} % of the observed",
        observed / 1e6,
        predicted / 1e6,
        measured / 1e6,
        err * 100.0
    );
    assert!(measured < observed / 2.0, "throttling did not fall by half");
    // The replay cannot know how much of a spike's frozen work the workload
    // still wanted after the thaw (tw-burn spins to a wall-clock deadline):
    // it assumes the most the log allows, so it errs high (docs/report.md).
    assert!(
        err <= 0.4,
        "prediction off by {:.1} % of the observed",
        err * 100.0
    );
}
