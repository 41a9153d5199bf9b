//! The register path of the agent: validate, take baselines and
//! put the cgroup in the kernel's watch map, answer, then write the log, its
//! `start` record and the state file ([`COMPLETE_AFTER_ANSWER`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use throttlewatch_cgroup::CpuCgroup;
use throttlewatch_core::metrics_detail::MetricsDetail;
use throttlewatch_core::protocol::{Register, Response};
use throttlewatch_qos::Key;

use super::in_flight::RegisterInFlight;
use super::Agent;
use crate::coldstart::ColdStartSpec;
use crate::labels::ContainerLabels;
use crate::socket::Responder;
use crate::spec::SessionSpec;
use crate::state::Persisted;
use throttlewatch_core::timing::Phases;

/// How long after its answer a register's log, `start` record and state
/// file are written (`Agent::register_answering`); sooner when anything
/// else needs the sessions (a request, the next poll, a signal). Zero: as
/// soon as the answer is out: with a delay the log may not exist yet when
/// `runc run -d` returns, and readers that open it at once (a log shipper,
/// `throttlewatch report ID`) find no file (bench/README.md).
const COMPLETE_AFTER_ANSWER: Duration = Duration::ZERO;

/// Why a container could not be registered; the text is the answer's error.
#[derive(Debug, thiserror::Error)]
pub(super) enum RegisterRefused {
    #[error("container_id {0:?}: expected 1 to 1024 bytes without NUL")]
    ContainerId(String),
    #[error("cgroup_path {path:?}: {source}")]
    Cgroup {
        path: String,
        source: throttlewatch_cgroup::CgroupError,
    },
    /// The cgroup could not be put in the kernel's watch map or its
    /// baselines read.
    #[error(transparent)]
    Watch(anyhow::Error),
    /// As [`RegisterRefused::Watch`], when `max_containers` containers are
    /// already watched (the kernel maps are sized from it).
    #[error("{cause}: {watching} containers are watched, max_containers = {max} (the kernel maps are sized from it)")]
    Full {
        cause: anyhow::Error,
        watching: usize,
        max: u32,
    },
    /// The log or its `start` record could not be written.
    #[error(transparent)]
    Log(anyhow::Error),
}

pub(super) enum Begun {
    /// Already watched: the answer.
    Known(Response),
    InFlight(Box<RegisterInFlight>),
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

/// The container's series: its `throttlewatch.io/metrics-detail`
/// annotation where the node's `allowed_keys` lets containers use it, else
/// the node's `metrics_detail`. A bad value is said and the node's level kept.
fn metrics_detail(r: &Register, cfg: &throttlewatch_core::config::Config) -> MetricsDetail {
    let key = Key::MetricsDetail.annotation();
    let Some(v) = r.annotations.get(&key) else {
        return cfg.metrics_detail;
    };
    if !throttlewatch_qos::Policy::from(&cfg.qos).allows(Key::MetricsDetail) {
        tracing::warn!(
            "{}: {key}={v:?}: not in the node's qos.allowed_keys; metrics_detail = {:?} kept",
            r.container_id,
            cfg.metrics_detail.name()
        );
        return cfg.metrics_detail;
    }
    MetricsDetail::parse(v).unwrap_or_else(|| {
        tracing::warn!(
            "{}: {key}={:?}: {}; metrics_detail = {:?} kept",
            r.container_id,
            throttlewatch_core::printable::printable(v)
                .chars()
                .take(64)
                .collect::<String>(),
            MetricsDetail::ACCEPTED,
            cfg.metrics_detail.name()
        );
        cfg.metrics_detail
    })
}

impl Agent {
    /// A register from the socket. The answer goes out as soon as the
    /// cgroup is in the kernel's watch map (its freezes are counted from
    /// there); the log, its `start` record and the state file follow
    /// [`COMPLETE_AFTER_ANSWER`] later, or before the next request, poll or
    /// stop, whichever comes first. `wait_for_log` (fail-closed) completes
    /// every deferred register, then its own, and answers after.
    pub(super) fn register_answering(&mut self, r: Register, to: Responder) {
        let wait = r.wait_for_log;
        if wait {
            self.complete_deferred();
        }
        let mut t = Phases::start("throttlewatch-agent register");
        let key = r.key();
        // Journaled before an answer that goes out ahead of the log (adopt.rs).
        let journal = if wait {
            None
        } else {
            serde_json::to_vec(&r).ok()
        };
        let begun = match self.begin_register(r, None, &mut t) {
            Ok(Begun::InFlight(p)) => p,
            Ok(Begun::Known(resp)) => {
                self.taken(&key);
                return to.send(resp);
            }
            Err(e) => {
                // The pending record stays: `start` finds it and the mark.
                self.mark_unwatched(&key);
                return to.send(Response::err(e));
            }
        };
        // Watched from here: a `start` waiting on it may go on.
        self.taken(&key);
        let answer = Response {
            log_path: Some(begun.log_path.display().to_string()),
            ..Response::ok()
        };
        if !wait {
            if let Some(bytes) = &journal {
                super::adopt::journal(&self.state_dir(), &key, bytes);
            }
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
            self.mark_unwatched(&key);
        }
        to.send(done.map(|_| answer).unwrap_or_else(Response::err));
        t.mark("answer");
    }

