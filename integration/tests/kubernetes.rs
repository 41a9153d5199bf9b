//! packaging/kubernetes: every kustomization renders offline (`kubectl
//! kustomize`), every document has what the API server requires, the
//! DaemonSet's selector, images, mounts and account hold together, the
//! RuntimeClass handler is the runtime the installer really writes, the
//! PodMonitor scrapes the agent's port, and the ConfigMap passes `throttlewatch
//! config check`. The installer and cleanup scripts the DaemonSets run are
//! run here too, on a host tree shaped like Debian's containerd node: install
//! then cleanup leaves every file as it was. The node image made by
//! packaging/build-image.sh is accepted by the real `ctr images import`
//! (its files checked through `ctr images mount`) and `docker load`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_yaml::Value;
use throttlewatch_integration::bundle::text;
use throttlewatch_integration::containerd::Containerd;
use throttlewatch_integration::daemons::DOCKER_API_VERSION;
use throttlewatch_integration::private_dockerd::PrivateDockerd;
use throttlewatch_integration::trees::snapshot;
use throttlewatch_integration::{bin, Scratch};

const NAMESPACE: &str = "throttlewatch";
/// What the installer step copies to the host (the runtime-class path).
const BINARIES: [&str; 4] = [
    "throttlewatch",
    "throttlewatch-hook",
    "throttlewatch-runtime",
    "containerd-shim-throttlewatch-v2",
];
/// What the node image holds: those and the NRI plugin (overlays/nri runs
/// it from the image, nothing is copied to the host).
const IMAGE_BINARIES: [&str; 5] = [
    "throttlewatch",
    "throttlewatch-hook",
    "throttlewatch-runtime",
    "containerd-shim-throttlewatch-v2",
    "throttlewatch-nri",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `kubectl kustomize DIR`, one value per document.
fn render(dir: &str) -> Vec<Value> {
    let o = Command::new("kubectl")
        .arg("kustomize")
        .arg(repo().join("packaging/kubernetes").join(dir))
        .output()
        .expect("kubectl");
    assert!(o.status.success(), "kubectl kustomize {dir}: {}", text(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    out.split("\n---\n")
        .map(|d| serde_yaml::from_str(d).unwrap_or_else(|e| panic!("{dir}: {e}\n{d}")))
        .collect()
}

fn s<'a>(v: &'a Value, path: &str) -> &'a str {
    let mut cur = v;
    for k in path.split('.') {
        cur = &cur[k];
    }
    cur.as_str()
        .unwrap_or_else(|| panic!("{path} missing or not a string in {v:?}"))
}

fn seq<'a>(v: &'a Value, key: &str) -> Vec<&'a Value> {
    v[key]
        .as_sequence()
        .map(|s| s.iter().collect())
        .unwrap_or_default()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn labels(v: &Value) -> BTreeMap<String, String> {
    v.as_mapping()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.as_str().unwrap().into(), v.as_str().unwrap().into()))
                .collect()
        })
        .unwrap_or_default()
}

