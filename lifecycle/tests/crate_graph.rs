//! The front ends stand side by side on this crate: `cargo metadata` shows
//! no dependency between the hook, the runtime wrapper and the shim, and
//! each of them depends on the lifecycle crate.

mod common;

use std::collections::BTreeMap;

const FRONT_ENDS: [&str; 3] = [
    "throttlewatch-hook",
    "throttlewatch-runtime",
    "containerd-shim-throttlewatch-v2",
];

/// Each workspace crate's normal dependencies on other workspace crates.
fn workspace_deps() -> BTreeMap<String, Vec<String>> {
    let m = common::workspace_metadata();
    let pkgs = m["packages"].as_array().unwrap();
    let names: Vec<&str> = pkgs.iter().filter_map(|p| p["name"].as_str()).collect();
    pkgs.iter()
        .map(|p| {
            let mut d: Vec<String> = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["kind"].is_null())
                .filter_map(|d| d["name"].as_str())
                .filter(|n| names.contains(n))
                .map(str::to_string)
                .collect();
            d.sort();
            d.dedup();
            (p["name"].as_str().unwrap().to_string(), d)
        })
        .collect()
}

#[test]
fn front_ends_depend_on_lifecycle_and_not_on_each_other() {
    let all = workspace_deps();
    let deps: BTreeMap<&str, Vec<&str>> = all
        .iter()
        .map(|(k, v)| (k.as_str(), v.iter().map(String::as_str).collect()))
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

/// docs/architecture.md's dependency table is the crate graph.
#[test]
fn the_architecture_docs_table_is_the_crate_graph() {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/architecture.md"),
    )
    .unwrap();
    let full = |short: &str| {
        let s = short.trim().split(' ').next().unwrap_or("").trim();
        if s.is_empty() || s == "—" {
            None
        } else if s.starts_with("throttlewatch") || s.starts_with("containerd-shim") {
            Some(s.to_string())
        } else {
            Some(format!("throttlewatch-{}", s.trim_start_matches('-')))
        }
    };
    let mut table: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let start = doc.find("| crate | depends on |").expect("the table");
    for row in doc[start..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
    {
        let cells: Vec<&str> = row.trim_matches('|').split('|').collect();
        let mut deps: Vec<String> = cells[1]
            .split(',')
            .filter_map(|d| full(d.split('(').next().unwrap_or("")))
            .collect();
        deps.sort();
        for c in cells[0].split(',') {
            let c = full(c.split('(').next().unwrap()).unwrap();
            table.insert(c, deps.clone());
        }
    }
    let mut actual = workspace_deps();
    for test_crate in [
        "throttlewatch-integration",
        "throttlewatch-fuzz-cases",
        "throttlewatch-test-support",
    ] {
        actual.remove(test_crate);
    }
    assert_eq!(
        table, actual,
        "docs/architecture.md's table against cargo metadata"
    );
}
