//! The TOML logic on fixtures: Debian's containerd 1.6 default (generated
//! with the real `containerd config default`), the same with SystemdCgroup
//! and an nvidia runtime, a config whose drop-in holds the CRI table.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use super::names::*;
use super::*;
use crate::install::files;
use crate::install::test_support::{install, uninstall};

const FIXTURES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../integration/fixtures/containerd"
);

/// A temporary root with the fixture's files under etc/containerd.
fn root_with(fixture: &str) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    copy_tree(
        &Path::new(FIXTURES).join(fixture),
        &d.path().join("etc/containerd"),
    );
    d
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// Every file under `root` with its bytes, for "nothing written" checks.
fn snapshot(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                out.push((e.path(), std::fs::read(e.path()).unwrap()));
            }
        }
    }
    out.sort();
    out
}

fn main_of(root: &Path) -> PathBuf {
    root.join("etc/containerd/config.toml")
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn runtimes(text: &str, plugin: &str) -> toml::Table {
    let v: toml::Table = toml::from_str(text).unwrap();
    v["plugins"][plugin]["containerd"]["runtimes"]
        .as_table()
        .unwrap()
        .clone()
}

fn assert_ours(rt: &toml::Table) {
    let t = &rt["throttlewatch"];
    assert_eq!(t["runtime_type"].as_str(), Some(RUNTIME_TYPE), "{t}");
    assert_eq!(
        t["pod_annotations"].as_array().unwrap()[0].as_str(),
        Some(ANNOTATIONS)
    );
    assert_eq!(
        t["container_annotations"].as_array().unwrap()[0].as_str(),
        Some(ANNOTATIONS)
    );
}

/// Install, check only lines were added, install again (no change), uninstall → byte equal.
fn round_trip(fixture: &str, edited: &str) -> String {
    let d = root_with(fixture);
    let before = snapshot(d.path());
    let target = d.path().join("etc/containerd").join(edited);
    let original = read(&target);
    assert_eq!(
        install("containerd", false, d.path(), Path::new("/b")).unwrap(),
        0
    );
    let installed = read(&target);
    let diff = crate::install::unified_diff(&original, &installed, "/f");
    let removed: Vec<&str> = diff
        .lines()
        .filter(|l| l.starts_with('-') && !l.starts_with("---"))
        .collect();
    assert!(removed.is_empty(), "install removed lines: {removed:?}");
    assert_eq!(read(&files::backup_of(&target)), original);
    let again = install_plan(d.path()).unwrap();
    assert!(again.edits.is_empty(), "{again:?}");
    assert!(
        again.nothing_to_do.starts_with("already installed"),
        "{}",
        again.nothing_to_do
    );
    assert_eq!(uninstall("containerd", false, d.path()).unwrap(), 0);
    assert_eq!(
        snapshot(d.path()),
        before,
        "uninstall must restore every file byte for byte"
    );
    installed
}

#[test]
fn debian_default_keeps_runc_and_gets_throttlewatch() {
    let text = round_trip("debian-1.6-default", "config.toml");
    let rt = runtimes(&text, PLUGIN_V2);
    assert_eq!(rt.keys().collect::<Vec<_>>(), ["runc", "throttlewatch"]);
    assert_eq!(rt["runc"]["runtime_type"].as_str(), Some(RUNC_TYPE));
    assert_eq!(
        rt["runc"]["options"]["SystemdCgroup"].as_bool(),
        Some(false)
    );
    assert_ours(&rt);
}

#[test]
fn systemd_and_nvidia_runtimes_are_kept_with_their_options() {
    let text = round_trip("systemd-nvidia", "config.toml");
    let rt = runtimes(&text, PLUGIN_V2);
    assert_eq!(
        rt.keys().collect::<Vec<_>>(),
        ["nvidia", "runc", "throttlewatch"]
    );
    assert_eq!(rt["runc"]["options"]["SystemdCgroup"].as_bool(), Some(true));
    assert_eq!(
        rt["nvidia"]["options"]["BinaryName"].as_str(),
        Some("/usr/bin/nvidia-container-runtime")
    );
    assert_ours(&rt);
}

#[test]
fn the_drop_in_holding_the_cri_table_is_the_one_edited() {
    let d = root_with("imports");
    let main = read(&main_of(d.path()));
    let plan = install_plan(d.path()).unwrap();
    assert!(
        plan.notes[0].contains(
            "config.toml: its [plugins.\"io.containerd.grpc.v1.cri\"] table is not the one"
        ),
        "{:?}",
        plan.notes
    );
    assert!(
        plan.notes[1].contains("99-nvidia.toml: holds the CRI table"),
        "{:?}",
        plan.notes
    );
    let text = round_trip("imports", "conf.d/99-nvidia.toml");
    let rt = runtimes(&text, PLUGIN_V2);
    assert_eq!(
        rt.keys().collect::<Vec<_>>(),
        ["nvidia", "runc", "throttlewatch"]
    );
    assert_eq!(rt["runc"]["options"]["SystemdCgroup"].as_bool(), Some(true));
    // config.toml is not touched: its CRI table is not the one containerd uses.
    assert_eq!(read(&main_of(d.path())), main);
}

#[test]
fn no_file_at_all_gets_a_minimal_config_with_runc() {
    let d = tempfile::tempdir().unwrap();
    assert_eq!(
        install("containerd", false, d.path(), Path::new("/b")).unwrap(),
        0
    );
    let text = read(&main_of(d.path()));
    let v: toml::Table = toml::from_str(&text).unwrap();
    assert_eq!(v["version"].as_integer(), Some(2));
    let rt = runtimes(&text, PLUGIN_V2);
    assert_eq!(rt.keys().collect::<Vec<_>>(), ["runc", "throttlewatch"]);
    assert_eq!(rt["runc"]["runtime_type"].as_str(), Some(RUNC_TYPE));
    assert_ours(&rt);
    assert!(!files::backup_of(&main_of(d.path())).exists());
    let mode = std::fs::metadata(main_of(d.path()))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o644);
    assert_eq!(uninstall("containerd", false, d.path()).unwrap(), 0);
    assert!(
        !main_of(d.path()).exists(),
        "the file install created is removed"
    );
}

