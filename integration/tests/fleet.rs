//! Issue 46: `throttlewatch fleet` against a real fleet in small. Three
//! agents are three nodes (each its own config, log dir, socket and
//! metrics port); a real Prometheus 2.42 with native histograms scrapes
//! them, each target labelled `node` as the PodMonitor does. The replicas
//! of three Deployments run through the runtime wrapper and runc with the
//! CRI annotations kubelet's containerd writes (`io.kubernetes.cri.*`):
//! - `steady`: a steady overload (a busy thread under 0.3 CPUs) on every node;
//! - `bursty`: 2 workers with 40 ms of CPU every 400 ms under 0.5 CPUs, on two
//!   nodes, at the highest CPU weight (so that it waits for its quota, not
//!   behind the steady ones on this 2-CPU machine);
//! - `idle`: asleep, on one.
//!
//! The answer: one entry per workload container, replicas and nodes right,
//! throttled seconds within 5 % of the replicas' kernel totals (their logs'
//! `end`), the limit advice the node reports give (the largest of them),
//! a burst for the bursty one, nothing for the idle one. Then the limit is
//! applied to every replica and the workload run again: its throttled time
//! falls as predicted (the node report's validation bound, docs/report.md:
//! within 25 % of the observed time). Bad inputs of the CLI, last.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use throttlewatch_integration::bundle::{add_tw_burn, text, Bundle, ContainerOpts, OciCli};
use throttlewatch_integration::daemons::{Agent, PrivateConfig};
use throttlewatch_integration::prometheus::{free_port, Histograms, Prometheus};
use throttlewatch_integration::{bin, cpu_lock, of_type, read_log, report_json, unique};

/// One node: an agent with its own everything, and the wrapper bound to it.
struct Node {
    name: String,
    cfg: PrivateConfig,
    port: u16,
    _agent: Agent,
    rt: OciCli,
}

impl Node {
    fn start(name: &str) -> Node {
        let port = free_port();
        let cfg = PrivateConfig::serving_metrics(
            port,
            &format!("snapshot_interval_s = 2\nmetrics_grace_s = {GRACE_S}"),
        );
        let agent = Agent::start(&cfg);
        let rt = OciCli::throttlewatch(&cfg);
        Node {
            name: name.into(),
            cfg,
            port,
            _agent: agent,
            rt,
        }
    }
}

/// How long an ended container's series stay (its last advice is read at
/// its end, on the agent's advice thread, and must be scraped before they go).
const GRACE_S: u64 = 6;

