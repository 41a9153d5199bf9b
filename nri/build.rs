//! Generates the NRI API bindings from the vendored `api.proto` with
//! `ttrpc-codegen` (pure-Rust parser, no `protoc`).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;

use ttrpc_codegen::{Codegen, Customize, ProtobufCustomize};

const PROTO: &str = "proto/github.com/containerd/nri/pkg/api/api.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed={PROTO}");
    println!("cargo:rerun-if-changed=build.rs");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").ok_or("OUT_DIR is not set")?);
    Codegen::new()
        .out_dir(&out)
        .input(PROTO)
        .include("proto")
        .rust_protobuf()
        .rust_protobuf_customize(ProtobufCustomize::default().gen_mod_rs(false))
        .customize(Customize {
            gen_mod: false,
            ..Default::default()
        })
        .run()?;
    // `include!` refuses inner attributes and inner doc comments: drop them
    // (the including module carries the allows instead).
    // Only the messages are used: the services are served and called by
    // src/rpc.rs over the multiplexer.
    {
        let path = out.join("api.rs");
        let file = std::fs::File::open(&path)?;
        let mut kept = String::new();
        for line in BufReader::new(file).lines() {
            let line = line?;
            if !(line.starts_with("#!") || line.starts_with("//!")) {
                kept.push_str(&line);
                kept.push('\n');
            }
        }
        std::fs::write(&path, kept)?;
    }
    Ok(())
}
