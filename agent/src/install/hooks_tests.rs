use super::*;
use crate::install::crio_conf::CRIO_DEFAULT_HOOKS_DIR;
use serde_json::json;

fn settings() -> HookSettings {
    HookSettings {
        bin_dir: PathBuf::from("/opt/tw/bin"),
        config: Some(PathBuf::from("/etc/tw/tw.toml")),
        timeout_s: 15,
    }
}

/// Every field oci-hooks(5) 1.0.0 requires, and the stage in the arguments.
#[test]
fn hook_files_follow_oci_hooks_1_0_0() {
    for stage in STAGES {
        let v: Value = serde_json::from_str(&hook_file(stage, &settings())).unwrap();
        assert_eq!(v["version"], "1.0.0");
        assert_eq!(v["hook"]["path"], "/opt/tw/bin/throttlewatch-hook");
        assert_eq!(
            v["hook"]["args"],
            json!(["throttlewatch-hook", stage, "--config", "/etc/tw/tw.toml"])
        );
        assert_eq!(v["hook"]["timeout"], 15);
        assert_eq!(v["stages"], json!([stage]));
        assert_eq!(
            v["when"],
            json!({"annotations": {r"^throttlewatch\.io/": ".*"}})
        );
        assert!(v["when"].get("always").is_none());
    }
}

#[test]
fn install_then_uninstall_leaves_the_tree_as_it_was() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("etc/containers/oci/hooks.d");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("oci-nvidia-hook.json"), "{}").unwrap();
    let plan = install_plan(
        HookEngine::Podman,
        d.path(),
        &settings(),
        &HookPaths::default(),
    )
    .unwrap();
    assert_eq!(plan.edits.len(), 2);
    plan.carry_out(false).unwrap();
    let created = std::fs::read_to_string(dir.join("throttlewatch-poststop.json")).unwrap();
    assert_eq!(created, hook_file("poststop", &settings()));
    assert!(install_plan(
        HookEngine::Podman,
        d.path(),
        &settings(),
        &HookPaths::default()
    )
    .unwrap()
    .edits
    .is_empty());
    uninstall_plan(HookEngine::Podman, d.path(), &HookPaths::default())
        .unwrap()
        .carry_out(false)
        .unwrap();
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left, ["oci-nvidia-hook.json"]);
}

#[test]
fn a_foreign_file_of_our_name_is_refused_and_left_alone() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("etc/containers/oci/hooks.d");
    std::fs::create_dir_all(&dir).unwrap();
    let foreign = r#"{"version":"1.0.0","hook":{"path":"/usr/bin/other"},"when":{"always":true},"stages":["poststop"]}"#;
    std::fs::write(dir.join("throttlewatch-poststop.json"), foreign).unwrap();
    let e = install_plan(
        HookEngine::Podman,
        d.path(),
        &settings(),
        &HookPaths::default(),
    )
    .unwrap_err();
    assert!(
        e.message.contains("not a throttlewatch hook file"),
        "{}",
        e.message
    );
    let plan = uninstall_plan(HookEngine::Podman, d.path(), &HookPaths::default()).unwrap();
    assert!(plan.edits.is_empty());
    assert!(plan.notes[0].contains("left alone"), "{:?}", plan.notes);
}

