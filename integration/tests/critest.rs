//! The Kubernetes CRI validation suite (critest, cri-tools 1.36, in
//! `../shared/bin`) against the CRI plugin of containerd 1.6 and of
//! containerd 2.3.4, each once with the default handler (runc: on 2.3.4 its
//! own `containerd-shim-runc-v2`) and once with
//! `--runtime-handler=throttlewatch` (our shim, with a private agent), side
//! by side on two identical nodes (both handlers configured on each): same
//! images, same skips. Every spec that passes with runc must pass with
//! throttlewatch, both must skip the same specs, and no spec may take
//! notably longer with ours ([`SLOWER_FACTOR`], [`SLOWER_SLACK`]). Specs
//! that fail with runc too (containerd's own), and any that pass with ours
//! only, are printed. A spec that came out differently runs again alone on
//! both nodes ([`RERUNS`]) before it is judged: on two loaded cores either
//! handler misses a deadline now and then.
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
use throttlewatch_integration::cri::{bridge_cni, ContainerdRelease, CriNode};
use throttlewatch_integration::daemons::{Agent, PrivateConfig};
use throttlewatch_integration::{bin, shared_bin, Scratch};

const HANDLER: &str = "throttlewatch";
/// The most one critest run may take (a full run takes 1-2 minutes; the
/// two releases' pairs run at once).
const RUN_TIMEOUT: Duration = Duration::from_secs(300);
/// A spec may take at most `runc's time * SLOWER_FACTOR + SLOWER_SLACK`
/// with ours: the pairs run side by side on two busy cores, where a spec's
/// time varies by a second or two (and by up to a third for the long
/// ones); a spec stuck in a timeout (a 300 s StopPodSandbox, say) is far
/// beyond it.
const SLOWER_FACTOR: f64 = 1.5;
const SLOWER_SLACK: f64 = 2.0;
/// How often specs that came out differently run again, and the most that
/// do (more than a dozen is no chance).
const RERUNS: u32 = 2;
const RERUN_MAX: usize = 12;
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
    std::fs::create_dir_all(&cni).unwrap();
    std::os::unix::fs::symlink(CNI_BIN, cni.join("bin")).unwrap();
    bridge_cni(&cni, "critest", "10.99.0.0/16");
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
    /// Spec text -> seconds it ran.
    secs: BTreeMap<String, f64>,
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
    fn state(&self, name: &str) -> &str {
        self.specs.get(name).map_or("not run", |(s, _)| s.as_str())
    }
    /// `name`'s outcome from a run again (which ran it, the rest skipped).
    fn take(&mut self, again: &Outcome, name: &str) {
        if let Some(o) = again.specs.get(name) {
            self.specs.insert(name.to_string(), o.clone());
        }
        if let Some(secs) = again.secs.get(name) {
            self.secs.insert(name.to_string(), *secs);
        }
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
            if state != "skipped" {
                o.slowest.push((secs, name.join(" ")));
            }
            o.secs.insert(name.join(" "), secs);
            o.specs.insert(name.join(" "), (state, msg));
        }
    }
    o.slowest.sort_by(|a, b| b.0.total_cmp(&a.0));
    o
}

/// One critest run in containerd's namespaces (only the specs `focus`
/// matches when given, a run again: `attempt` > 0); its report parsed.
fn run_critest(
    node: &CriNode,
    out_dir: &Path,
    handler: Option<&str>,
    focus: Option<&str>,
    attempt: u32,
) -> Outcome {
    let mut tag = format!("{}-{}", node.release.tag(), handler.unwrap_or("runc"));
    if attempt > 0 {
        tag = format!("{tag}-again{attempt}");
    }
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
    .args(focus.map(|f| format!("--ginkgo.focus={f}")))
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
            let kept = std::env::temp_dir()
                .join(format!("tw-critest-{tag}-timeout-{}", std::process::id()));
            let _ = std::fs::create_dir_all(&kept);
            let _ = std::fs::copy(&log_path, kept.join(format!("{tag}.log")));
            let _ = std::fs::write(kept.join("containerd.log"), node.log());
            panic!(
                "critest ({tag}) ran past {RUN_TIMEOUT:?}; its output:\n{}\ncontainerd's errors (tail):\n{}\nlogs kept in {}",
                tail(&log_path, 60),
                log_errors(&node.log(), 40),
                kept.display()
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

/// Specs whose state differs between the handlers (passed with one and
/// not the other, or run by one only), and those notably slower with ours.
fn disagreeing(runc: &Outcome, ours: &Outcome) -> Vec<String> {
    let mut names: std::collections::BTreeSet<String> = runc
        .specs
        .keys()
        .chain(ours.specs.keys())
        .filter(|n| runc.state(n) != ours.state(n))
        .cloned()
        .collect();
    names.extend(slower(runc, ours).0.into_iter().map(|t| t.2));
    names.into_iter().collect()
}

/// `s` as a Go (RE2) regular expression matching it literally
/// (regexp.QuoteMeta).
fn go_regexp_quote(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if r"\.+*?()|[]{}^$".contains(c) {
            q.push('\\');
        }
        q.push(c);
    }
    q
}

fn first_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take(3)
        .collect::<Vec<_>>()
        .join(" / ")
}

