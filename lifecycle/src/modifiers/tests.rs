use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use serde_json::json;
use throttlewatch_core::config::Config;

use super::*;
use crate::spec_file::CONFIG_JSON;

fn ctx() -> ModifyContext {
    ModifyContext {
        hook_path: PathBuf::from("/usr/local/bin/throttlewatch-hook"),
        config_path: Some(PathBuf::from("/etc/tw.toml")),
        cfg: Config::default(),
        create_runtime_hook: true,
        created_unix_ns: None,
    }
}

fn bundle(config: &str) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join(CONFIG_JSON), config).unwrap();
    std::fs::set_permissions(
        d.path().join(CONFIG_JSON),
        std::fs::Permissions::from_mode(0o604),
    )
    .unwrap();
    d
}

fn read(d: &tempfile::TempDir) -> Value {
    serde_json::from_slice(&std::fs::read(d.path().join(CONFIG_JSON)).unwrap()).unwrap()
}

#[test]
fn adds_hooks_once_and_keeps_unknown_fields() {
    let d = bundle(
        r#"{"ociVersion":"1.0.2","process":{"args":["sh"]},"x-vendor":{"keep":[1,2]},
        "hooks":{"createRuntime":[{"path":"/other/hook"}]}}"#,
    );
    let m = modify_bundle(d.path(), &ctx()).unwrap();
    assert_eq!(m.changes.len(), 2, "{m:?}"); // two hooks, nothing else
    let v = read(&d);
    assert_eq!(v["x-vendor"]["keep"], json!([1, 2]));
    let cr = v["hooks"]["createRuntime"].as_array().unwrap();
    assert_eq!(cr.len(), 2);
    assert_eq!(cr[0]["path"], "/other/hook");
    assert_eq!(cr[1]["path"], "/usr/local/bin/throttlewatch-hook");
    assert_eq!(
        cr[1]["args"],
        json!([
            "throttlewatch-hook",
            "createRuntime",
            "--config",
            "/etc/tw.toml"
        ])
    );
    assert_eq!(v["hooks"]["poststop"][0]["args"][1], "poststop");
    // Idempotent: a second pass changes nothing and does not rewrite.
    let before = std::fs::read(d.path().join(CONFIG_JSON)).unwrap();
    assert!(modify_bundle(d.path(), &ctx()).unwrap().changes.is_empty());
    assert_eq!(std::fs::read(d.path().join(CONFIG_JSON)).unwrap(), before);
    let mode = std::fs::metadata(d.path().join(CONFIG_JSON))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o604);
    // No temporary file left behind.
    assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
}

#[test]
fn stale_entry_of_ours_is_replaced_not_duplicated() {
    let d = bundle(
        r#"{"hooks":{"poststop":[{"path":"/old/throttlewatch-hook","args":["x"]},{"path":"/old/throttlewatch-hook"}]}}"#,
    );
    modify_bundle(d.path(), &ctx()).unwrap();
    let v = read(&d);
    assert_eq!(v["hooks"]["poststop"].as_array().unwrap().len(), 1);
    assert_eq!(
        v["hooks"]["poststop"][0]["path"],
        "/usr/local/bin/throttlewatch-hook"
    );
}

#[test]
fn malformed_config_is_a_clear_error() {
    let d = bundle("{\"ociVersion\": ");
    let e = format!("{:#}", modify_bundle(d.path(), &ctx()).unwrap_err());
    assert!(
        e.contains("config.json") && e.contains("not valid JSON"),
        "{e}"
    );
    let d = bundle(r#"{"hooks":{"createRuntime":"nope"}}"#);
    let e = format!("{:#}", modify_bundle(d.path(), &ctx()).unwrap_err());
    assert!(
        e.contains("\"hooks.createRuntime\" is a string; expected an array"),
        "{e}"
    );
    let d = bundle("[1]");
    let e = format!("{:#}", modify_bundle(d.path(), &ctx()).unwrap_err());
    assert!(e.contains("expected a JSON object"), "{e}");
    // The broken file is left as it was.
    assert_eq!(
        std::fs::read_to_string(d.path().join(CONFIG_JSON)).unwrap(),
        "[1]"
    );
}

#[test]
fn symlinked_config_is_refused() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("elsewhere.json"), "{}").unwrap();
    std::os::unix::fs::symlink(d.path().join("elsewhere.json"), d.path().join(CONFIG_JSON))
        .unwrap();
    let e = format!("{:#}", modify_bundle(d.path(), &ctx()).unwrap_err());
    assert!(e.contains("symlink"), "{e}");
    assert_eq!(
        std::fs::read_to_string(d.path().join("elsewhere.json")).unwrap(),
        "{}"
    );
}

