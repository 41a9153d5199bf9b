//! `throttlewatch agent`: the node daemon. One probe for the node, one
//! session per registered container, a root-only unix socket for the hook,
//! Prometheus metrics, and state that survives a restart.

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use throttlewatch_cgroup::{CpuCgroup, Hierarchies};
use throttlewatch_core::config::Config;
use throttlewatch_core::logfmt::{LogWriter, Record};
use throttlewatch_core::protocol::{self, Register, Request, Response};
use throttlewatch_core::ContainerKey;
use throttlewatch_core::EndReason;
use throttlewatch_qos::Key;

use crate::coldstart::ColdStartSpec;
use crate::engine::{probe_options, Engine};
use crate::labels::ContainerLabels;
use crate::metrics::Metrics;
use crate::output::Output;
use crate::reading::Due;
use crate::socket::{bind, raise_nofile_limit, serve_socket, Answer, Job};
use crate::spec::SessionSpec;
use crate::state::{Persisted, StateDir};
use crate::timing::Phases;
use crate::{signals, CliError};

/// Start an agent in the background and wait until it answers.
pub fn detach(cfg: &Config, config_path: Option<&Path>) -> Result<i32, CliError> {
    if protocol::call(&cfg.socket, &Request::Status, Duration::from_secs(1)).is_ok() {
        return Ok(0);
    }
    mkdir(&cfg.log_dir, 0o750)?;
    let log = cfg.log_dir.join("agent.log");
    let out = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o640)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&log)
        .map_err(|e| CliError::fail(format!("{}: {e}", log.display())))?;
    let exe = std::env::current_exe().map_err(|e| CliError::fail(e.to_string()))?;
    let mut cmd = std::process::Command::new(exe);
    if let Some(c) = config_path {
        cmd.arg("--config").arg(c);
    }
    cmd.arg("agent")
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out);
    // SAFETY: setsid is async-signal-safe; it detaches from the caller's session.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| CliError::fail(format!("starting the agent: {e}")))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if protocol::call(&cfg.socket, &Request::Status, Duration::from_secs(1)).is_ok() {
            return Ok(0);
        }
        if let Ok(Some(st)) = child.try_wait() {
            // Exit 0: it lost the lock race to another agent, which is still
            // coming up; keep polling until the deadline.
            if !st.success() {
                return Err(CliError::fail(format!(
                    "the agent exited ({st}); see {}",
                    log.display()
                )));
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(CliError::fail(format!(
        "the agent did not answer on {} within 10s; see {}",
        cfg.socket.display(),
        log.display()
    )))
}

pub(crate) fn mkdir(p: &Path, mode: u32) -> Result<(), CliError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(p)
        .map_err(|e| CliError::fail(format!("{}: {e}", p.display())))
}

/// Hold `<state_dir>/agent.lock` for the life of the process: one agent per node.
fn lock(state_dir: &Path) -> Result<Option<std::fs::File>, CliError> {
    let p = throttlewatch_core::StateDir::new(state_dir).agent_lock();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&p)
        .map_err(|e| CliError::fail(format!("{}: {e}", p.display())))?;
    // SAFETY: flock on an fd we own.
    if unsafe {
        libc::flock(
            std::os::fd::AsRawFd::as_raw_fd(&f),
            libc::LOCK_EX | libc::LOCK_NB,
        )
    } != 0
    {
        return Ok(None);
    }
    Ok(Some(f))
}

/// How long after its answer a register's log, `start` record and state
/// file are written (`Agent::register_answering`): the container start the
/// hook is part of goes on for a few milliseconds after the answer (runc's
/// remaining hooks, start, `run -d` returning), and on a small node the
/// agent's writing competes with it for the CPUs. Sooner when anything else
/// needs the sessions (a request, the next poll, a signal).
const COMPLETE_AFTER_ANSWER: Duration = Duration::from_millis(25);

/// A register past its kernel half (see `Agent::register_answering`).
struct PendingRegister {
    prepared: crate::session::Prepared,
    key: ContainerKey,
    log_path: PathBuf,
    control_cgroup: CpuCgroup,
    wants_control: bool,
}

enum Begun {
    /// Already watched: the answer.
    Known(Response),
    Pending(Box<PendingRegister>),
}