    /// A register refused (or whose log could not be opened): the empty
    /// marker `unwatched/<key>` in the state directory, as the hook writes
    /// when its register fails. Its answer may have gone to a client that
    /// did not wait (the wrapper's `create`, `throttlewatch_lifecycle::pending`):
    /// the wrapper's `start` sees the marker instead of waiting out its
    /// timeout, and poststop skips the unregister.
    fn mark_unwatched(&self, key: &throttlewatch_core::ContainerKey) {
        let state = throttlewatch_core::StateDir::new(&self.cfg.state_dir);
        if let Err(e) = state.mark_unwatched(key) {
            eprintln!(
                "throttlewatch agent: {key}: cannot mark it unwatched in {}: {e}",
                state.unwatched_dir().display()
            );
        }
    }

    /// The register of `key` is taken: its `pending/<key>` record, if the
    /// client left one, is removed (the agent's transition of
    /// `throttlewatch_lifecycle::create_marks`).
    pub(super) fn state_dir(&self) -> throttlewatch_core::StateDir {
        throttlewatch_core::StateDir::new(&self.cfg.state_dir)
    }

    fn taken(&self, key: &throttlewatch_core::ContainerKey) {
        throttlewatch_core::StateDir::new(&self.cfg.state_dir).clear_pending(key);
    }

    /// The log, `start` record and state file of every register answered
    /// before them, oldest first.
    pub(super) fn complete_deferred(&mut self) {
        self.deferred_due = None;
        for p in std::mem::take(&mut self.deferred) {
            let key = p.key.clone();
            let mut t = Phases::start("throttlewatch-agent complete");
            if let Err(e) = self.complete_register(p, &mut t) {
                eprintln!("throttlewatch agent: {key}: {e}; not watched");
                self.mark_unwatched(&key);
            }
            super::adopt::journal_done(&self.state_dir(), &key);
        }
    }

    /// Register in one go (the socket's synchronous path and resume).
    pub(super) fn register(
        &mut self,
        r: Register,
        resume: Option<&Persisted>,
    ) -> Result<Response, RegisterRefused> {
        let mut t = Phases::start("throttlewatch-agent register-sync");
        match self.begin_register(r, resume, &mut t)? {
            Begun::Known(resp) => Ok(resp),
            Begun::InFlight(p) => {
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
    ) -> Result<Begun, RegisterRefused> {
        if r.container_id.is_empty() || r.container_id.len() > 1024 || r.container_id.contains('\0')
        {
            return Err(RegisterRefused::ContainerId(r.container_id));
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
        let g =
            CpuCgroup::open(&self.h, &r.cgroup_path).map_err(|source| RegisterRefused::Cgroup {
                path: r.cgroup_path.clone(),
                source,
            })?;
        let labels = ContainerLabels::new(&r.container_id, &r.container_name, &r.annotations)
            .with_qos_summary(r.qos.as_ref())
            .with_scope(r.scope.as_ref());
        let detail = metrics_detail(&r, &self.cfg);
        if let Ok(m) = self.metrics.lock() {
            m.keep(&labels);
            m.set_detail(&labels, detail);
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
        let draft = self.engine.begin_watch(spec, g, t).map_err(|cause| {
            // The kernel maps are sized from max_containers (E2BIG when full).
            if watching >= max as usize {
                RegisterRefused::Full {
                    cause,
                    watching,
                    max,
                }
            } else {
                RegisterRefused::Watch(cause)
            }
        })?;
        Ok(Begun::InFlight(Box::new(RegisterInFlight {
            draft,
            key,
            log_path,
            control_cgroup,
            wants_control,
        })))
    }

    /// The log and its `start` record, the controller, the state file.
    fn complete_register(
        &mut self,
        p: Box<RegisterInFlight>,
        t: &mut Phases,
    ) -> Result<u64, RegisterRefused> {
        let id = self
            .engine
            .complete_watch(p.draft)
            .map_err(RegisterRefused::Log)?;
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
        self.arm_exit(id);
        self.persist(id);
        t.mark("state");
        self.count_watched();
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::RegisterRefused;

    #[test]
    fn register_errors_read_as_the_answer_words_them() {
        assert_eq!(
            RegisterRefused::ContainerId("a\0b".into()).to_string(),
            r#"container_id "a\0b": expected 1 to 1024 bytes without NUL"#
        );
        let full = RegisterRefused::Full {
            cause: anyhow::anyhow!("watch map: E2BIG").context("watch"),
            watching: 3,
            max: 3,
        };
        assert_eq!(
            full.to_string(),
            "watch: 3 containers are watched, max_containers = 3 (the kernel maps are sized from it)"
        );
        let log = RegisterRefused::Log(anyhow::anyhow!("disk full").context("/x.log"));
        assert_eq!(log.to_string(), "/x.log", "the outer message only");
    }
}
