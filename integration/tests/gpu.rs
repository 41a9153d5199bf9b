//! GPU sampling where there is no NVIDIA management library (these build
//! machines): the agent says so once, not once per container, and watches
//! as before — freezes logged, `cpu_stat` records without GPU samples, the
//! report without a GPU section. The alignment itself is unit-tested on
//! recorded series (report/src/gpu_tests.rs, agent/src/pipeline/gpu/).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use throttlewatch_cgroup::{Hierarchies, TransientCgroup};
use throttlewatch_core::protocol::{call, Register, Request};
use throttlewatch_integration::daemons::{Agent, PrivateConfig};
use throttlewatch_integration::{bin, burn_in, cpu_lock, of_type, read_log, unique};

const NO_LIBRARY: &str = "/nonexistent/libnvidia-ml.so.1";

#[test]
fn without_the_library_the_agent_says_so_once_and_still_logs_freezes() {
    let _l = cpu_lock();
    // Read by the agent at its start (inherited by the child).
    std::env::set_var("THROTTLEWATCH_NVML_LIB", NO_LIBRARY);
    let cfg = PrivateConfig::new("snapshot_interval_s = 1");
    let agent = Agent::start(&cfg);
    let h = Hierarchies::discover().unwrap();
    let mut logs = vec![];
    let groups: Vec<TransientCgroup> = (0..2)
        .map(|i| {
            let rel = format!("/tw-test-gpu-{i}-{}-{}", std::process::id(), unique());
            let cg = TransientCgroup::create(&h, &rel).unwrap();
            cg.group.set_quota(Some(20_000), 100_000).unwrap();
            cg
        })
        .collect();
    let mut burners: Vec<_> = groups
        .iter()
        .map(|cg| burn_in(cg, &["--threads", "2", "--ms", "2500"]))
        .collect();
    for (i, (cg, b)) in groups.iter().zip(&burners).enumerate() {
        let r = call(
            &cfg.socket,
            &Request::Register(Register {
                container_id: format!("gpu-{i}"),
                pid: Some(b.id()),
                cgroup_path: cg.group.rel.clone(),
                ..Default::default()
            }),
            Duration::from_secs(5),
        )
        .unwrap();
        assert!(r.ok, "register: {r:?}");
    }
    for b in &mut burners {
        assert!(b.wait().unwrap().success());
    }
    for i in 0..2 {
        let r = call(
            &cfg.socket,
            &Request::Unregister {
                container_id: format!("gpu-{i}"),
                scope: None,
                reason: throttlewatch_core::EndReason::Poststop,
                exit_code: Some(0),
            },
            Duration::from_secs(5),
        )
        .unwrap();
        assert!(r.ok, "{r:?}");
        logs.push(PathBuf::from(r.log_path.unwrap()));
    }
    let out = agent.output();
    eprintln!("{out}");
    let said: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("GPU utilisation"))
        .collect();
    assert_eq!(said.len(), 1, "once per agent, not per container: {out}");
    let want = format!(
        "throttlewatch agent: GPU utilisation is not sampled: no NVIDIA management library ({NO_LIBRARY}: "
    );
    assert!(said[0].starts_with(&want), "{}", said[0]);
    assert!(
        said[0].ends_with(
            "freezes are watched as before (nvml_library in throttlewatch.toml or THROTTLEWATCH_NVML_LIB names the library if it is elsewhere)"
        ),
        "{}",
        said[0]
    );
    for log in &logs {
        let v = read_log(log);
        assert!(
            !of_type(&v, "throttle").is_empty(),
            "freezes logged: {log:?}"
        );
        let stats = of_type(&v, "cpu_stat");
        assert!(!stats.is_empty(), "periodic cpu_stat records");
        assert!(stats.iter().all(|s| s.get("gpu").is_none()), "{stats:?}");
        let end = of_type(&v, "end")[0];
        assert!(end["kernel_throttled_ns"].as_u64().unwrap() > 100_000_000);
        let o = Command::new(bin("throttlewatch"))
            .args(["report", "--json"])
            .arg(log)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let c = &doc["containers"][0];
        assert!(c["kernel_throttled_ns"].as_u64().unwrap() > 0);
        assert!(c.get("gpu").is_none(), "no samples, no GPU section: {c}");
    }
    drop(agent);

    // The configuration's `nvml_library`, where the environment names none.
    std::env::remove_var("THROTTLEWATCH_NVML_LIB");
    let configured = "/nonexistent/configured/libnvidia-ml.so.1";
    let cfg = PrivateConfig::new(&format!("nvml_library = {configured:?}"));
    let out = Agent::start(&cfg).output();
    assert!(
        out.contains(&format!(
            "GPU utilisation is not sampled: no NVIDIA management library ({configured}: "
        )),
        "{out}"
    );
}
