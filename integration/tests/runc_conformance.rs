//! The wrapper is runc to its callers: what runc prints, the status it
//! exits with, the spec it is given and the state it reports carry nothing
//! of ours beyond our hooks. Real runc 1.1.5, real agent.

use std::time::Duration;

use serde_json::Value;
use throttlewatch_integration::bundle::{text, Bundle, ContainerOpts, OciCli};
use throttlewatch_integration::daemons::{Agent, PrivateConfig};
use throttlewatch_integration::{of_type, read_log, unique};

fn id(tag: &str) -> String {
    format!("tw-{tag}-{}-{}", std::process::id(), unique())
}

/// `create` with no container id: runc refuses it with its usage text and
/// status; the wrapper answers exactly the same, adds no line of its own
/// and edits no spec.
#[test]
fn create_without_an_id_answers_exactly_as_runc() {
    let cfg = PrivateConfig::new("");
    let b = Bundle::new(&id("noid"), &ContainerOpts::sh("true"));
    let before = std::fs::read(b.config_path()).unwrap();
    let runc_path = std::env::split_paths(&std::env::var_os("PATH").unwrap())
        .map(|d| d.join("runc"))
        .find(|p| p.is_file())
        .expect("runc on PATH");
    let plain = OciCli::new(&runc_path);
    let ours = OciCli::throttlewatch(&cfg);
    let bundle = b.dir().to_str().unwrap();
    let (a, w) = (
        plain.run(&["create", "--bundle", bundle]),
        ours.run(&["create", "--bundle", bundle]),
    );
    // runc stamps its error line with the time; nothing else may differ.
    let clean = |o: &std::process::Output| {
        String::from_utf8_lossy(&o.stderr)
            .lines()
            .map(|l| match l.find(" level=") {
                Some(i) if l.starts_with("time=") => l[i..].to_string(),
                _ => l.to_string(),
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(a.status.code(), w.status.code());
    assert!(!a.status.success());
    assert_eq!(clean(&a), clean(&w));
    assert_eq!(a.stdout, w.stdout);
    assert_eq!(
        std::fs::read(b.config_path()).unwrap(),
        before,
        "spec untouched"
    );
}

/// Nothing of ours in what runc reports: `state`'s annotations and the
/// state every hook gets on stdin are the user's, under `create` + `start`
/// (the wrapper's helper registers) and `run` (our createRuntime hook); the
/// cold-start timeline still has its `create` stage, from the front end's
/// own clock.
#[test]
fn runc_state_and_hook_stdin_carry_only_the_users_annotations() {
    let cfg = PrivateConfig::new("");
    let _agent = Agent::start(&cfg);
    let rt = OciCli::throttlewatch(&cfg);
    for how in ["create", "run"] {
        let b = Bundle::new(
            &id(&format!("state-{how}")),
            &ContainerOpts::sh("sleep 0.3").annotation("example.com/owner", "me"),
        );
        let seen = b.dir().join("poststop-stdin.json");
        b.edit(|v| {
            v["hooks"]["poststop"] = serde_json::json!([{
                "path": "/bin/sh",
                "args": ["sh", "-c", format!("cat > {}", seen.display())],
            }]);
        });
        let before = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        if how == "create" {
            let o = rt.create(&b);
            assert!(o.status.success(), "create: {}", text(&o));
            let o = rt.run(&["start", &b.id]);
            assert!(o.status.success(), "start: {}", text(&o));
        } else {
            let o = rt.run_detached(&b);
            assert!(o.status.success(), "run -d: {}", text(&o));
        }
        let o = rt.run(&["state", &b.id]);
        assert!(o.status.success(), "state: {}", text(&o));
        let st: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(
            st["annotations"],
            serde_json::json!({"example.com/owner": "me"}),
            "{how}: runc state"
        );
        rt.wait_stopped(&b.id, Duration::from_secs(30));
        assert!(rt.delete(&b.id).status.success());
        let hook: Value = serde_json::from_slice(&std::fs::read(&seen).unwrap()).unwrap();
        assert_eq!(
            hook["annotations"],
            serde_json::json!({"example.com/owner": "me"}),
            "{how}: the poststop hook's stdin"
        );
        let log = read_log(&cfg.log_of(&b.id));
        let cs = of_type(&log, "cold_start");
        assert_eq!(cs.len(), 1, "{how}: {log:?}");
        let create = cs[0]["stages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["stage"] == "create")
            .unwrap_or_else(|| panic!("{how}: no create stage: {}", cs[0]))["unix_ns"]
            .as_u64()
            .unwrap();
        assert!(
            create >= before && create - before < 10_000_000_000,
            "{how}: create at {create}, the test began the create at {before}"
        );
    }
}
