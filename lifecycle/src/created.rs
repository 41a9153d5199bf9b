//! The work done once a container's cgroup exists and before its entrypoint
//! runs: the annotations' QoS into the cgroup, the burst record, then the
//! register with the agent. The hook does it at `createRuntime` (runc runs
//! it); the wrapper does it itself after the low-level runtime's `create`
//! returns (no hook process, no runc hook machinery on the start path).

use std::path::{Path, PathBuf};

use anyhow::Context;
use throttlewatch_cgroup::proc::cpu_cgroup_of_pid;
use throttlewatch_cgroup::{CpuCgroup, Hierarchies};
use throttlewatch_core::config::{Config, FailMode};
use throttlewatch_core::logfmt::now_unix_ns;
use throttlewatch_core::protocol::Register;

use crate::agent_client::EarlyConnection;
use crate::burst_record::BurstRecord;
use crate::create_marks::CreateMarks;
use crate::qos::{self, QosOutcome, Requested, Target};
use crate::report::Reporter;
use crate::timing::Phases;
use crate::{agent_start, burst_record, pending, AgentClient, BundleSpec, ContainerKey, StateDir};

/// A container created and not yet started.
pub struct Created<'a> {
    pub key: &'a ContainerKey,
    /// Its bundle directory, as the runtime was given it.
    pub bundle: &'a Path,
    /// Its init process (runc's `init`, waiting for `start`).
    pub pid: u32,
    /// Its config.json, as read (and edited) once.
    pub spec: &'a BundleSpec,
    /// When the runtime was asked to create it (the front end's own clock).
    pub created_ns: Option<u64>,
    /// The front end reports the exit, with its code, itself
    /// ([`throttlewatch_core::protocol::Register::exit_reported`]).
    pub exit_reported: bool,
}

/// What can be done before the cgroup exists: the request parsed from the
/// spec, the cgroup hierarchies found. The wrapper does it while the
/// low-level runtime's `create` runs. None for a pod sandbox (the pause
/// container: no workload, no QoS, no log).
pub struct Prepared {
    asked: Requested,
    hierarchies: anyhow::Result<Hierarchies>,
}

pub fn prepare(cfg: &Config, spec: &BundleSpec) -> Option<Prepared> {
    if spec.is_pod_sandbox() {
        return None;
    }
    Some(Prepared {
        asked: Requested::parse(cfg, spec),
        hierarchies: Hierarchies::discover().context("cgroup hierarchies"),
    })
}

/// Whether the register's answer is awaited before returning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Wait for it: the container is watched when this returns.
    Now,
    /// Fail-open only (fail-closed always waits): send it, record it as
    /// [`crate::pending`], return; the wrapper's `start` waits for the
    /// watch before the entrypoint runs.
    AtStart,
}

/// [`prepare`], then [`on_prepared`] waiting for the answer: QoS into the
/// cgroup, then register.
pub fn on_created(
    cfg: &Config,
    config_path: Option<&Path>,
    rep: &mut Reporter,
    c: Created,
    t: &mut Phases,
) -> anyhow::Result<()> {
    match prepare(cfg, c.spec) {
        Some(p) => on_prepared(cfg, config_path, rep, c, p, Answer::Now, t),
        None => Ok(()),
    }
}

/// QoS into the cgroup, then register. `config_path` is handed to an agent
/// this starts (`start_agent`). Errors that do not stop the rest are
/// reported to `rep` (fail-closed turns any into a refusal); the error
/// returned is the one that stopped it.
pub fn on_prepared(
    cfg: &Config,
    config_path: Option<&Path>,
    rep: &mut Reporter,
    c: Created,
    p: Prepared,
    answer: Answer,
    t: &mut Phases,
) -> anyhow::Result<()> {
    let Prepared { asked, hierarchies } = p;
    // Connect now: the agent accepts while the cgroup is written below.
    let early = (asked.req.watch != Some(false)).then(|| AgentClient::of(cfg).connect_early());
    t.mark("spec");
    let h = hierarchies?;
    // From the kernel, never from the (container-controlled) spec.
    let rel = cpu_cgroup_of_pid(Path::new("/proc"), c.pid, h.mode)?;
    let cg = CpuCgroup::open(&h, &rel)?;
    t.mark("cgroup");
    let target = Target {
        key: c.key,
        pid: c.pid,
        hierarchies: &h,
        cgroup: &cg,
    };
    let mut q = qos::apply(cfg, c.spec, asked, target);
    t.mark("qos");
    for r in &q.refused {
        rep.error(&r.to_string());
    }
    // The burst record is for `update`, not for the start: written once
    // the register is out (the agent works on it meanwhile).
    let burst = q.burst.take();
    send_register(cfg, config_path, rep, &c, rel.clone(), q, answer, early, t);
    record_burst(cfg, rep, c.key, burst.as_ref());
    if let Some(b) = &burst {
        share_with_ancestors(cfg, rep, &h, &rel, b.applied_us);
    }
    t.mark("burst_record");
    Ok(())
}