/// Until no node serves a series of the namespace's containers any more
/// (their grace is over: everything they had was there to scrape).
fn wait_retired(nodes: &[Node], ns: &str) {
    let t = Instant::now();
    let key = format!("namespace=\"{ns}\"");
    while nodes.iter().any(|n| {
        throttlewatch_integration::prometheus::http_get(n.port, "/metrics")
            .lines()
            .any(|l| l.contains(&key) && l.contains("container_id="))
    }) {
        assert!(
            t.elapsed() < Duration::from_secs(GRACE_S + 20),
            "series of {ns} still served"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A replica: its pod's name (`<deployment>-<hash>-<5>`), the node, the bundle.
struct Replica<'a> {
    pod: String,
    node: &'a Node,
    b: Bundle,
}

const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

fn suffix() -> String {
    let mut n = unique() as usize * 7919 + std::process::id() as usize;
    (0..5)
        .map(|_| {
            let c = ALPHABET[n % ALPHABET.len()] as char;
            n /= ALPHABET.len();
            n += 13;
            c
        })
        .collect()
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn replica<'a>(
    ns: &str,
    deploy: &str,
    hash: &str,
    node: &'a Node,
    opts: ContainerOpts,
) -> Replica<'a> {
    let pod = format!("{deploy}-{hash}-{}", suffix());
    let mut o = opts;
    for (k, v) in [
        ("io.kubernetes.cri.container-type", "container"),
        ("io.kubernetes.cri.sandbox-namespace", ns),
        ("io.kubernetes.cri.sandbox-name", &pod),
        ("io.kubernetes.cri.container-name", "app"),
    ] {
        o = o.annotation(k, v);
    }
    let b = Bundle::new(&format!("{pod}-{}", unique()), &o);
    Replica { pod, node, b }
}

fn run_all(rs: &[Replica], secs: u64) {
    for r in rs {
        let o = r.node.rt.run_detached(&r.b);
        assert!(o.status.success(), "run -d {}: {}", r.pod, text(&o));
    }
    for r in rs {
        r.node
            .rt
            .wait_stopped(&r.b.id, Duration::from_secs(secs + 60));
        assert!(r.node.rt.delete(&r.b.id).status.success());
    }
}

/// 2 workers (tw-burn), each spinning until it had 40 ms of CPU (its own
/// thread CPU clock: the same work on any machine, however busy), then 400
/// ms asleep, for `secs`: 80 ms a batch against a quota of 50 ms. A counted
/// shell loop was tried first: on a faster CPU its batch fell to the quota
/// and the replicas were hardly throttled, so their waits were the host's.
fn bursty(secs: u64) -> ContainerOpts {
    let ms = (secs * 1000).to_string();
    let args = [
        "/tw-burn",
        "--threads",
        "2",
        "--ms",
        &ms,
        "--spin-cpu",
        "40",
        "--sleep",
        "400",
    ];
    ContainerOpts {
        args: args.iter().map(|a| a.to_string()).collect(),
        ..Default::default()
    }
}

fn kernel_throttled_s(r: &Replica) -> f64 {
    let log = read_log(&r.node.cfg.log_of(&r.b.id));
    let end = of_type(&log, "end");
    assert_eq!(end.len(), 1, "{}: one end record", r.pod);
    end[0]["kernel_throttled_ns"].as_f64().unwrap() / 1e9
}

/// The node report's first recommendation a fleet can apply, as `key=value`.
fn node_advice(r: &Replica) -> Option<(String, String)> {
    let rep = report_json(&r.node.cfg.log_of(&r.b.id), &[])["containers"][0].clone();
    rep["recommendations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| {
            ["quota", "cpu-burst", "contention", "cpuset"].contains(&x["kind"].as_str().unwrap())
        })
        .map(|x| {
            (
                x["key"].as_str().unwrap().to_string(),
                x["value"].as_str().unwrap().to_string(),
            )
        })
}

fn fleet(args: &[&str]) -> std::process::Output {
    Command::new(bin("throttlewatch"))
        .arg("fleet")
        .args(args)
        .output()
        .unwrap()
}

