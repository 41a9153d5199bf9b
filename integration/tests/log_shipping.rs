//! packaging/logging: the Vector and Fluent Bit configurations that ship the
//! per-container logs. Neither shipper installs here, so the files are
//! parsed (TOML, YAML), their input globs must name the log directory the
//! node configuration (and the DaemonSet's ConfigMap) uses and no diagnostic
//! log, and their file-name patterns are run (by perl, whose regex dialect
//! takes both the `(?P<n>)` of Vector and the `(?<n>)` of Fluent Bit) over
//! log file names as docs/log-format.md and the agent spell them.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn read(p: &str) -> String {
    std::fs::read_to_string(repo().join(p)).unwrap_or_else(|e| panic!("{p}: {e}"))
}

/// The log_dir of a configuration file.
fn log_dir(p: &str) -> String {
    let t: toml::Table = toml::from_str(&read(p)).unwrap();
    t["log_dir"].as_str().unwrap().to_string()
}

/// `regex` applied to each name: "id|scope" per name ("-" for no match).
fn captures(regex: &str, id: &str, scope: &str, names: &[String]) -> Vec<String> {
    let script = format!(
        "while (<STDIN>) {{ chomp; if (m{{{regex}}}) {{ print \"$+{{{id}}}|\", ($+{{{scope}}} // \"\"), \"\\n\" }} else {{ print \"-\\n\" }} }}"
    );
    let mut c = Command::new("perl")
        .arg("-e")
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("perl");
    let input: String = names.iter().map(|n| format!("{n}\n")).collect();
    c.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let o = c.wait_with_output().unwrap();
    assert!(o.status.success(), "perl: {script}");
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

fn names(dir: &str) -> Vec<String> {
    let plain = throttlewatch_core::logfmt::log_file_name("web");
    [
        plain.as_str(),
        "web@ns-k8s.io.jsonl",
        "a%2Fb@root-moby-1a2b3c4d.jsonl",
        "web@ns-k8s.io.jsonl.1",
        "agent.log",
        "hook.log",
    ]
    .iter()
    .map(|n| format!("{dir}/{n}"))
    .collect()
}

const WANT: [&str; 6] = [
    "web|",
    "web|ns-k8s.io",
    "a%2Fb|root-moby-1a2b3c4d",
    "-",
    "-",
    "-",
];

#[test]
fn vector_config_reads_the_log_directory_and_names_each_container() {
    let v: toml::Table = toml::from_str(&read("packaging/logging/vector.toml")).unwrap();
    let dir = log_dir("configs/throttlewatch.toml");
    assert_eq!(dir, log_dir("packaging/kubernetes/base/throttlewatch.toml"));
    let src = &v["sources"]["throttlewatch"];
    assert_eq!(src["type"].as_str(), Some("file"));
    let include: Vec<&str> = src["include"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap())
        .collect();
    assert_eq!(include, [format!("{dir}/*.jsonl")]);
    let remap = &v["transforms"]["throttlewatch_records"];
    assert_eq!(
        remap["inputs"].as_array().unwrap()[0].as_str(),
        Some("throttlewatch")
    );
    let vrl = remap["source"].as_str().unwrap();
    assert!(vrl.contains("parse_json!(string!(.message))"), "{vrl}");
    assert!(
        vrl.contains("unit: \"nanoseconds\""),
        "ts is epoch ns: {vrl}"
    );
    let regex = vrl
        .split("r'")
        .nth(1)
        .and_then(|r| r.split('\'').next())
        .expect("a raw regex r'…' in the VRL");
    assert_eq!(captures(regex, "id", "scope", &names(&dir)), WANT);
    let sink = &v["sinks"]["throttlewatch_out"];
    assert_eq!(
        sink["inputs"].as_array().unwrap()[0].as_str(),
        Some("throttlewatch_records")
    );
}

#[test]
fn fluent_bit_config_reads_the_log_directory_and_names_each_container() {
    let f: serde_yaml::Value =
        serde_yaml::from_str(&read("packaging/logging/fluent-bit.yaml")).unwrap();
    let dir = log_dir("configs/throttlewatch.toml");
    let input = &f["pipeline"]["inputs"][0];
    assert_eq!(input["name"], "tail");
    assert_eq!(
        input["path"].as_str(),
        Some(format!("{dir}/*.jsonl").as_str())
    );
    assert_eq!(input["path_key"], "file");
    let parser = |name: &str| {
        f["parsers"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("no parser {name}"))
            .clone()
    };
    assert_eq!(parser(input["parser"].as_str().unwrap())["format"], "json");
    let filter = &f["pipeline"]["filters"][0];
    assert_eq!(filter["key_name"], "file");
    let file_parser = parser(filter["parser"].as_str().unwrap());
    assert_eq!(file_parser["format"], "regex");
    let regex = file_parser["regex"].as_str().unwrap();
    assert_eq!(captures(regex, "log_id", "log_scope", &names(&dir)), WANT);
    assert_eq!(f["pipeline"]["outputs"][0]["match"], input["tag"]);
}
