//! `throttlewatch install containerd|docker [--dry-run]`: the drop-in
//! configuration that gives an engine the runtime `throttlewatch`.
//!
//! Never overwrites silently: a containerd drop-in that exists and differs is
//! refused (exit 2) unless it already has our runtime; docker's daemon.json is
//! merged (our one key added, the user's text kept, the diff printed, the old
//! file kept as `daemon.json.throttlewatch-backup`) and refused when it has a
//! different `throttlewatch` runtime or is not JSON. `--dry-run` prints the
//! diff and writes nothing.

use std::path::{Path, PathBuf};

use crate::CliError;

/// The CRI runtime table our entry lives in (containerd config version 2).
pub const CONTAINERD_TABLE: &str =
    r#"[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.throttlewatch]"#;
pub const CONTAINERD_MAIN: &str = "etc/containerd/config.toml";
pub const CONTAINERD_DROPIN_DIR: &str = "etc/containerd/conf.d";
pub const CONTAINERD_DROPIN: &str = "etc/containerd/conf.d/throttlewatch.toml";
pub const DOCKER_DAEMON_JSON: &str = "etc/docker/daemon.json";
pub const RUNTIME_NAME: &str = "throttlewatch";

pub fn install(
    engine: &str,
    dry_run: bool,
    etc_root: &Path,
    bin_dir: &Path,
) -> Result<i32, CliError> {
    match engine {
        "containerd" => install_containerd(dry_run, etc_root),
        "docker" => install_docker(dry_run, etc_root, bin_dir),
        other => Err(CliError::usage(format!(
            "install: unknown engine {other:?}; accepted: containerd, docker"
        ))),
    }
}

pub fn containerd_dropin() -> String {
    format!(
        "# Written by `throttlewatch install containerd`: the runtime handler `throttlewatch`\n\
         # (RuntimeClass handler), served by containerd-shim-throttlewatch-v2 from containerd's PATH.\n\
         version = 2\n\n{CONTAINERD_TABLE}\n  runtime_type = \"io.containerd.throttlewatch.v2\"\n  \
         pod_annotations = [\"throttlewatch.io/*\"]\n  container_annotations = [\"throttlewatch.io/*\"]\n"
    )
}