fn root_with_main(text: &str) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(d.path().join("etc/containerd")).unwrap();
    std::fs::write(main_of(d.path()), text).unwrap();
    d
}

#[test]
fn no_cri_section_or_no_runtimes_table_gets_runc_too() {
    for main in [
        "version = 2\nroot = \"/var/lib/containerd\"\n",
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"my/pause:1\"\n",
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  snapshotter = \"native\"\n",
    ] {
        let d = root_with_main(main);
        assert_eq!(install("containerd", false, d.path(), Path::new("/b")).unwrap(), 0);
        let text = read(&main_of(d.path()));
        let rt = runtimes(&text, PLUGIN_V2);
        assert_eq!(rt.keys().collect::<Vec<_>>(), ["runc", "throttlewatch"], "{text}");
        assert!(text.starts_with(main), "{text}");
        assert_eq!(uninstall("containerd", false, d.path()).unwrap(), 0);
        assert_eq!(read(&main_of(d.path())), main);
    }
}

#[test]
fn version_3_edits_the_containerd_2_runtime_plugin() {
    let main = "version = 3\n\n[plugins]\n  [plugins.'io.containerd.cri.v1.runtime']\n    [plugins.'io.containerd.cri.v1.runtime'.containerd]\n      default_runtime_name = 'runc'\n      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes]\n        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n          runtime_type = 'io.containerd.runc.v2'\n          [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n            SystemdCgroup = true\n";
    let d = root_with_main(main);
    assert_eq!(
        install("containerd", false, d.path(), Path::new("/b")).unwrap(),
        0
    );
    let rt = runtimes(&read(&main_of(d.path())), PLUGIN_V3);
    assert_eq!(rt["runc"]["options"]["SystemdCgroup"].as_bool(), Some(true));
    assert_ours(&rt);
    assert_eq!(uninstall("containerd", false, d.path()).unwrap(), 0);
    assert_eq!(read(&main_of(d.path())), main);
}