struct Agent {
    cfg: Config,
    h: Hierarchies,
    /// Every watched container is a session of the engine.
    engine: Engine,
    state: StateDir,
    metrics: Arc<Mutex<Metrics>>,
    /// The dynamic CPU controller's containers (docs/control.md).
    controls: crate::control::Controls,
    /// Registers answered whose log, `start` record and state file are
    /// still to be written, oldest first, and when they are due.
    deferred: Vec<Box<PendingRegister>>,
    deferred_due: Option<Instant>,
}

/// What the registration tells about the container's cold start; the CPU
/// target comes from the `throttlewatch.io/cold-start-cpu` annotation.
fn cold_start_spec(r: &Register) -> ColdStartSpec {
    let target = r
        .annotations
        .get(&Key::ColdStartCpu.annotation())
        .and_then(|v| {
            match throttlewatch_core::units::parse_duration(&Key::ColdStartCpu.annotation(), v) {
                Ok(d) if !d.is_zero() => Some(d),
                Ok(_) | Err(_) => {
                    tracing::warn!(
                        "{}: {}={v:?}: expected a duration such as 10ms; using the default",
                        r.container_id,
                        Key::ColdStartCpu.annotation()
                    );
                    None
                }
            }
        })
        .unwrap_or(crate::coldstart::DEFAULT_CPU_TARGET);
    ColdStartSpec {
        created_unix_ns: r.created_ns,
        hook_unix_ns: r.hook_ns,
        init_pid: r.pid,
        cpu_target_ns: target.as_nanos() as u64,
    }
}

pub fn run(cfg: &Config) -> Result<i32, CliError> {
    let nofile = raise_nofile_limit();
    tracing::info!("open files: up to {nofile}");
    mkdir(&cfg.state_dir, 0o700)?;
    mkdir(&cfg.log_dir, 0o750)?;
    let Some(_lock) = lock(&cfg.state_dir)? else {
        eprintln!(
            "throttlewatch agent: another agent holds {}; exiting",
            throttlewatch_core::StateDir::new(&cfg.state_dir)
                .agent_lock()
                .display()
        );
        return Ok(0);
    };
    let h = Hierarchies::discover().map_err(|e| CliError::fail(e.to_string()))?;
    let engine = Engine::load(&probe_options(cfg)).map_err(|e| CliError::fail(e.to_string()))?;
    let state = StateDir::open(&cfg.state_dir)
        .map_err(|e| CliError::fail(format!("{}: {e}", cfg.state_dir.display())))?;
    let metrics = Arc::new(Mutex::new(Metrics::new()));
    if !cfg.metrics_addr.is_empty() {
        match crate::metrics::serve(&cfg.metrics_addr, metrics.clone()) {
            Ok(a) => eprintln!("throttlewatch agent: metrics on http://{a}/metrics"),
            Err(e) => eprintln!(
                "throttlewatch agent: metrics on {} disabled: {e}",
                cfg.metrics_addr
            ),
        }
    }
    let mut agent = Agent {
        cfg: cfg.clone(),
        h,
        engine,
        state,
        metrics,
        controls: crate::control::Controls::new(&cfg.control, &cfg.state_dir),
        deferred: Vec::new(),
        deferred_due: None,
    };
    agent.restore();
    let listener = bind(&cfg.socket)?;
    let (tx, rx) = mpsc::channel::<Job>();
    serve_socket(listener, tx);
    signals::install();
    eprintln!(
        "throttlewatch agent: {} probe, {} throttling model; socket {}",
        agent.engine.probe().kind().as_str(),
        agent.engine.probe().model().as_str(),
        cfg.socket.display()
    );
    agent.event_loop(rx);
    Ok(0)
}

