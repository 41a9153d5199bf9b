//! Issue 11, what a container or a bad configuration may ask for: an image's
//! environment and annotations never replace the orchestrator's cpuset, a
//! bad configuration never widens what is allowed nor loosens fail-closed,
//! and `throttlewatch config check` says so. Real agent, hook, wrapper, runc
//! and containerd with the shim.

use std::process::Command;

use throttlewatch_cgroup::Hierarchies;
use throttlewatch_integration::bundle::{text, Bundle, ContainerOpts, OciCli};
use throttlewatch_integration::daemons::{Agent, PrivateConfig};
use throttlewatch_integration::fixtures::force_delete;
use throttlewatch_integration::unique;

fn id(tag: &str) -> String {
    format!("tw-hard-{tag}-{}-{}", std::process::id(), unique())
}

/// The container's cpuset.cpus, read from its cgroup.
fn cpuset_of(b: &Bundle) -> String {
    let h = Hierarchies::discover().unwrap();
    let g = throttlewatch_cgroup::CpuCgroup::open(&h, &b.cgroup_path).unwrap();
    g.limits().unwrap().cpus.unwrap_or_default()
}

/// Finding 3: an image's `ENV THROTTLEWATCH_CPUSET` never moves a container,
/// and no request widens or replaces the cpuset the orchestrator set
/// (`docker --cpuset-cpus`, kubelet's CPU manager); a subset narrows it.
#[test]
fn image_env_and_requests_never_replace_the_orchestrator_cpuset() {
    let cfg = PrivateConfig::new("");
    let _agent = Agent::start(&cfg);
    let rt = OciCli::throttlewatch(&cfg);
    let with_cpus = |tag: &str, opts: ContainerOpts, cpus: &str| {
        let b = Bundle::new(&id(tag), &opts);
        b.edit(|v| v["linux"]["resources"]["cpu"]["cpus"] = serde_json::json!(cpus));
        b
    };
    // (what the container asks, the orchestrator's set, the cpuset it gets, what the hook says)
    let cases = [
        (
            ContainerOpts::sh("sleep 5").env("THROTTLEWATCH_CPUSET=1"),
            "0",
            "0",
            "THROTTLEWATCH_CPUSET=\"1\": cpusets are honoured from annotations only",
        ),
        (
            ContainerOpts::sh("sleep 5").env("THROTTLEWATCH_CPUSET=1,exclusive"),
            "",
            "",
            "THROTTLEWATCH_CPUSET=\"1,exclusive\": cpusets are honoured from annotations only",
        ),
        (
            ContainerOpts::sh("sleep 5").annotation("throttlewatch.io/cpuset", "1"),
            "0",
            "0",
            "throttlewatch.io/cpuset=\"1\": not inside the cpuset the orchestrator set (linux.resources.cpu.cpus = 0)",
        ),
        (
            ContainerOpts::sh("sleep 5").annotation("throttlewatch.io/cpuset", "1"),
            "0-1",
            "1",
            "",
        ),
    ];
    let all = std::fs::read_to_string("/sys/fs/cgroup/cpuset/cpuset.cpus")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    for (i, (opts, orch, want, said)) in cases.into_iter().enumerate() {
        let b = with_cpus(&format!("envcpus{i}"), opts, orch);
        let o = rt.run_detached(&b);
        assert!(o.status.success(), "{i}: {}", text(&o));
        let want = if want.is_empty() {
            all.clone()
        } else {
            want.to_string()
        };
        assert_eq!(cpuset_of(&b), want, "case {i}: orchestrator {orch:?}");
        let spec_cpus = b.config()["linux"]["resources"]["cpu"]["cpus"].clone();
        if orch == "0" {
            assert_eq!(
                spec_cpus, "0",
                "case {i}: the wrapper left the spec's cpuset"
            );
        }
        let log = cfg.hook_log();
        assert!(
            log.contains(said),
            "case {i}: {said:?} not in hook.log: {log}"
        );
        force_delete(&rt, &b.id);
    }
}