/// Bad input: exit 2, the file and the problem named, nothing written.
fn refused(main: &str, expect: &[&str]) {
    let d = root_with_main(main);
    let before = snapshot(d.path());
    let e = install("containerd", false, d.path(), Path::new("/b")).unwrap_err();
    assert_eq!(e.code, 2, "{}", e.message);
    assert!(
        e.message.contains("etc/containerd/config.toml"),
        "{}",
        e.message
    );
    for x in expect {
        assert!(e.message.contains(x), "{:?} lacks {x:?}", e.message);
    }
    assert_eq!(snapshot(d.path()), before);
}

#[test]
fn bad_input_is_refused_and_nothing_written() {
    refused("version = 2\n[plugins\n", &["not TOML", "accepted"]);
    refused(
        "[plugins.cri.containerd]\n  snapshotter = \"overlayfs\"\n",
        &["version 1", "version = 2", "version = 3"],
    );
    refused("version = 1\n[plugins.cri]\n", &["version 1"]);
    refused("version = 5\n", &["version = 5", "accepted", "version = 4"]);
    refused("version = \"2\"\n", &["version = \"2\"", "accepted"]);
    refused(
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  runtimes = \"runc\"\n",
        &["runtimes is string", "accepted"],
    );
    refused(
        "version = 2\nimports = \"/etc/containerd/conf.d\"\n",
        &["imports", "array of paths"],
    );
    refused(
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.throttlewatch]\n  runtime_type = \"io.containerd.runc.v2\"\n",
        &["differs from ours", "refusing"],
    );
    refused(
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"crun\"\n",
        &["default_runtime_name = \"crun\"", "accepted"],
    );
    let d = tempfile::tempdir().unwrap();
    assert_eq!(
        install("kata", false, d.path(), Path::new("/b"))
            .unwrap_err()
            .code,
        2
    );
    assert_eq!(uninstall("lxc", false, d.path()).unwrap_err().code, 2);
}

#[test]
fn a_bad_drop_in_is_named() {
    let d = root_with("imports");
    std::fs::write(
        d.path().join("etc/containerd/conf.d/50-broken.toml"),
        "[x\n",
    )
    .unwrap();
    let before = snapshot(d.path());
    let e = install("containerd", false, d.path(), Path::new("/b")).unwrap_err();
    assert_eq!(e.code, 2);
    assert!(
        e.message.contains("conf.d/50-broken.toml") && e.message.contains("not TOML"),
        "{}",
        e.message
    );
    assert_eq!(snapshot(d.path()), before);
}

#[test]
fn dry_run_writes_nothing() {
    for fixture in ["debian-1.6-default", "imports"] {
        let d = root_with(fixture);
        let before = snapshot(d.path());
        assert_eq!(
            install("containerd", true, d.path(), Path::new("/b")).unwrap(),
            0
        );
        assert_eq!(snapshot(d.path()), before);
        assert_eq!(
            install("containerd", false, d.path(), Path::new("/b")).unwrap(),
            0
        );
        let installed = snapshot(d.path());
        assert_eq!(uninstall("containerd", true, d.path()).unwrap(), 0);
        assert_eq!(snapshot(d.path()), installed);
    }
}

#[test]
fn a_file_changed_since_install_loses_only_our_entries() {
    let d = root_with("systemd-nvidia");
    let main = main_of(d.path());
    let original = read(&main);
    install("containerd", false, d.path(), Path::new("/b")).unwrap();
    let edited = read(&main).replace(
        "sandbox_image = \"registry.k8s.io/pause:3.6\"",
        "sandbox_image = \"my/pause:2\"",
    );
    std::fs::write(&main, &edited).unwrap();
    let plan = uninstall_plan(d.path()).unwrap();
    assert!(
        plan.notes
            .iter()
            .any(|n| n.contains("changed since install")),
        "{:?}",
        plan.notes
    );
    uninstall("containerd", false, d.path()).unwrap();
    let after = read(&main);
    assert_eq!(
        after,
        original.replace("registry.k8s.io/pause:3.6", "my/pause:2")
    );
    assert_eq!(
        read(&files::backup_of(&main)),
        original,
        "the pre-install copy stays"
    );
}

