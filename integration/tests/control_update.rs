//! Issue 15: an operator's update during control, through the real stacks:
//! `docker update --cpus` (a private dockerd 20.10 with the `throttlewatch`
//! runtime: dockerd -> containerd -> runc shim -> our wrapper -> runc
//! update) and the shim's own `Update` (a private containerd 1.6 running
//! containerd-shim-throttlewatch-v2, called over its ttrpc socket the way
//! containerd sends it: `ctr` 1.6 has no update command). In both, the
//! container opts in through the environment (`THROTTLEWATCH_CPU_CONTROL`,
//! allowed by `[qos] env_keys`: Docker 20.10 has no `--annotation`), gets
//! its quota raised, and the update's quota becomes the new original: an
//! `adopt` record (`operator_update`), later raises counted from it, within
//! 300 % of it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use throttlewatch_cgroup::proc::cpu_cgroup_of_pid;
use throttlewatch_cgroup::{CpuCgroup, Hierarchies};
use throttlewatch_integration::bundle::text as out_text;
use throttlewatch_integration::containerd::{IMAGE_NAME, SHIM_RUNTIME};
use throttlewatch_integration::daemons::{Agent, Dockerd, PrivateConfig, BUSYBOX_IMAGE};
use throttlewatch_integration::shim::{setup, shim_update, text, wait_until};
use throttlewatch_integration::{cpu_lock, max_cpu_weight, of_type, read_log};

/// Control on (the node guard off: this shared machine's pressure is not
/// the test's), the opt-in allowed from the environment.
const CONTROL: &str =
    "[qos]\nenv_keys = [\"watch\", \"threshold\", \"cpu-burst\", \"cpu-control\"]\n\
     [control]\nenabled = true\npressure_psi_some_percent = 100.0\npressure_idle_percent = 0.0\n";
const QUOTA: u64 = 50_000;
/// Off the controller's grid: its raises step by 20 % of QUOTA (60 000, 70 000,
/// ...), and an update to the value it holds is no change the kernel can show.
const UPDATE: u64 = 73_000;
/// Two spinning shells, for longer than the test (removed at its end).
const BUSY: &str = "(while :; do :; done) & (while :; do :; done) & sleep 120";

/// The most weight for the container's group and its parent (dockerd's
/// cgroup-parent, containerd's namespace group: 1024 by default, so on a
/// loaded machine the whole subtree got ~0.25 CPU and never reached a
/// 0.7 CPU quota), so the container reaches its quota.
fn weigh_up(h: &Hierarchies, g: &CpuCgroup) {
    let mut d = g.cpu_dir.clone();
    while d != h.cpu && d.starts_with(&h.cpu) {
        max_cpu_weight(&d);
        if !d.pop() {
            break;
        }
    }
}

fn quota_of(g: &CpuCgroup) -> u64 {
    g.limits().ok().and_then(|l| l.quota_us).unwrap_or(0)
}

fn adopted(log: &Path) -> Option<Value> {
    of_type(&read_log(log), "control")
        .into_iter()
        .find(|c| c["action"] == "adopt")
        .cloned()
}

