//! One function per fuzz target: parse an input the way the daemons do and
//! check the properties that must hold for any input (no panic; round trips
//! keep what they read). `fuzz/fuzz_targets/*.rs` call these under
//! libFuzzer (nightly, `scripts/fuzz.sh`); `tests/replay.rs` runs every
//! saved input (`fuzz/corpus/<target>/`, `fuzz/regressions/<target>/`) on
//! stable in the normal test suite.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// What a target runs on one input.
pub type Target = fn(&[u8]);

/// Every target, by the name of its corpus directory and fuzz binary.
pub const TARGETS: [(&str, Target); 10] = [
    ("oci_state", oci_state),
    ("bundle_spec", bundle_spec),
    ("spec_modifiers", spec_modifiers),
    ("qos_request", qos_request),
    ("cpulist", cpulist),
    ("duration", duration),
    ("config", config),
    ("protocol", protocol),
    ("mountinfo", mountinfo),
    ("log_line", log_line),
];

fn text(data: &[u8]) -> &str {
    std::str::from_utf8(data).unwrap_or("")
}

/// The OCI state a hook reads on stdin.
pub fn oci_state(data: &[u8]) {
    let _ = throttlewatch_lifecycle::OciState::parse(data);
}

/// The parts of config.json the hook reads.
pub fn bundle_spec(data: &[u8]) {
    if let Ok(s) = serde_json::from_slice::<throttlewatch_lifecycle::BundleSpec>(data) {
        let _ = s.cpu_quota();
        let _ = s.orchestrator_cpus();
        let _ = s.container_name();
        let _ = s.is_pod_sandbox();
    }
}

/// The spec modifiers of the wrapper and the shim: never panic, and every
/// field of the input survives (unknown fields are kept).
pub fn spec_modifiers(data: &[u8]) {
    let Ok(mut spec) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let before = spec.clone();
    let ctx = throttlewatch_lifecycle::modifiers::ModifyContext {
        hook_path: PathBuf::from("/usr/local/bin/throttlewatch-hook"),
        config_path: None,
        cfg: Default::default(),
        // Both ways: the hook's spec and the wrapper's `create` (none of ours).
        create_runtime_hook: data.len().is_multiple_of(2),
        created_unix_ns: Some(1),
    };
    if throttlewatch_lifecycle::modifiers::apply_to_value(&mut spec, &ctx).is_err() {
        return;
    }
    if let (Some(b), Some(a)) = (before.as_object(), spec.as_object()) {
        for k in b.keys() {
            assert!(a.contains_key(k), "the modifiers dropped field {k:?}");
        }
    }
    let again = spec.clone();
    throttlewatch_lifecycle::modifiers::apply_to_value(&mut spec, &ctx).unwrap();
    let stamp = |v: &mut Value| {
        if let Some(a) = v.get_mut("annotations").and_then(Value::as_object_mut) {
            a.remove(&throttlewatch_qos::Key::CreatedUnixNs.annotation());
        }
    };
    let (mut x, mut y) = (again, spec);
    stamp(&mut x);
    stamp(&mut y);
    assert_eq!(x, y, "the modifiers are idempotent");
}

/// Annotations and environment: the first byte splits the input into
/// `key=value` lines for annotations and for the environment.
pub fn qos_request(data: &[u8]) {
    let t = text(data);
    let (a, e) = t.split_once('\u{0}').unwrap_or((t, ""));
    let ann: BTreeMap<String, String> = a
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (format!("throttlewatch.io/{k}"), v.to_string()))
        .collect();
    let env: Vec<String> = e.lines().map(str::to_string).collect();
    for policy in [
        throttlewatch_qos::Policy::default(),
        throttlewatch_qos::Policy {
            env_keys: vec!["qos-class".into(), "gpus".into()],
            min_threshold_us: 1000,
            max_burst_percent: 30,
            allow_exclusive: false,
            ..Default::default()
        },
    ] {
        let (req, refused) = throttlewatch_qos::parse_request(&ann, &env, &policy);
        for r in &refused {
            let _ = r.to_string();
        }
        assert!(
            req.threshold_us
                .is_none_or(|t| t >= policy.min_threshold_us),
            "threshold below the node's"
        );
        assert!(
            req.cpuset.is_none()
                || !req.origins[&throttlewatch_qos::Key::Cpuset]
                    .key
                    .starts_with("THROTTLEWATCH_")
        );
        let _ = serde_json::to_string(&req).unwrap();
    }
}

/// CPU lists: whatever parses prints back to the same list.
pub fn cpulist(data: &[u8]) {
    if let Ok(l) = throttlewatch_core::CpuList::parse("cpus", text(data)) {
        let s = l.to_string();
        let again = throttlewatch_core::CpuList::parse("cpus", &s).unwrap();
        assert_eq!(again, l, "{s}");
    }
}

/// Durations (`threshold`, `cpu-burst`, `--burst`).
pub fn duration(data: &[u8]) {
    let _ = throttlewatch_core::units::parse_duration("d", text(data));
    let _ = throttlewatch_core::units::parse_cpus("c", text(data));
    let _ = throttlewatch_qos::values::parse_burst(text(data), 100);
    let _ = throttlewatch_qos::values::parse_cpuset(text(data));
    let _ = throttlewatch_qos::values::parse_gpus(text(data));
}

/// throttlewatch.toml, as the hook loads it.
pub fn config(data: &[u8]) {
    let t = text(data);
    if let Ok(c) = throttlewatch_core::config::Config::parse(Path::new("f.toml"), t) {
        let _ = throttlewatch_qos::config_check::check(&c);
        let _ = throttlewatch_qos::Policy::for_config(&c);
    }
    let _ = throttlewatch_core::config::fail_mode_meant(t);
}

/// One request line on the agent's socket.
pub fn protocol(data: &[u8]) {
    let line = String::from_utf8_lossy(data);
    if let Ok(r) = serde_json::from_str::<throttlewatch_core::protocol::Request>(&line) {
        let back = serde_json::to_string(&r).unwrap();
        assert_eq!(
            serde_json::from_str::<throttlewatch_core::protocol::Request>(&back).unwrap(),
            r
        );
    }
}

/// /proc/self/mountinfo and /proc/<pid>/cgroup.
pub fn mountinfo(data: &[u8]) {
    let t = text(data);
    let _ = throttlewatch_cgroup::Hierarchies::from_mountinfo(t, |_| Some(0x27e0eb));
    let _ = throttlewatch_cgroup::Hierarchies::from_mountinfo(t, |_| Some(0x63677270));
    for mode in [
        throttlewatch_cgroup::CgroupMode::V1,
        throttlewatch_cgroup::CgroupMode::V2,
    ] {
        let _ = throttlewatch_cgroup::proc::cpu_cgroup_of(t, mode);
    }
    let _ = throttlewatch_cgroup::parse::flat_keyed_str(t);
    let _ = throttlewatch_cgroup::parse::cpu_max_str(t);
}

/// One line of a per-container log, as `read_log` reads it.
pub fn log_line(data: &[u8]) {
    if let Ok(l) = serde_json::from_slice::<throttlewatch_core::logfmt::Line>(data) {
        let _ = serde_json::to_string(&l).unwrap();
    }
    let _ = throttlewatch_core::logfmt::log_file_name(text(data));
    let _ = throttlewatch_core::printable::printable(text(data));
}