fn fleet_json(prom: &Prometheus, ns: &str, from: f64, to: f64) -> Value {
    let window = format!("{}s", (to - from).ceil() as u64);
    let end = format!("{to:.3}");
    // The last advice is read at each container's end: wait for it to be
    // scraped (at most 10 s).
    let o = fleet(&[
        "--prometheus",
        &prom.url(),
        "-n",
        ns,
        "--window",
        &window,
        "--end",
        &end,
        "--json",
    ]);
    assert!(o.status.success(), "fleet: {}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn workload<'a>(a: &'a Value, name: &str) -> &'a Value {
    a["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["workload"] == name)
        .unwrap_or_else(|| panic!("no workload {name}: {a:#}"))
}

#[test]
fn the_fleet_answer_on_three_nodes() {
    let _cpu = cpu_lock();
    let nodes: Vec<Node> = ["node-a", "node-b", "node-c"]
        .iter()
        .map(|n| Node::start(n))
        .collect();
    let targets: Vec<(u16, &str)> = nodes.iter().map(|n| (n.port, n.name.as_str())).collect();
    let prom = Prometheus::start_nodes(&targets, &[], Histograms::Native);
    // Prometheus hands new targets to its scrapers every 5 s: wait until it
    // scrapes all three, or the replicas' first seconds are not in it.
    let t = Instant::now();
    while prom
        .query("count(up == 1)")
        .first()
        .map(throttlewatch_integration::prometheus::num)
        != Some(3.0)
    {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the three agents not scraped"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let ns = format!("tw-fleet-{}-{}", std::process::id(), unique());
    let secs = 12;
    let steady = || ContainerOpts::busy(1, secs as u32).quota(30_000, 100_000);
    let mut rs = vec![];
    for n in &nodes {
        rs.push(replica(&ns, "steady", "7d9f8b6c5d", n, steady()));
    }
    for n in &nodes[..2] {
        let r = replica(
            &ns,
            "bursty",
            "5c8d7f9b4",
            n,
            bursty(secs).quota(50_000, 100_000),
        );
        add_tw_burn(&r.b);
        r.b.edit(|v| v["linux"]["resources"]["cpu"]["shares"] = serde_json::json!(262_144));
        rs.push(r);
    }
    rs.push(replica(
        &ns,
        "idle",
        "6b7c8d9f2",
        &nodes[2],
        ContainerOpts::sh(&format!("sleep {secs}")),
    ));
    let t0 = now() - 2.0;
    run_all(&rs, secs);
    wait_retired(&nodes, &ns);
    let t1 = now();
    let a = fleet_json(&prom, &ns, t0, t1);
    eprintln!(
        "{}",
        String::from_utf8_lossy(
            &fleet(&[
                "--prometheus",
                &prom.url(),
                "-n",
                &ns,
                "--window",
                &format!("{}s", (t1 - t0).ceil() as u64),
                "--end",
                &format!("{t1:.3}")
            ])
            .stdout
        )
    );
    let ws = a["workloads"].as_array().unwrap();
    assert_eq!(ws.len(), 3, "one entry per workload container: {a:#}");
    assert_eq!(a["owner_source"], "pod-name", "no kube-state-metrics here");
    for (name, replicas, nodes) in [("steady", 3, 3), ("bursty", 2, 2), ("idle", 1, 1)] {
        let w = workload(&a, name);
        assert_eq!(w["kind"], "Deployment", "{w:#}");
        assert_eq!(w["container"], "app");
        assert_eq!(
            (w["replicas"].as_u64(), w["nodes"].as_u64()),
            (Some(replicas), Some(nodes)),
            "{name}: {w:#}"
        );
        let ours: Vec<&Replica> = rs
            .iter()
            .filter(|r| r.pod.starts_with(&format!("{name}-")))
            .collect();
        let kernel: f64 = ours.iter().map(|r| kernel_throttled_s(r)).sum();
        let got = w["throttled_seconds"].as_f64().unwrap();
        eprintln!("{name}: fleet {got:.3} s throttled, the replicas' kernel totals {kernel:.3} s");
        if kernel > 0.5 {
            assert!(
                (got - kernel).abs() <= 0.05 * kernel,
                "{name}: {got} against {kernel}"
            );
        } else {
            assert!(
                (got - kernel).abs() <= 0.05,
                "{name}: {got} against {kernel}"
            );
        }
        // Each replica's advice in Prometheus is its node report's.
        let per: BTreeMap<String, Option<String>> = w["spread"]["per_replica"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["pod"].as_str().unwrap().to_string(),
                    p["advice"].as_str().map(str::to_string),
                )
            })
            .collect();
        for r in &ours {
            let t = Instant::now();
            let want = node_advice(r).map(|(k, v)| format!("{k}={v}"));
            eprintln!("{}: node report {want:?} in {:?}", r.pod, t.elapsed());
            assert_eq!(
                per.get(&r.pod).cloned().flatten(),
                want,
                "{}: the agent's advice against its node report",
                r.pod
            );
        }
    }
    let st = workload(&a, "steady");
    let rec = &st["recommendations"][0];
    assert_eq!(rec["key"], "resources.limits.cpu", "{st:#}");
    let largest = rs
        .iter()
        .filter(|r| r.pod.starts_with("steady-"))
        .filter_map(node_advice)
        .filter(|(k, _)| k == "resources.limits.cpu")
        .map(|(_, v)| v.parse::<f64>().unwrap())
        .fold(0.0, f64::max);
    assert_eq!(
        rec["value"].as_str().unwrap().parse::<f64>().unwrap(),
        largest,
        "{rec:#}"
    );
    assert!(
        rec["kubectl_patch"]
            .as_str()
            .unwrap()
            .contains("patch deployment steady"),
        "{rec:#}"
    );
    let bu = workload(&a, "bursty");
    assert_eq!(
        bu["recommendations"][0]["key"], "throttlewatch.io/cpu-burst",
        "{bu:#}"
    );
    let idle = workload(&a, "idle");
    assert!(
        idle["recommendations"].as_array().unwrap().is_empty(),
        "{idle:#}"
    );
    assert_eq!(idle["throttled_seconds"].as_f64(), Some(0.0));

    // Apply the limit to every replica (a new ReplicaSet), run again.
    let limit: f64 = rec["value"].as_str().unwrap().parse().unwrap();
    let observed = st["throttled_seconds"].as_f64().unwrap();
    let predicted = rec["predicted_throttled_seconds"].as_f64().unwrap();
    // The first run's series are gone (wait_retired) before the second window opens.
    std::thread::sleep(Duration::from_secs(2));
    let t2 = now();
    let again: Vec<Replica> = nodes
        .iter()
        .map(|n| {
            replica(
                &ns,
                "steady",
                "8f9c7d6b5",
                n,
                ContainerOpts::busy(1, secs as u32).quota((limit * 100_000.0) as i64, 100_000),
            )
        })
        .collect();
    run_all(&again, secs);
    wait_retired(&nodes, &ns);
    let t3 = Instant::now();
    let b = fleet_json(&prom, &ns, t2, now());
    let st2 = workload(&b, "steady");
    assert_eq!(
        st2["replicas"].as_u64(),
        Some(3),
        "only the new ReplicaSet's pods: {st2:#}"
    );
    let measured = st2["throttled_seconds"].as_f64().unwrap();
    eprintln!(
        "steady: throttled {observed:.3} s under 0.3 CPUs; limit {limit} predicted {predicted:.3} s, measured {measured:.3} s ({:.1} % of observed off) [{:?}]",
        (measured - predicted).abs() / observed * 100.0,
        t3.elapsed()
    );
    assert!(
        measured < observed / 2.0,
        "the limit did not halve the throttling"
    );
    assert!(
        (measured - predicted).abs() <= 0.25 * observed,
        "measured {measured} predicted {predicted} observed {observed}"
    );

    // The CLI's bad inputs, and the three failures told apart.
    let url = prom.url();
    for (args, want) in [
        (
            vec!["--prometheus", "ftp://x"],
            "expected an http:// or https:// URL",
        ),
        (
            vec!["--prometheus", &url, "--window", "7x"],
            "--window \"7x\": expected a duration",
        ),
        (
            vec!["--prometheus", &url, "-l", "1bad=x"],
            "--selector \"1bad=x\": not a label name",
        ),
        (
            vec!["--prometheus", &url, "-n", "Not_A_Namespace"],
            "--namespace \"Not_A_Namespace\"",
        ),
        (vec!["--prometheus", &url, "--top", "0"], "--top 0"),
        (
            vec!["--prometheus", &url, "--end", "yesterday"],
            "--end \"yesterday\"",
        ),
    ] {
        let o = fleet(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(want), "{args:?}: {}", text(&o));
    }
    let dead = format!("http://127.0.0.1:{}", free_port());
    for (args, want) in [
        (
            vec!["--prometheus", dead.as_str()],
            "cannot reach the Prometheus API",
        ),
        (
            vec!["--prometheus", &url, "-n", &ns, "-l", "pod=~\"(\""],
            "the query was refused (bad_data",
        ),
        (
            vec!["--prometheus", &url, "-n", "no-such-namespace"],
            "no throttlewatch series",
        ),
        (
            vec!["--prometheus", &url, "-n", &ns, "--workload", "nope"],
            "--workload \"nope\"",
        ),
    ] {
        let o = fleet(&args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(want), "{args:?}: {}", text(&o));
    }
    // CSV and HTML from the same answer.
    let o = fleet(&["--prometheus", &url, "-n", &ns, "--window", "2m", "--csv"]);
    let csv = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        csv.starts_with("rank,namespace,workload,") && csv.lines().count() == 4,
        "{csv}"
    );
    let page = std::env::temp_dir().join(format!("tw-fleet-{}.html", unique()));
    let o = fleet(&[
        "--prometheus",
        &url,
        "-n",
        &ns,
        "--window",
        "2m",
        "--html",
        page.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains("<polyline") && html.contains("steady") && html.contains("onclick"),
        "{html}"
    );
    let _ = std::fs::remove_file(page);
}
