//! `throttlewatch agent`: the node daemon. One probe for the node, one
//! session per registered container, a root-only unix socket for the hook,
//! Prometheus metrics, and state that survives a restart.

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use throttlewatch_cgroup::{CpuCgroup, Hierarchies};
use throttlewatch_core::config::Config;
use throttlewatch_core::logfmt::{LogWriter, Record};
use throttlewatch_core::protocol::{self, Request, Response};
use throttlewatch_core::ContainerKey;
use throttlewatch_core::EndReason;

use crate::engine::{probe_options, Engine};
use crate::metrics::Metrics;
use crate::output::Output;
use crate::reading::Due;
use crate::socket::{bind, raise_nofile_limit, Server};
use crate::state::{ContainersDir, Persisted};
use crate::{signals, CliError};

mod adopt;
pub(crate) mod advice;
mod dirs;
mod ended_at_exit;
mod exit_end;
mod exits;
pub(crate) mod exported_advice;
mod in_flight;
pub(crate) mod logdir;
mod metric_labels;
pub(crate) mod metrics;
pub(crate) mod metrics_http;
mod register;
pub(crate) mod socket;
pub(crate) mod state;
pub(crate) use dirs::mkdir;
use in_flight::RegisterInFlight;

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

struct Agent {
    cfg: Config,
    h: Hierarchies,
    /// Every watched container is a session of the engine.
    engine: Engine,
    state: ContainersDir,
    metrics: Arc<Mutex<Metrics>>,
    /// The dynamic CPU controller's containers (docs/control.md).
    controls: crate::control::Controls,
    /// Registers answered whose log, `start` record and state file are
    /// still to be written, oldest first, and when they are due.
    #[allow(clippy::vec_box)] // the Box that `Begun::InFlight` holds, not moved out
    deferred: Vec<Box<RegisterInFlight>>,
    deferred_due: Option<Instant>,
    /// Reads throttled containers' logs for their advice (advice.rs).
    advisor: advice::Advisor,
    /// Hook and wrapper containers' inits, to end their logs at exit.
    exits: exits::ExitWatch,
    ended_at_exit: ended_at_exit::EndedAtExit,
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
    let engine = Engine::load(
        &probe_options(cfg),
        crate::gpu::GpuSampler::open(&cfg.nvml_library),
    )
    .map_err(|e| CliError::fail(e.to_string()))?;
    let state = ContainersDir::open(&cfg.state_dir)
        .map_err(|e| CliError::fail(format!("{}: {e}", cfg.state_dir.display())))?;
    let metrics = Arc::new(Mutex::new(Metrics::with_detail(cfg.metrics_detail)));
    if !cfg.metrics_addr.is_empty() {
        match metrics_http::serve(&cfg.metrics_addr, metrics.clone()) {
            Ok(a) => eprintln!("throttlewatch agent: metrics on http://{a}/metrics"),
            Err(e) => eprintln!(
                "throttlewatch agent: metrics on {} disabled: {e}",
                cfg.metrics_addr
            ),
        }
    }
    let advisor = advice::Advisor::start(metrics.clone());
    let mut agent = Agent {
        advisor,
        cfg: cfg.clone(),
        h,
        engine,
        state,
        metrics,
        controls: crate::control::Controls::new(&cfg.control, &cfg.state_dir),
        deferred: Vec::new(),
        deferred_due: None,
        exits: exits::ExitWatch::new(),
        ended_at_exit: Default::default(),
    };
    agent.restore();
    let server = Server::new(bind(&cfg.socket)?)
        .map_err(|e| CliError::fail(format!("{}: {e}", cfg.socket.display())))?;
    // Once bound: a front end that found no listener before has written
    // its record by the first snapshot's look (adopt.rs); requests wait.
    agent.adopt();
    signals::install();
    eprintln!(
        "throttlewatch agent: {} probe, {} throttling model; socket {}",
        agent.engine.probe().kind().as_str(),
        agent.engine.probe().model().as_str(),
        cfg.socket.display()
    );
    // Once per agent: where GPU utilisation comes from, or why it does not.
    eprintln!("{}", agent.engine.gpu_status());
    agent.event_loop(server);
    Ok(0)
}

