//! Benchmark (issue 31): what a pod costs through handler `throttlewatch`
//! (our shim, the agent running) against the default handler runc
//! (containerd's `containerd-shim-runc-v2`), through the CRI as kubelet
//! drives it: RunPodSandbox + CreateContainer + StartContainer (the pod is
//! running), then StopPodSandbox + RemovePodSandbox. Cycles alternate
//! between the handlers (which goes first alternates too) on one node, so
//! both see the same machine; the figure is the ratio of the medians
//! (ours / runc), start and whole cycle, within one run.
//!
//! It is a benchmark, not a timed test: it is ignored by the suite and
//! asserts only that every cycle ran its pod and left nothing behind. Run
//! by hand (root; `cargo build --workspace --bins` first):
//!
//! ```sh
//! cargo test -p throttlewatch-integration --test pod_start_bench -- --ignored --nocapture
//! # a release build of the shim: cargo build --release -p containerd-shim-throttlewatch-v2
//! TW_SHIM_DIR=$PWD/target/release cargo test -p throttlewatch-integration --test pod_start_bench -- --ignored --nocapture
//! ```
//!
//! `TW_BENCH_CYCLES` (default 40) cycles per handler and release.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_cri::v1::ContainerState;
use throttlewatch_integration::containerd::SHIM_RUNTIME;
use throttlewatch_integration::cpu_lock;
use throttlewatch_integration::cri::{ContainerdRelease, CriNode};
use throttlewatch_integration::daemons::{Agent, PrivateConfig};
use throttlewatch_integration::shim::shim_dir;

const HANDLER: &str = "throttlewatch";
/// Cycles per handler left out of the figures (first image unpack, caches).
const WARM_UP: usize = 2;

/// One pod's (start, whole cycle) times through `handler` ("" = runc).
fn cycle(node: &CriNode, handler: &str, n: usize) -> (Duration, Duration) {
    let t0 = Instant::now();
    let pod = node
        .run_pod(handler, node.pod_config(&format!("bench{n}"), "bench", &[]))
        .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
    let id = node
        .create_container(&pod, "app", &["sleep", "1000"], Some((50_000, 100_000)))
        .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
    node.start_container(&id)
        .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
    let started = t0.elapsed();
    node.stop_pod(&pod).unwrap();
    node.remove_pod(&pod).unwrap();
    let whole = t0.elapsed();
    // Checked after the clock stopped: the container was running (stopped
    // by the pod's stop) and is gone with the pod.
    assert!(
        node.container_state(&id).is_err(),
        "{handler}: container {id} outlived its pod"
    );
    (started, whole)
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn bench(release: ContainerdRelease) {
    // One release at a time: the two benchmarks must not share the CPUs.
    let _cpu = cpu_lock();
    let cycles: usize = std::env::var("TW_BENCH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let tw = PrivateConfig::new("");
    let _agent = Agent::start(&tw);
    let mut dirs: Vec<PathBuf> = std::env::var_os("TW_SHIM_DIR")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    dirs.push(shim_dir());
    let mut node = CriNode::new_on(
        release,
        &release.handler_toml(HANDLER, SHIM_RUNTIME, &[]),
        &dirs,
        &[("THROTTLEWATCH_CONFIG", tw.path.to_str().unwrap())],
    );
    node.start();
    // A pod through each handler is running as it should before timing.
    for handler in ["", HANDLER] {
        let pod = node
            .run_pod(handler, node.pod_config("probe", "bench", &[]))
            .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
        let id = node
            .create_container(&pod, "app", &["sleep", "1000"], None)
            .unwrap();
        node.start_container(&id).unwrap();
        assert_eq!(
            node.container_state(&id).unwrap().0,
            ContainerState::ContainerRunning,
            "handler {handler:?}"
        );
        node.stop_pod(&pod).unwrap();
        node.remove_pod(&pod).unwrap();
    }

    let (mut runc, mut ours) = (vec![], vec![]);
    for n in 0..cycles + WARM_UP {
        let order: [(&str, &mut Vec<_>); 2] = match n % 2 {
            0 => [("", &mut runc), (HANDLER, &mut ours)],
            _ => [(HANDLER, &mut ours), ("", &mut runc)],
        };
        for (handler, times) in order {
            let t = cycle(&node, handler, n);
            if n >= WARM_UP {
                times.push(t);
            }
        }
    }
    let t_shims = Instant::now();
    while !node.shim_pids().is_empty() && t_shims.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(node.shim_pids(), Vec::<u32>::new(), "shims left");
    node.stop();

    let split = |v: &[(Duration, Duration)]| -> (Vec<Duration>, Vec<Duration>) {
        v.iter().copied().unzip()
    };
    let ((mut rs, mut rw), (mut os, mut ow)) = (split(&runc), split(&ours));
    let (rs, rw, os, ow) = (
        median(&mut rs),
        median(&mut rw),
        median(&mut os),
        median(&mut ow),
    );
    eprintln!(
        "pod start on {} ({cycles} alternating cycles per handler, medians):\n  \
         runp+create+start: runc {:.1} ms, throttlewatch {:.1} ms, ratio {:.3}\n  \
         whole cycle (+stop+rm): runc {:.1} ms, throttlewatch {:.1} ms, ratio {:.3}",
        release.name(),
        ms(rs),
        ms(os),
        ms(os) / ms(rs),
        ms(rw),
        ms(ow),
        ms(ow) / ms(rw),
    );
    assert_eq!((runc.len(), ours.len()), (cycles, cycles));
}

#[test]
#[ignore = "benchmark: run by hand with --ignored --nocapture"]
fn pod_start_throttlewatch_vs_runc_on_containerd_2_3() {
    bench(ContainerdRelease::V2_3);
}

#[test]
#[ignore = "benchmark: run by hand with --ignored --nocapture"]
fn pod_start_throttlewatch_vs_runc_on_containerd_1_6() {
    bench(ContainerdRelease::V1_6);
}
