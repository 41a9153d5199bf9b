//! The Kubernetes CRI validation suite (critest, cri-tools 1.36, in
//! `../shared/bin`) against containerd 1.6's CRI plugin, once with the
//! default handler (runc) and once with `--runtime-handler=throttlewatch`
//! (our shim, with a private agent), side by side on two identical nodes
//! (both handlers configured on each): same images, same skips. Every spec that passes with runc must pass with throttlewatch.
//! Specs that fail with runc too (containerd 1.6's own) are printed only.
//!
//! No registry here: the images critest uses are busybox stand-ins built
//! from Debian's static busybox and imported into `k8s.io` under critest's
//! names. containerd runs in private mount, network and IPC namespaces with
//! a tmpfs over /run (its pods' bridge CNI, netns files and shim sockets,
//! and the shared memory critest's host-IPC specs make, stay private);
//! critest enters them, as its streaming tests need containerd's loopback
//! and its host-IPC specs containerd's IPC namespace. Run `cargo build --workspace --bins` first.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use throttlewatch_integration::containerd::{build_busybox_image_as, SHIM_RUNTIME};
use throttlewatch_integration::cri::{CriNode, ALLOWLISTS, CRI_TABLE};
use throttlewatch_integration::daemons::{Agent, PrivateConfig};
use throttlewatch_integration::{bin, shared_bin, Scratch};

const HANDLER: &str = "throttlewatch";
/// The most one critest run may take (a full run takes 1-2 minutes).
const RUN_TIMEOUT: Duration = Duration::from_secs(240);
/// CNI plugins from Debian's `containernetworking-plugins`.
const CNI_BIN: &str = "/usr/lib/cni";

/// The web server stand-in, `/bin/nginx` in the nginx and httpd images:
/// its pid in /var/run/nginx.pid, named `nginx` (pidof), "master process"
/// in pid 1's command line (its argument), what critest reads from httpd's
/// log, and busybox httpd serving `/www` on port 80 — under a shell that
/// exits on SIGTERM as nginx and httpd do (a pid 1 without a handler
/// ignores it, and each stop would wait out its grace period).
const NGINX: &str = r#"#!/bin/sh
echo $$ > /var/run/nginx.pid
echo "httpd -D FOREGROUND"
trap 'exit 0' TERM
httpd -f -p 80 -h /www &
wait
"#;
const WEB_SERVER: &[&str] = &["nginx", "master process"];

/// The images critest runs (cri-tools pkg/framework, pkg/validate), as
/// busybox with a command standing in for each.
const IMAGES: &[(&str, &[&str])] = &[
    ("registry.k8s.io/e2e-test-images/busybox:1.29-2", &["sh"]),
    ("registry.k8s.io/e2e-test-images/nginx:1.14-2", WEB_SERVER),
    ("registry.k8s.io/e2e-test-images/httpd:2.4.39-4", WEB_SERVER),
    (
        "registry.k8s.io/e2e-test-images/nonewprivs:1.3",
        &["sh", "-c", "echo Effective uid: $(id -u)"],
    ),
    ("registry.k8s.io/pause:3.9", &["sleep", "2147483647"]),
];

/// Scripts for commands critest runs that Debian's busybox has no applet
/// for: `pgrep NAME` (the PIDs whose command name matches, status 1 if
/// none) and `ipcs -m` (the System V shared memory segments).
const PGREP: &str = r#"#!/bin/sh
found=1
for d in /proc/[0-9]*; do
  if grep -qE -- "$1" "$d/comm" 2>/dev/null; then echo "${d#/proc/}"; found=0; fi
done
exit $found
"#;
const IPCS: &str = "#!/bin/sh\ncat /proc/sysvipc/shm\n";
/// Users critest names (RunAsUserName: nobody).
const PASSWD: &str = "root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n";
const GROUP: &str = "root:x:0:\nnogroup:x:65534:\n";

/// Skipped for every handler alike (`--ginkgo.skip`, a regular expression
/// over the full spec text):
/// - AppArmor: this kernel has no AppArmor (no /sys/module/apparmor);
/// - image specs that pull from a registry (Image Manager, Image
///   Consistency, Image Identifier Consistency, Image Volume's test images,
///   SupplementalGroupsPolicy's image with predefined groups): no network;
/// - host ports (`with host port`, port-forward `in host network`): they
///   need the portmap CNI and iptables on the machine's network.
const SKIP: &str = "AppArmor|Image Manager|Image Consistency|Image Identifier Consistency\
|Image Volume|SupplementalGroupsPolicy|with host port|in host network";