impl Agent {
    fn event_loop(&mut self, mut server: Server) {
        let mut last_tick = Instant::now();
        let mut last_snap = Instant::now();
        let snap_every = Duration::from_secs(self.cfg.snapshot_interval_s.max(1));
        let mut next_poll = Instant::now() + self.cfg.poll_interval();
        server.also_wait_for(self.exits.fd());
        loop {
            // The kernel's events are drained every poll interval (requests
            // do not add drains); deferred registers complete when due.
            let wake = self.deferred_due.map_or(next_poll, |d| d.min(next_poll));
            let jobs = server.wait(wake.saturating_duration_since(Instant::now()));
            // Exits first: a delete that came after one finds it ended.
            if server.take_extra_ready() {
                self.exits.collect();
            }
            if self.exits.take_news() {
                self.end_exited();
            }
            for (req, answer) in jobs {
                match req {
                    Request::Register(r) => self.register_answering(r, answer),
                    req => {
                        self.complete_deferred();
                        answer.send(self.handle(req))
                    }
                }
            }
            let now = Instant::now();
            if self.deferred_due.is_some_and(|d| d <= now) || now >= next_poll {
                // Before any drain: events of a cgroup without its session are not kept.
                self.complete_deferred();
            }
            if signals::received().is_some() {
                self.stop();
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
            // After the drain: an exited container's last events are in.
            self.end_exited();
            if due >= Due::Tick {
                last_tick = Instant::now();
                if due == Due::Snapshot {
                    last_snap = last_tick;
                    self.adopt_unsent();
                    self.sweep_logs();
                    self.advise();
                }
                self.reap_gone();
                self.persist_all();
                if let Ok(m) = self.metrics.lock() {
                    m.sweep(Instant::now());
                }
            }
        }
    }

    /// A signal: containers keep running, so flush and persist, never
    /// `end`; controlled ones get their original bandwidth back.
    fn stop(&mut self) {
        self.complete_deferred();
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
    }

    fn observe(&mut self, outputs: &[Output]) {
        if let Ok(m) = self.metrics.lock() {
            for o in outputs {
                m.observe(o);
            }
        }
        for o in outputs {
            match o {
                Output::Counters {
                    container, kernel, ..
                } if kernel.throttled_ns > 0 => self.advisor.news(container),
                Output::Runq {
                    container, record, ..
                } if record.preempted_by_other + record.preempted_by_host > 0 => {
                    self.advisor.news(container)
                }
                _ => {}
            }
        }
    }

    /// Containers with news get their log read for advice (at most once a
    /// minute each; advice.rs).
    fn advise(&mut self) {
        for (_, s) in self.engine.sessions() {
            self.advisor.due(&s.spec.labels, &s.spec.log_path, false);
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

    fn unregister(
        &mut self,
        key: &ContainerKey,
        reason: EndReason,
        exit_code: Option<i32>,
    ) -> Response {
        // One that ended at its exit: its log is closed already.
        let log = match self.engine.find(key) {
            Some(id) => match self.exits.take_exited(id) {
                Some(e) => self.end(id, e.reason, exit_code.or(e.exit_code)),
                None => self.end(id, reason, exit_code),
            },
            None => {
                self.state.remove(key);
                let Some(log) = self.ended_at_exit.take(key, &self.cfg.log_dir) else {
                    return Response::not_watched(key);
                };
                Some(log)
            }
        };
        Response {
            log_path: log.map(|p| p.display().to_string()),
            ..Response::ok()
        }
    }

    /// End a session: `end` written, state and metrics forgotten. Returns its log.
    fn end(&mut self, id: u64, reason: EndReason, exit_code: Option<i32>) -> Option<PathBuf> {
        self.exits.disarm(id);
        let rec = self
            .controls
            .release(id, crate::control::Release::ContainerEnd);
        self.control_records(id, rec.into_iter().collect());
        let f = self.engine.finish(id, reason, exit_code)?;
        self.observe(&f.outputs);
        self.advisor.due(&f.spec.labels, &f.spec.log_path, true);
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

    /// The container's state file, rewritten only when its figures moved.
    fn persist(&self, id: u64) {
        let Some(s) = self.engine.session(id) else {
            return;
        };
        let Some(r) = &s.spec.register else { return };
        let baseline = s.baseline();
        if self.state.holds(&r.key(), &baseline) {
            return;
        }
        let p = Persisted {
            register: r.clone(),
            log_path: s.spec.log_path.clone(),
            cgroup_id: id,
            baseline,
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
