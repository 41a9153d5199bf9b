//! daemon.json: every key and runtime kept, uninstall byte for byte.

use std::os::unix::fs::PermissionsExt;

use super::*;
use crate::install::files;
use crate::install::test_support::{install, uninstall};

const NVIDIA: &str = include_str!("../../../integration/fixtures/docker/nvidia/daemon.json");

fn root_with(text: Option<&str>) -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let p = under_root(d.path(), Path::new(DAEMON_JSON));
    if let Some(t) = text {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, t).unwrap();
    }
    (d, p)
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap()
}

fn json(t: &str) -> Value {
    serde_json::from_str(t).unwrap()
}

#[test]
fn nvidia_daemon_json_keeps_every_key_and_restores_byte_for_byte() {
    let (d, p) = root_with(Some(NVIDIA));
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(
        install("docker", false, d.path(), Path::new("/usr/local/bin")).unwrap(),
        0
    );
    let text = read(&p);
    let mut expected = json(NVIDIA);
    expected["runtimes"]["throttlewatch"] =
        serde_json::json!({"path": "/usr/local/bin/throttlewatch-runtime"});
    assert_eq!(json(&text), expected);
    assert!(
        text.starts_with("{\n    \"default-runtime\""),
        "layout kept: {text}"
    );
    let backup = files::backup_of(&p);
    assert_eq!(read(&backup), NVIDIA);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!((mode(&p), mode(&backup)), (0o600, 0o600));
    let again = install_plan(d.path(), Path::new("/usr/local/bin")).unwrap();
    assert!(again.edits.is_empty() && again.nothing_to_do.starts_with("already installed"));
    let e = install("docker", false, d.path(), Path::new("/opt/bin")).unwrap_err();
    assert_eq!(e.code, 2);
    assert!(e.message.contains("refusing"), "{}", e.message);
    assert_eq!(uninstall("docker", true, d.path()).unwrap(), 0);
    assert_eq!(read(&p), text, "dry run");
    assert_eq!(uninstall("docker", false, d.path()).unwrap(), 0);
    assert_eq!(read(&p), NVIDIA);
    assert_eq!(mode(&p), 0o600);
    assert!(!backup.exists());
}

#[test]
fn new_and_empty_files() {
    let (d, p) = root_with(None);
    assert_eq!(
        install("docker", true, d.path(), Path::new("/b")).unwrap(),
        0
    );
    assert!(!p.exists());
    assert_eq!(
        install("docker", false, d.path(), Path::new("/b")).unwrap(),
        0
    );
    assert_eq!(
        json(&read(&p)),
        serde_json::json!({"runtimes": {"throttlewatch": {"path": "/b/throttlewatch-runtime"}}})
    );
    assert!(!files::backup_of(&p).exists());
    uninstall("docker", false, d.path()).unwrap();
    assert!(!p.exists(), "install created it, uninstall removes it");
    for old in ["{}", "", "{\"debug\": true}\n", "{\"runtimes\": {}}"] {
        let (d, p) = root_with(Some(old));
        install("docker", false, d.path(), Path::new("/b")).unwrap();
        assert_eq!(
            json(&read(&p))["runtimes"]["throttlewatch"]["path"],
            "/b/throttlewatch-runtime"
        );
        uninstall("docker", false, d.path()).unwrap();
        assert_eq!(read(&p), old);
    }
}

#[test]
fn bad_input_is_refused_and_nothing_written() {
    for (bad, what) in [
        ("{ not json", "not JSON"),
        ("[1, 2]", "unexpected shape"),
        ("{\"runtimes\": []}", "unexpected shape"),
        ("{\"runtimes\": {\"nvidia\": \"x\"}}", "unexpected shape"),
    ] {
        let (d, p) = root_with(Some(bad));
        let e = install("docker", false, d.path(), Path::new("/b")).unwrap_err();
        assert_eq!(e.code, 2);
        assert!(
            e.message.contains("etc/docker/daemon.json") && e.message.contains(what),
            "{}",
            e.message
        );
        assert!(e.message.contains("accepted"), "{}", e.message);
        assert_eq!(read(&p), bad);
        assert!(!files::backup_of(&p).exists());
        assert_eq!(uninstall("docker", false, d.path()).unwrap_err().code, 2);
    }
}

#[test]
fn a_file_changed_since_install_loses_only_our_runtime() {
    let (d, p) = root_with(Some(NVIDIA));
    install("docker", false, d.path(), Path::new("/usr/local/bin")).unwrap();
    let changed = read(&p).replace("\"10m\"", "\"20m\"");
    std::fs::write(&p, &changed).unwrap();
    let plan = uninstall_plan(d.path()).unwrap();
    assert!(
        plan.notes
            .iter()
            .any(|n| n.contains("changed since install")),
        "{:?}",
        plan.notes
    );
    uninstall("docker", false, d.path()).unwrap();
    assert_eq!(
        read(&p),
        NVIDIA.replace("\"10m\"", "\"20m\""),
        "only our entry cut out"
    );
    assert_eq!(read(&files::backup_of(&p)), NVIDIA);
    assert!(uninstall_plan(d.path()).unwrap().edits.is_empty());
}

#[test]
fn our_entry_follows_the_files_indentation_and_is_cut_out_again() {
    let cases = [
        NVIDIA,
        "{\n  \"debug\": true\n}\n",
        "{\n\t\"runtimes\": {}\n}\n",
        "{\n  \"runtimes\": {\n    \"crun\": { \"path\": \"/usr/bin/crun\" }\n  },\n  \"debug\": true\n}\n",
        "{}",
    ];
    for old in cases {
        let new = add_runtime(old, "/b/throttlewatch-runtime").unwrap();
        let line = new
            .lines()
            .find(|l| l.contains("throttlewatch-runtime"))
            .unwrap();
        let want_indent = if old.contains("\t") {
            "\t\t"
        } else if old == NVIDIA {
            "        "
        } else {
            "    "
        };
        assert!(line.starts_with(&format!("{want_indent}\"")), "{new:?}");
        let mut expected = if old == "{}" {
            serde_json::json!({})
        } else {
            json(old)
        };
        expected
            .as_object_mut()
            .unwrap()
            .entry("runtimes")
            .or_insert(serde_json::json!({}))["throttlewatch"] =
            serde_json::json!({"path": "/b/throttlewatch-runtime"});
        assert_eq!(json(&new), expected);
        // A user's later change elsewhere; removing ours gives back their text.
        let changed = new.replacen('{', "{\"x\": 1,", 1);
        let back = remove_runtime(&changed, Some(old)).unwrap();
        if old == "{}" {
            assert_eq!(back, "{\"x\": 1\n}");
        } else {
            assert_eq!(back, old.replacen('{', "{\"x\": 1,", 1), "from {changed:?}");
        }
    }
}
