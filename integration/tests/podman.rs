//! Debian's Podman 4.3 with the OCI hook files `throttlewatch install podman`
//! writes (oci-hooks(5) 1.0.0, createRuntime + poststop, an annotation match):
//! `podman run --annotation throttlewatch.io/cpu-burst=10ms --cpus 0.2` gives
//! the burst in the container's cgroup and a log from `start` to `end` that
//! agrees with the kernel's `cpu.stat`; a container without our annotations
//! runs no hook and gets no log; `uninstall podman` removes exactly our files.
//! Podman runs on private storage with `--hooks-dir` pointing at the tree the
//! installer wrote (`--etc-root`), so the host's hooks.d is never touched.
//! CRI-O gets the same files in the hooks_dir its own configuration names;
//! their content is checked here, and a real CRI-O runs them in crio.rs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use throttlewatch_integration::bundle::text;
use throttlewatch_integration::daemons::{Agent, PrivateConfig};
use throttlewatch_integration::podman::{Podman, IMAGE, ULIMITS};
use throttlewatch_integration::{bin, cpu_lock, of_type, read_log, Scratch};

const HOOKS_D: &str = "etc/containers/oci/hooks.d";

fn throttlewatch(cfg: &Path, args: &[&str], root: &Path) -> Output {
    let hook_dir = bin("throttlewatch-hook").parent().unwrap().to_path_buf();
    let o = Command::new(bin("throttlewatch"))
        .arg("--config")
        .arg(cfg)
        .args(args)
        .arg("--etc-root")
        .arg(root)
        .args(if args[0] == "install" {
            vec!["--bin-dir".into(), hook_dir.into_os_string()]
        } else {
            vec![]
        })
        .output()
        .unwrap();
    assert!(o.status.success(), "throttlewatch {args:?}: {}", text(&o));
    o
}

fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| (e.path(), std::fs::read(e.path()).unwrap()))
        .collect();
    v.sort();
    v
}

fn read(p: PathBuf) -> String {
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .to_string()
}

#[test]
fn podman_run_with_hook_files_logs_bursts_and_agrees_with_the_kernel() {
    let _cpu = cpu_lock();
    let cfg = PrivateConfig::new("");
    let _agent = Agent::start(&cfg);
    let tree = Scratch::new("podman-etc");
    let hooks = tree.0.join(HOOKS_D);
    std::fs::create_dir_all(&hooks).unwrap();
    // Someone else's hook file, which install and uninstall must leave alone.
    std::fs::write(hooks.join("oci-other.json"), "{\"version\": \"1.0.0\"}\n").unwrap();
    let before = files(&hooks);

    let dry = throttlewatch(&cfg.path, &["install", "podman", "--dry-run"], &tree.0);
    assert!(
        String::from_utf8_lossy(&dry.stdout).contains("\"createRuntime\""),
        "{}",
        text(&dry)
    );
    assert_eq!(files(&hooks), before, "--dry-run wrote something");
    throttlewatch(&cfg.path, &["install", "podman"], &tree.0);
    let names: Vec<String> = files(&hooks)
        .iter()
        .map(|(p, _)| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "oci-other.json",
            "throttlewatch-createRuntime.json",
            "throttlewatch-poststop.json"
        ]
    );
    // Podman skips a file it cannot read; ours must load: it validates them
    // on every run, so a bad file would show as an error here.
    std::fs::remove_file(hooks.join("oci-other.json")).unwrap();

    let p = Podman::new(&hooks);
    // The spinning stops a second before the container exits: runc removes
    // the cgroup before poststop under Podman, so `end`'s kernel figure is the
    // agent's last reading of cpu.stat (issue 11); throttling in the last
    // poll before the removal would be in the probe's total only.
    let busy =
        "for i in 1 2 3; do (while :; do :; done) & done; sleep 4; kill $(jobs -p); sleep 1; true";
    let mut args = vec!["run", "-d", "--network", "none"];
    args.extend(ULIMITS);
    args.extend([
        "--cgroup-parent",
        &p.cgroup_parent,
        "--annotation",
        "throttlewatch.io/cpu-burst=10ms",
        "--cpus",
        "0.2",
        IMAGE,
        "sh",
        "-c",
        busy,
    ]);
    let o = p.run(&args);
    assert!(
        o.status.success(),
        "podman run: {}\n{}",
        text(&o),
        cfg.hook_log()
    );
    let id = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let cpu = p.cgroup_dir("cpu", &id);
    assert_eq!(read(cpu.join("cpu.cfs_quota_us")), "20000");
    assert_eq!(
        read(cpu.join("cpu.cfs_burst_us")),
        "10000",
        "the burst from --annotation, written by the createRuntime hook; hook log: {}",
        cfg.hook_log()
    );

    // A container without our annotations: no hook, no log.
    let mut plain = vec!["run", "--rm", "--network", "none"];
    plain.extend(ULIMITS);
    plain.extend(["--cgroup-parent", &p.cgroup_parent, IMAGE, "true"]);
    let o = p.run(&plain);
    assert!(o.status.success(), "podman run (plain): {}", text(&o));

    let o = p.run(&["wait", &id]);
    assert!(o.status.success(), "podman wait: {}", text(&o));
    let o = p.run(&["rm", &id]);
    assert!(o.status.success(), "podman rm: {}", text(&o));
    let path = cfg.log_of(&id);
    let t = Instant::now();
    while of_type(&read_log(&path), "end").is_empty() && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = read_log(&path);
    assert_eq!(log[0]["type"], "start", "{log:?}");
    assert_eq!(log.last().unwrap()["type"], "end", "{log:?}");
    assert_eq!(of_type(&log, "start").len(), 1);
    let start = &log[0];
    assert_eq!(start["container_id"], id.as_str());
    assert_eq!(start["qos"]["applied"]["burst_us"], 10_000, "{start}");
    let recs = of_type(&log, "throttle");
    assert!(!recs.is_empty(), "throttle records");
    let end = of_type(&log, "end")[0];
    let probe = end["probe_throttled_ns"].as_u64().unwrap();
    let kernel = end["kernel_throttled_ns"].as_u64().unwrap();
    let err = (probe as f64 - kernel as f64).abs() / kernel.max(1) as f64;
    eprintln!(
        "podman: probe {probe} ns, kernel {kernel} ns, error {:.3} %, {} throttle records, end reason {}",
        err * 100.0,
        recs.len(),
        end["reason"]
    );
    assert!(kernel > 100_000_000, "too little throttling: {end}");
    assert!(err <= 0.02, "probe {probe} vs kernel {kernel}");
    let logs: Vec<_> = std::fs::read_dir(&cfg.log_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".jsonl"))
        .collect();
    assert_eq!(
        logs.len(),
        1,
        "only the annotated container has a log: {logs:?}"
    );
    assert!(cfg.stray_files().is_empty(), "{:?}", cfg.stray_files());
    drop(p);

    std::fs::write(hooks.join("oci-other.json"), "{\"version\": \"1.0.0\"}\n").unwrap();
    throttlewatch(&cfg.path, &["uninstall", "podman"], &tree.0);
    assert_eq!(files(&hooks), before, "uninstall removes exactly our files");
}