/// Raised, updated to `UPDATE`, adopted, raised from it; `update` runs the
/// stack's update.
fn raised_updated_adopted(g: &CpuCgroup, log: &dyn Fn() -> PathBuf, update: &dyn Fn()) {
    wait_until("quota raised", Duration::from_secs(10), || {
        quota_of(g) > QUOTA
    });
    let start = of_type(&read_log(&log()), "start")[0].clone();
    assert_eq!(start["qos"]["request"]["cpu_control"], "auto", "{start}");
    let before = g.limits().unwrap();
    update();
    // Generous: with the other stack's test beside it on two CPUs, the
    // adoption after docker's update (dockerd, containerd, the runc shim,
    // the wrapper, then the controller's poll) did not come within 10 s
    // once in a whole-suite run (alone: 2 of 2 in 13 s); what is asserted
    // is what was adopted.
    wait_until("the update adopted", Duration::from_secs(30), || {
        adopted(&log()).is_some()
    });
    let a = adopted(&log()).unwrap();
    eprintln!("raised to {before:?}, then adopted: {a}");
    assert_eq!(a["cause"], "operator_update", "{a}");
    assert_eq!(a["original"]["quota_us"], json!(UPDATE), "{a}");
    assert_eq!(a["original"]["period_us"], json!(100_000), "{a}");
    // Both stacks hold the burst across runc's update: the burst the
    // controller raised stays its own to hand back, not a new original.
    assert_eq!(a["original"]["burst_us"], json!(0), "{a}");
    let t = Instant::now();
    while quota_of(g) <= UPDATE {
        if t.elapsed() > Duration::from_secs(10) {
            let c: Vec<String> = of_type(&read_log(&log()), "control")
                .iter()
                .map(|c| c.to_string())
                .collect();
            panic!(
                "raised from the update within 10 s: {:?}, cpu.stat {:?}\n{}",
                g.limits(),
                g.cpu_stat(),
                c.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(quota_of(g) <= 3 * UPDATE, "{:?}", g.limits());
    for c in of_type(&read_log(&log()), "control") {
        if c["action"] == "raise" && c["original"]["quota_us"] == json!(UPDATE) {
            assert!(
                c["after"]["quota_us"].as_u64().unwrap() <= 3 * UPDATE,
                "{c}"
            );
        }
    }
}

#[test]
fn docker_update_during_control_becomes_the_new_original() {
    let _cpu = cpu_lock();
    let cfg = PrivateConfig::new(CONTROL);
    let _agent = Agent::start(&cfg);
    let d = Dockerd::start(&cfg);
    let o = d.docker(&[
        "run",
        "-d",
        "--network",
        "none",
        "--runtime",
        "throttlewatch",
        "--cpus",
        "0.5",
        // The most weight: the container reaches its quota on a loaded machine.
        "--cpu-shares",
        "262144",
        "-e",
        "THROTTLEWATCH_CPU_CONTROL=auto",
        BUSYBOX_IMAGE,
        "sh",
        "-c",
        BUSY,
    ]);
    assert!(
        o.status.success(),
        "docker run: {}\n{}",
        out_text(&o),
        d.log()
    );
    let id = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let h = Hierarchies::discover().unwrap();
    let dir = d.cgroup_dir("cpu", &id);
    let rel = dir
        .strip_prefix(&h.cpu)
        .unwrap()
        .to_string_lossy()
        .to_string();
    let g = CpuCgroup::open(&h, &format!("/{rel}")).unwrap();
    weigh_up(&h, &g);
    raised_updated_adopted(&g, &|| cfg.log_of(&id), &|| {
        let cpus = format!("{}", UPDATE as f64 / 100_000.0);
        let o = d.docker(&["update", "--cpus", &cpus, &id]);
        assert!(o.status.success(), "docker update: {}", out_text(&o));
    });
    let o = d.docker(&["rm", "-f", &id]);
    assert!(o.status.success(), "docker rm: {}", out_text(&o));
    wait_until("the log's end", Duration::from_secs(10), || {
        !of_type(&read_log(&cfg.log_of(&id)), "end").is_empty()
    });
}

#[test]
fn shim_update_during_control_becomes_the_new_original() {
    let _cpu = cpu_lock();
    let s = setup();
    let mut cfg = std::fs::read_to_string(&s.config).unwrap();
    cfg.push_str(CONTROL);
    std::fs::write(&s.config, cfg).unwrap();
    let _agent = s.start_agent();
    let id = "ctl-upd";
    let out = s.ctd.ctr(&[
        "run",
        "-d",
        "--runtime",
        SHIM_RUNTIME,
        "--cpu-quota",
        "50000",
        "--cpu-period",
        "100000",
        "--cpu-shares",
        "262144",
        "--env",
        "THROTTLEWATCH_CPU_CONTROL=auto",
        IMAGE_NAME,
        id,
        "sh",
        "-c",
        BUSY,
    ]);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stderr),
        s.ctd.log()
    );
    let pid: u32 = text(&s.ctd.ctr(&["task", "ls"]).stdout)
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 3 && f[0] == id).then(|| f[1].parse().unwrap())
        })
        .expect("task listed");
    let h = Hierarchies::discover().unwrap();
    let g = CpuCgroup::open(
        &h,
        &cpu_cgroup_of_pid(Path::new("/proc"), pid, h.mode).unwrap(),
    )
    .unwrap();
    weigh_up(&h, &g);
    let logs = s.tw.0.join("logs");
    let log = || {
        std::fs::read_dir(&logs)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.to_string_lossy().contains(id))
            .unwrap_or_else(|| logs.join("none"))
    };
    raised_updated_adopted(&g, &log, &|| {
        shim_update(
            &s,
            id,
            &format!("{{\"cpu\":{{\"quota\":{UPDATE},\"period\":100000}}}}"),
        )
        .unwrap()
    });
    let _ = s.ctd.ctr(&["task", "kill", "-s", "SIGKILL", id]);
    wait_until("the task stopped", Duration::from_secs(10), || {
        text(&s.ctd.ctr(&["task", "ls"]).stdout)
            .lines()
            .all(|l| !l.starts_with(id) || l.contains("STOPPED"))
    });
    let _ = s.ctd.ctr(&["task", "rm", id]);
    let _ = s.ctd.ctr(&["container", "rm", id]);
}