impl Agent {
    fn event_loop(&mut self, rx: Receiver<Job>) {
        let mut last_tick = Instant::now();
        let mut last_snap = Instant::now();
        let snap_every = Duration::from_secs(self.cfg.snapshot_interval_s.max(1));
        let mut next_poll = Instant::now() + self.cfg.poll_interval();
        loop {
            // The kernel's events are drained every poll interval (requests
            // do not add drains); deferred registers complete when due.
            let wake = self.deferred_due.map_or(next_poll, |d| d.min(next_poll));
            match rx.recv_timeout(wake.saturating_duration_since(Instant::now())) {
                Ok((Request::Register(r), answer)) => self.register_answering(r, answer),
                Ok((req, answer)) => {
                    self.complete_deferred();
                    answer.send(self.handle(req))
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
            let now = Instant::now();
            if self.deferred_due.is_some_and(|d| d <= now) || now >= next_poll {
                // Before any drain: events of a cgroup without its session are not kept.
                self.complete_deferred();
            }
            if signals::received().is_some() {
                self.complete_deferred();
                // Containers keep running: flush and persist, never `end`;
                // controlled ones get their original bandwidth back.
                for id in self.controls.ids() {
                    let rec = self
                        .controls
                        .release(id, crate::control::Release::AgentStop);
                    self.control_records(id, rec.into_iter().collect());
                }
                self.engine.suspend();
                self.persist_all();
                eprintln!(
                    "throttlewatch agent: stopping; {} container logs will resume",
                    self.engine.sessions().count()
                );
                let _ = std::fs::remove_file(&self.cfg.socket);
                return;
            }
            if now < next_poll {
                continue;
            }
            next_poll = now + self.cfg.poll_interval();
            let due = if last_snap.elapsed() >= snap_every {
                Due::Snapshot
            } else if last_tick.elapsed() >= Duration::from_secs(1) {
                Due::Tick
            } else {
                Due::Events
            };
            let outputs = self.engine.poll(due);
            self.observe(&outputs);
            let control = self.controls.poll(&mut self.engine);
            self.observe(&control);
            if due >= Due::Tick {
                last_tick = Instant::now();
                if due == Due::Snapshot {
                    last_snap = last_tick;
                    self.sweep_logs();
                }
                self.reap_gone();
                self.persist_all();
                if let Ok(m) = self.metrics.lock() {
                    m.sweep(Instant::now());
                }
            }
        }
    }

    fn observe(&self, outputs: &[Output]) {
        if let Ok(m) = self.metrics.lock() {
            for o in outputs {
                m.observe(o);
            }
        }
    }

    fn handle(&mut self, req: Request) -> Response {
        match req {
            Request::Register(r) => self.register(r, None).unwrap_or_else(Response::err),
            Request::Unregister {
                container_id,
                scope,
                reason,
                exit_code,
            } => self.unregister(&ContainerKey::new(container_id, scope), reason, exit_code),
            Request::Status => Response {
                ok: true,
                watched: Some(
                    self.engine
                        .sessions()
                        .map(|(_, s)| s.spec.container_id().to_string())
                        .collect(),
                ),
                watch_map_entries: Some(self.engine.probe().watched_count()),
                ..Response::ok()
            },
        }
    }

    /// A register from the socket. The answer goes out as soon as the
    /// cgroup is in the kernel's watch map (its freezes are counted from
    /// there); the log, its `start` record and the state file follow
    /// [`COMPLETE_AFTER_ANSWER`] later, or before the next request, poll or
    /// stop, whichever comes first. `wait_for_log` (fail-closed) completes
    /// every deferred register, then its own, and answers after.
    fn register_answering(&mut self, r: Register, to: Answer) {
        let wait = r.wait_for_log;
        if wait {
            self.complete_deferred();
        }
        let mut t = Phases::start("register");
        let begun = match self.begin_register(r, None, &mut t) {
            Ok(Begun::Pending(p)) => p,
            Ok(Begun::Known(resp)) => return to.send(resp),
            Err(e) => return to.send(Response::err(e)),
        };
        let answer = Response {
            log_path: Some(begun.log_path.display().to_string()),
            ..Response::ok()
        };
        if !wait {
            to.send(answer);
            t.mark("answer");
            self.deferred.push(begun);
            self.deferred_due
                .get_or_insert_with(|| Instant::now() + COMPLETE_AFTER_ANSWER);
            return;
        }
        let key = begun.key.clone();
        let done = self.complete_register(begun, &mut t);
        if let Err(e) = &done {
            eprintln!("throttlewatch agent: {key}: {e}; not watched");
        }
        to.send(done.map(|_| answer).unwrap_or_else(Response::err));
        t.mark("answer");
    }

    /// The log, `start` record and state file of every register answered
    /// before them, oldest first.
    fn complete_deferred(&mut self) {
        self.deferred_due = None;
        for p in std::mem::take(&mut self.deferred) {
            let key = p.key.clone();
            let mut t = Phases::start("complete");
            if let Err(e) = self.complete_register(p, &mut t) {
                eprintln!("throttlewatch agent: {key}: {e}; not watched");
            }
        }
    }

    /// Register in one go (the socket's synchronous path and resume).
    fn register(&mut self, r: Register, resume: Option<&Persisted>) -> Result<Response, String> {
        let mut t = Phases::start("register-sync");
        match self.begin_register(r, resume, &mut t)? {
            Begun::Known(resp) => Ok(resp),
            Begun::Pending(p) => {
                let log_path = p.log_path.display().to_string();
                self.complete_register(p, &mut t)?;
                Ok(Response {
                    log_path: Some(log_path),
                    ..Response::ok()
                })
            }
        }
    }

    /// Validate, take the baselines and put the cgroup in the watch map.
    fn begin_register(
        &mut self,
        r: Register,
        resume: Option<&Persisted>,
        t: &mut Phases,
    ) -> Result<Begun, String> {
        if r.container_id.is_empty() || r.container_id.len() > 1024 || r.container_id.contains('\0')
        {
            return Err(format!(
                "container_id {:?}: expected 1 to 1024 bytes without NUL",
                r.container_id
            ));
        }
        let key = r.key();
        let known = self
            .engine
            .find(&key)
            .and_then(|id| self.engine.session(id))
            .map(|s| &s.spec.log_path)
            .or_else(|| {
                self.deferred
                    .iter()
                    .find(|p| p.key == key)
                    .map(|p| &p.log_path)
            });
        if let Some(log_path) = known {
            return Ok(Begun::Known(Response {
                log_path: Some(log_path.display().to_string()),
                ..Response::ok()
            }));
        }
        let g = CpuCgroup::open(&self.h, &r.cgroup_path)
            .map_err(|e| format!("cgroup_path {:?}: {e}", r.cgroup_path))?;
        let labels = ContainerLabels::new(&r.container_id, &r.container_name, &r.annotations)
            .with_qos_summary(r.qos.as_ref())
            .with_scope(r.scope.as_ref());
        if let Ok(m) = self.metrics.lock() {
            m.keep(&labels);
        }
        // (scope, id): `web` of two runc roots or namespaces has two logs.
        let log_path: PathBuf = self.cfg.log_dir.join(key.log_file_name());
        let wants_control = crate::control::requested(&r);
        let spec = SessionSpec {
            labels: Arc::new(labels),
            pid: r.pid,
            qos: r.qos.clone(),
            threshold_ns: r.threshold_ns.unwrap_or_else(|| self.cfg.threshold_ns()),
            log_path: log_path.clone(),
            resume: resume.map(|p| p.baseline.clone()),
            cold_start: Some(cold_start_spec(&r)),
            register: Some(r),
            log: crate::budget::LogLimits::from_config(&self.cfg),
        };
        let control_cgroup = g.clone();
        t.mark("cgroup");
        let watching = self.engine.watching();
        let max = self.cfg.max_containers;
        let prepared = self.engine.begin_watch(spec, g, t).map_err(|e| {
            // The kernel maps are sized from max_containers (E2BIG when full).
            if watching >= max as usize {
                format!("{e}: {watching} containers are watched, max_containers = {max} (the kernel maps are sized from it)")
            } else {
                e.to_string()
            }
        })?;
        Ok(Begun::Pending(Box::new(PendingRegister {
            prepared,
            key,
            log_path,
            control_cgroup,
            wants_control,
        })))
    }

    /// The log and its `start` record, the controller, the state file.
    fn complete_register(
        &mut self,
        p: Box<PendingRegister>,
        t: &mut Phases,
    ) -> Result<u64, String> {
        let id = self
            .engine
            .complete_watch(p.prepared)
            .map_err(|e| e.to_string())?;
        t.mark("log");
        let recs = self.controls.attach(
            id,
            &p.key,
            &p.control_cgroup,
            p.wants_control,
            crate::clock::Clock::monotonic_ns(),
        );
        self.control_records(id, recs);
        t.mark("control");
        self.persist(id);
        t.mark("state");
        self.count_watched();
        Ok(id)
    }

    fn unregister(
        &mut self,
        key: &ContainerKey,
        reason: EndReason,
        exit_code: Option<i32>,
    ) -> Response {
        let Some(id) = self.engine.find(key) else {
            self.state.remove(key);
            return Response::not_watched(key);
        };
        let log = self.end(id, reason, exit_code);
        Response {
            log_path: log.map(|p| p.display().to_string()),
            ..Response::ok()
        }
    }

    /// End a session: `end` written, state and metrics forgotten. Returns its log.
    fn end(&mut self, id: u64, reason: EndReason, exit_code: Option<i32>) -> Option<PathBuf> {
        let rec = self
            .controls
            .release(id, crate::control::Release::ContainerEnd);
        self.control_records(id, rec.into_iter().collect());
        let f = self.engine.finish(id, reason, exit_code)?;
        self.observe(&f.outputs);
        self.state.remove(&f.spec.key());
        if let Ok(m) = self.metrics.lock() {
            let grace = Duration::from_secs(self.cfg.metrics_grace_s);
            m.retire(&f.spec.labels, grace, Instant::now());
        }
        self.count_watched();
        Some(f.spec.log_path)
    }

    /// Keep the log directory within `log_dir_max_bytes` (closed logs go,
    /// oldest first; said once per sweep) and rotate agent.log.
    fn sweep_logs(&self) {
        let dir = &self.cfg.log_dir;
        if let Err(e) = crate::logdir::rotate_agent_log(dir, self.cfg.log_rotation()) {
            eprintln!("throttlewatch agent: rotating agent.log: {e}");
        }
        let open: std::collections::HashSet<std::ffi::OsString> = self
            .engine
            .sessions()
            .filter_map(|(_, s)| s.spec.log_path.file_name().map(|n| n.to_owned()))
            .collect();
        let max = self.cfg.log_dir_max_bytes;
        match crate::logdir::sweep(dir, max, &open, std::time::SystemTime::now()) {
            Ok(Some(done)) => eprintln!("{}", done.describe(dir, max)),
            Ok(None) => {}
            Err(e) => eprintln!("throttlewatch agent: {}: sweeping: {e}", dir.display()),
        }
    }

    /// `control` records into the container's log and the metrics.
    fn control_records(&mut self, id: u64, recs: Vec<throttlewatch_core::logfmt::Control>) {
        let Some(s) = self.engine.session_mut(id) else {
            return;
        };
        let mut out = vec![];
        for rec in recs {
            s.write_control(rec.clone());
            out.push(Output::Control {
                container: s.spec.labels.clone(),
                record: rec,
            });
        }
        self.observe(&out);
    }

    fn count_watched(&self) {
        if let Ok(m) = self.metrics.lock() {
            m.watched.set(self.engine.sessions().count() as i64);
        }
    }

    /// Containers whose cgroup vanished without a poststop (killed runtime).
    fn reap_gone(&mut self) {
        let gone: Vec<u64> = self
            .engine
            .sessions()
            .filter(|(_, s)| !s.cgroup.exists())
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.end(id, EndReason::CgroupRemoved, None);
        }
    }

    fn persist(&self, id: u64) {
        let Some(s) = self.engine.session(id) else {
            return;
        };
        let Some(r) = &s.spec.register else { return };
        let p = Persisted {
            register: r.clone(),
            log_path: s.spec.log_path.clone(),
            cgroup_id: id,
            baseline: s.baseline(),
        };
        if let Err(e) = self.state.save(&p) {
            tracing::warn!("persisting {}: {e}", r.key());
        }
    }

    fn persist_all(&self) {
        for (id, _) in self.engine.sessions() {
            self.persist(*id);
        }
    }

    /// Resume the sessions of a previous agent; end those whose container is gone.
    fn restore(&mut self) {
        for p in self.state.load_all() {
            let cid = p.register.key();
            let alive = CpuCgroup::open(&self.h, &p.register.cgroup_path)
                .ok()
                .and_then(|g| g.id().ok())
                == Some(p.cgroup_id);
            if alive {
                if let Err(e) = self.register(p.register.clone(), Some(&p)) {
                    eprintln!("throttlewatch agent: resuming {cid}: {e}");
                }
                continue;
            }
            // Ended while no agent ran: close the log with what is known.
            if let Ok(mut w) = LogWriter::open(&p.log_path, true) {
                let _ = w.write(Record::End(p.baseline.ended_while_agent_down()));
                let _ = w.finish();
            }
            self.controls.forget(&cid);
            self.state.remove(&cid);
        }
    }
}
