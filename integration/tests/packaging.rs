//! packaging/install.sh and packaging/uninstall.sh on a staged root
//! (DESTDIR), with the debug binaries (BIN_DIR, ALLOW_DYNAMIC): every file
//! installed is byte for byte its source (the NRI plugin both as
//! `throttlewatch-nri` and, with NRI_LAUNCH=1, in the runtime's plugin_path
//! as `90-throttlewatch`, its conf file in plugin_config_path, both units);
//! a second install changes nothing; a configuration the node changed is
//! kept by both; uninstall leaves the tree as it was before the install.
//! The unit files pass `systemd-analyze verify`. Run `cargo build
//! --workspace --bins` first.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use throttlewatch_integration::bundle::text;
use throttlewatch_integration::trees::snapshot;
use throttlewatch_integration::{bin, Scratch};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn script(name: &str, root: &Path, extra: &[(&str, &str)]) -> Output {
    let bin_dir = bin("throttlewatch").parent().unwrap().to_path_buf();
    Command::new("bash")
        .arg(repo().join("packaging").join(name))
        .env("DESTDIR", root)
        .env("BIN_DIR", bin_dir)
        .env("ALLOW_DYNAMIC", "1")
        .envs(extra.iter().copied())
        .output()
        .unwrap()
}

fn same_bytes(installed: &Path, source: &Path) {
    let (a, b) = (std::fs::read(installed), std::fs::read(source));
    assert!(
        a.is_ok() && a.as_ref().ok() == b.as_ref().ok(),
        "{} is not byte for byte {}",
        installed.display(),
        source.display()
    );
}

#[test]
fn install_sh_and_uninstall_sh_round_trip_with_the_nri_plugin() {
    let d = Scratch::new("packaging");
    let root = d.0.join("root");
    // A node with something of its own beside ours.
    std::fs::create_dir_all(root.join("etc/nri/conf.d")).unwrap();
    std::fs::write(root.join("etc/nri/conf.d/10-other.conf"), "x = 1\n").unwrap();
    std::fs::create_dir_all(root.join("usr/local/bin")).unwrap();
    std::fs::write(root.join("usr/local/bin/other"), "#!/bin/sh\n").unwrap();
    let before = snapshot(&root);
    let launch = [("NRI_LAUNCH", "1")];

    let o = script("install.sh", &root, &launch);
    assert!(o.status.success(), "install.sh: {}", text(&o));
    let r = repo();
    let nri = bin("throttlewatch-nri");
    same_bytes(&root.join("usr/local/bin/throttlewatch-nri"), &nri);
    same_bytes(&root.join("opt/nri/plugins/90-throttlewatch"), &nri);
    for b in [
        "throttlewatch",
        "throttlewatch-hook",
        "throttlewatch-runtime",
    ] {
        same_bytes(&root.join("usr/local/bin").join(b), &bin(b));
    }
    same_bytes(
        &root.join("etc/nri/conf.d/90-throttlewatch.conf"),
        &r.join("packaging/nri/90-throttlewatch.conf"),
    );
    same_bytes(
        &root.join("etc/throttlewatch/throttlewatch.toml"),
        &r.join("configs/throttlewatch.toml"),
    );
    for u in ["throttlewatch-agent.service", "throttlewatch-nri.service"] {
        same_bytes(
            &root.join("etc/systemd/system").join(u),
            &r.join("packaging").join(u),
        );
    }
    let installed = snapshot(&root);
    let o = script("install.sh", &root, &launch);
    assert!(o.status.success(), "install.sh again: {}", text(&o));
    assert!(
        snapshot(&root) == installed,
        "a second install changed files"
    );

    // The node's own settings for the plugin survive both scripts.
    let conf = root.join("etc/nri/conf.d/90-throttlewatch.conf");
    std::fs::write(&conf, "watch = \"all\"\n").unwrap();
    let o = script("install.sh", &root, &launch);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("keeping existing /etc/nri/conf.d/90-throttlewatch.conf"),
        "{}",
        text(&o)
    );
    let o = script("uninstall.sh", &root, &[]);
    assert!(o.status.success(), "uninstall.sh: {}", text(&o));
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), "watch = \"all\"\n");
    assert!(text(&o).contains("keeping /etc/nri/conf.d/90-throttlewatch.conf"));
    std::fs::remove_file(&conf).unwrap();
    let after = snapshot(&root);
    let names = |s: &[(PathBuf, Vec<u8>)]| s.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>();
    assert_eq!(names(&after), names(&before), "files left or lost");
    assert!(after == before, "a file of the node's changed");
    assert!(
        !root.join("etc/throttlewatch").exists(),
        "our empty directory left"
    );
}

#[test]
fn the_units_pass_systemd_analyze_verify() {
    let d = Scratch::new("units");
    // verify checks that ExecStart's program exists: the binaries where the
    // units name them, in a root of their own.
    for u in ["throttlewatch-agent.service", "throttlewatch-nri.service"] {
        let unit = std::fs::read_to_string(repo().join("packaging").join(u)).unwrap();
        let exec = unit
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .unwrap();
        let program = exec.split(' ').next().unwrap();
        assert!(
            program.starts_with("/usr/local/bin/throttlewatch"),
            "{u}: {exec}"
        );
        let name = Path::new(program).file_name().unwrap();
        let here = d.0.join(name);
        std::fs::copy(bin(name.to_str().unwrap()), &here).unwrap();
        let rewritten = unit.replace(program, here.to_str().unwrap());
        let f = d.0.join(u);
        std::fs::write(&f, rewritten).unwrap();
        let o = Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(&f)
            .output()
            .unwrap();
        assert!(
            o.status.success() && o.stderr.is_empty(),
            "{u}: {}",
            text(&o)
        );
    }
}
