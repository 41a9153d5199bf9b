//! Builds the BPF skeleton. vmlinux.h is generated from the build machine's
//! BTF (the programs are CO-RE, so they load on other kernels too).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

use libbpf_cargo::SkeletonBuilder;

const PROGS: &[&str] = &["throttle", "fentry"];

fn vmlinux_h(out: &Path) -> PathBuf {
    let dir = out.join("vmlinux");
    let file = dir.join("vmlinux.h");
    if file.exists() {
        return dir;
    }
    std::fs::create_dir_all(&dir).unwrap();
    let btf =
        env::var("THROTTLEWATCH_VMLINUX_BTF").unwrap_or_else(|_| "/sys/kernel/btf/vmlinux".into());
    let o = Command::new("bpftool")
        .args(["btf", "dump", "file", &btf, "format", "c"])
        .output()
        .unwrap_or_else(|e| {
            panic!("running bpftool to generate vmlinux.h from {btf}: {e} (run scripts/setup.sh)")
        });
    assert!(
        o.status.success(),
        "bpftool btf dump {btf}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::write(&file, o.stdout).unwrap();
    dir
}

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").unwrap());
    let vmlinux = vmlinux_h(&out);
    println!("cargo:rerun-if-env-changed=THROTTLEWATCH_VMLINUX_BTF");
    println!("cargo:rerun-if-changed=src/bpf");
    for name in PROGS {
        let src = format!("src/bpf/{name}.bpf.c");
        SkeletonBuilder::new()
            .source(&src)
            .clang_args([
                "-I",
                vmlinux.to_str().unwrap(),
                "-I",
                "src/bpf",
                "-O2",
                "-g",
                "-Wall",
            ])
            .build_and_generate(out.join(format!("{name}.skel.rs")))
            .unwrap_or_else(|e| panic!("building {src}: {e:#}"));
    }
}
