//! Unit tests of plugin.rs: the events against a private state directory,
//! with and without an agent.
use super::*;
use crate::container::spec_of;

fn private_config(dir: &Path) -> Config {
    Config {
        log_dir: dir.join("logs"),
        socket: dir.join("none.sock"),
        state_dir: dir.join("state"),
        start_agent: false,
        ..Config::default()
    }
}

fn plugin(dir: &Path, watch: WatchMode, mode: CgroupMode) -> Arc<Plugin> {
    Arc::new(Plugin::with_mode(
        private_config(dir),
        None,
        watch,
        Some(mode),
    ))
}

fn call<Q: Message, A: Message>(p: &Arc<Plugin>, method: &str, q: &Q) -> A {
    let bytes = p
        .handle(PLUGIN_SERVICE, method, &q.write_to_bytes().unwrap())
        .unwrap_or_else(|s| panic!("{method}: {s:?}"));
    A::parse_from_bytes(&bytes).unwrap()
}

fn container(id: &str, annotations: &[(&str, &str)], quota: Option<i64>) -> api::Container {
    let mut c = api::Container::new();
    c.id = id.into();
    c.pod_sandbox_id = "pod".into();
    c.annotations = annotations
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    if let Some(q) = quota {
        let cpu = c
            .linux
            .mut_or_insert_default()
            .resources
            .mut_or_insert_default()
            .cpu
            .mut_or_insert_default();
        cpu.quota.mut_or_insert_default().value = q;
        cpu.period.mut_or_insert_default().value = 100_000;
    }
    c
}

fn create(
    p: &Arc<Plugin>,
    pod: api::PodSandbox,
    c: api::Container,
) -> api::CreateContainerResponse {
    let mut q = api::CreateContainerRequest::new();
    q.pod = MessageField::some(pod);
    q.container = MessageField::some(c);
    call(p, "CreateContainer", &q)
}

/// The mask NRI's `EventMask.Set` builds for these events.
#[test]
fn configure_subscribes_to_the_container_events() {
    let d = tempfile::tempdir().unwrap();
    let p = plugin(d.path(), WatchMode::Annotated, CgroupMode::V1);
    let mut q = api::ConfigureRequest::new();
    q.runtime_name = "containerd".into();
    q.runtime_version = "v2.3.4".into();
    q.request_timeout = 2000;
    let res: api::ConfigureResponse = call(&p, "Configure", &q);
    // CreateContainer 4, StartContainer 6, UpdateContainer 8,
    // PostUpdateContainer 9, StopContainer 10, RemoveContainer 11.
    assert_eq!(res.events, 0b111_1010_1000);
    assert_eq!(p.deadline(), Duration::from_millis(1500));
    assert_eq!(p.key("c").scope, Some(Scope::of_namespace("k8s.io")));
    let e = p.handle(PLUGIN_SERVICE, "Nope", b"").unwrap_err();
    assert_eq!(e.code.enum_value_or_default(), Code::UNIMPLEMENTED);
    let e = p
        .handle(PLUGIN_SERVICE, "Configure", b"\xff\xff")
        .unwrap_err();
    assert_eq!(e.code.enum_value_or_default(), Code::INVALID_ARGUMENT);
}

#[test]
fn opt_in_by_annotation_or_configuration() {
    let d = tempfile::tempdir().unwrap();
    let p = plugin(d.path(), WatchMode::Annotated, CgroupMode::V1);
    let mut pod = api::PodSandbox::new();
    let plain = container("a", &[], None);
    assert!(!p.wanted(&pod, &plain));
    assert!(p.wanted(
        &pod,
        &container("b", &[("throttlewatch.io/watch", "true")], None)
    ));
    pod.annotations
        .insert("throttlewatch.io/cpu-burst".into(), "20ms".into());
    assert!(p.wanted(&pod, &plain));
    pod.runtime_handler = SHIM_HANDLER.into();
    assert!(!p.wanted(&pod, &plain), "our shim's pods are the shim's");
    let all = plugin(d.path(), WatchMode::All, CgroupMode::V1);
    let mut q = api::ConfigureRequest::new();
    q.config = "watch = \"annotated\"".into();
    let _: api::ConfigureResponse = call(&all, "Configure", &q);
    assert!(!all.wanted(&api::PodSandbox::new(), &plain));
    q.config = String::new();
    let _: api::ConfigureResponse = call(&all, "Configure", &q);
    assert!(all.wanted(&api::PodSandbox::new(), &plain));
    let sandbox = container(
        "s",
        &[("io.kubernetes.cri.container-type", "sandbox")],
        None,
    );
    assert!(!all.wanted(&api::PodSandbox::new(), &sandbox));
}

