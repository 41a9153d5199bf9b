use super::*;

fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (format!("{PREFIX}{k}"), v.to_string()))
        .collect()
}

fn env(vars: &[&str]) -> Vec<String> {
    vars.iter().map(|s| s.to_string()).collect()
}

fn parse(pairs: &[(&str, &str)]) -> (QosRequest, Vec<Refusal>) {
    parse_request(&ann(pairs), &[], &Policy::default())
}

#[test]
fn nothing_asked_nothing_refused() {
    let mut other = BTreeMap::new();
    other.insert("io.kubernetes.pod.name".to_string(), "x".to_string());
    let (r, refused) = parse_request(
        &other,
        &env(&["PATH=/bin", "HOME=/", "NOEQUALS"]),
        &Policy::default(),
    );
    assert_eq!(refused, vec![]);
    assert_eq!(
        r,
        QosRequest {
            burst_cap_percent: 100,
            ..Default::default()
        }
    );
}

#[test]
fn every_key_parses() {
    let (r, refused) = parse(&[
        ("watch", "true"),
        ("threshold", "1ms"),
        ("cpu-burst", "20ms"),
        ("cpuset", "0-3,8"),
        ("cpuset-exclusive", "true"),
        ("cpuset-cpus", "4"),
        ("gpus", "0,GPU-8f6e1b2a-0001-4c1d-9e3f-000000000001"),
    ]);
    assert_eq!(refused, vec![]);
    assert_eq!(r.watch, Some(true));
    assert_eq!(r.threshold(), Some(Duration::from_millis(1)));
    assert_eq!(r.burst, Some(BurstSpec::Micros(20_000)));
    assert_eq!(
        r.cpuset.as_ref().map(|c| c.to_string()).as_deref(),
        Some("0-3,8")
    );
    assert!(r.exclusive);
    assert_eq!(r.cpuset_cpus, Some(4));
    let g = r.gpus.as_ref().unwrap();
    assert_eq!(g.key, "throttlewatch.io/gpus");
    assert!(matches!(&g.devices, GpuDevices::List(l) if l.len() == 2));
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["cpuset"], "0-3,8");
    assert_eq!(json["burst"]["micros"], 20000);
}

#[test]
fn env_channel_and_annotation_wins() {
    let e = env(&[
        "THROTTLEWATCH_CPU_BURST=10ms",
        "THROTTLEWATCH_WATCH=false",
        "THROTTLEWATCH_WATCH=true",
        "THROTTLEWATCH_QOS_CLASS=burstable",
    ]);
    let widened = Policy {
        env_keys: vec!["watch".into(), "cpu-burst".into(), "qos-class".into()],
        ..Policy::default()
    };
    let (r, refused) = parse_request(&ann(&[("cpu-burst", "30ms")]), &e, &widened);
    assert_eq!(refused, vec![]);
    assert_eq!(r.burst, Some(BurstSpec::Micros(30_000)), "annotation wins");
    assert_eq!(r.watch, Some(true), "last env entry wins");
    assert_eq!(r.qos_class, Some(QosClass::Burstable));
    assert_eq!(r.origins[&Key::Watch].key, "THROTTLEWATCH_WATCH");

    let (_, refused) = parse_request(
        &BTreeMap::new(),
        &env(&["THROTTLEWATCH_CPU_BURST=abc"]),
        &Policy::default(),
    );
    assert_eq!(refused[0].key, "THROTTLEWATCH_CPU_BURST");
}

#[test]
fn refusal_reads_key_value_accepted_and_the_rest_applies() {
    let (r, refused) = parse(&[("cpu-burst", "abc"), ("threshold", "2ms")]);
    assert_eq!(
        refused[0].to_string(),
        "throttlewatch.io/cpu-burst=\"abc\": expected a duration such as 20ms or a percentage of the quota such as 50%"
    );
    assert_eq!(refused.len(), 1);
    assert_eq!(r.burst, None);
    assert_eq!(r.threshold_us, Some(2000));
}