/// After the QoS: the register (or the `unwatched` mark when the
/// container asked not to be watched). Failures are reported and leave the
/// container unwatched; none fails the create.
#[allow(clippy::too_many_arguments)]
fn send_register(
    cfg: &Config,
    config_path: Option<&Path>,
    rep: &mut Reporter,
    c: &Created,
    rel: String,
    q: QosOutcome,
    answer: Answer,
    early: Option<EarlyConnection>,
    t: &mut Phases,
) {
    if q.watch == Some(false) {
        mark_unwatched(cfg, rep, c.key);
        return; // throttlewatch.io/watch=false: QoS only, no log
    }
    let mut reg = registration(c, rel, q);
    // Fail-closed: a log the agent cannot open refuses the container, so
    // wait for it; fail-open: the answer comes once the cgroup is watched.
    reg.wait_for_log = cfg.fail_mode == FailMode::Closed;
    let mut early = early;
    // Whether `pending/<key>` holds the register while it is sent again
    // below: `start` (maybe already running: the wrapper's helper) waits on it.
    let mut recorded = None;
    if answer == Answer::AtStart && !reg.wait_for_log {
        let marks = CreateMarks::new(&cfg.state_dir, c.key);
        marks.watched();
        // Recorded before the send: the agent removes it once watched.
        let record = pending::PendingRegister {
            socket: pending::socket_id(&cfg.socket),
            register: reg.clone(),
        };
        if let Err(e) = marks.sent(&record) {
            rep.warn(&format!(
                "cannot record the register of {} in {}: {e}; waiting for the answer",
                c.key,
                marks.state().pending_dir().display()
            ));
        } else {
            match AgentClient::of(cfg).register_unanswered(&reg, early) {
                Ok(()) => {
                    t.mark("register_sent");
                    return;
                }
                // No agent: the waiting path starts one (start_agent) or says
                // why not; the record stays until it is done.
                Err(e) if e.is_no_listener() => {
                    recorded = Some(marks);
                    early = None;
                }
                Err(e) => {
                    marks.taken();
                    rep.error(&format!("{e}; cannot register container {:?}", c.key.id));
                    mark_unwatched(cfg, rep, c.key);
                    return;
                }
            }
        }
    }
    let done = agent_start::register(cfg, config_path, &reg, early);
    let marks = CreateMarks::new(&cfg.state_dir, c.key);
    match done {
        Ok(_) => {
            if recorded.is_some() {
                marks.taken(); // the agent took it
            }
            marks.watched()
        }
        Err(e) if e.is_not_started() => pending::keep_for_agent(cfg, rep, c.key, &reg, &e),
        Err(e) => {
            if recorded.is_some() {
                marks.taken();
            }
            rep.error(&e.to_string());
            mark_unwatched(cfg, rep, c.key);
        }
    }
    t.mark("register");
}

fn mark_unwatched(cfg: &Config, rep: &mut Reporter, key: &ContainerKey) {
    if let Err(e) = CreateMarks::new(&cfg.state_dir, key).refused() {
        rep.warn(&format!(
            "cannot mark {key} unwatched in {}: {e} (poststop will ask the agent)",
            cfg.state_dir.display()
        ));
    }
}

/// The container's burst on the ancestors with a quota too (a pod cgroup
/// under kubelet): [`crate::pod_burst`]. Before the entrypoint runs.
pub fn share_with_ancestors(
    cfg: &Config,
    rep: &mut Reporter,
    h: &Hierarchies,
    rel: &str,
    applied_us: u64,
) {
    let s = crate::pod_burst::share(&StateDir::new(&cfg.state_dir), h, rel, applied_us);
    for w in &s.warnings {
        rep.warn(w);
    }
}

/// The burst record for `update`, or none when no burst was written.
fn record_burst(cfg: &Config, rep: &mut Reporter, key: &ContainerKey, burst: Option<&BurstRecord>) {
    let state = StateDir::new(&cfg.state_dir);
    let Some(b) = burst else {
        burst_record::remove(&state, key);
        return;
    };
    if let Err(e) = burst_record::save(&state, b) {
        rep.error(&format!(
            "cannot record the burst of {key} in {}: {e} (`update` will not restore it)",
            cfg.state_dir.display()
        ));
    }
}

fn registration(c: &Created, rel: String, q: QosOutcome) -> Register {
    Register {
        container_id: c.key.id.clone(),
        scope: c.key.scope.clone(),
        container_name: c.spec.container_name(),
        pid: Some(c.pid),
        cgroup_path: rel,
        annotations: c.spec.annotations.clone(),
        bundle: c.bundle.to_string_lossy().into_owned(),
        created_ns: c.created_ns,
        hook_ns: Some(now_unix_ns()),
        threshold_ns: q.threshold_ns,
        qos: Some(q.summary),
        wait_for_log: false,
        exit_reported: c.exit_reported,
    }
}

/// A `--pid-file` that gives no pid: the file, and why.
#[derive(Debug, thiserror::Error)]
pub enum PidFileError {
    #[error("pid file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Not a positive decimal: the beginning of what was there.
    #[error("pid file {}: expected a process id, got {got:?}", path.display())]
    NotAPid { path: PathBuf, got: String },
}

/// Read the pid the runtime wrote with `--pid-file` (a decimal, maybe with
/// a newline); the error names the file and what was there.
pub fn read_pid_file(path: &Path) -> Result<u32, PidFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| PidFileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    text.trim()
        .parse::<u32>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| PidFileError::NotAPid {
            path: path.to_path_buf(),
            got: text.chars().take(40).collect(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_file_is_a_positive_decimal() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("pid");
        std::fs::write(&p, "1234").unwrap();
        assert_eq!(read_pid_file(&p).unwrap(), 1234);
        std::fs::write(&p, "99\n").unwrap();
        assert_eq!(read_pid_file(&p).unwrap(), 99);
        std::fs::write(&p, "12x").unwrap();
        assert_eq!(
            read_pid_file(&p).unwrap_err().to_string(),
            format!(
                "pid file {}: expected a process id, got \"12x\"",
                p.display()
            )
        );
        for bad in ["", "0", "-3", "12x"] {
            std::fs::write(&p, bad).unwrap();
            let e = read_pid_file(&p).unwrap_err().to_string();
            assert!(
                e.contains("expected a process id") && e.contains("pid"),
                "{e}"
            );
        }
        let e = read_pid_file(&d.path().join("none"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("none"), "{e}");
    }
}
