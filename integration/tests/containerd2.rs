//! The shim under containerd 2.3.4 (../shared/bin), the containerd nodes
//! run now: its `-info` answered as containerd-shim-runc-v2 answers it (the
//! same OCI runtime features, the options echoed), containerd 2.x logging no
//! runtime-info failure for our containers, and a throttled container
//! logged start..end that agrees with `cpu.stat`. Run `cargo build
//! --workspace --bins` first.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use containerd_shim::protos::protobuf::well_known_types::any::Any;
use containerd_shim::protos::protobuf::Message;
use containerd_shim::protos::types::introspection::RuntimeInfo;
use throttlewatch_integration::shim::{run_args, setup_2x, text, wait_until};
use throttlewatch_integration::{bin, cpu_lock, of_type, read_log, shared_bin};

/// `SHIM -info` with `stdin`, decoded.
fn info(shim: &Path, stdin: &[u8]) -> RuntimeInfo {
    let mut c = Command::new(shim)
        .arg("-info")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(stdin).unwrap();
    let o = c.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "{} -info: {}",
        shim.display(),
        text(&o.stderr)
    );
    RuntimeInfo::parse_from_bytes(&o.stdout)
        .unwrap_or_else(|e| panic!("{} -info: not a RuntimeInfo: {e}", shim.display()))
}

#[test]
fn info_answers_like_the_runc_shim() {
    let ours = bin("containerd-shim-throttlewatch-v2");
    let runc = shared_bin("containerd-shim-runc-v2");
    // No options (ctr), then runc options (the CRI plugin's for runc).
    let mut opts = Any::new();
    opts.type_url = "containerd.runc.v1.Options".into();
    opts.value = vec![0x48, 0x01]; // systemd_cgroup = true (field 9)
    for stdin in [Vec::new(), opts.write_to_bytes().unwrap()] {
        let (a, b) = (info(&runc, &stdin), info(&ours, &stdin));
        assert_eq!(a.name, "io.containerd.runc.v2");
        assert_eq!(b.name, "io.containerd.throttlewatch.v2");
        assert!(!b.version.version.is_empty(), "{b:?}");
        let (fa, fb) = (a.features.as_ref(), b.features.as_ref());
        let fa = fa.expect("the runc shim reports features");
        let fb = fb.unwrap_or_else(|| panic!("no features: {b:?}"));
        assert_eq!(fb.type_url, fa.type_url);
        assert_eq!(
            text(&fb.value),
            text(&fa.value),
            "the OCI runtime features, byte for byte"
        );
        let f: serde_json::Value = serde_json::from_slice(&fb.value).unwrap();
        assert!(f["linux"]["namespaces"].is_array(), "{f}");
        assert_eq!(b.options, a.options, "options echoed like the runc shim");
        assert_eq!(b.annotations, a.annotations);
    }
    let o = Command::new(&ours)
        .arg("-info")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().unwrap().write_all(&[0xff, 0xff, 0xff])?;
            c.wait_with_output()
        })
        .unwrap();
    assert!(!o.status.success(), "bad options must fail");
    assert!(
        text(&o.stderr).contains("runtime options"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn containerd_2_runs_our_containers_with_no_runtime_info_error() {
    let s = setup_2x();
    let out = s.ctd.ctr(&run_args("echo2", &[], &["echo", "hello"]));
    assert!(
        out.status.success(),
        "ctr run: {}\n{}",
        text(&out.stderr),
        s.ctd.log()
    );
    assert_eq!(text(&out.stdout), "hello\n");
    let out = s.ctd.ctr(&run_args("exit3", &[], &["sh", "-c", "exit 3"]));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    wait_until("shims to exit", Duration::from_secs(5), || {
        s.ctd.shim_pids().is_empty()
    });
    let log = s.ctd.log();
    assert!(
        !log.contains("runtime info") && !log.contains("-namespace is required"),
        "containerd 2.3.4 could not read our runtime info:\n{log}"
    );
}

#[test]
fn throttled_container_on_containerd_2_agrees_with_cpu_stat() {
    let _cpu = cpu_lock();
    let s = setup_2x();
    let _agent = s.start_agent();
    let burn = "(timeout 3 sh -c 'while :; do :; done') & timeout 3 sh -c 'while :; do :; done'; wait; true";
    let quota = ["--cpu-quota", "20000", "--cpu-period", "100000"];
    let out = s
        .ctd
        .ctr(&run_args("throttled2", &quota, &["sh", "-c", burn]));
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stderr),
        s.ctd.log()
    );
    let logs = s.tw.0.join("logs");
    let path = std::fs::read_dir(&logs)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().contains("throttled2"))
        .unwrap_or_else(|| panic!("no log for throttled2 in {}", logs.display()));
    wait_until("the end record", Duration::from_secs(5), || {
        !of_type(&read_log(&path), "end").is_empty()
    });
    let log = throttlewatch_integration::assert_whole_log(&path);
    let end = of_type(&log, "end")[0];
    assert_eq!(end["exit_code"], 0, "{end}");
    let probe = end["probe_throttled_ns"].as_u64().unwrap();
    let kernel = end["kernel_throttled_ns"].as_u64().unwrap();
    assert!(kernel > 100_000_000, "too little throttling: {end}");
    let err = (probe as f64 - kernel as f64).abs() / kernel as f64;
    eprintln!(
        "containerd 2.3.4 shim fidelity: probe {probe} ns, kernel {kernel} ns, error {:.3} %",
        err * 100.0
    );
    assert!(err <= 0.02, "probe {probe} vs kernel {kernel}: {end}");
}