#[test]
fn every_bad_value_is_refused_by_its_key() {
    let long = "1".repeat(300);
    let cases: &[(&str, &str, &str)] = &[
        ("watch", "yes", "true or false"),
        ("watch", "", "true or false"),
        ("threshold", "-1ms", "duration"),
        ("threshold", "11s", "10s"),
        ("threshold", "1e400s", "duration"),
        ("cpu-burst", "-20ms", "duration"),
        ("cpu-burst", "101%", "0% to 100%"),
        ("cpu-burst", "-5%", "percentage"),
        ("cpu-burst", "99999999999999999999999", "duration"),
        ("cpu-burst", "1h", "10s"),
        (
            "qos-class",
            "gold",
            "latency-critical, burstable, best-effort",
        ),
        ("cpuset", "3-1", "CPU list"),
        ("cpuset", "0-99999", "CPU list"),
        ("cpuset", "numa:-1", "numa:N"),
        ("cpuset", "numa:99999", "limit"),
        ("cpuset", "nowhere", "gpu-local"),
        ("cpuset-exclusive", "maybe", "true or false"),
        ("cpuset-cpus", "0", "whole number"),
        ("cpuset-cpus", "-3", "whole number"),
        ("cpuset-cpus", "100000", "whole number"),
        ("cpuset-cpus", "2.5", "whole number"),
        ("gpus", "gpu0", "index"),
        ("gpus", "0,,1", "index"),
        ("threshold", &long, "at most 256"),
    ];
    for (key, value, expect) in cases {
        let (_, refused) = parse(&[(key, value)]);
        assert_eq!(refused.len(), 1, "{key}={value}: {refused:?}");
        let r = &refused[0];
        assert_eq!(r.key, format!("{PREFIX}{key}"));
        assert!(r.reason.contains(expect), "{key}={value}: {r}");
        assert!(
            r.to_string().starts_with(&format!("{PREFIX}{key}=\"")),
            "{r}"
        );
    }
}

#[test]
fn unknown_keys_are_refused() {
    let mut a = ann(&[("cpu-brust", "20ms")]);
    a.insert("throttlewatch.iox/cpu-burst".into(), "1".into());
    let (_, refused) = parse_request(
        &a,
        &env(&["THROTTLEWATCH_CPUBURST=1", "THROTTLEWATCHER=1"]),
        &Policy::default(),
    );
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert!(refused
        .iter()
        .any(|r| r.key == "throttlewatch.io/cpu-brust"
            && r.reason.contains("unknown annotation key")));
    assert!(
        refused
            .iter()
            .any(|r| r.key == "THROTTLEWATCH_CPUBURST"
                && r.reason.contains("THROTTLEWATCH_CPU_BURST"))
    );
}

#[test]
fn policy_limits_keys_bursts_and_exclusivity() {
    let policy = Policy {
        allowed_keys: Some(vec!["watch".into(), "cpu-burst".into()]),
        env_keys: vec!["gpus".into()],
        ..Default::default()
    };
    let (r, refused) = parse_request(
        &ann(&[("watch", "true"), ("cpuset", "0-3")]),
        &env(&["THROTTLEWATCH_GPUS=0"]),
        &policy,
    );
    assert_eq!(r.watch, Some(true));
    assert_eq!(r.cpuset, None);
    assert_eq!(refused.len(), 2);
    assert!(
        refused.iter().all(|r| r.reason == "not allowed by policy"),
        "{refused:?}"
    );

    let policy = Policy {
        max_burst_percent: 50,
        allow_exclusive: false,
        ..Default::default()
    };
    let (r, refused) = parse_request(
        &ann(&[("cpu-burst", "80%"), ("cpuset", "numa:0,exclusive")]),
        &[],
        &policy,
    );
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert!(
        refused[0].reason.contains("0% to 50% (policy maximum)"),
        "{}",
        refused[0]
    );
    assert!(
        refused[1]
            .reason
            .contains("exclusive cpusets are not allowed by policy"),
        "{}",
        refused[1]
    );
    assert_eq!(
        r.cpuset,
        Some(CpusetTarget::Numa(0)),
        "the cpuset still applies, shared"
    );
    assert!(!r.exclusive);

    let (r, refused) = parse_request(&ann(&[("qos-class", "latency-critical")]), &[], &policy);
    assert_eq!(refused, vec![]);
    assert_eq!(r.burst, Some(BurstSpec::Percent(50)));
    assert!(!r.exclusive);
    assert!(
        r.notes
            .iter()
            .any(|n| n.contains("lowered to the policy maximum 50%")),
        "{:?}",
        r.notes
    );
    assert!(
        r.notes.iter().any(|n| n.contains("not exclusive")),
        "{:?}",
        r.notes
    );
}

