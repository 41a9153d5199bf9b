//! The `throttlewatch` command line: bad input gets one clear line and exit
//! status 2 with nothing left behind; exit statuses and signals pass through.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use throttlewatch_cgroup::{Hierarchies, TransientCgroup};
use throttlewatch_integration::{bin, burn_in, cpu_lock, of_type, read_log, Scratch};

fn tw(args: &[&str]) -> Output {
    Command::new(bin("throttlewatch"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn leftovers() -> Vec<String> {
    let h = Hierarchies::discover().unwrap();
    std::fs::read_dir(&h.cpu)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("throttlewatch-run-"))
        .collect()
}

#[test]
fn bad_input_is_one_clear_line_with_status_2() {
    let _l = cpu_lock();
    let d = Scratch::new("cli");
    let log = d.0.join("never.jsonl");
    let l = log.to_str().unwrap();
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["run", "--log", l, "--cpus", "abc", "--", "true"],
            &["--cpus", "\"abc\"", "expected"],
        ),
        (
            &["run", "--log", l, "--cpus", "-1", "--", "true"],
            &["--cpus", "-1"],
        ),
        (
            &[
                "run", "--log", l, "--cpus", "0.5", "--burst", "200ms", "--", "true",
            ],
            &["--burst", "200ms", "larger than the quota"],
        ),
        (
            &["run", "--log", l, "--burst", "5ms", "--", "true"],
            &["--burst", "needs a quota"],
        ),
        (
            &[
                "run", "--log", l, "--burst", "lots", "--cpus", "1", "--", "true",
            ],
            &["--burst", "lots"],
        ),
        (
            &["run", "--log", l, "--cpuset", "0-999", "--", "true"],
            &["--cpuset", "0-999", "not available"],
        ),
        (
            &["run", "--log", l, "--cpuset", "two", "--", "true"],
            &["--cpuset", "two"],
        ),
        (
            &["run", "--log", l, "--", "no-such-command-tw"],
            &["command not found", "no-such-command-tw"],
        ),
        (
            &["run", "--log", "/nonexistent-dir/x.jsonl", "--", "true"],
            &["--log", "does not exist"],
        ),
        (
            &["run", "--log", l, "--threshold", "soon", "--", "true"],
            &["--threshold", "soon"],
        ),
        (
            &["watch", "--log", l, "--cgroup", "/no/such/group"],
            &["--cgroup", "/no/such/group", "no such cgroup"],
        ),
        (
            &["watch", "--log", l, "--pid", "999999999"],
            &["--pid", "999999999", "no such process"],
        ),
        (&["watch", "--log", l, "--pid", "abc"], &["--pid", "abc"]),
        (
            &["watch", "--log", l, "--pid", "1", "--duration", "forever"],
            &["--duration", "forever"],
        ),
    ];
    for (args, wants) in cases {
        let o = tw(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(
            err.trim().lines().count(),
            1,
            "{args:?}: one line, got: {err}"
        );
        for w in *wants {
            assert!(err.contains(w), "{args:?}: {err:?} should mention {w}");
        }
        assert!(!log.exists(), "{args:?}: a log was left behind");
    }
    assert!(leftovers().is_empty(), "stray cgroups: {:?}", leftovers());
}

#[test]
fn exit_status_and_signals_pass_through() {
    let _l = cpu_lock();
    let d = Scratch::new("cli2");
    let log = d.0.join("x.jsonl");
    let l = log.to_str().unwrap();
    let o = tw(&[
        "run",
        "--quiet",
        "--log",
        l,
        "--cpus",
        "0.5",
        "--",
        "sh",
        "-c",
        "echo out; exit 7",
    ]);
    assert_eq!(o.status.code(), Some(7));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "out\n",
        "stdout passes through"
    );
    let end = read_log(&log);
    assert_eq!(of_type(&end, "end")[0]["exit_code"], 7);
    let o = tw(&[
        "run",
        "--quiet",
        "--log",
        l,
        "--",
        "sh",
        "-c",
        "kill -TERM $$",
    ]);
    assert_eq!(o.status.code(), Some(128 + 15));

    // SIGTERM to throttlewatch: the command is stopped, the end record written.
    let child = Command::new(bin("throttlewatch"))
        .args([
            "run", "--quiet", "--log", l, "--cpus", "0.2", "--", "sleep", "30",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(128 + 15));
    let log_v = read_log(&log);
    let end = of_type(&log_v, "end");
    assert_eq!(end.len(), 1);
    assert_eq!(end[0]["reason"], "signal");
    assert!(leftovers().is_empty(), "stray cgroups: {:?}", leftovers());
}

#[test]
fn watch_an_existing_cgroup_for_a_duration() {
    let _l = cpu_lock();
    let h = Hierarchies::discover().unwrap();
    let cg =
        TransientCgroup::create(&h, &format!("/tw-test-watch-{}", std::process::id())).unwrap();
    cg.group.set_quota(Some(20_000), 100_000).unwrap();
    // 2.5 s of watching: under emulation (the VM lane) loading the probe
    // takes a good part of a second, and a 1.5 s watch once saw no freeze.
    let mut b = burn_in(&cg, &["--threads", "2", "--ms", "5000"]);
    let d = Scratch::new("watch");
    let log = d.0.join("w.jsonl");
    let o = tw(&[
        "watch",
        "--pid",
        &b.id().to_string(),
        "--duration",
        "2500ms",
        "--json",
        "--log",
        log.to_str().unwrap(),
    ]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let err = String::from_utf8_lossy(&o.stderr);
    let json_lines: Vec<serde_json::Value> = err
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(
        json_lines.iter().any(|v| v["type"] == "throttle"),
        "--json shows live throttle events"
    );
    assert!(json_lines.iter().any(|v| v["type"] == "end"));
    let v = read_log(&log);
    assert_eq!(
        of_type(&v, "start")[0]["cgroup_path"],
        cg.group.rel.as_str()
    );
    let end = of_type(&v, "end")[0];
    assert_eq!(end["reason"], "duration");
    assert!(end["freezes"].as_u64().unwrap() > 0);
    b.kill().unwrap();
    b.wait().unwrap();
    // The full path under the mount is accepted too.
    let full = cg.group.cpu_dir.to_str().unwrap().to_string();
    let o = tw(&[
        "watch",
        "--cgroup",
        &full,
        "--duration",
        "200ms",
        "--quiet",
        "--log",
        log.to_str().unwrap(),
    ]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(Path::new(&log).exists());
}

#[test]
fn topology_on_a_fixture_tree() {
    let d = Scratch::new("topo");
    let sys = d.0.join("sys");
    let w = |p: &str, s: &str| {
        let f = sys.join(p);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, s).unwrap();
    };
    w("devices/system/cpu/online", "0-7\n");
    w("devices/system/node/node0/cpulist", "0-3\n");
    w("devices/system/node/node1/cpulist", "4-7\n");
    for (i, bus) in ["0000:1a:00.0", "0000:9b:00.0"].iter().enumerate() {
        w(&format!("bus/pci/devices/{bus}/vendor"), "0x10de\n");
        w(&format!("bus/pci/devices/{bus}/class"), "0x030200\n");
        w(
            &format!("bus/pci/devices/{bus}/numa_node"),
            &format!("{i}\n"),
        );
    }
    let o = tw(&[
        "topology",
        "--sysfs-root",
        sys.to_str().unwrap(),
        "--procfs-root",
        d.0.join("proc").to_str().unwrap(),
        "--annotation",
        "throttlewatch.io/cpuset=gpu-local",
        "--env",
        "NVIDIA_VISIBLE_DEVICES=1",
        "--json",
    ]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["plan"]["cpus"], "4-7", "GPU 1 sits on node 1: {v}");
    assert_eq!(v["topology"]["gpus"].as_array().unwrap().len(), 2);
}

/// Issue 19: an unprivileged user gets one line saying what is needed, not a
/// warning per fallback the probe loader tries on its way to EPERM.
#[test]
fn unprivileged_run_says_once_what_it_needs() {
    use std::os::unix::fs::PermissionsExt;
    // A copy the unprivileged user can reach, wherever the checkout lives.
    let d = Scratch::new("unpriv");
    std::fs::set_permissions(&d.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = d.0.join("throttlewatch");
    std::fs::copy(bin("throttlewatch"), &exe).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(&exe)
        .args(["run", "--cpus", "1", "--", "true"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line, got: {err}");
    assert!(
        err.contains("needs root (or CAP_BPF + CAP_PERFMON + CAP_SYS_ADMIN)"),
        "{err}"
    );
}

/// Issue 19: diagnostics written to a file or a pipe carry no colour codes.
#[test]
fn diagnostics_in_a_pipe_have_no_colour() {
    let _l = cpu_lock();
    let d = Scratch::new("nocolour");
    let log = d.0.join("r.jsonl");
    let o = Command::new(bin("throttlewatch"))
        .env("THROTTLEWATCH_LOG", "debug")
        .env_remove("NO_COLOR")
        .args([
            "run",
            "--cpus",
            "1",
            "--log",
            log.to_str().unwrap(),
            "--",
            "true",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("DEBUG"),
        "the test needs diagnostics to look at: {err}"
    );
    assert!(!err.contains('\u{1b}'), "ANSI escapes in a pipe: {err:?}");
}

/// Issue 19: `watch --pid` of a process in the root cgroup says there is
/// nothing to throttle and writes no log.
#[test]
fn watch_pid_in_the_root_cgroup_has_nothing_to_watch() {
    let h = Hierarchies::discover().unwrap();
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    std::fs::write(h.cpu.join("cgroup.procs"), child.id().to_string()).unwrap();
    let d = Scratch::new("watchroot");
    let log = d.0.join("w.jsonl");
    let o = tw(&[
        "watch",
        "--pid",
        &child.id().to_string(),
        "--duration",
        "1s",
        "--log",
        log.to_str().unwrap(),
    ]);
    let _ = child.kill();
    let _ = child.wait();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("root cpu cgroup") && err.contains("no CPU limit"),
        "{err}"
    );
    assert!(!log.exists(), "a log was written for the root cgroup");
}

/// The flag names a Go-style `-help` text lists (`  -name type`).
fn go_flags(help: &str) -> Vec<String> {
    help.lines()
        .filter_map(|l| l.strip_prefix("  -"))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// The containerd 2.x runc shim the tests use (`$TW_SHARED_BIN`, else
/// `../shared/bin` beside the checkout, else /work/shared/bin), and whether
/// it is that one; else the one Debian's containerd 1.6 installs.
fn runc_shim() -> (std::path::PathBuf, bool) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let shared: Vec<std::path::PathBuf> = std::env::var_os("TW_SHARED_BIN")
        .map(std::path::PathBuf::from)
        .into_iter()
        .chain([repo.join("../shared/bin"), "/work/shared/bin".into()])
        .map(|d| d.join("containerd-shim-runc-v2"))
        .collect();
    if let Some(p) = shared.into_iter().find(|p| p.exists()) {
        return (p, true);
    }
    let debian = std::path::PathBuf::from("/usr/bin/containerd-shim-runc-v2");
    assert!(
        debian.exists(),
        "containerd-shim-runc-v2: neither ../shared/bin's nor Debian's (apt-get install containerd)"
    );
    eprintln!("NOTE: containerd 2.x's runc shim not found (../shared/bin): comparing with Debian's 1.6 one");
    (debian, false)
}

#[test]
fn every_binary_answers_help_like_the_component_it_stands_in_for() {
    let help = |b: &str, flag: &str| {
        Command::new(bin(b))
            .arg(flag)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let o = help("throttlewatch", "--help");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{o:?}");
    for sub in ["run", "watch", "demo", "burn", "agent", "report", "install"] {
        assert!(out.contains(&format!("  {sub} ")), "{sub} missing: {out}");
    }
    let o = help("throttlewatch-hook", "--help");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{o:?}");
    assert!(
        out.contains("createRuntime") && out.contains("poststop"),
        "{out}"
    );
    // The wrapper is runc to its callers: runc's own help, runc's status.
    let o = help("throttlewatch-runtime", "--help");
    assert!(o.status.success(), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("runc"), "{o:?}");
    // The shim lists its flags as the runc shim does (Go's flag package: on
    // stderr, exit 0), and every one of them is a flag of the runc shim's.
    let o = help("containerd-shim-throttlewatch-v2", "-help");
    let ours = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{o:?}");
    assert!(ours.starts_with("Usage of "), "{ours}");
    let (shim, two) = runc_shim();
    let r = Command::new(shim).arg("-help").output().unwrap();
    let mut theirs = go_flags(&String::from_utf8_lossy(&r.stderr));
    if !two {
        // containerd 1.6's shim predates -info and -version (2.x has both).
        theirs.extend(["info".to_string(), "version".to_string()]);
    }
    let ours = go_flags(&ours);
    for f in [
        "address",
        "bundle",
        "id",
        "namespace",
        "socket",
        "info",
        "version",
    ] {
        assert!(ours.iter().any(|o| o == f), "-{f} missing: {ours:?}");
    }
    for f in &ours {
        assert!(
            theirs.contains(f),
            "-{f} is not a runc shim flag ({theirs:?})"
        );
    }
}

/// The quickstart's demo on this machine as it is (the suite runs other
/// binaries at the same time): the limit it picks is below what the threads
/// got, the kernel throttles them, the log agrees with `cpu.stat`, and it
/// prints the `run` command it amounts to, and nothing of the workload's
/// own (its `{"pid":…,"tids":[…]}` line). No cgroup of its own is left.
#[test]
fn demo_throttles_whatever_else_runs_and_prints_its_command() {
    let _l = cpu_lock();
    let d = Scratch::new("demo");
    let log = d.0.join("demo.jsonl");
    let o = tw(&[
        "demo",
        "--quiet",
        "--duration",
        "1500ms",
        "--log",
        log.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        !out.contains("\"tids\"") && !err.contains("\"tids\""),
        "the workload's tids line among the demo's output:\n{out}\n{err}"
    );
    let said: Vec<&str> = err.lines().take(2).collect();
    assert!(said[0].starts_with("demo: 4 busy threads got "), "{err}");
    let (got, cpus) = {
        let got: f64 = said[0]["demo: 4 busy threads got ".len()..]
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let cpus: f64 = said[0].rsplit("--cpus ").next().unwrap().parse().unwrap();
        (got, cpus)
    };
    assert!(
        cpus < got && cpus >= 0.05,
        "limit {cpus} for {got} CPUs got"
    );
    assert!(
        said[1].starts_with(&format!("+ throttlewatch run --cpus {cpus} --log ")),
        "{err}"
    );
    assert!(
        said[1].ends_with("-- throttlewatch burn --threads 4 --ms 1500"),
        "{err}"
    );
    let v = read_log(&log);
    let start = &of_type(&v, "start")[0];
    assert_eq!(
        start["quota_us"].as_u64(),
        Some((cpus * 100_000.0).round() as u64),
        "{start}"
    );
    let end = &of_type(&v, "end")[0];
    let k = end["kernel_throttled_ns"].as_u64().unwrap();
    let p = end["probe_throttled_ns"].as_u64().unwrap();
    assert!(k >= 100_000_000, "throttled only {k} ns: {end}");
    assert!(p.abs_diff(k) * 100 <= 5 * k, "probe {p} vs cpu.stat {k}");
    let h = Hierarchies::discover().unwrap();
    let stray: Vec<_> = std::fs::read_dir(&h.cpu)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("throttlewatch-demo-") || n.starts_with("throttlewatch-run-"))
        .collect();
    assert!(stray.is_empty(), "stray cgroups: {stray:?}");
}
