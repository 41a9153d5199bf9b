//! Every configuration and annotation example in docs/, configs/ and the
//! README is parsed the way the hook parses it: a documented example that
//! the code refuses is a bug in one of them (issue 11, finding 8).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use throttlewatch_core::config::Config;
use throttlewatch_qos::{config_check, parse_request, Policy};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn files(dir: &str, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root().join(dir))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    v.sort();
    v
}

/// (language, first line number, text) of each fenced block.
fn blocks(md: &str) -> Vec<(String, usize, String)> {
    let mut out = vec![];
    let mut cur: Option<(String, usize, String)> = None;
    for (i, l) in md.lines().enumerate() {
        match (&mut cur, l.trim_start().strip_prefix("```")) {
            (None, Some(lang)) => cur = Some((lang.trim().to_string(), i + 2, String::new())),
            (Some(_), Some(_)) => out.push(cur.take().unwrap()),
            (Some((_, _, t)), None) => {
                t.push_str(l);
                t.push('\n');
            }
            (None, None) => {}
        }
    }
    out
}

/// Another program's configuration (containerd's runtimes table, a log
/// shipper's pipeline such as Vector's), not ours: checked as TOML only.
fn is_foreign(toml: &str) -> bool {
    toml.contains("[plugins")
        || toml.contains("pod_annotations")
        || toml.contains("runtime_type")
        || ["[sources.", "[transforms.", "[sinks."]
            .iter()
            .any(|t| toml.contains(t))
}

fn check_ours(what: &str, text: &str) {
    let c = Config::parse(Path::new(what), text).unwrap_or_else(|e| panic!("{what}: {e}"));
    config_check::check(&c).unwrap_or_else(|e| panic!("{what}: {e}"));
}

/// `throttlewatch.io/KEY: VALUE`, `throttlewatch.io/KEY=VALUE` and
/// `THROTTLEWATCH_VAR=VALUE` in a block; values in quotes are refusal
/// examples (`key="value": reason`) and are left out.
fn requests(block: &str) -> (BTreeMap<String, String>, Vec<String>) {
    let value = |s: &str| -> Option<String> {
        let v: String = s
            .chars()
            .take_while(|c| !c.is_whitespace() && *c != '\\' && *c != '"' && *c != '\'')
            .collect();
        (!v.is_empty()).then_some(v)
    };
    let mut ann = BTreeMap::new();
    let mut env = vec![];
    for line in block.lines() {
        for (i, _) in line.match_indices("throttlewatch.io/") {
            let rest = &line[i + "throttlewatch.io/".len()..];
            let key: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '-')
                .collect();
            let after = &rest[key.len()..];
            let v = after
                .strip_prefix(": ")
                .or_else(|| after.strip_prefix('='))
                .and_then(|a| value(a.trim_start()));
            if let (false, Some(v)) = (key.is_empty(), v) {
                ann.insert(format!("throttlewatch.io/{key}"), v);
            }
        }
        for (i, _) in line.match_indices("THROTTLEWATCH_") {
            let rest = &line[i..];
            let var: String = rest
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || *c == '_')
                .collect();
            if let Some(v) = rest[var.len()..].strip_prefix('=').and_then(value) {
                env.push(format!("{var}={v}"));
            }
        }
    }
    (ann, env)
}

#[test]
fn shipped_configs_parse() {
    check_ours(
        "configs/throttlewatch.toml",
        &std::fs::read_to_string(root().join("configs/throttlewatch.toml")).unwrap(),
    );
    let containerd = files("configs/containerd", "toml");
    assert!(!containerd.is_empty());
    for p in containerd {
        let t = std::fs::read_to_string(&p).unwrap();
        t.parse::<toml::Table>()
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    }
}

#[test]
fn every_documented_example_is_accepted() {
    let mut docs = files("docs", "md");
    docs.push(root().join("README.md"));
    let (mut tomls, mut requests_seen) = (0, 0);
    for p in docs {
        let md = std::fs::read_to_string(&p).unwrap();
        for (lang, line, text) in blocks(&md) {
            let what = format!("{}:{line}", p.strip_prefix(root()).unwrap_or(&p).display());
            if lang == "toml" {
                tomls += 1;
                if is_foreign(&text) {
                    text.parse::<toml::Table>()
                        .unwrap_or_else(|e| panic!("{what}: not TOML: {e}"));
                } else {
                    check_ours(&what, &text);
                }
                continue;
            }
            let (ann, env) = requests(&text);
            if ann.is_empty() && env.is_empty() {
                continue;
            }
            requests_seen += 1;
            let (_, refused) = parse_request(&ann, &env, &Policy::default());
            assert!(
                refused.is_empty(),
                "{what}: the documented example is refused: {refused:?}\n{text}"
            );
        }
    }
    assert!(tomls >= 3, "found {tomls} TOML examples");
    assert!(
        requests_seen >= 3,
        "found {requests_seen} annotation/env examples"
    );
}

#[test]
fn the_reader_finds_what_it_should() {
    let (a, e) = requests(
        "  throttlewatch.io/qos-class: latency-critical\n --annotation throttlewatch.io/cpuset=numa:1,exclusive \\\n -e THROTTLEWATCH_CPU_BURST=20ms \\\n`throttlewatch.io/cpu-burst=\"abc\": expected`",
    );
    assert_eq!(a["throttlewatch.io/qos-class"], "latency-critical");
    assert_eq!(a["throttlewatch.io/cpuset"], "numa:1,exclusive");
    assert!(!a.contains_key("throttlewatch.io/cpu-burst"));
    assert_eq!(e, ["THROTTLEWATCH_CPU_BURST=20ms"]);
}