/// What the API server requires of every document, and ours of every DaemonSet.
fn check_documents(dir: &str, docs: &[Value]) {
    assert!(!docs.is_empty(), "{dir}: nothing rendered");
    let accounts: Vec<&str> = of_kind(docs, "ServiceAccount")
        .iter()
        .map(|a| s(a, "metadata.name"))
        .collect();
    let config_maps: Vec<&str> = of_kind(docs, "ConfigMap")
        .iter()
        .map(|c| s(c, "metadata.name"))
        .collect();
    for d in docs {
        let kind = s(d, "kind");
        assert!(s(d, "apiVersion").contains('v'), "{dir}: {d:?}");
        assert!(!s(d, "metadata.name").is_empty());
        let cluster_scoped = matches!(kind, "Namespace" | "RuntimeClass");
        assert_eq!(
            d["metadata"]["namespace"].as_str(),
            (!cluster_scoped).then_some(NAMESPACE),
            "{dir}: {kind} {}",
            s(d, "metadata.name")
        );
        assert!(
            !kind.contains("Role"),
            "{dir}: nothing here needs the API, so no {kind}"
        );
    }
    for a in of_kind(docs, "ServiceAccount") {
        assert_eq!(a["automountServiceAccountToken"], false, "{a:?}");
    }
    for ds in of_kind(docs, "DaemonSet") {
        let name = s(ds, "metadata.name");
        let selector = labels(&ds["spec"]["selector"]["matchLabels"]);
        let pod_labels = labels(&ds["spec"]["template"]["metadata"]["labels"]);
        assert!(!selector.is_empty(), "{name}: empty selector");
        for (k, v) in &selector {
            assert_eq!(
                pod_labels.get(k),
                Some(v),
                "{name}: selector {k}={v} not on the pods"
            );
        }
        let pod = &ds["spec"]["template"]["spec"];
        assert_eq!(pod["automountServiceAccountToken"], false, "{name}");
        assert_eq!(pod["hostPID"], true, "{name}");
        assert!(
            accounts.contains(&s(pod, "serviceAccountName")),
            "{name}: account {} not rendered ({accounts:?})",
            s(pod, "serviceAccountName")
        );
        let volumes: BTreeMap<&str, &Value> = seq(pod, "volumes")
            .into_iter()
            .map(|v| (s(v, "name"), v))
            .collect();
        for v in volumes.values() {
            if let Some(cm) = v["configMap"]["name"].as_str() {
                assert!(
                    config_maps.contains(&cm),
                    "{name}: ConfigMap {cm} not rendered"
                );
            }
            if let Some(p) = v["hostPath"]["path"].as_str() {
                assert!(p.starts_with('/'), "{name}: hostPath {p}");
            }
        }
        let containers: Vec<&Value> = seq(pod, "initContainers")
            .into_iter()
            .chain(seq(pod, "containers"))
            .collect();
        assert!(!seq(pod, "containers").is_empty(), "{name}: no containers");
        for c in containers {
            let cname = s(c, "name");
            assert!(
                s(c, "image").starts_with("throttlewatch-node:"),
                "{name}/{cname}: image {:?}",
                c["image"]
            );
            assert!(!seq(c, "command").is_empty(), "{name}/{cname}: no command");
            for m in seq(c, "volumeMounts") {
                assert!(
                    volumes.contains_key(s(m, "name")),
                    "{name}/{cname}: mount {} has no volume",
                    s(m, "name")
                );
                assert!(s(m, "mountPath").starts_with('/'));
            }
        }
    }
}

/// The hostPath mounted at `mount` in container `c` of `pod`.
fn host_path_at<'a>(pod: &'a Value, c: &Value, mount: &str) -> Option<&'a str> {
    let m = seq(c, "volumeMounts")
        .into_iter()
        .find(|m| s(m, "mountPath") == mount)?;
    seq(pod, "volumes")
        .into_iter()
        .find(|v| v["name"] == m["name"])?["hostPath"]["path"]
        .as_str()
}

fn config_map_file<'a>(docs: &'a [Value], prefix: &str, key: &str) -> &'a str {
    of_kind(docs, "ConfigMap")
        .into_iter()
        .find(|c| s(c, "metadata.name").starts_with(prefix))
        .unwrap_or_else(|| panic!("no ConfigMap {prefix}-*"))["data"][key]
        .as_str()
        .unwrap()
}

