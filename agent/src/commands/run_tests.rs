use super::*;

fn args(
    cpus: Option<&str>,
    quota: Option<&str>,
    period: Option<&str>,
    burst: Option<&str>,
    cpuset: Option<&str>,
) -> RunArgs {
    RunArgs {
        cpus: cpus.map(Into::into),
        quota: quota.map(Into::into),
        period: period.map(Into::into),
        burst: burst.map(Into::into),
        cpuset: cpuset.map(Into::into),
        cgroup_parent: None,
        out: OutputArgs {
            log: None,
            threshold: None,
            json: false,
            quiet: false,
        },
        cmd: vec!["true".into()],
    }
}

#[test]
fn limits_from_cpus() {
    let two = CpuList::parse("", "0-1").unwrap();
    let over = parse_limits(&args(Some("3"), None, None, None, None), Some(&two)).unwrap();
    let w = limit_above_cpus(&over, Some(&two)).expect("3 CPUs on 2");
    assert!(w.contains("limit of 3 CPUs is above the 2 CPUs"), "{w}");
    let fits = parse_limits(&args(Some("1.5"), None, None, None, None), Some(&two)).unwrap();
    assert_eq!(limit_above_cpus(&fits, Some(&two)), None);
    let l = parse_limits(&args(Some("0.5"), None, None, Some("20ms"), None), None).unwrap();
    assert_eq!(
        l,
        RunLimits {
            quota_us: Some(50_000),
            period_us: 100_000,
            burst_us: Some(20_000),
            cpuset: None
        }
    );
    let l = parse_limits(&args(None, Some("10ms"), Some("50ms"), None, None), None).unwrap();
    assert_eq!((l.quota_us, l.period_us), (Some(10_000), 50_000));
}

#[test]
fn bad_limits_name_the_option() {
    let avail = CpuList::parse("x", "0-1").unwrap();
    let cases = [
        (args(Some("zero"), None, None, None, None), "--cpus"),
        (
            args(Some("0.5"), None, None, Some("60ms"), None),
            "larger than the quota",
        ),
        (args(None, None, None, Some("10ms"), None), "needs a quota"),
        (args(Some("1"), None, Some("5s"), None, None), "--period"),
        (args(None, Some("10us"), None, None, None), "--quota"),
        (
            args(None, None, None, None, Some("0-7")),
            "CPUs 2-7 are not available",
        ),
        (args(None, None, None, None, Some("x")), "--cpuset"),
    ];
    for (a, want) in cases {
        let e = parse_limits(&a, Some(&avail)).unwrap_err();
        assert_eq!(e.code, crate::EXIT_USAGE);
        assert!(
            e.message.contains(want),
            "{} should contain {want}",
            e.message
        );
    }
}

#[test]
fn programs() {
    assert!(resolve_program("sh").is_ok());
    let e = resolve_program("no-such-command-xyz").unwrap_err();
    assert!(e.message.contains("no-such-command-xyz") && e.code == 2);
    assert!(resolve_program("/nonexistent/bin").is_err());
}

#[test]
fn pid_formatting() {
    let mut b = [0u8; 16];
    let n = fmt_u32(4_194_303, &mut b);
    assert_eq!(&b[..n], b"4194303");
    let n = fmt_u32(0, &mut b);
    assert_eq!(&b[..n], b"0");
}