/// cgroup v2: the burst in the unified map, clamped to the quota; v1
/// and unannotated containers: no adjustment.
#[test]
fn create_adjusts_the_v2_burst() {
    let d = tempfile::tempdir().unwrap();
    let v2 = plugin(d.path(), WatchMode::Annotated, CgroupMode::V2);
    let burst = [("throttlewatch.io/cpu-burst", "20ms")];
    let res = create(
        &v2,
        api::PodSandbox::new(),
        container("a", &burst, Some(50_000)),
    );
    let unified = &res.adjust.linux.resources.unified;
    assert_eq!(
        unified.get(V2_BURST_FILE).map(String::as_str),
        Some("20000")
    );
    let half = [("throttlewatch.io/cpu-burst", "50%")];
    let res = create(
        &v2,
        api::PodSandbox::new(),
        container("b", &half, Some(30_000)),
    );
    assert_eq!(
        res.adjust
            .linux
            .resources
            .unified
            .get(V2_BURST_FILE)
            .map(String::as_str),
        Some("15000")
    );
    let res = create(&v2, api::PodSandbox::new(), container("c", &burst, None));
    assert!(res.adjust.is_none(), "no quota, no burst: {res:?}");
    let res = create(
        &v2,
        api::PodSandbox::new(),
        container("d", &[], Some(50_000)),
    );
    assert!(res.adjust.is_none());
    let v1 = plugin(d.path(), WatchMode::Annotated, CgroupMode::V1);
    let res = create(
        &v1,
        api::PodSandbox::new(),
        container("e", &burst, Some(50_000)),
    );
    assert!(res.adjust.is_none(), "NRI has no v1 burst field: {res:?}");
}