#[test]
fn crio_uses_its_configured_hooks_dir_else_its_default() {
    let d = tempfile::tempdir().unwrap();
    assert_eq!(
        hooks_dir(HookEngine::Crio, d.path(), &HookPaths::default())
            .unwrap()
            .0,
        Path::new(CRIO_DEFAULT_HOOKS_DIR)
    );
    std::fs::create_dir_all(d.path().join("etc/crio/crio.conf.d")).unwrap();
    std::fs::write(
        d.path().join("etc/crio/crio.conf"),
        "[crio.runtime]\nhooks_dir = [\"/usr/share/containers/oci/hooks.d\"]\n",
    )
    .unwrap();
    std::fs::write(
        d.path().join("etc/crio/crio.conf.d/10-hooks.conf"),
        "[crio.runtime]\nhooks_dir = [\"/etc/containers/oci/hooks.d\", \"/usr/share/containers/oci/hooks.d\"]\n",
    )
    .unwrap();
    assert_eq!(
        hooks_dir(HookEngine::Crio, d.path(), &HookPaths::default())
            .unwrap()
            .0,
        Path::new("/etc/containers/oci/hooks.d")
    );
    std::fs::write(
        d.path().join("etc/crio/crio.conf.d/20-bad.conf"),
        "[crio.runtime]\nhooks_dir = \"relative\"\n",
    )
    .unwrap();
    let e = hooks_dir(HookEngine::Crio, d.path(), &HookPaths::default()).unwrap_err();
    assert!(
        e.message.contains("20-bad.conf") && e.message.contains("absolute paths"),
        "{}",
        e.message
    );
}

/// `--crio-config` and `--crio-config-dir` name the files CRI-O runs with
/// (not /etc/crio's, which are then not read); their drop-ins go in lexical
/// order, the last `hooks_dir` winning; of its list the first directory that
/// exists is written to; `--hooks-dir` overrides all of it.
#[test]
fn crio_reads_the_config_it_is_started_with() {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(d.path().join("etc/crio")).unwrap();
    std::fs::write(
        d.path().join("etc/crio/crio.conf"),
        "[crio.runtime]\nhooks_dir = [\"/not/read\"]\n",
    )
    .unwrap();
    std::fs::create_dir_all(d.path().join("srv/crio/conf.d")).unwrap();
    std::fs::create_dir_all(d.path().join("srv/hooks-b")).unwrap();
    std::fs::write(
        d.path().join("srv/crio/main.conf"),
        "[crio.runtime]\nhooks_dir = [\"/srv/hooks-0\"]\n",
    )
    .unwrap();
    for (name, dirs) in [
        ("20-b.conf", r#"["/srv/hooks-a", "/srv/hooks-b"]"#),
        ("10-a.conf", r#"["/srv/hooks-z"]"#),
    ] {
        let text = format!("[crio.runtime]\nhooks_dir = {dirs}\n");
        std::fs::write(d.path().join("srv/crio/conf.d").join(name), text).unwrap();
    }
    let mut p = HookPaths {
        crio_config: Some("/srv/crio/main.conf".into()),
        crio_config_dir: Some("/srv/crio/conf.d".into()),
        hooks_dir: None,
    };
    let (dir, note) = hooks_dir(HookEngine::Crio, d.path(), &p).unwrap();
    assert_eq!(
        dir,
        Path::new("/srv/hooks-b"),
        "20-b.conf last; hooks-a missing"
    );
    assert_eq!(note, None);
    std::fs::remove_dir(d.path().join("srv/hooks-b")).unwrap();
    let (dir, note) = hooks_dir(HookEngine::Crio, d.path(), &p).unwrap();
    assert_eq!(dir, Path::new("/srv/hooks-a"));
    assert!(note.unwrap().contains("restart crio once"));
    p.hooks_dir = Some("/given".into());
    assert_eq!(
        hooks_dir(HookEngine::Crio, d.path(), &p).unwrap().0,
        Path::new("/given")
    );
    assert_eq!(
        hooks_dir(HookEngine::Podman, d.path(), &p).unwrap().0,
        Path::new("/given")
    );
    // hooks_dir = [] with no --hooks-dir: refused, naming what to do.
    std::fs::write(
        d.path().join("srv/crio/conf.d/30-none.conf"),
        "[crio.runtime]\nhooks_dir = []\n",
    )
    .unwrap();
    p.hooks_dir = None;
    let e = hooks_dir(HookEngine::Crio, d.path(), &p).unwrap_err();
    assert!(
        e.message.contains("hooks_dir = []") && e.message.contains("--hooks-dir"),
        "{}",
        e.message
    );
}