/// CRI-O: the same files, in the hooks_dir CRI-O's own
/// configuration names (a drop-in here), else CRI-O's default; uninstall
/// removes exactly them.
#[test]
fn crio_gets_the_same_files_in_its_configured_hooks_dir() {
    let cfg = PrivateConfig::new("");
    let tree = Scratch::new("crio-etc");
    let conf_d = tree.0.join("etc/crio/crio.conf.d");
    std::fs::create_dir_all(&conf_d).unwrap();
    let before_default = tree.0.join("usr/share/containers/oci/hooks.d");
    throttlewatch(&cfg.path, &["install", "crio"], &tree.0);
    let default_files = files(&before_default);
    assert_eq!(default_files.len(), 2, "CRI-O's default hooks_dir");
    throttlewatch(&cfg.path, &["uninstall", "crio"], &tree.0);
    assert!(files(&before_default).is_empty());

    std::fs::write(
        conf_d.join("10-hooks.conf"),
        "[crio.runtime]\nhooks_dir = [\"/etc/containers/oci/hooks.d\"]\n",
    )
    .unwrap();
    throttlewatch(&cfg.path, &["install", "crio"], &tree.0);
    let hooks = tree.0.join(HOOKS_D);
    let written = files(&hooks);
    assert_eq!(written.len(), 2, "the configured hooks_dir");
    // The same content Podman ran above: the same generator, the same stages.
    for ((path, bytes), (dpath, dbytes)) in written.iter().zip(&default_files) {
        assert_eq!(path.file_name(), dpath.file_name());
        assert_eq!(bytes, dbytes);
        let v: serde_json::Value = serde_json::from_slice(bytes).unwrap();
        assert_eq!(v["version"], "1.0.0");
        let stage = v["stages"][0].as_str().unwrap();
        assert_eq!(
            v["hook"]["args"][1], stage,
            "the stage is the hook's argument"
        );
        assert!(v["when"]["annotations"]
            .get(r"^throttlewatch\.io/")
            .is_some());
        assert!(Path::new(v["hook"]["path"].as_str().unwrap()).exists());
    }
    throttlewatch(&cfg.path, &["uninstall", "crio"], &tree.0);
    assert!(files(&hooks).is_empty());
}
