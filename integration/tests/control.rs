//! Issue 15: the dynamic CPU controller on real cgroups with the real agent.
//! A bursty group under `cpu-control: auto` gets its burst, then its quota,
//! raised within the ceilings and is throttled less than an uncontrolled
//! twin running the same work beside it; its original values come back at
//! its end, after an agent SIGKILL + restart, and at agent stop; an
//! operator's write to the cgroup during control becomes the new original,
//! and so does a real `runc update` of a real container whose opt-in came
//! through the runtime wrapper and the hook.
//! The node guard giving CPU back to a real neighbour: control_guard.rs;
//! `docker update` and the shim's `Update` during control: control_update.rs.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use throttlewatch_cgroup::{CpuCgroup, Hierarchies, TransientCgroup};
use throttlewatch_core::protocol::{call, Request};
use throttlewatch_integration::bundle::{text, Bundle, ContainerOpts, OciCli};
use throttlewatch_integration::daemons::{Agent, PrivateConfig};
use throttlewatch_integration::{
    bin, burn_in, cpu_lock, max_cpu_weight, of_type, read_log, unique,
};

const QUOTA: u64 = 50_000;
const PERIOD: u64 = 100_000;

/// Control on, the node guard off (this shared machine's pressure is not
/// the test's), the default ceilings: quota 300 %, burst 100 % of the quota.
const CONTROL: &str =
    "[control]\nenabled = true\npressure_psi_some_percent = 100.0\npressure_idle_percent = 0.0\n";

/// An operator's quota update (`runc update --cpu-quota`): not a value the
/// controller can hold (its raises step by at least 20 % of 50 000 µs: an
/// update to the held value is no change to adopt), and low enough that
/// its 300 % ceiling, 1.71 CPUs, leaves this 2-CPU machine's agent some CPU
/// beside a burner at the highest CPU weight. At 73 000 µs the ceiling was
/// 2.19 CPUs: the raised burner took both CPUs at 256 times the agent's
/// weight, the agent missed the 10 s SIGTERM grace and was SIGKILLed with
/// the raise in place ("agent stop restores the adopted original" failed
/// after 137 s in stop 42's CI).
const UPDATE: u64 = 57_013;

fn group(tag: &str) -> TransientCgroup {
    group_at(tag, QUOTA)
}

fn group_at(tag: &str, quota: u64) -> TransientCgroup {
    let h = Hierarchies::discover().unwrap();
    let rel = format!("/tw-test-control-{tag}-{}-{}", std::process::id(), unique());
    let cg = TransientCgroup::create(&h, &rel).unwrap();
    cg.group.set_quota(Some(quota), PERIOD).unwrap();
    cg.group.set_burst(0).unwrap();
    max_cpu_weight(&cg.group.cpu_dir);
    cg
}

/// (quota, period, burst) as the kernel holds them.
fn values(g: &CpuCgroup) -> (u64, u64, u64) {
    let l = g.limits().unwrap();
    (l.quota_us.unwrap(), l.period_us, l.burst_us.unwrap_or(0))
}

fn register(cfg: &PrivateConfig, id: &str, cg: &TransientCgroup, pid: u32, auto: bool) -> PathBuf {
    cfg.register_control(id, &cg.group.rel, pid, auto)
}

fn unregister(cfg: &PrivateConfig, id: &str) {
    let req: Request = serde_json::from_value(json!({
        "op": "unregister", "container_id": id, "reason": "poststop", "exit_code": 0
    }))
    .unwrap();
    let r = call(&cfg.socket, &req, Duration::from_secs(5)).unwrap();
    assert!(r.ok, "{r:?}");
}

fn u(v: &Value, path: &[&str]) -> u64 {
    path.iter()
        .fold(v, |v, k| &v[*k])
        .as_u64()
        .unwrap_or_else(|| panic!("{path:?} in {v}"))
}

