//! What the hook does at each stage.

use std::io::Read;
use std::path::Path;

use anyhow::{anyhow, Context};
use throttlewatch_cgroup::proc::cpu_cgroup_of_pid;
use throttlewatch_cgroup::{CpuCgroup, Hierarchies};
use throttlewatch_core::config::{Config, FailMode};
use throttlewatch_core::logfmt::now_unix_ns;
use throttlewatch_core::protocol::Register;
use throttlewatch_lifecycle::qos::{self, QosOutcome, Requested, Target};
use throttlewatch_lifecycle::timing::Phases;
use throttlewatch_lifecycle::{
    agent_start, burst_record, scope, unwatched, AgentClient, AgentError, BundleSpec, ContainerKey,
    EndReason, OciState, StateDir,
};
use throttlewatch_qos::{ExclusiveAllocator, Key};

use crate::cli::HookArgs;
use crate::report::Reporter;

pub fn run_stage(
    args: &HookArgs,
    cfg: &Config,
    rep: &mut Reporter,
    stdin: impl Read,
    t: &mut Phases,
) -> anyhow::Result<()> {
    let state = OciState::read(stdin).map_err(|e| anyhow!(e))?;
    rep.set_container(&state.id);
    // The id space: the --root of the runtime running this hook.
    let key = scope::hook_key(&state.id);
    t.mark("state");
    if args.stage.starts_container() {
        on_create(args, cfg, rep, &state, &key, t)
    } else {
        on_poststop(cfg, rep, &key);
        Ok(())
    }
}

/// createRuntime / prestart: QoS into the cgroup, then register.
fn on_create(
    args: &HookArgs,
    cfg: &Config,
    rep: &mut Reporter,
    st: &OciState,
    key: &ContainerKey,
    t: &mut Phases,
) -> anyhow::Result<()> {
    let spec = BundleSpec::load(&st.bundle)?;
    if spec.is_pod_sandbox() {
        return Ok(()); // the pause container: no workload, no QoS, no log
    }
    let asked = Requested::parse(cfg, &spec);
    // Connect now: the agent accepts while the cgroup is written below.
    let early = (asked.req.watch != Some(false)).then(|| AgentClient::of(cfg).connect_early());
    t.mark("spec");
    let pid = st
        .init_pid()
        .ok_or_else(|| anyhow!("the OCI state of container {:?} has no pid", st.id))?;
    let h = Hierarchies::discover().context("cgroup hierarchies")?;
    // From the kernel, never from the (container-controlled) spec.
    let rel = cpu_cgroup_of_pid(Path::new("/proc"), pid, h.mode)?;
    let cg = CpuCgroup::open(&h, &rel)?;
    t.mark("cgroup");
    let target = Target {
        key,
        pid,
        hierarchies: &h,
        cgroup: &cg,
    };
    let q = qos::apply(cfg, &spec, asked, target);
    t.mark("qos");
    for r in &q.refused {
        rep.error(&r.to_string());
    }
    record_burst(cfg, rep, key, &q);
    t.mark("burst_record");
    if q.watch == Some(false) {
        mark_unwatched(cfg, rep, key);
        return Ok(()); // throttlewatch.io/watch=false: QoS only, no log
    }
    let mut reg = registration(st, key, &spec, pid, rel, q);
    // Fail-closed: a log the agent cannot open refuses the container, so
    // wait for it; fail-open: the answer comes once the cgroup is watched.
    reg.wait_for_log = cfg.fail_mode == FailMode::Closed;
    match agent_start::register(cfg, args.config.as_deref(), &reg, early) {
        Ok(_) => unwatched::clear(&StateDir::new(&cfg.state_dir), key),
        Err(e) => {
            rep.error(&e);
            mark_unwatched(cfg, rep, key);
        }
    }
    t.mark("register");
    Ok(())
}

fn mark_unwatched(cfg: &Config, rep: &mut Reporter, key: &ContainerKey) {
    if let Err(e) = unwatched::mark(&StateDir::new(&cfg.state_dir), key) {
        rep.warn(&format!(
            "cannot mark {key} unwatched in {}: {e} (poststop will ask the agent)",
            cfg.state_dir.display()
        ));
    }
}