fn shim_handler() -> String {
    let t = format!("{CRI_TABLE}.containerd.runtimes.{HANDLER}");
    let allow = ALLOWLISTS
        .lines()
        .map(|l| format!("        {l}"))
        .collect::<Vec<_>>()
        .join("\n");
    format!("      [{t}]\n        runtime_type = {SHIM_RUNTIME:?}\n{allow}\n")
}

/// A bridge network with host-local IPAM (its leases in the node's dir) in
/// containerd's own network namespace; the CRI plugin's `cni` dirs.
fn write_cni(node: &CriNode) {
    for p in ["bridge", "host-local", "loopback"] {
        assert!(
            Path::new(CNI_BIN).join(p).exists(),
            "{CNI_BIN}/{p} is missing: apt-get install containernetworking-plugins"
        );
    }
    let cni = node.dir.0.join("cni");
    std::fs::create_dir_all(cni.join("net.d")).unwrap();
    std::os::unix::fs::symlink(CNI_BIN, cni.join("bin")).unwrap();
    let conf = serde_json::json!({
        "cniVersion": "0.4.0",
        "name": "critest",
        "plugins": [{
            "type": "bridge",
            "bridge": "cni0",
            "isGateway": true,
            "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "ranges": [[{ "subnet": "10.99.0.0/16" }]],
                "routes": [{ "dst": "0.0.0.0/0" }],
                "dataDir": cni.join("ipam"),
            },
        }],
    });
    std::fs::write(
        cni.join("net.d/10-critest.conflist"),
        serde_json::to_vec_pretty(&conf).unwrap(),
    )
    .unwrap();
}