fn install_containerd(dry_run: bool, etc_root: &Path) -> Result<i32, CliError> {
    let main = etc_root.join(CONTAINERD_MAIN);
    let main_text = std::fs::read_to_string(&main).unwrap_or_default();
    if main_text.contains(CONTAINERD_TABLE) {
        println!(
            "already installed: {} has the runtime {RUNTIME_NAME}",
            main.display()
        );
        return Ok(0);
    }
    let dropin_abs = Path::new("/").join(CONTAINERD_DROPIN);
    if !imports(&main_text)
        .iter()
        .any(|p| glob_match(p, &dropin_abs.to_string_lossy()))
    {
        println!(
            "{} does not import {}/; add this line at the top of it (before any [table]):\n\n\
             imports = [\"/{CONTAINERD_DROPIN_DIR}/*.toml\"]\n\n\
             and run `throttlewatch install containerd` again, or paste this into it:\n\n{}",
            main.display(),
            Path::new("/").join(CONTAINERD_DROPIN_DIR).display(),
            containerd_dropin()
        );
        return Err(CliError::fail(format!(
            "nothing written: {} does not import the drop-in directory",
            main.display()
        )));
    }
    let target = etc_root.join(CONTAINERD_DROPIN);
    let new = containerd_dropin();
    let old = match std::fs::read_to_string(&target) {
        Ok(old) if old == new || old.contains(CONTAINERD_TABLE) => {
            println!("already installed: {}", target.display());
            return Ok(0);
        }
        Ok(_) => {
            return Err(CliError::usage(format!(
                "{} exists with other content and no runtime {RUNTIME_NAME}; refusing to overwrite it \
                 (move it away or add the table from configs/containerd/throttlewatch-shim.toml by hand)",
                target.display()
            )))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(CliError::fail(format!("{}: {e}", target.display()))),
    };
    write_or_show(&target, &old, &new, dry_run, None)?;
    if !dry_run {
        println!("restart containerd to load the runtime {RUNTIME_NAME}");
    }
    Ok(0)
}

/// The strings of the top-level `imports = [...]` of a containerd config.
pub fn imports(config: &str) -> Vec<String> {
    let top = config.split("\n[").next().unwrap_or("");
    let Some(at) = top
        .lines()
        .position(|l| l.trim_start().starts_with("imports"))
    else {
        return vec![];
    };
    let rest: String = top.lines().skip(at).collect::<Vec<_>>().join("\n");
    let Some(open) = rest.find('[') else {
        return vec![];
    };
    let body = &rest[open + 1..rest.find(']').unwrap_or(rest.len())];
    body.split(',')
        .map(|s| s.trim().trim_matches(|c| c == '"' || c == '\'').to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// filepath.Glob's `*` (no `/`), enough for containerd's imports.
pub fn glob_match(pattern: &str, path: &str) -> bool {
    fn go(p: &[u8], s: &[u8]) -> bool {
        match p.split_first() {
            None => s.is_empty(),
            Some((b'*', rest)) => (0..=s.len())
                .take_while(|&i| i == 0 || s[i - 1] != b'/')
                .any(|i| go(rest, &s[i..])),
            Some((c, rest)) => s.first() == Some(c) && go(rest, &s[1..]),
        }
    }
    go(pattern.as_bytes(), path.as_bytes())
}

fn install_docker(dry_run: bool, etc_root: &Path, bin_dir: &Path) -> Result<i32, CliError> {
    let target = etc_root.join(DOCKER_DAEMON_JSON);
    let runtime_path = bin_dir
        .join("throttlewatch-runtime")
        .to_string_lossy()
        .into_owned();
    let ours = serde_json::json!({ "path": runtime_path });
    let old = match std::fs::read_to_string(&target) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(CliError::fail(format!("{}: {e}", target.display()))),
    };
    let mut doc: serde_json::Value = if old.trim().is_empty() {
        serde_json::json!({})
    } else {
        serde_json::from_str(&old).map_err(|e| {
            CliError::usage(format!(
                "{}: not JSON ({e}); refusing to edit it",
                target.display()
            ))
        })?
    };
    if !doc.is_object() || !(doc["runtimes"].is_null() || doc["runtimes"].is_object()) {
        return Err(CliError::usage(format!(
            "{}: unexpected shape (top level or \"runtimes\" is not an object); refusing to edit it",
            target.display()
        )));
    }
    match doc.get("runtimes").and_then(|r| r.get(RUNTIME_NAME)) {
        Some(existing) if existing["path"] == ours["path"] => {
            println!(
                "already installed: {} has the runtime {RUNTIME_NAME}",
                target.display()
            );
            return Ok(0);
        }
        Some(existing) => {
            return Err(CliError::usage(format!(
            "{}: runtimes.{RUNTIME_NAME} is already {existing}, not {ours}; refusing to change it",
            target.display()
        )))
        }
        None => {}
    }
    let entry = format!(
        "\"{RUNTIME_NAME}\": {{ \"path\": {} }}",
        serde_json::Value::String(runtime_path)
    );
    doc.as_object_mut()
        .expect("object")
        .entry("runtimes")
        .or_insert_with(|| serde_json::json!({}))[RUNTIME_NAME] = ours;
    let new = insert_runtime(&old, &entry)
        .filter(|t| serde_json::from_str::<serde_json::Value>(t).ok().as_ref() == Some(&doc))
        .unwrap_or_else(|| serde_json::to_string_pretty(&doc).expect("json") + "\n");
    let backup =
        (!old.is_empty()).then(|| target.with_file_name("daemon.json.throttlewatch-backup"));
    write_or_show(&target, &old, &new, dry_run, backup.as_deref())?;
    if !dry_run {
        println!("reload dockerd (SIGHUP or `systemctl reload docker`), then `docker run --runtime {RUNTIME_NAME} …`");
    }
    Ok(0)
}

/// Add our runtime to daemon.json's text, keeping the user's layout.
fn insert_runtime(old: &str, entry: &str) -> Option<String> {
    if old.trim().is_empty() {
        return Some(format!("{{\n  \"runtimes\": {{\n    {entry}\n  }}\n}}\n"));
    }
    let (at, text) = match old.find("\"runtimes\"") {
        Some(k) => {
            let brace = k + old[k..].find('{')?;
            let empty = old[brace + 1..].trim_start().starts_with('}');
            (
                brace + 1,
                format!("\n    {entry}{}", if empty { "\n  " } else { "," }),
            )
        }
        None => {
            let brace = old.find('{')?;
            let empty = old[brace + 1..].trim_start().starts_with('}');
            (
                brace + 1,
                format!(
                    "\n  \"runtimes\": {{\n    {entry}\n  }}{}",
                    if empty { "\n" } else { "," }
                ),
            )
        }
    };
    Some(format!("{}{}{}", &old[..at], text, &old[at..]))
}

fn write_or_show(
    target: &Path,
    old: &str,
    new: &str,
    dry_run: bool,
    backup: Option<&Path>,
) -> Result<(), CliError> {
    print!("{}", unified_diff(old, new, &target.to_string_lossy()));
    if dry_run {
        println!("(dry run: nothing written)");
        return Ok(());
    }
    let io = |p: &Path, e: std::io::Error| CliError::fail(format!("{}: {e}", p.display()));
    let dir = target
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    std::fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
    if let Some(b) = backup {
        std::fs::copy(target, b).map_err(|e| io(b, e))?;
    }
    let tmp = dir.join(format!(
        ".{}.tmp",
        target
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("throttlewatch")
    ));
    std::fs::write(&tmp, new).map_err(|e| io(&tmp, e))?;
    std::fs::rename(&tmp, target).map_err(|e| io(target, e))?;
    println!("wrote {}", target.display());
    Ok(())
}

/// A unified diff (3 lines of context) from an LCS of the lines.
pub fn unified_diff(old: &str, new: &str, path: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (old.lines().collect(), new.lines().collect());
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    // (tag, line, old index, new index)
    let mut ops: Vec<(char, &str, usize, usize)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            ops.push((' ', a[i], i, j));
            (i, j) = (i + 1, j + 1);
        } else if j < b.len() && (i == a.len() || lcs[i][j + 1] >= lcs[i + 1][j]) {
            ops.push(('+', b[j], i, j));
            j += 1;
        } else {
            ops.push(('-', a[i], i, j));
            i += 1;
        }
    }
    let changed: Vec<usize> = ops
        .iter()
        .enumerate()
        .filter(|(_, o)| o.0 != ' ')
        .map(|(k, _)| k)
        .collect();
    if changed.is_empty() {
        return String::new();
    }
    let from = if old.is_empty() {
        "/dev/null".to_string()
    } else {
        format!("a{path}")
    };
    let mut out = format!("--- {from}\n+++ b{path}\n");
    let mut k = 0;
    while k < changed.len() {
        let start = changed[k].saturating_sub(3);
        let mut end = changed[k];
        while k < changed.len() && changed[k] <= end + 7 {
            end = changed[k];
            k += 1;
        }
        let end = (end + 4).min(ops.len());
        let hunk = &ops[start..end];
        let old_n = hunk.iter().filter(|o| o.0 != '+').count();
        let new_n = hunk.iter().filter(|o| o.0 != '-').count();
        let old_start = if old_n == 0 { hunk[0].2 } else { hunk[0].2 + 1 };
        let new_start = if new_n == 0 { hunk[0].3 } else { hunk[0].3 + 1 };
        out.push_str(&format!(
            "@@ -{old_start},{old_n} +{new_start},{new_n} @@\n"
        ));
        for (tag, line, _, _) in hunk {
            out.push_str(&format!("{tag}{line}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn etc(main: Option<&str>) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        if let Some(m) = main {
            std::fs::create_dir_all(d.path().join("etc/containerd")).unwrap();
            std::fs::write(d.path().join(CONTAINERD_MAIN), m).unwrap();
        }
        d
    }

    const IMPORTING: &str =
        "version = 2\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n\n[plugins]\n";

    #[test]
    fn containerd_dropin_is_written_once_then_already_installed() {
        let d = etc(Some(IMPORTING));
        assert_eq!(
            install("containerd", false, d.path(), Path::new("/usr/local/bin")).unwrap(),
            0
        );
        let text = std::fs::read_to_string(d.path().join(CONTAINERD_DROPIN)).unwrap();
        assert!(
            text.contains(CONTAINERD_TABLE) && text.contains("io.containerd.throttlewatch.v2"),
            "{text}"
        );
        assert_eq!(
            install("containerd", false, d.path(), Path::new("/x")).unwrap(),
            0
        );
        assert_eq!(
            std::fs::read_to_string(d.path().join(CONTAINERD_DROPIN)).unwrap(),
            text
        );
    }

    #[test]
    fn containerd_refuses_a_different_existing_dropin() {
        let d = etc(Some(IMPORTING));
        std::fs::create_dir_all(d.path().join(CONTAINERD_DROPIN_DIR)).unwrap();
        std::fs::write(d.path().join(CONTAINERD_DROPIN), "# mine\n").unwrap();
        let e = install("containerd", false, d.path(), Path::new("/b")).unwrap_err();
        assert_eq!(e.code, 2);
        assert!(e.message.contains("refusing"), "{}", e.message);
        assert_eq!(
            std::fs::read_to_string(d.path().join(CONTAINERD_DROPIN)).unwrap(),
            "# mine\n"
        );
    }

    #[test]
    fn containerd_without_imports_writes_nothing() {
        let d = etc(Some("version = 2\n"));
        let e = install("containerd", false, d.path(), Path::new("/b")).unwrap_err();
        assert_eq!(e.code, 1);
        assert!(!d.path().join(CONTAINERD_DROPIN).exists());
        let d = etc(Some(&format!("version = 2\n{CONTAINERD_TABLE}\n")));
        assert_eq!(
            install("containerd", false, d.path(), Path::new("/b")).unwrap(),
            0
        );
    }

    #[test]
    fn containerd_dry_run_writes_nothing() {
        let d = etc(Some(IMPORTING));
        assert_eq!(
            install("containerd", true, d.path(), Path::new("/b")).unwrap(),
            0
        );
        assert!(!d.path().join(CONTAINERD_DROPIN).exists());
    }

    #[test]
    fn imports_and_globs() {
        let cfg = "version = 2\nimports = [\n  \"/etc/containerd/a.toml\",\n  \"/etc/containerd/conf.d/*.toml\",\n]\n[x]\nimports = [\"/no\"]\n";
        assert_eq!(
            imports(cfg),
            vec!["/etc/containerd/a.toml", "/etc/containerd/conf.d/*.toml"]
        );
        assert!(glob_match(
            "/etc/containerd/conf.d/*.toml",
            "/etc/containerd/conf.d/throttlewatch.toml"
        ));
        assert!(!glob_match(
            "/etc/containerd/*.toml",
            "/etc/containerd/conf.d/throttlewatch.toml"
        ));
        assert!(glob_match(
            "/etc/containerd/conf.d/throttlewatch.toml",
            "/etc/containerd/conf.d/throttlewatch.toml"
        ));
    }

    #[test]
    fn docker_merges_keeping_the_users_keys() {
        let d = etc(None);
        let p = d.path().join(DOCKER_DAEMON_JSON);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        let user = "{\n  \"log-driver\": \"json-file\",\n  \"runtimes\": {\n    \"nvidia\": { \"path\": \"/usr/bin/nvidia-container-runtime\" }\n  }\n}\n";
        std::fs::write(&p, user).unwrap();
        assert_eq!(
            install("docker", false, d.path(), Path::new("/usr/local/bin")).unwrap(),
            0
        );
        let text = std::fs::read_to_string(&p).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            v["runtimes"]["throttlewatch"]["path"],
            "/usr/local/bin/throttlewatch-runtime"
        );
        assert_eq!(
            v["runtimes"]["nvidia"]["path"],
            "/usr/bin/nvidia-container-runtime"
        );
        assert_eq!(v["log-driver"], "json-file");
        assert!(text.starts_with("{\n  \"log-driver\""), "{text}");
        assert_eq!(
            std::fs::read_to_string(p.with_file_name("daemon.json.throttlewatch-backup")).unwrap(),
            user
        );
        assert_eq!(
            install("docker", false, d.path(), Path::new("/usr/local/bin")).unwrap(),
            0
        );
        assert_eq!(std::fs::read_to_string(&p).unwrap(), text);
        let e = install("docker", false, d.path(), Path::new("/opt/bin")).unwrap_err();
        assert_eq!(e.code, 2);
    }

    #[test]
    fn docker_new_file_bad_json_and_dry_run() {
        let d = etc(None);
        let p = d.path().join(DOCKER_DAEMON_JSON);
        assert_eq!(
            install("docker", true, d.path(), Path::new("/b")).unwrap(),
            0
        );
        assert!(!p.exists());
        assert_eq!(
            install("docker", false, d.path(), Path::new("/b")).unwrap(),
            0
        );
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"runtimes": {"throttlewatch": {"path": "/b/throttlewatch-runtime"}}})
        );
        std::fs::write(&p, "{ not json").unwrap();
        assert_eq!(
            install("docker", false, d.path(), Path::new("/b"))
                .unwrap_err()
                .code,
            2
        );
        std::fs::write(&p, "{}").unwrap();
        assert_eq!(
            install("docker", false, d.path(), Path::new("/b")).unwrap(),
            0
        );
        assert!(
            serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(&p).unwrap())
                .is_ok()
        );
        assert_eq!(
            install("podman", false, d.path(), Path::new("/b"))
                .unwrap_err()
                .code,
            2
        );
    }

    #[test]
    fn diff_shows_insertions_with_context() {
        let d = unified_diff("a\nb\nc\n", "a\nb\nX\nc\n", "/f");
        assert_eq!(d, "--- a/f\n+++ b/f\n@@ -1,3 +1,4 @@\n a\n b\n+X\n c\n");
        assert_eq!(unified_diff("same\n", "same\n", "/f"), "");
        assert!(unified_diff("", "new\n", "/f")
            .starts_with("--- /dev/null\n+++ b/f\n@@ -0,0 +1,1 @@\n+new\n"));
    }
}