#[test]
fn explicit_cpuset_becomes_resources() {
    let d = bundle(
        r#"{"annotations":{"throttlewatch.io/cpuset":"0"},"linux":{"resources":{"cpu":{"quota":20000}}}}"#,
    );
    let m = modify_bundle(d.path(), &ctx()).unwrap();
    let v = read(&d);
    assert_eq!(v["linux"]["resources"]["cpu"]["cpus"], "0", "{m:?}");
    assert_eq!(v["linux"]["resources"]["cpu"]["quota"], 20000);
    // Exclusive requests are left to the hook (they need the container's pid).
    let d = bundle(r#"{"annotations":{"throttlewatch.io/cpuset":"0,exclusive"}}"#);
    modify_bundle(d.path(), &ctx()).unwrap();
    assert!(read(&d)["linux"].get("resources").is_none());
}

#[test]
fn no_config_path_means_no_config_arg() {
    let d = bundle("{}");
    let c = ModifyContext {
        config_path: None,
        ..ctx()
    };
    modify_bundle(d.path(), &c).unwrap();
    assert_eq!(
        read(&d)["hooks"]["createRuntime"][0]["args"],
        json!(["throttlewatch-hook", "createRuntime"])
    );
}

#[test]
fn pod_sandbox_is_left_untouched() {
    let text = r#"{"annotations":{"io.kubernetes.cri.container-type":"sandbox","throttlewatch.io/cpu-burst":"20ms"},"process":{"args":["/pause"]}}"#;
    let d = bundle(text);
    let m = modify_bundle(d.path(), &ctx()).unwrap();
    assert!(m.changes.is_empty(), "{m:?}");
    assert_eq!(
        std::fs::read_to_string(d.path().join(CONFIG_JSON)).unwrap(),
        text
    );
    // The pod's workload containers still get the hooks.
    let d = bundle(r#"{"annotations":{"io.kubernetes.cri.container-type":"container"}}"#);
    modify_bundle(d.path(), &ctx()).unwrap();
    assert_eq!(
        read(&d)["hooks"]["createRuntime"].as_array().unwrap().len(),
        1
    );
}

/// Nothing of ours in the spec's annotations (runc reports them in its
/// state, and every hook gets them on stdin): the create time rides in our
/// createRuntime hook's arguments only.
#[test]
fn the_create_time_is_our_hooks_argument_not_an_annotation() {
    let d = bundle(r#"{"annotations":{"throttlewatch.io/cpu-burst":"20ms"}}"#);
    let c = ModifyContext {
        created_unix_ns: Some(1_796_000_000_000_000_001),
        ..ctx()
    };
    modify_bundle(d.path(), &c).unwrap();
    let spec = crate::BundleSpec::load(d.path()).unwrap();
    assert_eq!(
        spec.annotations.keys().collect::<Vec<_>>(),
        vec!["throttlewatch.io/cpu-burst"]
    );
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.path().join("config.json")).unwrap()).unwrap();
    let args = &v["hooks"]["createRuntime"][0]["args"];
    let args: Vec<&str> = args
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let at = args.iter().position(|a| *a == "--created-unix-ns").unwrap();
    assert_eq!(args[at + 1], "1796000000000000001");
    assert!(!v["hooks"]["poststop"][0]["args"]
        .to_string()
        .contains("created"));
    let (req, refused) = crate::qos::request(&ctx().cfg, &spec);
    assert_eq!(refused, vec![]);
    assert!(req.burst.is_some());
}

/// The wrapper's `create` does the createRuntime work itself: the spec gets
/// our poststop hook only, an entry of ours already there is taken out
/// (else the work would be done twice), others' hooks stay, and a second
/// pass changes nothing.
#[test]
fn without_the_create_runtime_hook_ours_is_removed_and_others_kept() {
    let c = ModifyContext {
        create_runtime_hook: false,
        ..ctx()
    };
    let d = bundle("{}");
    modify_bundle(d.path(), &c).unwrap();
    let v = read(&d);
    assert!(v["hooks"].get("createRuntime").is_none(), "{v}");
    assert_eq!(v["hooks"]["poststop"].as_array().unwrap().len(), 1);
    let d = bundle(
        r#"{"hooks":{"createRuntime":[{"path":"/usr/bin/other"},{"path":"/opt/tw/throttlewatch-hook","args":["throttlewatch-hook","createRuntime"]}]}}"#,
    );
    let m = modify_bundle(d.path(), &c).unwrap();
    assert!(
        m.changes.iter().any(|c| c.contains("ours removed")),
        "{m:?}"
    );
    assert_eq!(
        read(&d)["hooks"]["createRuntime"],
        json!([{"path": "/usr/bin/other"}])
    );
    assert!(modify_bundle(d.path(), &c).unwrap().changes.is_empty());
}