/// Wait until `f` holds (polling every 20 ms), or panic with `what`.
fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < timeout, "{what} within {timeout:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `wait_for` 5 s while the throttled workload `burn` runs, and on a
/// timeout what the controller had to go on: the values, the kernel's
/// count, the node's PSI, the control records, the log's last other records
/// and the agent's output.
fn wait_or_explain(
    what: &str,
    agent: &Agent,
    log: &std::path::Path,
    g: &TransientCgroup,
    burn: &mut std::process::Child,
    mut f: impl FnMut() -> bool,
) {
    let t = Instant::now();
    while !f() {
        if let Some(st) = burn.try_wait().unwrap() {
            panic!("the throttled workload ended ({st}) before: {what}");
        }
        if t.elapsed() > Duration::from_secs(5) {
            let all = read_log(log);
            let show = |r: &&Value| r.to_string().chars().take(1500).collect::<String>();
            let controls: Vec<String> = of_type(&all, "control").iter().map(show).collect();
            let tail: Vec<String> = all
                .iter()
                .rev()
                .filter(|r| r["type"] != "control")
                .take(4)
                .map(|r| show(&r))
                .collect();
            panic!(
                "{what} within 5s: values {:?}, cpu.stat {:?}, pressure {:?}\ncontrols:\n{}\nlog tail:\n{}\nagent output:\n{}",
                values(&g.group),
                std::fs::read_to_string(g.group.cpu_dir.join("cpu.stat")),
                std::fs::read_to_string("/proc/pressure/cpu"),
                controls.join("\n"),
                tail.join("\n"),
                agent.output()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The bursty test's quota: 0.2 CPU, well below what the twin gets during
/// its spikes even with other jobs on the machine (at 0.5 CPU, with one
/// other job the twin was sometimes held by the machine rather than by its
/// quota, and its throttled time, the test's yardstick, fell to ~125 ms).
const BURSTY_QUOTA: u64 = 20_000;
/// How long the bursty workload runs, and the warm-up the steady-state
/// comparison leaves out: the first spike of the threads (started together
/// at a barrier) is throttled in both groups before the controller, which
/// sees throttling only once an episode has ended, can act on it, and it is
/// most of both groups' throttling over the whole run (the threads drift
/// apart later).
const BURSTY_MS: u64 = 8000;
const WARM_UP: Duration = Duration::from_secs(2);

#[test]
fn bursty_group_is_raised_within_ceilings_throttled_less_and_restored_at_its_end() {
    let _l = cpu_lock();
    let quota = BURSTY_QUOTA;
    let cfg = PrivateConfig::new(CONTROL);
    let agent = Agent::start(&cfg);
    let (auto, twin) = (group_at("auto", quota), group_at("twin", quota));
    // Spikes of 4 threads x 16 ms of CPU, then 360 ms asleep: under 0.16
    // CPU on average (below the 0.2 quota: burst can accrue), 64 ms at the
    // spike: over quota + burst (40 ms) even when the threads share one
    // CPU, so the quota has to be raised too.
    let ms = BURSTY_MS.to_string();
    let args = [
        "--threads",
        "4",
        "--ms",
        &ms,
        "--spin-cpu",
        "16",
        "--sleep",
        "360",
    ];
    let mut a = burn_in(&auto, &args);
    let mut b = burn_in(&twin, &args);
    let (ida, idb) = (format!("auto-{}", unique()), format!("twin-{}", unique()));
    let log_a = register(&cfg, &ida, &auto, a.id(), true);
    let log_b = register(&cfg, &idb, &twin, b.id(), false);
    let stats = || {
        (
            auto.group.cpu_stat().unwrap(),
            twin.group.cpu_stat().unwrap(),
        )
    };
    let (sa, sb) = stats();
    let t0 = Instant::now();
    let mut warm = None;
    let mut peak = (0, 0, 0);
    while a.try_wait().unwrap().is_none() {
        if warm.is_none() && t0.elapsed() >= WARM_UP {
            warm = Some(stats());
        }
        let v = values(&auto.group);
        peak = (peak.0.max(v.0), peak.1, peak.2.max(v.2));
        assert_eq!(
            values(&twin.group),
            (quota, PERIOD, 0),
            "the twin is not controlled"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(b.wait().unwrap().success());
    let (ea, eb) = stats();
    let (ta, tb) = (ea.since(&sa), eb.since(&sb));
    let (wa, wb) = warm.expect("the workload ran past the warm-up");
    let (steady_a, steady_b) = (ea.since(&wa), eb.since(&wb));
    let ms = |ns: u64| ns / 1_000_000;
    let controls: Vec<String> = of_type(&read_log(&log_a), "control")
        .iter()
        .map(|c| {
            format!(
                "{} {} -> {}/{} (signal {} ms in {} ms)",
                c["action"],
                c["cause"],
                c["after"]["quota_us"],
                c["after"]["burst_us"],
                ms(c["signal"]["throttled_ns"].as_u64().unwrap_or(0)),
                ms(c["signal"]["interval_ns"].as_u64().unwrap_or(0)),
            )
        })
        .collect();
    eprintln!(
        "throttled: auto {} ms ({} periods), twin {} ms ({} periods); after the {WARM_UP:?} warm-up: auto {} ms, twin {} ms; auto peak quota {} us, burst {} us; controls: {}",
        ms(ta.throttled_ns),
        ta.nr_throttled,
        ms(tb.throttled_ns),
        tb.nr_throttled,
        ms(steady_a.throttled_ns),
        ms(steady_b.throttled_ns),
        peak.0,
        peak.2,
        controls.join("; ")
    );
    assert!(peak.2 > 0, "burst was raised");
    assert!(
        peak.0 <= 3 * quota && peak.2 <= quota,
        "within the ceilings: {peak:?}"
    );
    assert!(
        steady_b.throttled_ns > 0,
        "the workload must be throttled at its quota"
    );
    // Once the controller has had the first spike to act on, over the last
    // ~6 s: 0-14 ms against the twin's 178-903 ms with two spinners in a
    // group of the most weight beside the test (the worst noise tried);
    // auto registered without control: 1173 ms against 728 ms.
    assert!(
        (steady_a.throttled_ns as f64) < 0.25 * steady_b.throttled_ns as f64,
        "control cuts the throttled time after the warm-up to a quarter at most: auto {} ns, twin {} ns",
        steady_a.throttled_ns,
        steady_b.throttled_ns
    );
    // And over the whole run, the first spike included.
    assert!(
        ta.throttled_ns < tb.throttled_ns,
        "control throttles less over the whole run: auto {} ns, twin {} ns",
        ta.throttled_ns,
        tb.throttled_ns
    );
    unregister(&cfg, &ida);
    unregister(&cfg, &idb);
    assert_eq!(
        values(&auto.group),
        (quota, PERIOD, 0),
        "originals back at the end"
    );
    let log = read_log(&log_a);
    let controls = of_type(&log, "control");
    let raises: Vec<_> = controls.iter().filter(|c| c["action"] == "raise").collect();
    assert!(!raises.is_empty(), "{controls:?}");
    for c in &raises {
        assert_eq!(c["cause"], "throttled", "{c}");
        assert!(u(c, &["signal", "throttled_ns"]) > 0, "{c}");
        assert_eq!(u(c, &["original", "quota_us"]), quota, "{c}");
        assert!(u(c, &["after", "quota_us"]) <= 3 * quota, "{c}");
        assert!(
            u(c, &["after", "burst_us"]) <= u(c, &["after", "quota_us"]).min(quota),
            "{c}"
        );
    }
    // Burst first: the first raise moves burst only.
    assert_eq!(u(raises[0], &["after", "quota_us"]), quota, "{}", raises[0]);
    let last = controls.last().unwrap();
    assert_eq!(
        (&last["action"], &last["cause"]),
        (&json!("restore"), &json!("container_end")),
        "{last}"
    );
    assert_eq!(
        last["after"],
        json!({"quota_us": quota, "period_us": PERIOD, "burst_us": 0})
    );
    let types: Vec<&str> = log.iter().map(|r| r["type"].as_str().unwrap()).collect();
    assert!(types.iter().rposition(|t| *t == "control") < types.iter().position(|t| *t == "end"));
    assert!(of_type(&read_log(&log_b), "control").is_empty());
    // `throttlewatch report` puts the changes on the timeline.
    let report = |json: bool| {
        let mut c = std::process::Command::new(bin("throttlewatch"));
        c.arg("report");
        if json {
            c.arg("--json");
        }
        let out = c.arg(&log_a).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let v: Value = serde_json::from_str(&report(true)).unwrap();
    let rows = v["containers"][0]["controls"]
        .as_array()
        .expect("controls in the report")
        .clone();
    assert_eq!(rows.len(), controls.len());
    assert_eq!(rows.last().unwrap()["cause"], "container_end");
    assert!(rows
        .windows(2)
        .all(|w| w[0]["at_ns"].as_u64() <= w[1]["at_ns"].as_u64()));
    let text = report(false);
    assert!(
        text.contains("cpu control") && text.contains("raise") && text.contains("container_end"),
        "{text}"
    );
    // The HTML page: the changes on a timeline and in a table.
    let page = log_a.with_extension("html");
    let out = std::process::Command::new(bin("throttlewatch"))
        .arg("report")
        .arg(&log_a)
        .arg("--html")
        .arg(&page)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains(&format!("data-changes=\"{}\"", controls.len())),
        "{html}"
    );
    assert_eq!(
        html.matches("<circle class=\"raise\"").count(),
        raises.len()
    );
    assert!(
        html.contains("<td class=\"l\">container_end</td>"),
        "{html}"
    );
    let _ = std::fs::remove_file(&page);
    drop(agent);
}

#[test]
fn sigkill_restart_restores_update_is_adopted_and_stop_restores() {
    let _l = cpu_lock();
    let cfg = PrivateConfig::new(CONTROL);
    let agent = Agent::start(&cfg);
    let g = group("restart");
    // Always over its quota: 2 spinning threads at 0.5 CPU, for longer than
    // the test can take anywhere (killed at its end): a 12 s burner ended
    // before "raised again" on the 6.1 VM lane (agent starts take seconds
    // under TCG) and nothing throttled was left to raise.
    let mut burn = burn_in(&g, &["--threads", "2", "--ms", "300000"]);
    let id = format!("restart-{}", unique());
    let log = register(&cfg, &id, &g, burn.id(), true);
    wait_for("quota raised", Duration::from_secs(5), || {
        values(&g.group).0 > QUOTA
    });
    let journal = cfg.state_dir.join("control").join(format!("{id}.json"));
    assert!(journal.is_file(), "originals journalled");
    agent.kill();
    let raised = values(&g.group);
    assert!(
        raised.0 > QUOTA,
        "SIGKILL leaves the raised values: {raised:?}"
    );

    let agent = Agent::start(&cfg);
    let restore = |log: &[Value]| {
        of_type(log, "control")
            .into_iter()
            .find(|c| c["cause"] == "agent_restart")
            .cloned()
    };
    wait_for(
        "the restart's restore record",
        Duration::from_secs(5),
        || restore(&read_log(&log)).is_some(),
    );
    let r = restore(&read_log(&log)).unwrap();
    assert_eq!(r["action"], "restore", "{r}");
    assert_eq!(
        r["after"],
        json!({"quota_us": QUOTA, "period_us": PERIOD, "burst_us": 0}),
        "{r}"
    );
    assert_eq!(u(&r, &["before", "quota_us"]), raised.0, "{r}");
    // Control goes on from the originals.
    wait_or_explain("raised again", &agent, &log, &g, &mut burn, || {
        values(&g.group).0 > QUOTA
    });

    // An operator's update (what `runc update --cpu-quota` writes) wins.
    let update = UPDATE;
    std::fs::write(g.group.cpu_dir.join("cpu.cfs_quota_us"), update.to_string())
        .or_else(|_| {
            std::fs::write(
                g.group.cpu_dir.join("cpu.max"),
                format!("{update} {PERIOD}"),
            )
        })
        .unwrap();
    let adopted = |log: &[Value]| {
        of_type(log, "control")
            .into_iter()
            .find(|c| c["action"] == "adopt")
            .cloned()
    };
    wait_for("the update adopted", Duration::from_secs(5), || {
        adopted(&read_log(&log)).is_some()
    });
    let a = adopted(&read_log(&log)).unwrap();
    assert_eq!(a["cause"], "operator_update", "{a}");
    assert_eq!(u(&a, &["original", "quota_us"]), update, "{a}");
    let new_original = a["original"].clone();
    // Later raises count from the update and stay under 300 % of it.
    wait_or_explain(
        "raised from the update",
        &agent,
        &log,
        &g,
        &mut burn,
        || values(&g.group).0 > update,
    );
    assert!(values(&g.group).0 <= 3 * update);

    // Agent stop: the (new) originals back; the container keeps running.
    let output = agent.output.clone();
    drop(agent);
    let now = values(&g.group);
    assert_eq!(
        json!({"quota_us": now.0, "period_us": now.1, "burst_us": now.2}),
        new_original,
        "agent stop restores the adopted original\ncontrols:\n{}\nagent output:\n{}",
        of_type(&read_log(&log), "control")
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join("\n"),
        std::fs::read_to_string(&output).unwrap_or_default()
    );
    let last = of_type(&read_log(&log), "control")
        .last()
        .cloned()
        .cloned()
        .unwrap();
    assert_eq!(
        (&last["action"], &last["cause"]),
        (&json!("restore"), &json!("agent_stop")),
        "{last}"
    );
    assert!(!journal.exists(), "nothing left to restore");
    let _ = burn.kill();
    let _ = burn.wait();
}

#[test]
fn runc_container_opts_in_through_the_hook_and_runc_update_wins() {
    let _l = cpu_lock();
    let cfg = PrivateConfig::new(CONTROL);
    let _agent = Agent::start(&cfg);
    let rt = OciCli::throttlewatch(&cfg);
    let opts = ContainerOpts::busy(2, 30)
        .quota(QUOTA as i64, PERIOD)
        .annotation("throttlewatch.io/cpu-control", "auto");
    let b = Bundle::new(
        &format!("tw-control-runc-{}-{}", std::process::id(), unique()),
        &opts,
    );
    // The most weight, so the container reaches its quota on a loaded
    // machine (at the default weight, under load 9, it was not throttled
    // after the update, and nothing was raised from it).
    b.edit(|c| c["linux"]["resources"]["cpu"]["shares"] = json!(262144u64));
    let o = rt.run_detached(&b);
    assert!(o.status.success(), "run -d: {}", text(&o));
    wait_for(
        "quota raised in the runc container",
        Duration::from_secs(10),
        || b.quota_us().is_some_and(|q| q > QUOTA),
    );
    let log_path = cfg.log_of(&b.id);
    let start = of_type(&read_log(&log_path), "start")[0].clone();
    assert_eq!(start["qos"]["request"]["cpu_control"], "auto", "{start}");
    let update = UPDATE;
    let o = rt.run(&["update", "--cpu-quota", &update.to_string(), &b.id]);
    assert!(o.status.success(), "update: {}", text(&o));
    let adopted = |log: &[Value]| {
        of_type(log, "control")
            .into_iter()
            .find(|c| c["action"] == "adopt")
            .cloned()
    };
    wait_for("runc update adopted", Duration::from_secs(5), || {
        adopted(&read_log(&log_path)).is_some()
    });
    let a = adopted(&read_log(&log_path)).unwrap();
    assert_eq!(
        (u(&a, &["original", "quota_us"]), &a["cause"]),
        (update, &json!("operator_update")),
        "{a}"
    );
    wait_for("raised from the update", Duration::from_secs(10), || {
        b.quota_us().is_some_and(|q| q > update)
    });
    assert!(b.quota_us().unwrap() <= 3 * update);
    assert!(rt.run(&["delete", "-f", &b.id]).status.success());
    wait_for("the log's end", Duration::from_secs(10), || {
        !of_type(&read_log(&log_path), "end").is_empty()
    });
}