/// overlays/nri: no runtime class, no installer step (nothing written to
/// the host's root or the runtime's configuration), the plugin on the
/// runtime's NRI socket beside the agent, sharing its configuration, state
/// and logs.
fn nri_overlay_deploys_the_plugin_beside_the_agent() {
    let nri = render("overlays/nri");
    check_documents("overlays/nri", &nri);
    assert_eq!(of_kind(&nri, "RuntimeClass").len(), 0, "no runtime class");
    let ds = of_kind(&nri, "DaemonSet")[0];
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(seq(pod, "initContainers").len(), 0, "no installer step");
    assert!(
        seq(pod, "volumes")
            .iter()
            .all(|v| v["hostPath"]["path"] != "/"),
        "the host's root is not mounted"
    );
    let containers = seq(pod, "containers");
    let named = |n: &str| {
        *containers
            .iter()
            .find(|c| s(c, "name") == n)
            .unwrap_or_else(|| panic!("no container {n}: {containers:?}"))
    };
    assert_eq!(containers.len(), 2, "the agent and the plugin");
    let (agent, plugin) = (named("agent"), named("nri"));
    let command: Vec<&str> = seq(plugin, "command")
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        command,
        [
            "/usr/local/bin/throttlewatch-nri",
            "--socket",
            "/var/run/nri/nri.sock",
            "--config",
            "/etc/throttlewatch/throttlewatch.toml",
            "--idx",
            "90"
        ]
    );
    assert_eq!(
        host_path_at(pod, plugin, "/var/run/nri"),
        Some("/var/run/nri")
    );
    for p in [
        "/run/throttlewatch",
        "/var/log/throttlewatch",
        "/sys/fs/cgroup",
    ] {
        assert_eq!(
            host_path_at(pod, plugin, p),
            host_path_at(pod, agent, p),
            "{p}"
        );
    }
    let config = |c: &Value| {
        seq(c, "volumeMounts")
            .into_iter()
            .find(|m| s(m, "mountPath") == "/etc/throttlewatch")
            .map(|m| s(m, "name").to_string())
    };
    assert_eq!(config(plugin), config(agent), "the agent's configuration");
}