#[test]
fn presets_and_explicit_overrides() {
    let (r, _) = parse(&[("qos-class", "latency-critical")]);
    assert_eq!(
        (r.burst, r.cpuset.clone(), r.exclusive),
        (
            Some(BurstSpec::Percent(100)),
            Some(CpusetTarget::Auto),
            true
        )
    );
    assert!(r.from_preset(Key::CpuBurst) && r.from_preset(Key::CpusetExclusive));
    let (r, _) = parse(&[("qos-class", "burstable")]);
    assert_eq!(
        (r.burst, r.cpuset.clone(), r.exclusive),
        (Some(BurstSpec::Percent(50)), None, false)
    );
    let (r, _) = parse(&[("qos-class", "best-effort")]);
    assert_eq!(
        (r.burst, r.cpuset.clone(), r.exclusive),
        (None, None, false)
    );

    let (r, _) = parse(&[
        ("qos-class", "latency-critical"),
        ("cpu-burst", "5ms"),
        ("cpuset", "numa:1"),
    ]);
    assert_eq!(
        (r.burst, r.cpuset.clone(), r.exclusive),
        (
            Some(BurstSpec::Micros(5000)),
            Some(CpusetTarget::Numa(1)),
            true
        )
    );
    assert!(!r.from_preset(Key::CpuBurst));
    let (r, _) = parse(&[
        ("qos-class", "latency-critical"),
        ("cpuset-exclusive", "false"),
    ]);
    assert!(!r.exclusive);
    assert_eq!(r.cpuset, Some(CpusetTarget::Auto));
    let (r, _) = parse(&[("cpuset", "0-3,exclusive"), ("cpuset-exclusive", "false")]);
    assert!(!r.exclusive, "cpuset-exclusive wins over the suffix");
}

#[test]
fn exclusive_or_count_alone_means_auto() {
    let (r, refused) = parse(&[("cpuset-cpus", "4")]);
    assert_eq!(refused, vec![]);
    assert_eq!(
        (r.cpuset.clone(), r.exclusive),
        (Some(CpusetTarget::Auto), false)
    );
    let (r, _) = parse(&[("cpuset-exclusive", "true")]);
    assert_eq!((r.cpuset, r.exclusive), (Some(CpusetTarget::Auto), true));
    assert_eq!(
        r.origins[&Key::Cpuset].key,
        "throttlewatch.io/cpuset-exclusive"
    );
}

/// The wrapper's create stamp and the agent's cold-start target are keys
/// under the prefix but not QoS: passed over, never refused as unknown.
#[test]
fn keys_that_are_not_qos_are_passed_over() {
    let (r, refused) = parse(&[
        ("created-unix-ns", "1700000000000000000"),
        ("cold-start-cpu", "25ms"),
        ("cpu-burst", "20ms"),
    ]);
    assert_eq!(refused, vec![]);
    assert_eq!(r.burst, Some(BurstSpec::Micros(20_000)));
    assert!(!r.origins.contains_key(&Key::CreatedUnixNs));
    let (_, refused) = parse(&[("created-unix-nss", "1")]);
    assert_eq!(refused.len(), 1);
    assert!(
        refused[0].reason.contains("unknown annotation key"),
        "{refused:?}"
    );
}

#[test]
fn refusals_say_which_setting() {
    let (_, refused) = parse(&[("cpu-burst", "abc"), ("cpu-brust", "1ms")]);
    let settings: Vec<_> = refused.iter().map(|r| r.setting).collect();
    assert_eq!(settings, vec![None, Some(Key::CpuBurst)], "{refused:?}");
    assert!(refused[1].is_about(Key::CpuBurst));
}

#[test]
fn our_non_qos_annotations_are_not_refused() {
    let (r, refused) = parse(&[
        ("created-unix-ns", "1796073626048627852"),
        ("cold-start-cpu", "10ms"),
        ("cpu-burst", "20ms"),
    ]);
    assert!(refused.is_empty(), "{refused:?}");
    assert!(r.burst.is_some(), "{r:?}");
}

