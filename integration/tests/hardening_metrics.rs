//! Issue 11, the metrics server: what an untrusted container can make the
//! root agent serve (label values from annotations) and read (a request
//! line of any length). Real agent, real promtool.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use throttlewatch_cgroup::Hierarchies;
use throttlewatch_core::protocol::{call, Register, Request};
use throttlewatch_integration::daemons::{Agent, PrivateConfig};
use throttlewatch_integration::fixtures::{http_get, Sleeper};

/// A free loopback port (bound, read, released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Finding 1: label values from annotations (quotes, backslashes, newlines,
/// bytes that are not UTF-8) cannot forge series; Debian's promtool accepts
/// what the real agent serves.
#[test]
fn metrics_labels_are_escaped_and_promtool_accepts_them() {
    let port = free_port();
    let cfg = PrivateConfig::new("");
    let text = std::fs::read_to_string(&cfg.path).unwrap().replace(
        "metrics_addr = \"\"",
        &format!("metrics_addr = \"127.0.0.1:{port}\"\nsnapshot_interval_s = 1"),
    );
    std::fs::write(&cfg.path, text).unwrap();
    let _agent = Agent::start(&cfg);
    let h = Hierarchies::discover().unwrap();
    let quoted = Sleeper::new(&h, "quoted");
    let raw = Sleeper::new(&h, "raw");

    let mut ann = BTreeMap::new();
    ann.insert(
        "io.kubernetes.pod.name".to_string(),
        "evil\"} 1\ninjected_metric{x=\"y".to_string(),
    );
    ann.insert(
        "io.kubernetes.pod.namespace".to_string(),
        "back\\slash\\\\n\\".to_string(),
    );
    ann.insert(
        "io.kubernetes.container.name".to_string(),
        "cr\rtab\tnl\n# TYPE forged counter\nforged 1".to_string(),
    );
    let r = call(
        &cfg.socket,
        &Request::Register(Register {
            container_id: "quoted".into(),
            container_name: "q\"uote".into(),
            pid: Some(quoted.child.id()),
            cgroup_path: quoted.cg.group.rel.clone(),
            annotations: ann,
            ..Default::default()
        }),
        Duration::from_secs(5),
    )
    .unwrap();
    assert!(r.ok, "{r:?}");

    // Bytes that are not UTF-8 inside the JSON strings, sent as they are.
    let mut line = format!(
        "{{\"op\":\"register\",\"container_id\":\"raw\",\"container_name\":\"n\\u0000\",\"pid\":{},\"cgroup_path\":{:?},\"annotations\":{{\"io.kubernetes.pod.name\":\"",
        raw.child.id(),
        raw.cg.group.rel
    )
    .into_bytes();
    line.extend_from_slice(b"bad\xff\xfe\xc3(utf8\"");
    line.extend_from_slice(
        b"},\"bundle\":\"\",\"created_ns\":null,\"threshold_ns\":null,\"qos\":null}\n",
    );
    let mut s = UnixStream::connect(&cfg.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&line).unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    assert!(
        resp.contains("\"ok\":true"),
        "a register with bytes that are not UTF-8 is watched (replaced by U+FFFD): {resp}"
    );

    // Per-container series appear at the first snapshot.
    let t = std::time::Instant::now();
    let body = loop {
        let page = http_get(port, "/metrics");
        let body = page
            .split_once("\r\n\r\n")
            .map(|x| x.1)
            .unwrap_or("")
            .to_string();
        // (The counters exist from the register; the gauge follows.)
        let both = body.contains("container_id=\"raw\"")
            && body.contains("throttlewatch_watched_containers 2");
        if both || t.elapsed() > Duration::from_secs(10) {
            break body;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        body.contains("throttlewatch_watched_containers 2"),
        "{body}"
    );
    for l in body.lines() {
        assert!(
            !l.starts_with("injected_metric") && !l.starts_with("forged"),
            "a label value forged a series: {l:?}\n{body}"
        );
    }
    assert!(
        body.contains(r#"pod="evil\"} 1\ninjected_metric{x=\"y""#),
        "quote and newline escaped: {body}"
    );
    assert!(
        body.contains(r#"namespace="back\\slash\\\\n\\""#),
        "backslashes escaped: {body}"
    );
    assert!(body.contains("pod=\"bad\u{fffd}"), "{body}");
    let mut p = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus; scripts/setup.sh --test)");
    p.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    let out = p.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // promtool reads the 0.0.4 text format; the agent serves OpenMetrics,
    // whose counter samples end in `_total` while HELP names the family. Those
    // lint notes are the only thing allowed: a forged line is a parse error.
    assert!(
        !said.contains("error"),
        "promtool check metrics: {said}\n{body}"
    );
    for l in said.lines() {
        let family = l
            .strip_suffix("_total no help text")
            .unwrap_or_else(|| panic!("promtool check metrics: {l:?}\n{said}\n{body}"));
        assert!(body.contains(&format!("# HELP {family} ")), "{l}");
    }
    assert!(
        out.status.success() || !said.is_empty(),
        "promtool failed silently"
    );
}

/// Finding 9: the metrics server reads at most 8 KiB of a request and
/// answers at once (it used to read a line of any length, until its timeout).
#[test]
fn metrics_server_bounds_what_it_reads() {
    let port = free_port();
    let cfg = PrivateConfig::new("");
    let text = std::fs::read_to_string(&cfg.path).unwrap().replace(
        "metrics_addr = \"\"",
        &format!("metrics_addr = \"127.0.0.1:{port}\""),
    );
    std::fs::write(&cfg.path, text).unwrap();
    let _agent = Agent::start(&cfg);
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t = std::time::Instant::now();
    // 64 KiB of request line, no newline, and the connection kept open.
    let _ = s.write_all(&vec![b'A'; 64 * 1024]);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let took = t.elapsed();
    eprintln!("answer to a 64 KiB request line: {took:?}");
    assert!(
        String::from_utf8_lossy(&out).starts_with("HTTP/1.1 404"),
        "{out:?}"
    );
    assert!(took < Duration::from_millis(1000), "took {took:?}");
    assert!(http_get(port, "/metrics").starts_with("HTTP/1.1 200"));
}
