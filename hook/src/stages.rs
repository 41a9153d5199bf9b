//! What the hook does at each stage.

use std::io::Read;
use std::path::Path;

use anyhow::{anyhow, Context};
use throttlewatch_cgroup::proc::cpu_cgroup_of_pid;
use throttlewatch_cgroup::{CpuCgroup, Hierarchies};
use throttlewatch_core::config::Config;
use throttlewatch_core::logfmt::now_unix_ns;
use throttlewatch_core::protocol::{Register, ANNOTATION_CREATED_NS};
use throttlewatch_qos::ExclusiveAllocator;

use crate::cli::HookArgs;
use crate::report::Reporter;
use crate::spec::BundleSpec;
use crate::state::OciState;
use crate::timing::Phases;
use crate::{agent, burst_record, qos, unwatched};

pub fn run_stage(
    args: &HookArgs,
    cfg: &Config,
    rep: &mut Reporter,
    stdin: impl Read,
    t: &mut Phases,
) -> anyhow::Result<()> {
    let state = OciState::read(stdin).map_err(|e| anyhow!(e))?;
    rep.set_container(&state.id);
    t.mark("state");
    if args.stage.starts_container() {
        on_create(args, cfg, rep, &state, t)
    } else {
        on_poststop(cfg, rep, &state);
        Ok(())
    }
}

/// createRuntime / prestart: QoS into the cgroup, then register.
fn on_create(
    args: &HookArgs,
    cfg: &Config,
    rep: &mut Reporter,
    st: &OciState,
    t: &mut Phases,
) -> anyhow::Result<()> {
    let spec = BundleSpec::load(&st.bundle).map_err(|e| anyhow!(e))?;
    if spec.is_pod_sandbox() {
        return Ok(()); // the pause container: no workload, no QoS, no log
    }
    // Connect now: the agent accepts while the cgroup is written below.
    let early = (qos::request(cfg, &spec).0.watch != Some(false))
        .then(|| agent::EarlyConnection::open(cfg));
    t.mark("spec");
    let pid = st
        .init_pid()
        .ok_or_else(|| anyhow!("the OCI state of container {:?} has no pid", st.id))?;
    let h = Hierarchies::discover().context("cgroup hierarchies")?;
    // From the kernel, never from the (container-controlled) spec.
    let rel = cpu_cgroup_of_pid(Path::new("/proc"), pid, h.mode)?;
    let cg = CpuCgroup::open(&h, &rel)?;
    t.mark("cgroup");
    let q = qos::apply(cfg, &st.id, pid, &spec, &h, &cg);
    t.mark("qos");
    for r in &q.refused {
        rep.error(&r.to_string());
    }
    match &q.burst {
        Some(b) => {
            if let Err(e) = burst_record::save(&cfg.state_dir, b) {
                rep.error(&format!(
                    "cannot record the burst of {:?} in {}: {e} (`update` will not restore it)",
                    st.id,
                    cfg.state_dir.display()
                ));
            }
        }
        None => burst_record::remove(&cfg.state_dir, &st.id),
    }
    t.mark("burst_record");
    if q.watch == Some(false) {
        mark_unwatched(cfg, rep, &st.id);
        return Ok(()); // throttlewatch.io/watch=false: QoS only, no log
    }
    let reg = Register {
        container_id: st.id.clone(),
        container_name: spec.container_name(),
        pid: Some(pid),
        cgroup_path: rel,
        annotations: spec.annotations.clone(),
        bundle: st.bundle.to_string_lossy().into_owned(),
        created_ns: spec
            .annotations
            .get(ANNOTATION_CREATED_NS)
            .and_then(|v| v.trim().parse().ok()),
        hook_ns: Some(now_unix_ns()),
        threshold_ns: q.threshold_ns,
        qos: Some(q.summary),
    };
    match agent::register(cfg, args.config.as_deref(), reg, early) {
        Ok(_) => unwatched::clear(&cfg.state_dir, &st.id),
        Err(e) => {
            rep.error(&e);
            mark_unwatched(cfg, rep, &st.id);
        }
    }
    t.mark("register");
    Ok(())
}

fn mark_unwatched(cfg: &Config, rep: &mut Reporter, id: &str) {
    if let Err(e) = unwatched::mark(&cfg.state_dir, id) {
        rep.warn(&format!(
            "cannot mark {id:?} unwatched in {}: {e} (poststop will ask the agent)",
            cfg.state_dir.display()
        ));
    }
}

/// poststop: the agent writes `end`; exclusive cores and the burst record
/// are released. Errors are reported but never fail the delete.
fn on_poststop(cfg: &Config, rep: &mut Reporter, st: &OciState) {
    if !unwatched::take(&cfg.state_dir, &st.id) {
        if let Err(e) = agent::unregister(cfg, &st.id, "poststop") {
            rep.warn(&e);
        }
    }
    let cpusets = cfg.state_dir.join(qos::CPUSETS_DIR);
    if cpusets
        .join(throttlewatch_qos::exclusive::STATE_FILE)
        .exists()
    {
        match ExclusiveAllocator::open(&cpusets).and_then(|a| {
            a.with_lock_timeout(cfg.cpuset_lock_timeout())
                .release(&st.id)
        }) {
            Ok(_) => {}
            Err(e) => rep.warn(&format!(
                "cannot release the exclusive cpuset of {:?}: {e}",
                st.id
            )),
        }
    }
    burst_record::remove(&cfg.state_dir, &st.id);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Stage;

    /// The pause container is passed over before anything else is read (a
    /// workload container without a pid fails at the pid).
    #[test]
    fn create_passes_over_a_pod_sandbox() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config {
            log_dir: d.path().join("logs"),
            socket: d.path().join("none.sock"),
            state_dir: d.path().join("state"),
            start_agent: false,
            ..Config::default()
        };
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
}