/// Issue 11 finding 3: an image's ENV reaches only keys that cannot touch
/// other tenants; cpusets come from annotations only; threshold only upward.
#[test]
fn environment_is_a_lesser_source() {
    let e = env(&[
        "THROTTLEWATCH_CPUSET=2-3,exclusive",
        "THROTTLEWATCH_CPUSET_EXCLUSIVE=true",
        "THROTTLEWATCH_CPUSET_CPUS=2",
        "THROTTLEWATCH_QOS_CLASS=latency-critical",
        "THROTTLEWATCH_CPU_BURST=10ms",
        "THROTTLEWATCH_WATCH=true",
    ]);
    let (r, refused) = parse_request(&BTreeMap::new(), &e, &Policy::default());
    assert_eq!(r.cpuset, None, "{r:?}");
    assert!(!r.exclusive && r.cpuset_cpus.is_none() && r.qos_class.is_none());
    assert_eq!(r.burst, Some(BurstSpec::Micros(10_000)));
    assert_eq!(r.watch, Some(true));
    let keys: Vec<&str> = refused.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "THROTTLEWATCH_QOS_CLASS",
            "THROTTLEWATCH_CPUSET",
            "THROTTLEWATCH_CPUSET_EXCLUSIVE",
            "THROTTLEWATCH_CPUSET_CPUS"
        ]
    );
    assert!(
        refused[1].reason.contains("annotations only"),
        "{refused:?}"
    );
    assert!(refused[0].reason.contains("env_keys"), "{refused:?}");

    // Widening the list never reaches cpusets: a qos-class from the
    // environment fills the burst only.
    let widened = Policy {
        env_keys: vec!["qos-class".into(), "cpuset".into()],
        ..Policy::default()
    };
    let (r, refused) = parse_request(
        &BTreeMap::new(),
        &env(&[
            "THROTTLEWATCH_QOS_CLASS=latency-critical",
            "THROTTLEWATCH_CPUSET=0",
        ]),
        &widened,
    );
    assert_eq!(r.qos_class, Some(QosClass::LatencyCritical));
    assert_eq!(r.burst, Some(BurstSpec::Percent(100)));
    assert!(r.cpuset.is_none() && !r.exclusive, "{r:?}");
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(
        r.notes.iter().any(|n| n.contains("from the environment")),
        "{r:?}"
    );

    // The annotation of the same key wins without a refusal for the variable.
    let (r, refused) = parse_request(
        &ann(&[("cpuset", "0")]),
        &env(&["THROTTLEWATCH_CPUSET=2-3"]),
        &Policy::default(),
    );
    assert_eq!(refused, vec![]);
    assert_eq!(r.cpuset.map(|c| c.to_string()).as_deref(), Some("0"));

    // threshold: up, never below the node's.
    let node = Policy {
        min_threshold_us: 1000,
        ..Policy::default()
    };
    for (v, ok) in [("500us", false), ("0", false), ("1ms", true), ("5ms", true)] {
        let (r, refused) = parse_request(
            &BTreeMap::new(),
            &env(&[&format!("THROTTLEWATCH_THRESHOLD={v}")]),
            &node,
        );
        assert_eq!(r.threshold_us.is_some(), ok, "{v}: {refused:?}");
        if !ok {
            assert!(refused[0].reason.contains("never lower"), "{refused:?}");
        }
    }
    let (_, refused) = parse_request(&ann(&[("threshold", "100us")]), &[], &node);
    assert!(
        refused[0].reason.contains("node's threshold"),
        "annotations too: {refused:?}"
    );
}

#[test]
fn cpu_control_from_annotation_preset_not_env() {
    let (r, refused) = parse(&[("cpu-control", "auto")]);
    assert_eq!((r.cpu_control, refused), (Some(CpuControl::Auto), vec![]));
    assert_eq!(serde_json::to_value(&r).unwrap()["cpu_control"], "auto");
    let (r, refused) = parse(&[("cpu-control", "sometimes")]);
    assert_eq!(r.cpu_control, None);
    let text = refused[0].to_string();
    assert!(
        text.contains("throttlewatch.io/cpu-control")
            && text.contains("sometimes")
            && text.contains("expected auto or off"),
        "{text}"
    );
    // The environment cannot turn it on by default (an image's ENV lands there).
    let (r, refused) = parse_request(
        &BTreeMap::new(),
        &env(&["THROTTLEWATCH_CPU_CONTROL=auto"]),
        &Policy::default(),
    );
    assert_eq!(r.cpu_control, None);
    assert!(refused[0].to_string().contains("env_keys"), "{:?}", refused);
    // latency-critical implies it; an explicit off wins over the preset.
    let (r, _) = parse(&[("qos-class", "latency-critical")]);
    assert_eq!(r.cpu_control, Some(CpuControl::Auto));
    assert!(r.from_preset(Key::CpuControl));
    let (r, _) = parse(&[("qos-class", "latency-critical"), ("cpu-control", "off")]);
    assert_eq!(r.cpu_control, Some(CpuControl::Off));
}