/// A failed run's critest reports and logs and both containerds' logs,
/// copied to a directory that outlives the test (for the failure message).
fn keep(out: &Path, nodes: &[CriNode], release: ContainerdRelease) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "tw-critest-{}-failed-{}",
        release.tag(),
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(out).into_iter().flatten().flatten() {
        let _ = std::fs::copy(e.path(), dir.join(e.file_name()));
    }
    for (node, tag) in nodes.iter().zip(["runc", HANDLER]) {
        let _ = std::fs::write(dir.join(format!("containerd-{tag}.log")), node.log());
    }
    dir
}

/// The last `n` lines of containerd's log at level error or warning.
fn log_errors(log: &str, n: usize) -> String {
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("level=error") || l.contains("level=warning"))
        .collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn tail(p: &Path, n: usize) -> String {
    let t = std::fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = t.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A node with both handlers (runc the default, ours as `throttlewatch`)
/// in private namespaces, its pod network and critest's images ready.
fn node(release: ContainerdRelease, tw: &PrivateConfig) -> CriNode {
    let bins = bin("containerd-shim-throttlewatch-v2")
        .parent()
        .unwrap()
        .to_path_buf();
    let mut node = CriNode::new_on(
        release,
        &release.handler_toml(HANDLER, SHIM_RUNTIME, &[]),
        &[bins],
        &[("THROTTLEWATCH_CONFIG", tw.path.to_str().unwrap())],
    );
    node.isolate();
    write_cni(&node);
    node.start();
    import_images(&node);
    node
}

/// Specs that passed with both handlers and took longer with ours than
/// `runc * SLOWER_FACTOR + SLOWER_SLACK`, and the five that lost most time
/// with ours; each as (seconds ours, seconds runc, spec).
type Timed = (f64, f64, String);

fn slower(runc: &Outcome, ours: &Outcome) -> (Vec<Timed>, Vec<Timed>) {
    let mut both: Vec<(f64, f64, String)> = runc
        .passed()
        .into_iter()
        .filter(|n| ours.passed().contains(n))
        .map(|n| (ours.secs[n], runc.secs[n], n.clone()))
        .collect();
    both.sort_by(|a, b| (b.0 - b.1).total_cmp(&(a.0 - a.1)));
    let too_slow = both
        .iter()
        .filter(|(o, r, _)| *o > r * SLOWER_FACTOR + SLOWER_SLACK)
        .cloned()
        .collect();
    both.truncate(5);
    (too_slow, both)
}

/// critest on `release` with runc and with ours, side by side on two
/// identical nodes (one for each handler, so neither run sees the other's
/// pods) to keep the test short; the checks named in the file's doc.
fn critest_runc_and_throttlewatch_agree(release: ContainerdRelease) {
    let t_test = Instant::now();
    let tw = PrivateConfig::new("");
    let _agent = Agent::start(&tw);
    let nodes = [node(release, &tw), node(release, &tw)];
    eprintln!(
        "{}: nodes and images ready in {:.1} s; critest {}",
        release.name(),
        t_test.elapsed().as_secs_f64(),
        shared_bin("critest").display()
    );

    let out = Scratch::new("critest");
    let both = |focus: Option<&str>, attempt: u32| {
        std::thread::scope(|s| {
            let runc = s.spawn(|| run_critest(&nodes[0], &out.0, None, focus, attempt));
            let ours = s.spawn(|| run_critest(&nodes[1], &out.0, Some(HANDLER), focus, attempt));
            (runc.join().unwrap(), ours.join().unwrap())
        })
    };
    let (mut runc, mut ours) = both(None, 0);
    // A spec that came out differently, or notably slower with ours, runs
    // again alone on both nodes: two busy cores make either handler miss
    // a deadline now and then (runc's OOM spec on containerd 1.6, once).
    // What differs again is what the asserts below judge.
    for attempt in 1..=RERUNS {
        let names = disagreeing(&runc, &ours);
        if names.is_empty() || names.len() > RERUN_MAX {
            break;
        }
        let focus: Vec<String> = names.iter().map(|n| go_regexp_quote(n)).collect();
        let (r, o) = both(Some(&focus.join("|")), attempt);
        for n in &names {
            eprintln!(
                "  {} again ({attempt}): runc {} -> {}, {HANDLER} {} -> {}: {n}",
                release.tag(),
                runc.state(n),
                r.state(n),
                ours.state(n),
                o.state(n)
            );
            runc.take(&r, n);
            ours.take(&o, n);
        }
    }
    let (too_slow, most_lost) = slower(&runc, &ours);
    let too_slow: Vec<String> = too_slow
        .iter()
        .map(|(o, r, n)| format!("{o:.1} s with {HANDLER}, {r:.1} s with runc: {n}"))
        .collect();
    eprintln!(
        "critest on {}:\n  runc:          {}\n  throttlewatch: {}\n  whole test {:.0} s",
        release.name(),
        runc.counts(),
        ours.counts(),
        t_test.elapsed().as_secs_f64()
    );
    for (o, r, n) in &most_lost {
        eprintln!(
            "  {} most time lost with {HANDLER}: {o:.1} s vs runc {r:.1} s: {n}",
            release.tag()
        );
    }
    assert!(
        runc.passed().len() > 50,
        "critest passed only {} specs with runc on {}: the harness is broken\n{}",
        runc.passed().len(),
        release.name(),
        tail(&out.0.join(format!("{}-runc.log", release.tag())), 80)
    );
    let lost: Vec<String> = runc
        .passed()
        .into_iter()
        .filter(|n| ours.specs.get(*n).is_none_or(|(s, _)| s != "passed"))
        .map(|n| match ours.specs.get(n) {
            Some((s, m)) => format!("{n}: {s}: {}", m.chars().take(2000).collect::<String>()),
            None => format!("{n}: not run"),
        })
        .collect();
    assert!(
        lost.is_empty(),
        "{}: specs that pass with runc but not with handler {HANDLER}:\n{}\ncontainerd's errors (tail):\n{}\nreports and logs kept in {}",
        release.name(),
        lost.join("\n"),
        log_errors(&nodes[1].log(), 40),
        keep(&out.0, &nodes, release).display()
    );
    // The other way round is not a defect of ours: containerd 1.6's runc
    // shim misses the OOM kill on a loaded machine (64 s, twice in a row),
    // where ours reports it. Said, and the rest must match spec for spec.
    let only_ours: Vec<&String> = ours
        .passed()
        .into_iter()
        .filter(|n| runc.state(n) != "passed")
        .collect();
    for n in &only_ours {
        eprintln!(
            "  {}: passes with {HANDLER} only (runc: {}): {n}",
            release.tag(),
            runc.state(n)
        );
    }
    let skipped_differently: Vec<&String> = runc
        .specs
        .keys()
        .chain(ours.specs.keys())
        .filter(|n| (runc.state(n) == "skipped") != (ours.state(n) == "skipped"))
        .collect();
    assert!(
        skipped_differently.is_empty(),
        "{}: skipped with one handler only: {skipped_differently:?}",
        release.name()
    );
    assert!(
        too_slow.is_empty(),
        "{}: specs notably slower with {HANDLER} (> runc * {SLOWER_FACTOR} + {SLOWER_SLACK} s):\n{}",
        release.name(),
        too_slow.join("\n")
    );
}

#[test]
fn critest_on_containerd_1_6_passes_with_throttlewatch_what_it_passes_with_runc() {
    critest_runc_and_throttlewatch_agree(ContainerdRelease::V1_6);
}

#[test]
fn critest_on_containerd_2_3_passes_with_throttlewatch_what_it_passes_with_runc() {
    critest_runc_and_throttlewatch_agree(ContainerdRelease::V2_3);
}
