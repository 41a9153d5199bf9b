//! The GPU panel and alert through a real Prometheus reading the agent.

use super::*;

/// The dashboard's GPU panel and the GPU alert through a real Prometheus
/// (Debian's 2.42, scraping and evaluating the shipped rules every second)
/// reading the agent with the stub library: a container frozen by its
/// 0.2-CPU quota uses GPU 0, 10 % busy, and GPU 1, 90 % busy. The panel's
/// query has a line per GPU with the container's labels; the alert's
/// condition holds for GPU 0 alone, and Prometheus has that alert pending
/// (its `for: 10m` still to run).
#[test]
fn the_gpu_panel_and_alert_read_the_agent_in_prometheus() {
    use throttlewatch_integration::prometheus::{
        dashboard, dump_panels, expand, num, repo, sample, targets, Prometheus, RULES,
    };
    let _l = cpu_lock();
    let scratch = Scratch::new("gpu-prom");
    let stub = stub_library(&scratch.0);
    let port = free_port();
    let cfg = with_metrics(port);
    let agent = GpuAgent::start(
        &cfg,
        &stub,
        &[("STUB_NVML_GPUS", "2"), ("STUB_NVML_UTIL", "10,90")],
    );
    let prom = Prometheus::start(port, &[repo().join(RULES)]);
    let began = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let h = Hierarchies::discover().unwrap();
    let cg = limited(&h, "prom");
    let mut b = gpu_burner_on(&cg, 60_000, "0,1");
    let ns = format!("tw-gpu-{}-{}", std::process::id(), unique());
    let id = format!("gpu-prom-{}", unique());
    let r = call(
        &cfg.socket,
        &Request::Register(Register {
            container_id: id.clone(),
            pid: Some(b.id()),
            cgroup_path: cg.group.rel.clone(),
            annotations: [
                ("io.kubernetes.pod.namespace", ns.as_str()),
                ("io.kubernetes.pod.name", "trainer-0"),
                ("io.kubernetes.container.name", "trainer"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            ..Default::default()
        }),
        Duration::from_secs(5),
    )
    .unwrap();
    assert!(r.ok, "register: {r:?}");

    let rules = std::fs::read_to_string(repo().join(RULES)).unwrap();
    let doc: serde_yaml::Value = serde_yaml::from_str(&rules).unwrap();
    let alert = doc["groups"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_sequence().unwrap())
        .find(|r| r["alert"].as_str() == Some("ThrottlewatchGpuIdleWhileFrozen"))
        .expect("the GPU alert in the shipped rules");
    let expr = alert["expr"].as_str().unwrap().to_string();
    let pending = format!(
        "ALERTS{{alertname=\"ThrottlewatchGpuIdleWhileFrozen\", alertstate=\"pending\", container_id=\"{id}\"}}"
    );
    // The frozen share is a rate over 5 minutes: on a new series it grows
    // with the window's data (about 0.1 after 20 s here), so the condition
    // holds after some 20 s; the alert is pending from its next evaluation.
    let t0 = Instant::now();
    let mut cond_at = None;
    while prom.query(&pending).is_empty() {
        if cond_at.is_none() && !prom.query(&expr).is_empty() {
            cond_at = Some(t0.elapsed());
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the GPU alert not pending in 60 s; its expression gives {:?}; the rule: {}; agent:\n{}\nprometheus:\n{}",
            prom.query(&expr),
            prom.api("/api/v1/rules?type=alert")["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
                .find(|r| r["name"] == "ThrottlewatchGpuIdleWhileFrozen")
                .unwrap_or_default(),
            std::fs::read_to_string(&agent.output).unwrap_or_default(),
            prom.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!(
        "the alert's condition held after {:?}, the alert pending after {} ms",
        cond_at,
        t0.elapsed().as_millis()
    );
    let fired = prom.query(&pending);
    let gpus: Vec<_> = fired.iter().map(|s| s["metric"]["gpu"].clone()).collect();
    assert_eq!(
        gpus,
        vec![serde_json::json!("0")],
        "pending for GPU 0 alone: {fired:?}"
    );
    assert_eq!(fired[0]["metric"]["namespace"], ns.as_str(), "{fired:?}");
    assert_eq!(fired[0]["metric"]["severity"], "warning", "{fired:?}");
    let cond = prom.query(&format!("({expr}) and on (container_id) throttlewatch_gpu_utilization_ratio{{container_id=\"{id}\"}}"));
    eprintln!("the alert's expression: {cond:?}");
    assert!(
        sample(&cond, "gpu", "0").is_some_and(|s| (num(s) - 0.1).abs() < 1e-9)
            && sample(&cond, "gpu", "1").is_none(),
        "{cond:?}"
    );

    // The panel's queries: a line per GPU of the container, the frozen
    // share beside them.
    let d = dashboard();
    let panel: Vec<_> = targets(&d)
        .into_iter()
        .filter(|(p, _)| p["title"] == "GPU utilisation while frozen")
        .collect();
    assert_eq!(panel.len(), 2, "the GPU panel's two queries");
    for (_, t) in panel {
        let q = expand(t["expr"].as_str().unwrap(), &ns);
        let r = prom.query(&q);
        eprintln!("{q}: {r:?}");
        if q.contains("throttlewatch_gpu_utilization_ratio") {
            assert_eq!(r.len(), 2, "a line per GPU: {r:?}");
            assert!(
                sample(&r, "gpu", "0").is_some_and(|s| (num(s) - 0.1).abs() < 1e-9),
                "{r:?}"
            );
            assert!(
                sample(&r, "gpu", "1").is_some_and(|s| (num(s) - 0.9).abs() < 1e-9),
                "{r:?}"
            );
            assert!(
                r.iter().all(|s| s["metric"]["container"] == "trainer"),
                "{r:?}"
            );
        } else {
            assert!(r.iter().any(|s| num(s) > 0.0), "frozen share: {r:?}");
        }
    }
    // Every panel's data over the run, for scripts/render-dashboard.py
    // (docs/dashboard.md: the GPU panel's picture).
    if let Some(path) = std::env::var_os("TW_DASHBOARD_DUMP") {
        std::thread::sleep(Duration::from_secs(20));
        dump_panels(&prom, &d, &ns, began, std::path::Path::new(&path));
    }
    let _ = b.kill();
    let _ = b.wait();
    unregister(&cfg.socket, &id);
    drop(agent);
}
