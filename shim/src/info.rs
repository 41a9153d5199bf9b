//! `-info`: what containerd 2.x asks every runtime before it uses it
//! (`RuntimeInfo`, containerd's api/types/introspection.proto), answered
//! as containerd-shim-runc-v2 answers it (cmd/containerd-shim-runc-v2/
//! manager `Info`): the runtime options read from stdin (a protobuf `Any`,
//! maybe empty) are echoed, and the low-level runtime's `features` JSON is
//! the `Features` (what the CRI plugin reads for recursive read-only
//! mounts, user namespaces, mount options). No namespace is needed.

use std::io::{Read, Write};
use std::process::Command;

use containerd_shim::protos::protobuf::well_known_types::any::Any;
use containerd_shim::protos::protobuf::{Message, MessageField};
use containerd_shim::protos::types::introspection::{RuntimeInfo, RuntimeVersion};

pub const RUNTIME_ID: &str = "io.containerd.throttlewatch.v2";

/// The type URL the runc shim gives the OCI runtime features (typeurl's
/// registration of runtime-spec's `features.Features`).
pub const FEATURES_TYPE_URL: &str =
    "types.containerd.io/opencontainers/runtime-spec/1/features/Features";

/// Why `-info` could not answer, in the runc shim's words.
#[derive(Debug, thiserror::Error)]
pub enum InfoError {
    #[error("failed to read runtime options: {0}")]
    ReadStdin(std::io::Error),
    #[error("failed to read runtime options (a protobuf Any on stdin): {0}")]
    Options(containerd_shim::protos::protobuf::Error),
    #[error("failed to marshal runtime info: {0}")]
    Marshal(containerd_shim::protos::protobuf::Error),
    #[error("failed to write runtime info: {0}")]
    WriteStdout(std::io::Error),
}

/// Read the options from stdin, print the `RuntimeInfo` on stdout.
pub fn main(runtime: &str) -> Result<(), InfoError> {
    let mut opts = Vec::new();
    std::io::stdin()
        .read_to_end(&mut opts)
        .map_err(InfoError::ReadStdin)?;
    let info = runtime_info(&opts, runtime)?;
    let bytes = info.write_to_bytes().map_err(InfoError::Marshal)?;
    std::io::stdout()
        .write_all(&bytes)
        .map_err(InfoError::WriteStdout)
}

pub fn runtime_info(opts: &[u8], runtime: &str) -> Result<RuntimeInfo, InfoError> {
    let mut info = RuntimeInfo::new();
    info.name = RUNTIME_ID.to_string();
    let mut v = RuntimeVersion::new();
    v.version = concat!("v", env!("CARGO_PKG_VERSION")).to_string();
    v.revision = option_env!("TW_GIT_REVISION")
        .unwrap_or_default()
        .to_string();
    info.version = MessageField::some(v);
    if !opts.is_empty() {
        let any = Any::parse_from_bytes(opts).map_err(InfoError::Options)?;
        info.options = MessageField::some(any);
    }
    // Like the runc shim: a runtime without `features` gives no Features.
    if let Some(json) = features(runtime) {
        let mut any = Any::new();
        any.type_url = FEATURES_TYPE_URL.to_string();
        any.value = json;
        info.features = MessageField::some(any);
    }
    Ok(info)
}

/// `RUNTIME features`, compacted as Go's json.Marshal writes the struct that
/// runc's json.MarshalIndent printed (same fields, same order, same escapes).
fn features(runtime: &str) -> Option<Vec<u8>> {
    let out = Command::new(runtime).arg("features").output().ok()?;
    if !out.status.success() {
        return None;
    }
    let compact = compact_json(&out.stdout);
    serde_json::from_slice::<serde_json::Value>(&compact)
        .ok()
        .filter(|v| v.is_object())?;
    Some(compact)
}

/// JSON without the whitespace between tokens (strings untouched).
fn compact_json(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let (mut in_str, mut esc) = (false, false);
    for &b in s {
        if in_str {
            out.push(b);
            match (esc, b) {
                (true, _) => esc = false,
                (false, b'\\') => esc = true,
                (false, b'"') => in_str = false,
                _ => {}
            }
        } else if !b.is_ascii_whitespace() {
            in_str = b == b'"';
            out.push(b);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compacts_outside_strings_only() {
        let s = b"{\n  \"a b\": [ \"x \\\" y\", 1 ],\n  \"c\":{ }\n}\n";
        assert_eq!(
            compact_json(s),
            b"{\"a b\":[\"x \\\" y\",1],\"c\":{}}".to_vec()
        );
    }

    #[test]
    fn options_are_echoed_and_bad_options_refused() {
        let mut any = Any::new();
        any.type_url = "containerd.runc.v1.Options".into();
        any.value = vec![0x32, 0x04, b'r', b'u', b'n', b'c'];
        let info = runtime_info(&any.write_to_bytes().unwrap(), "/nonexistent").unwrap();
        assert_eq!(info.name, RUNTIME_ID);
        assert_eq!(info.options.as_ref().unwrap().type_url, any.type_url);
        assert!(info.features.is_none(), "no runtime, no features");
        let e = runtime_info(&[0xff, 0xff], "/nonexistent")
            .unwrap_err()
            .to_string();
        assert!(e.contains("runtime options"), "{e}");
    }
}