/// cgroup v2: an update's burst is sized for the new quota (the create's
/// is in the spec and would be written again after it).
#[test]
fn update_resizes_the_v2_burst() {
    let d = tempfile::tempdir().unwrap();
    let v2 = plugin(d.path(), WatchMode::Annotated, CgroupMode::V2);
    let burst = [("throttlewatch.io/cpu-burst", "20ms")];
    let update = |p: &Arc<Plugin>, quota: i64| {
        let mut q = api::UpdateContainerRequest::new();
        q.container = MessageField::some(container("u", &burst, Some(50_000)));
        q.linux_resources
            .mut_or_insert_default()
            .cpu
            .mut_or_insert_default()
            .quota
            .mut_or_insert_default()
            .value = quota;
        let res: api::UpdateContainerResponse = call(p, "UpdateContainer", &q);
        res.update
            .iter()
            .map(|u| {
                let v = u.linux.resources.unified.get(V2_BURST_FILE).cloned();
                (u.container_id.clone(), v.unwrap_or_default())
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        update(&v2, 10_000),
        [("u".to_string(), "10000".to_string())]
    );
    assert_eq!(
        update(&v2, 80_000),
        [("u".to_string(), "20000".to_string())]
    );
    assert_eq!(update(&v2, -1), [], "no quota: the spec's burst stands");
    let v1 = plugin(d.path(), WatchMode::Annotated, CgroupMode::V1);
    assert_eq!(update(&v1, 10_000), [], "v1: nothing in the spec to resize");
}

/// No agent: start and stop are answered at once, nothing refused.
#[test]
fn events_are_answered_without_an_agent() {
    let d = tempfile::tempdir().unwrap();
    let p = plugin(d.path(), WatchMode::Annotated, CgroupMode::V1);
    let mut c = container("a", &[("throttlewatch.io/watch", "true")], Some(50_000));
    c.pid = std::process::id();
    let mut q = api::StartContainerRequest::new();
    q.container = MessageField::some(c.clone());
    let t0 = std::time::Instant::now();
    let _: api::StartContainerResponse = call(&p, "StartContainer", &q);
    let mut q = api::StopContainerRequest::new();
    q.container = MessageField::some(c);
    let _: api::StopContainerResponse = call(&p, "StopContainer", &q);
    assert!(t0.elapsed() < p.deadline() * 2 + Duration::from_millis(500));
}

/// An agent that accepts and never answers: the start is answered by
/// the deadline (three quarters of the runtime's request timeout).
#[test]
fn a_slow_agent_holds_no_start_up() {
    let d = tempfile::tempdir().unwrap();
    let p = plugin(d.path(), WatchMode::Annotated, CgroupMode::V1);
    let listener = std::os::unix::net::UnixListener::bind(d.path().join("none.sock")).unwrap();
    let _held = std::thread::spawn(move || {
        let conns: Vec<_> = listener.incoming().take(2).collect();
        std::thread::sleep(Duration::from_secs(30));
        drop(conns);
    });
    let mut q = api::ConfigureRequest::new();
    q.request_timeout = 400;
    let _: api::ConfigureResponse = call(&p, "Configure", &q);
    assert_eq!(p.deadline(), Duration::from_millis(300));
    let mut c = container("slow", &[("throttlewatch.io/watch", "true")], Some(50_000));
    c.pid = std::process::id();
    let mut q = api::StartContainerRequest::new();
    q.container = MessageField::some(c);
    let t0 = std::time::Instant::now();
    let _: api::StartContainerResponse = call(&p, "StartContainer", &q);
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_millis(1000),
        "answered after {took:?}"
    );
}

#[test]
fn spec_takes_the_pods_keys_under_the_containers() {
    let mut pod = api::PodSandbox::new();
    pod.annotations
        .insert("throttlewatch.io/cpu-burst".into(), "5ms".into());
    pod.annotations
        .insert("throttlewatch.io/watch".into(), "true".into());
    pod.annotations.insert("other".into(), "x".into());
    let c = container("a", &[("throttlewatch.io/cpu-burst", "7ms")], Some(40_000));
    let s = spec_of(&pod, &c);
    assert_eq!(
        s.annotations.get("throttlewatch.io/cpu-burst").unwrap(),
        "7ms"
    );
    assert_eq!(s.annotations.get("throttlewatch.io/watch").unwrap(), "true");
    assert!(!s.annotations.contains_key("other"));
    assert_eq!(s.cpu_quota(), (Some(40_000), Some(100_000)));
}

#[test]
fn event_mask_is_nris() {
    assert_eq!(event_mask(&[api::Event::RUN_POD_SANDBOX]), 1);
    assert_eq!(event_mask(&[api::Event::CREATE_CONTAINER]), 1 << 3);
    assert_eq!(event_mask(&[]), 0);
}

fn sync_req(containers: Vec<api::Container>, more: bool) -> api::SynchronizeRequest {
    let mut q = api::SynchronizeRequest::new();
    q.containers = containers;
    q.more = more;
    q
}

fn in_state(c: api::Container, state: api::ContainerState) -> api::Container {
    api::Container {
        state: state.into(),
        pid: std::process::id(),
        ..c
    }
}

/// Wait (at most 5 s) for `f`.
fn eventually(what: &str, f: impl Fn() -> bool) {
    let t0 = std::time::Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(5), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A whole Synchronize (its last piece) ends this plugin's registrations
/// it does not list running: the burst record and the registration go;
/// the running one and another front end's burst record stay.
#[test]
fn synchronize_ends_what_stopped_while_the_plugin_was_down() {
    use throttlewatch_lifecycle::burst_record::{self, BurstRecord, BurstRequest, RECORD_VERSION};
    let d = tempfile::tempdir().unwrap();
    let p = plugin(d.path(), WatchMode::Annotated, CgroupMode::V1);
    let mut q = api::ConfigureRequest::new();
    q.runtime_name = "containerd".into();
    let _: api::ConfigureResponse = call(&p, "Configure", &q);
    let cfg = &p.settings().cfg;
    let state = throttlewatch_lifecycle::StateDir::new(&cfg.state_dir);
    let reg = Registered::new(&cfg.state_dir);
    let record = |key: &ContainerKey| BurstRecord {
        v: RECORD_VERSION,
        container_id: key.id.clone(),
        scope: key.scope.clone(),
        cgroup_path: "/nowhere".into(),
        request: BurstRequest::Micros(20_000),
        cap_percent: 100,
        applied_us: 20_000,
    };
    let (gone, stopped, running) = (p.key("gone"), p.key("stopped"), p.key("running"));
    let other = p.key("the-shims");
    for k in [&gone, &stopped, &running] {
        reg.add(k).unwrap();
    }
    for k in [&gone, &stopped, &running, &other] {
        burst_record::save(&state, &record(k)).unwrap();
    }
    // A first piece lists nothing: nothing is ended before the last one.
    let _: api::SynchronizeResponse = call(&p, "Synchronize", &sync_req(vec![], true));
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(reg.all(&mut |_| {}).len(), 3, "ended before the last piece");
    let unannotated = |id| container(id, &[], Some(50_000));
    let last = vec![
        in_state(
            unannotated("running"),
            api::ContainerState::CONTAINER_RUNNING,
        ),
        in_state(
            unannotated("stopped"),
            api::ContainerState::CONTAINER_STOPPED,
        ),
        in_state(
            unannotated("the-shims"),
            api::ContainerState::CONTAINER_STOPPED,
        ),
    ];
    let _: api::SynchronizeResponse = call(&p, "Synchronize", &sync_req(last, false));
    eventually("the gone and the stopped ended", || {
        reg.all(&mut |_| {}) == vec![running.clone()]
    });
    eventually("their burst records released", || {
        !state.burst_file(&gone).exists() && !state.burst_file(&stopped).exists()
    });
    assert!(state.burst_file(&running).exists(), "the running one's");
    assert!(state.burst_file(&other).exists(), "another front end's");
}

#[test]
fn a_burst_waits_twice_the_request_timeout_for_its_post_update() {
    let d = tempfile::tempdir().unwrap();
    let p = plugin(d.path(), WatchMode::Annotated, CgroupMode::V1);
    assert_eq!(p.hold_limit(), DEFAULT_REQUEST_TIMEOUT * 2);
    let mut q = api::ConfigureRequest::new();
    q.request_timeout = 700;
    let _: api::ConfigureResponse = call(&p, "Configure", &q);
    assert_eq!(p.hold_limit(), Duration::from_millis(1400));
}

/// StartContainer notes the registration before the register (no agent
/// here), StopContainer forgets it.
#[test]
fn a_started_container_is_noted_until_it_stops() {
    let d = tempfile::tempdir().unwrap();
    let p = plugin(d.path(), WatchMode::Annotated, CgroupMode::V1);
    let mut c = container("noted", &[("throttlewatch.io/watch", "true")], Some(50_000));
    c.pid = std::process::id();
    let reg = Registered::new(&p.settings().cfg.state_dir);
    let mut q = api::StartContainerRequest::new();
    q.container = MessageField::some(c.clone());
    let _: api::StartContainerResponse = call(&p, "StartContainer", &q);
    assert!(reg.contains(&p.key("noted")));
    let mut q = api::StopContainerRequest::new();
    q.container = MessageField::some(c);
    let _: api::StopContainerResponse = call(&p, "StopContainer", &q);
    assert!(!reg.contains(&p.key("noted")));
}

/// A Synchronize counts every running container in its summary, not only
/// those the plugin asks for (the trial's "1 of 1 running containers
/// watched" with two running: the unannotated one was left out of "of").
#[test]
fn synchronize_counts_every_running_container() {
    let d = tempfile::tempdir().unwrap();
    let p = plugin(d.path(), WatchMode::Annotated, CgroupMode::V1);
    let running = api::ContainerState::CONTAINER_RUNNING;
    let annotated = container("annotated", &[("throttlewatch.io/watch", "true")], None);
    let plain = container("plain", &[], None);
    let stopped = container("stopped", &[("throttlewatch.io/watch", "true")], None);
    let (all, wanted) = p.running_of(
        vec![],
        vec![
            in_state(annotated, running),
            in_state(plain, running),
            in_state(stopped, api::ContainerState::CONTAINER_STOPPED),
        ],
    );
    assert_eq!(all, 2, "both running containers count");
    let ids: Vec<&str> = wanted.iter().map(|(_, c)| c.id.as_str()).collect();
    assert_eq!(ids, ["annotated"]);
    assert!(sync::summary(all, wanted.len(), 1)
        .starts_with("Synchronize: 1 of 2 running containers watched (1 not asked for"));
}