fn import_images(node: &CriNode) {
    for (name, cmd) in IMAGES {
        let d = Scratch::new("critestimg");
        // Files the image builder keeps: it adds busybox and its applets.
        let root = d.0.join("rootfs");
        for dir in ["www", "bin", "etc", "var/run"] {
            std::fs::create_dir_all(root.join(dir)).unwrap();
        }
        std::fs::write(root.join("www/index.html"), "<html>critest</html>\n").unwrap();
        std::fs::write(root.join("etc/passwd"), PASSWD).unwrap();
        std::fs::write(root.join("etc/group"), GROUP).unwrap();
        for (script, text) in [("pgrep", PGREP), ("ipcs", IPCS), ("nginx", NGINX)] {
            let p = root.join("bin").join(script);
            std::fs::write(&p, text).unwrap();
            std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
        }
        let tar = build_busybox_image_as(&d.0, name, cmd);
        let out = node.ctr(&["images", "import", tar.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "ctr images import {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let t0 = Instant::now();
        while !node.image_known(name) {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "the CRI plugin does not list {name}:\n{}",
                node.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[derive(Default)]
struct Outcome {
    /// Spec text -> (state, failure message).
    specs: BTreeMap<String, (String, String)>,
    /// (seconds, spec text), slowest first.
    slowest: Vec<(f64, String)>,
}

impl Outcome {
    fn with(&self, f: impl Fn(&str) -> bool) -> Vec<&String> {
        self.specs
            .iter()
            .filter(|(_, (s, _))| f(s))
            .map(|(n, _)| n)
            .collect()
    }
    fn passed(&self) -> Vec<&String> {
        self.with(|s| s == "passed")
    }
    fn skipped(&self) -> Vec<&String> {
        self.with(|s| s == "skipped" || s == "pending")
    }
    fn failed(&self) -> Vec<&String> {
        self.with(|s| !matches!(s, "passed" | "skipped" | "pending"))
    }
    fn counts(&self) -> String {
        format!(
            "passed {}, failed {}, skipped {}",
            self.passed().len(),
            self.failed().len(),
            self.skipped().len()
        )
    }
}

/// Ginkgo's JSON report: the `It` specs' full texts and states.
fn parse_report(path: &Path) -> Outcome {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut o = Outcome::default();
    for suite in v.as_array().expect("a list of suite reports") {
        for s in suite["SpecReports"].as_array().into_iter().flatten() {
            if s["LeafNodeType"] != "It" {
                continue;
            }
            let mut name: Vec<String> = s["ContainerHierarchyTexts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t.as_str().map(String::from))
                .collect();
            name.push(s["LeafNodeText"].as_str().unwrap_or_default().to_string());
            let state = s["State"].as_str().unwrap_or("unknown").to_string();
            let msg = s["Failure"]["Message"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let secs = s["RunTime"].as_f64().unwrap_or_default() / 1e9;
            o.slowest.push((secs, name.join(" ")));
            o.specs.insert(name.join(" "), (state, msg));
        }
    }
    o.slowest.sort_by(|a, b| b.0.total_cmp(&a.0));
    o
}

/// One critest run in containerd's namespaces; its report parsed.
fn run_critest(node: &CriNode, out_dir: &Path, handler: Option<&str>) -> Outcome {
    let tag = handler.unwrap_or("runc");
    let report = out_dir.join(format!("{tag}.json"));
    let log_path = out_dir.join(format!("{tag}.log"));
    let log = std::fs::File::create(&log_path).unwrap();
    let endpoint = format!("unix://{}", node.socket.display());
    let mut cmd = node.nsenter_cmd(&shared_bin("critest"));
    cmd.args([
        "--runtime-endpoint",
        &endpoint,
        "--image-endpoint",
        &endpoint,
    ])
    .args(handler.map(|h| format!("--runtime-handler={h}")))
    .arg(format!("--ginkgo.skip={SKIP}"))
    .arg(format!("--ginkgo.json-report={}", report.display()))
    .arg("--ginkgo.no-color")
    .current_dir(out_dir)
    .stdin(Stdio::null())
    .stdout(log.try_clone().unwrap())
    .stderr(log);
    let t0 = Instant::now();
    let mut child = cmd.spawn().expect("nsenter (util-linux)");
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > RUN_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "critest ({tag}) ran past {RUN_TIMEOUT:?}; its output:\n{}",
                tail(&log_path, 60)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    // Exit status 1 is failed specs; the report tells which.
    assert!(
        report.exists(),
        "critest ({tag}) wrote no report ({status}):\n{}",
        tail(&log_path, 60)
    );
    let o = parse_report(&report);
    eprintln!(
        "critest {tag}: {} in {:.0} s ({status})",
        o.counts(),
        t0.elapsed().as_secs_f64()
    );
    for (secs, name) in o.slowest.iter().take(5) {
        eprintln!("  {tag} slow: {secs:.1} s {name}");
    }
    for name in o.failed() {
        let (state, msg) = &o.specs[name];
        eprintln!("  {tag} {state}: {name}\n      {}", first_line(msg));
    }
    o
}

fn first_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take(3)
        .collect::<Vec<_>>()
        .join(" / ")
}

fn tail(p: &Path, n: usize) -> String {
    let t = std::fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = t.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A node with both handlers (runc the default, ours as `throttlewatch`)
/// in private namespaces, its pod network and critest's images ready.
fn node(tw: &PrivateConfig) -> CriNode {
    let bins = bin("containerd-shim-throttlewatch-v2")
        .parent()
        .unwrap()
        .to_path_buf();
    let mut node = CriNode::new(
        &shim_handler(),
        &[bins],
        &[("THROTTLEWATCH_CONFIG", tw.path.to_str().unwrap())],
    );
    node.isolate();
    write_cni(&node);
    node.start();
    import_images(&node);
    node
}

/// The two runs go side by side on two identical nodes (one for each
/// handler, so neither run sees the other's pods) to keep the test short.
#[test]
fn critest_specs_that_pass_with_runc_pass_with_throttlewatch() {
    let t_test = Instant::now();
    let tw = PrivateConfig::new("");
    let _agent = Agent::start(&tw);
    let nodes = [node(&tw), node(&tw)];
    eprintln!(
        "nodes and images ready in {:.1} s; critest {}",
        t_test.elapsed().as_secs_f64(),
        shared_bin("critest").display()
    );

    let out = Scratch::new("critest");
    let (runc, ours) = std::thread::scope(|s| {
        let runc = s.spawn(|| run_critest(&nodes[0], &out.0, None));
        let ours = s.spawn(|| run_critest(&nodes[1], &out.0, Some(HANDLER)));
        (runc.join().unwrap(), ours.join().unwrap())
    });
    eprintln!(
        "critest runc:          {}\ncritest throttlewatch: {}\nwhole test {:.0} s",
        runc.counts(),
        ours.counts(),
        t_test.elapsed().as_secs_f64()
    );
    assert!(
        runc.passed().len() > 50,
        "critest passed only {} specs with runc: the harness is broken\n{}",
        runc.passed().len(),
        tail(&out.0.join("runc.log"), 80)
    );
    let lost: Vec<String> = runc
        .passed()
        .into_iter()
        .filter(|n| ours.specs.get(*n).is_none_or(|(s, _)| s != "passed"))
        .map(|n| match ours.specs.get(n) {
            Some((s, m)) => format!("{n}: {s}: {}", first_line(m)),
            None => format!("{n}: not run"),
        })
        .collect();
    assert!(
        lost.is_empty(),
        "specs that pass with runc but not with handler {HANDLER}:\n{}\ncontainerd's log (tail):\n{}",
        lost.join("\n"),
        nodes[1]
            .log()
            .lines()
            .rev()
            .take(60)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(
        runc.passed().len(),
        ours.passed().len(),
        "pass counts differ: runc passed {:?}, {HANDLER} passed {:?}",
        runc.passed(),
        ours.passed()
    );
}
