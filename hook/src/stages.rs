//! What the hook does at each stage.

use std::io::Read;

use anyhow::anyhow;
use throttlewatch_core::config::Config;
use throttlewatch_lifecycle::created::{self, Created};
use throttlewatch_lifecycle::report::Reporter;
use throttlewatch_lifecycle::timing::Phases;
use throttlewatch_lifecycle::{
    burst_record, create_marks::CreateMarks, scope, AgentClient, AgentError, BundleSpec,
    ContainerKey, EndReason, OciState, StateDir,
};
use throttlewatch_qos::ExclusiveAllocator;

use crate::cli::HookArgs;

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
    let pid = st
        .init_pid()
        .ok_or_else(|| anyhow!("the OCI state of container {:?} has no pid", st.id))?;
    let c = Created {
        key,
        bundle: &st.bundle,
        pid,
        spec: &spec,
        created_ns: args.created_ns,
        exit_reported: false,
    };
    created::on_created(cfg, args.config.as_deref(), rep, c, t)
}

/// poststop: the agent writes `end`; exclusive cores and the burst record
/// are released. Errors are reported but never fail the delete. A container
/// the agent no longer watches (the wrapper ended it before `delete`) is not
/// an error; one it was never told about (marked unwatched) is not asked.
fn on_poststop(cfg: &Config, rep: &mut Reporter, key: &ContainerKey) {
    let state = StateDir::new(&cfg.state_dir);
    let marks = CreateMarks::new(&cfg.state_dir, key);
    if !marks.take_refusal() {
        unregister(cfg, rep, key);
    }
    // A register kept for an agent that never came: the container is gone.
    marks.taken();
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
    let had = burst_record::load(&state, key).ok().flatten();
    burst_record::remove(&state, key);
    // Its part of a pod cgroup's burst is taken back (lifecycle::pod_burst).
    if let Some(r) = had.filter(|r| r.applied_us > 0) {
        for w in throttlewatch_lifecycle::pod_burst::share_here(&state, &r.cgroup_path, 0).warnings
        {
            rep.warn(&w);
        }
    }
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
    use crate::cli::HookStage;

    use std::path::Path;

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
            stage: HookStage::CreateRuntime,
            config: None,
            created_ns: None,
        };
        let state = format!(r#"{{"id":"c1","bundle":{:?}}}"#, d.path());
        let run = |kind: &str| {
            std::fs::write(
                d.path().join("config.json"),
                format!(r#"{{"annotations":{{"io.kubernetes.cri.container-type":"{kind}"}}}}"#),
            )
            .unwrap();
            let mut rep = Reporter::new(&cfg, args.stage, crate::NAME);
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
            stage: HookStage::Poststop,
            config: None,
            created_ns: None,
        };
        let state = format!(r#"{{"id":"c1","pid":0,"bundle":{:?}}}"#, d.path());
        let mut rep = Reporter::new(&cfg, args.stage, crate::NAME);
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