/// A configuration the code refuses: `fail_mode` as given, and a typo'd key
/// name in the policy (the kind of mistake docs used to invite).
fn bad_config(mode: &str) -> PrivateConfig {
    PrivateConfig::new(&format!(
        "fail_mode = {mode:?}\n[qos]\nallowed_keys = [\"cpu-brust\"]\n"
    ))
}

/// Finding 8: a bad configuration never widens what is allowed (the shim
/// used to fall back to permissive defaults and write the cpuset an
/// annotation asked for), and `fail_mode = "closed"` in a bad file still
/// refuses containers (the hook used to exit 0).
#[test]
fn bad_config_never_widens_and_keeps_fail_closed() {
    use throttlewatch_integration::containerd::{build_busybox_image, IMAGE_NAME, SHIM_RUNTIME};
    use throttlewatch_integration::shim::containerd_with_shim;
    use throttlewatch_integration::{bin, Scratch};
    // The hook itself, as runc runs it from a spec that names the bad file.
    for (mode, ok) in [("open", true), ("closed", false)] {
        let cfg = bad_config(mode);
        let b = Bundle::new(&id("badcfg-hook"), &ContainerOpts::sh("sleep 5"));
        let hook = bin("throttlewatch-hook");
        b.edit(|v| {
            v["hooks"]["createRuntime"] = serde_json::json!([{
                "path": hook.to_str().unwrap(),
                "args": ["throttlewatch-hook", "createRuntime", "--config", cfg.path.to_str().unwrap()],
            }])
        });
        let rt = OciCli::new("runc");
        let o = rt.run_detached(&b);
        assert_eq!(
            o.status.success(),
            ok,
            "runc with our hook and a bad config, fail_mode {mode}: {}",
            text(&o)
        );
        if !ok {
            assert!(
                text(&o).contains("cpu-brust"),
                "the reason reaches runc: {}",
                text(&o)
            );
        }
        // Through the wrapper: refused before runc when closed was meant.
        let rt = OciCli::throttlewatch(&cfg);
        let b = Bundle::new(&id("badcfg-wrap"), &ContainerOpts::sh("sleep 5"));
        let o = rt.run_detached(&b);
        assert_eq!(
            o.status.success(),
            ok,
            "wrapper, fail_mode {mode}: {}",
            text(&o)
        );
        if ok {
            assert!(
                b.config()
                    .get("hooks")
                    .is_none_or(|h| h.get("createRuntime").is_none()),
                "spec left unchanged: {}",
                b.config()
            );
        }
    }
    // The shim: under a bad (fail-open) file, no spec change at all.
    let cfg = bad_config("open");
    let ctd = containerd_with_shim(&cfg.path);
    let img = Scratch::new("img");
    ctd.import(&build_busybox_image(&img.0));
    let all = std::fs::read_to_string("/sys/fs/cgroup/cpuset/cpuset.cpus").unwrap();
    let out = ctd.ctr(&[
        "run",
        "--rm",
        "--runtime",
        SHIM_RUNTIME,
        "--annotation",
        "throttlewatch.io/cpuset=1",
        IMAGE_NAME,
        &id("badcfg-shim"),
        "sh",
        "-c",
        "grep Cpus_allowed_list /proc/self/status",
    ]);
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        ctd.log()
    );
    assert!(
        said.trim().ends_with(all.trim()),
        "the shim applied a cpuset under a bad config: {said:?} (machine: {all:?})"
    );
}

/// Finding 8: `throttlewatch config check [FILE]` validates as the hook
/// loads, and says what a file would do.
#[test]
fn config_check_validates_and_describes() {
    use throttlewatch_integration::bin;
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/throttlewatch.toml");
    let o = Command::new(bin("throttlewatch"))
        .args(["config", "check", shipped])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.contains("valid") && out.contains("may set: watch, threshold, cpu-burst"),
        "{out}"
    );
    let cfg = bad_config("closed");
    let o = Command::new(bin("throttlewatch"))
        .args(["config", "check"])
        .arg(&cfg.path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("\"cpu-brust\" is not a key") && err.contains("containers are refused"),
        "{err}"
    );
}