#[test]
fn added_runc_is_taken_out_again_when_unchanged() {
    let main =
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"my/pause:1\"\n";
    let d = root_with_main(main);
    install("containerd", false, d.path(), Path::new("/b")).unwrap();
    let p = main_of(d.path());
    std::fs::write(&p, read(&p) + "# a comment of the user\n").unwrap();
    uninstall("containerd", false, d.path()).unwrap();
    assert_eq!(read(&p), format!("{main}# a comment of the user\n"));
}

#[test]
fn an_older_throttlewatch_drop_in_is_moved_aside() {
    let d = root_with("imports");
    let legacy = d.path().join("etc/containerd/conf.d/throttlewatch.toml");
    std::fs::write(
        &legacy,
        "version = 2\n\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.throttlewatch]\n  runtime_type = \"io.containerd.throttlewatch.v2\"\n  pod_annotations = [\"throttlewatch.io/*\"]\n  container_annotations = [\"throttlewatch.io/*\"]\n",
    )
    .unwrap();
    install("containerd", false, d.path(), Path::new("/b")).unwrap();
    assert!(!legacy.exists());
    assert!(files::backup_of(&legacy).exists());
    let rt = runtimes(
        &read(&d.path().join("etc/containerd/conf.d/99-nvidia.toml")),
        PLUGIN_V2,
    );
    assert_eq!(
        rt.keys().collect::<Vec<_>>(),
        ["nvidia", "runc", "throttlewatch"]
    );
}

#[test]
fn backups_have_the_originals_mode() {
    let d = root_with("debian-1.6-default");
    let main = main_of(d.path());
    std::fs::set_permissions(&main, std::fs::Permissions::from_mode(0o600)).unwrap();
    install("containerd", false, d.path(), Path::new("/b")).unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&main), 0o600);
    assert_eq!(mode(&files::backup_of(&main)), 0o600);
    uninstall("containerd", false, d.path()).unwrap();
    assert_eq!(mode(&main), 0o600);
}

#[test]
fn imports_resolve_like_containerd() {
    assert!(glob_match("*.toml", "99-nvidia.toml"));
    assert!(!glob_match("*.toml", "99-nvidia.toml.throttlewatch-backup"));
    assert!(glob_match("a?c", "abc"));
    let d = root_with("imports");
    let chain = load_chain(d.path()).unwrap();
    let names: Vec<_> = chain
        .iter()
        .map(|f| {
            f.host
                .strip_prefix(d.path())
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(
        names,
        [
            "etc/containerd/config.toml",
            "etc/containerd/conf.d/10-gc.toml",
            "etc/containerd/conf.d/99-nvidia.toml"
        ]
    );
    let d = root_with_main("version = 2\nimports = [\"missing.toml\"]\n");
    let e = load_chain(d.path()).err().unwrap();
    assert!(
        e.message.contains("etc/containerd/missing.toml") && e.message.contains("missing"),
        "{}",
        e.message
    );
}

#[test]
fn a_runtime_added_by_hand_is_removed_alone() {
    let main = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n";
    let ours = "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.throttlewatch]\n  runtime_type = \"io.containerd.throttlewatch.v2\"\n  pod_annotations = [\"throttlewatch.io/*\"]\n  container_annotations = [\"throttlewatch.io/*\"]\n";
    let d = root_with_main(&format!("{main}{ours}"));
    assert!(install_plan(d.path())
        .unwrap()
        .nothing_to_do
        .starts_with("already installed"));
    let plan = uninstall_plan(d.path()).unwrap();
    assert!(
        plan.notes[0].contains("no pre-install backup"),
        "{:?}",
        plan.notes
    );
    uninstall("containerd", false, d.path()).unwrap();
    assert_eq!(read(&main_of(d.path())), main);
    assert!(uninstall_plan(d.path()).unwrap().edits.is_empty());
}
