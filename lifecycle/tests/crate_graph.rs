//! The front ends stand side by side on this crate: `cargo metadata` shows
//! no dependency between the hook, the runtime wrapper and the shim, and
//! each of them depends on the lifecycle crate.

use std::collections::BTreeMap;
use std::process::Command;

const FRONT_ENDS: [&str; 3] = [
    "throttlewatch-hook",
    "throttlewatch-runtime",
    "containerd-shim-throttlewatch-v2",
];

#[test]
fn front_ends_depend_on_lifecycle_and_not_on_each_other() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let deps: BTreeMap<&str, Vec<&str>> = m["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let d = p["dependencies"].as_array().unwrap();
            let names = d.iter().filter_map(|d| d["name"].as_str()).collect();
            (p["name"].as_str().unwrap(), names)
        })
        .collect();
    for fe in FRONT_ENDS {
        let d = deps
            .get(fe)
            .unwrap_or_else(|| panic!("{fe} is in the workspace"));
        assert!(d.contains(&"throttlewatch-lifecycle"), "{fe}: {d:?}");
        for other in FRONT_ENDS.iter().filter(|o| **o != fe) {
            assert!(!d.contains(other), "{fe} depends on {other}: {d:?}");
        }
    }
}