/// The burst record for `update`, or none when no burst was written.
fn record_burst(cfg: &Config, rep: &mut Reporter, key: &ContainerKey, q: &QosOutcome) {
    let state = StateDir::new(&cfg.state_dir);
    let Some(b) = &q.burst else {
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

fn registration(
    st: &OciState,
    key: &ContainerKey,
    spec: &BundleSpec,
    pid: u32,
    rel: String,
    q: QosOutcome,
) -> Register {
    Register {
        container_id: key.id.clone(),
        scope: key.scope.clone(),
        container_name: spec.container_name(),
        pid: Some(pid),
        cgroup_path: rel,
        annotations: spec.annotations.clone(),
        bundle: st.bundle.to_string_lossy().into_owned(),
        created_ns: spec
            .annotations
            .get(&Key::CreatedUnixNs.annotation())
            .and_then(|v| v.trim().parse().ok()),
        hook_ns: Some(now_unix_ns()),
        threshold_ns: q.threshold_ns,
        qos: Some(q.summary),
        wait_for_log: false,
    }
}

/// poststop: the agent writes `end`; exclusive cores and the burst record
/// are released. Errors are reported but never fail the delete. A container
/// the agent no longer watches (the wrapper ended it before `delete`) is not
/// an error; one it was never told about (marked unwatched) is not asked.
fn on_poststop(cfg: &Config, rep: &mut Reporter, key: &ContainerKey) {
    let state = StateDir::new(&cfg.state_dir);
    if !unwatched::take(&state, key) {
        unregister(cfg, rep, key);
    }
    let cpusets = state.cpusets_dir();
    if cpusets
        .join(throttlewatch_qos::exclusive::STATE_FILE)
        .exists()
    {
        let released = ExclusiveAllocator::open(&cpusets).and_then(|a| {
            a.with_lock_timeout(cfg.cpuset_lock_timeout())
                .release(&key.qualified())
        });
        if let Err(e) = released {
            rep.warn(&format!(
                "cannot release the exclusive cpuset of {key}: {e}"
            ));
        }
    }
    burst_record::remove(&state, key);
}

fn unregister(cfg: &Config, rep: &mut Reporter, key: &ContainerKey) {
    match AgentClient::of(cfg).unregister(key, EndReason::Poststop, None) {
        Ok(_) => {}
        Err(AgentError::Refused(r)) => rep.warn(&format!(
            "the agent refused to unregister container {key}: {}",
            r.error.unwrap_or_else(|| "no reason given".into())
        )),
        Err(e) => rep.warn(&format!(
            "{e}; the end record of container {key} may not be written"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Stage;

    /// Logs, socket and state in `dir`; no agent is started.
    fn private_config(dir: &Path) -> Config {
        Config {
            log_dir: dir.join("logs"),
            socket: dir.join("none.sock"),
            state_dir: dir.join("state"),
            start_agent: false,
            ..Config::default()
        }
    }

    /// The pause container is passed over before anything else is read (a
    /// workload container without a pid fails at the pid).
    #[test]
    fn create_passes_over_a_pod_sandbox() {
        let d = tempfile::tempdir().unwrap();
        let cfg = private_config(d.path());
        let args = HookArgs {
            stage: Stage::CreateRuntime,
            config: None,
        };
        let state = format!(r#"{{"id":"c1","bundle":{:?}}}"#, d.path());
        let run = |kind: &str| {
            std::fs::write(
                d.path().join("config.json"),
                format!(r#"{{"annotations":{{"io.kubernetes.cri.container-type":"{kind}"}}}}"#),
            )
            .unwrap();
            let mut rep = Reporter::new(&cfg, args.stage);
            let mut t = Phases::start("test");
            run_stage(&args, &cfg, &mut rep, state.as_bytes(), &mut t)
        };
        run("sandbox").unwrap();
        let e = run("container").unwrap_err();
        assert!(format!("{e:#}").contains("no pid"), "{e:#}");
    }

    /// poststop with no agent: one warning naming the socket, not a failure.
    #[test]
    fn poststop_without_an_agent_warns() {
        let d = tempfile::tempdir().unwrap();
        let cfg = private_config(d.path());
        let args = HookArgs {
            stage: Stage::Poststop,
            config: None,
        };
        let state = format!(r#"{{"id":"c1","pid":0,"bundle":{:?}}}"#, d.path());
        let mut rep = Reporter::new(&cfg, args.stage);
        let mut t = Phases::start("test");
        run_stage(&args, &cfg, &mut rep, state.as_bytes(), &mut t).unwrap();
        assert!(!rep.failed());
        assert_eq!(rep.lines.len(), 1, "{:?}", rep.lines);
        assert!(
            rep.lines[0].contains("none.sock") && rep.lines[0].contains("end record"),
            "{:?}",
            rep.lines
        );
    }
}