#[test]
fn manifests_render_and_hold_together() {
    let base = render("base");
    check_documents("base", &base);
    let monitoring = render("overlays/monitoring");
    check_documents("overlays/monitoring", &monitoring);
    let cleanup = render("overlays/cleanup");
    check_documents("overlays/cleanup", &cleanup);
    assert_eq!(of_kind(&cleanup, "RuntimeClass").len(), 0);
    nri_overlay_deploys_the_plugin_beside_the_agent();

    // The agent: the mounts it needs, at the host's paths.
    let ds = of_kind(&base, "DaemonSet")[0];
    let pod = &ds["spec"]["template"]["spec"];
    let agent = seq(pod, "containers")[0];
    for p in [
        "/sys/fs/bpf",
        "/sys/kernel/btf",
        "/sys/fs/cgroup",
        "/var/log/throttlewatch",
        "/run/throttlewatch",
    ] {
        assert_eq!(host_path_at(pod, agent, p), Some(p), "agent mount {p}");
    }
    let install = seq(pod, "initContainers")[0];
    assert_eq!(host_path_at(pod, install, "/host"), Some("/"));
    assert_eq!(install["securityContext"]["privileged"], true);

    // The ConfigMap is a valid configuration, its paths are the mounted ones,
    // and its metrics port is the one the pod and the PodMonitor name.
    let toml_text = config_map_file(&base, "throttlewatch-config", "throttlewatch.toml");
    let dir = Scratch::new("k8s-config");
    let file = dir.0.join("throttlewatch.toml");
    std::fs::write(&file, toml_text).unwrap();
    let o = Command::new(bin("throttlewatch"))
        .args(["config", "check"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(o.status.success(), "config check: {}", text(&o));
    let cfg: toml::Table = toml::from_str(toml_text).unwrap();
    assert_eq!(cfg["start_agent"].as_bool(), Some(false));
    for key in ["log_dir", "state_dir"] {
        let p = cfg[key].as_str().unwrap();
        assert_eq!(
            host_path_at(pod, agent, p),
            Some(p),
            "{key} = {p} mounted from the host"
        );
    }
    let port = seq(agent, "ports")
        .into_iter()
        .find(|p| p["name"] == "metrics")
        .expect("a port named metrics");
    let addr = cfg["metrics_addr"].as_str().unwrap();
    assert_eq!(
        addr.rsplit(':').next().unwrap(),
        port["containerPort"].as_u64().unwrap().to_string()
    );
    let pm = of_kind(&monitoring, "PodMonitor")[0];
    let ep = seq(&pm["spec"], "podMetricsEndpoints")[0];
    assert_eq!(ep["port"], "metrics");
    assert_eq!(s(ep, "path"), "/metrics");
    // The series' own namespace/pod/container labels win over the agent
    // pod's (docs/metrics.md; the dashboard and rules read them).
    assert_eq!(ep["honorLabels"].as_bool(), Some(true), "{ep:?}");
    for (k, v) in labels(&pm["spec"]["selector"]["matchLabels"]) {
        assert_eq!(
            labels(&ds["spec"]["template"]["metadata"]["labels"]).get(&k),
            Some(&v)
        );
    }

    // The RuntimeClass: the one in configs/, and its handler is the runtime
    // the installer writes into containerd's configuration.
    let rc = of_kind(&base, "RuntimeClass")[0];
    let ours: Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo().join("configs/runtimeclass.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        rc, &ours,
        "base/runtimeclass.yaml and configs/runtimeclass.yaml differ"
    );
    let root = dir.0.join("host");
    std::fs::create_dir_all(root.join("etc")).unwrap();
    let o = Command::new(bin("throttlewatch"))
        .args(["install", "containerd", "--etc-root"])
        .arg(&root)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let installed: toml::Table =
        toml::from_str(&std::fs::read_to_string(root.join("etc/containerd/config.toml")).unwrap())
            .unwrap();
    let runtimes = &installed["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"];
    let handler = s(rc, "handler");
    assert!(
        runtimes.get(handler).is_some(),
        "handler {handler} is not a runtime the installer writes: {runtimes:?}"
    );
}

fn run_script(script: &str, env: &[(&str, &Path)]) -> Output {
    let mut c = Command::new("sh");
    c.arg("-c").arg(script);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// The installer and cleanup steps, exactly as the DaemonSets carry them,
/// on a host tree with Debian's containerd 1.6 configuration.
#[test]
fn node_install_and_cleanup_scripts_leave_the_host_as_it_was() {
    node_scripts_on(
        &std::fs::read_to_string(
            repo().join("integration/fixtures/containerd/debian-1.6-default/config.toml"),
        )
        .unwrap(),
    );
}

/// The same on a current node: the configuration containerd 2.3.4's
/// `containerd config default` prints (version 4), generated now.
#[test]
fn node_scripts_work_on_a_containerd_2_3_node() {
    let out = Command::new(throttlewatch_integration::shared_bin("containerd"))
        .args(["config", "default"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let config = String::from_utf8(out.stdout).unwrap();
    assert!(config.contains("version = 4"), "{config}");
    node_scripts_on(&config);
}

fn node_scripts_on(containerd_config: &str) {
    let base = render("base");
    let cleanup = render("overlays/cleanup");
    let install = config_map_file(&base, "throttlewatch-node-install", "node-install.sh");
    let uninstall = config_map_file(
        &cleanup,
        "throttlewatch-node-uninstall",
        "node-uninstall.sh",
    );
    let dir = Scratch::new("k8s-node");
    let host = dir.0.join("host");
    let etc = host.join("etc/containerd");
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::write(etc.join("config.toml"), containerd_config).unwrap();
    let config = dir.0.join("throttlewatch.toml");
    std::fs::write(
        &config,
        config_map_file(&base, "throttlewatch-config", "throttlewatch.toml"),
    )
    .unwrap();
    let src = bin("throttlewatch").parent().unwrap().to_path_buf();
    let no_procs = dir.0.join("proc");
    std::fs::create_dir_all(&no_procs).unwrap();
    let before = snapshot(&host);
    let env: [(&str, &Path); 5] = [
        ("HOST_ROOT", &host),
        ("SRC", &src),
        ("CONFIG", &config),
        ("RESTART", Path::new("none")),
        ("HOST_PROC", &no_procs),
    ];

    let o = run_script(install, &env);
    assert!(o.status.success(), "node-install.sh: {}", text(&o));
    for b in BINARIES {
        assert_eq!(
            std::fs::read(host.join("usr/local/bin").join(b)).unwrap(),
            std::fs::read(src.join(b)).unwrap(),
            "{b} copied"
        );
    }
    assert_eq!(
        std::fs::read(host.join("etc/throttlewatch/throttlewatch.toml")).unwrap(),
        std::fs::read(&config).unwrap()
    );
    let installed = std::fs::read_to_string(etc.join("config.toml")).unwrap();
    assert!(installed.contains("runtimes.throttlewatch]"), "{installed}");
    // Run again (a pod restart): nothing changes.
    let again = snapshot(&host);
    let o = run_script(install, &env);
    assert!(o.status.success(), "node-install.sh again: {}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("already installed"));
    assert_eq!(snapshot(&host), again);

    let o = run_script(uninstall, &env);
    assert!(o.status.success(), "node-uninstall.sh: {}", text(&o));
    assert_eq!(
        snapshot(&host),
        before,
        "cleanup leaves every host file as it was"
    );
}

/// The image packaging/build-image.sh makes from (stripped debug) binaries:
/// the real containerd imports it and its layer holds the binaries; the
/// real dockerd loads it.
#[test]
fn node_image_is_accepted_by_ctr_import_and_docker_load() {
    let dir = Scratch(PathBuf::from(format!("/tmp/twk{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let bins = dir.0.join("bin");
    std::fs::create_dir_all(&bins).unwrap();
    for b in IMAGE_BINARIES {
        let st = Command::new("strip")
            .arg("-o")
            .arg(bins.join(b))
            .arg(bin(b))
            .status()
            .unwrap();
        assert!(st.success(), "strip {b}");
    }
    let tar = dir.0.join("node.tar");
    // Debug builds link glibc dynamically: refused without --allow-dynamic.
    let o = Command::new(repo().join("packaging/build-image.sh"))
        .arg("--bin-dir")
        .arg(&bins)
        .arg("--out")
        .arg(&tar)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(2),
        "dynamic binaries refused: {}",
        text(&o)
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("dynamically linked"));
    assert!(!tar.exists());
    let build = || {
        Command::new(repo().join("packaging/build-image.sh"))
            .args(["--allow-dynamic", "--bin-dir"])
            .arg(&bins)
            .arg("--out")
            .arg(&tar)
            .output()
            .unwrap()
    };
    let o = build();
    assert!(o.status.success(), "build-image.sh: {}", text(&o));
    let digest = std::fs::read(&tar).unwrap();
    let o = build();
    assert!(o.status.success());
    assert!(
        std::fs::read(&tar).unwrap() == digest,
        "the same binaries give the same tar"
    );

    let c = Containerd::start(&[], &[]);
    c.import(&tar);
    let o = c.ctr(&["images", "ls", "-q"]);
    let listed = String::from_utf8_lossy(&o.stdout).into_owned();
    let name = "docker.io/library/throttlewatch-node:0.1.0";
    assert!(listed.lines().any(|l| l == name), "{listed}");
    let mnt = dir.0.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let o = c.ctr(&["images", "mount", name, mnt.to_str().unwrap()]);
    assert!(o.status.success(), "ctr images mount: {}", text(&o));
    let checked: Vec<bool> = IMAGE_BINARIES
        .iter()
        .map(|b| {
            std::fs::read(mnt.join("usr/local/bin").join(b)).ok()
                == std::fs::read(bins.join(b)).ok()
        })
        .chain([mnt.join("bin/sh").exists()])
        .collect();
    let _ = c.ctr(&["images", "unmount", "--rm", mnt.to_str().unwrap()]);
    assert!(checked.iter().all(|&x| x), "{checked:?}");
    drop(c);

    let daemon_json = dir.0.join("daemon.json");
    std::fs::write(&daemon_json, "{}\n").unwrap();
    let mut d = PrivateDockerd::start(&daemon_json, &dir.0);
    d.runtimes(); // up
    let docker = |args: &[&str]| {
        Command::new("docker")
            .env("DOCKER_API_VERSION", DOCKER_API_VERSION)
            .arg("-H")
            .arg(format!("unix://{}", dir.0.join("d.sock").display()))
            .args(args)
            .output()
            .unwrap()
    };
    let o = docker(&["load", "-i", tar.to_str().unwrap()]);
    assert!(o.status.success(), "docker load: {}\n{}", text(&o), d.log());
    let o = docker(&[
        "image",
        "inspect",
        "--format",
        "{{json .Config.Entrypoint}}",
        "throttlewatch-node:0.1.0",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "[\"/usr/local/bin/throttlewatch\"]"
    );
}
