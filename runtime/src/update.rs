//! `update`: runc 1.1 has no CFS burst and a quota below the burst is
//! refused by the kernel, so the wrapper clears the recorded burst, runs the
//! low-level update as a child, and writes the burst back clamped to the new
//! quota. Exits with the runtime's status.
//!
//! Without a record (`<state_dir>/bursts/<id>.json` lost, e.g. a state dir
//! on tmpfs after a reboot of the wrapper's host while the runtime kept its
//! own state, or a container created before the hook recorded bursts), the
//! burst is derived again from the bundle's annotations and environment: the
//! bundle comes from the runtime's `state`, the cgroup from the kernel.

use std::path::Path;

use throttlewatch_cgroup::proc::cpu_cgroup_of_pid;
use throttlewatch_cgroup::{CpuCgroup, Hierarchies};
use throttlewatch_core::config::{Config, FailMode};
use throttlewatch_hook::burst_record::{self, BurstRecord, RECORD_VERSION};
use throttlewatch_hook::spec::BundleSpec;

use crate::args::RuncArgs;
use crate::lowlevel;
use crate::runlog::RuncLog;

pub fn update(runtime: &Path, args: &RuncArgs, cfg: &Config, log: &RuncLog) -> i32 {
    let id = args
        .container_id()
        .map(|i| i.to_string_lossy().into_owned());
    let record = match id
        .as_deref()
        .map(|id| burst_record::load(&cfg.state_dir, id))
    {
        Some(Ok(Some(r))) => Some(r),
        Some(Ok(None)) => id
            .as_deref()
            .and_then(|id| derive_record(runtime, args, cfg, id, log)),
        Some(Err(e)) => {
            log.warning(&format!(
                "cannot read the recorded burst: {e}; the burst may be lost by this update"
            ));
            None
        }
        None => None,
    };
    let group = record.as_ref().and_then(|r| open_group(r, log));
    if let Some(g) = &group {
        // A burst above the new quota would make the kernel refuse the quota.
        let _ = g.set_burst(0);
    }
    let code = match lowlevel::run_child(runtime, &args.argv) {
        Ok(c) => c,
        Err(e) => {
            log.error(&format!("cannot run {}: {e}", runtime.display()));
            127
        }
    };
    if let (Some(rec), Some(g)) = (&record, &group) {
        if let Err(e) = restore(rec, g, cfg) {
            log.error(&format!(
                "container {:?}: cannot restore the CFS burst after update: {e}",
                rec.container_id
            ));
            if code == 0 && cfg.fail_mode == FailMode::Closed {
                return 1;
            }
        }
    }
    code
}

/// The burst record of a container that has none: its bundle (from the
/// runtime's `state`) asks for a burst in its annotations or environment,
/// and its init process gives the cgroup. None when it asks for none.
fn derive_record(
    runtime: &Path,
    args: &RuncArgs,
    cfg: &Config,
    id: &str,
    log: &RuncLog,
) -> Option<BurstRecord> {
    let state = lowlevel::state(runtime, args.global_args(), id)?;
    let bundle = Path::new(state["bundle"].as_str()?);
    let pid = state["pid"]
        .as_u64()
        .filter(|p| *p > 0 && *p <= u32::MAX as u64)? as u32;
    let spec = BundleSpec::load(bundle)
        .map_err(|e| log.warning(&format!("no burst record for {id:?} and {e}")))
        .ok()?;
    derive_from_spec(
        cfg,
        id,
        &spec,
        |mode| cpu_cgroup_of_pid(Path::new("/proc"), pid, mode).ok(),
        log,
    )
}

/// The record for `spec`'s burst request; `cgroup_of` gives the cgroup path
/// for the hierarchy's mode.
pub fn derive_from_spec(
    cfg: &Config,
    id: &str,
    spec: &BundleSpec,
    cgroup_of: impl FnOnce(throttlewatch_cgroup::CgroupMode) -> Option<String>,
    log: &RuncLog,
) -> Option<BurstRecord> {
    let (req, _) = throttlewatch_hook::qos::request(cfg, spec);
    let burst = req.burst?;
    let h = Hierarchies::discover()
        .map_err(|e| log.warning(&format!("cgroup hierarchies: {e}")))
        .ok()?;
    let Some(cgroup_path) = cgroup_of(h.mode) else {
        log.warning(&format!(
            "container {id:?}: no cgroup for its init process; its burst is not restored"
        ));
        return None;
    };
    Some(BurstRecord {
        v: RECORD_VERSION,
        container_id: id.to_string(),
        cgroup_path,
        request: burst.into(),
        cap_percent: req.burst_cap_percent,
        applied_us: 0,
    })
}

fn open_group(rec: &BurstRecord, log: &RuncLog) -> Option<CpuCgroup> {
    let h = Hierarchies::discover()
        .map_err(|e| log.warning(&format!("cgroup hierarchies: {e}")))
        .ok()?;
    CpuCgroup::open(&h, &rec.cgroup_path)
        .map_err(|e| {
            log.warning(&format!(
                "container {:?}: {e}; its burst is not restored",
                rec.container_id
            ))
        })
        .ok()
}

/// Write the burst for the current quota and record what was applied.
pub fn restore(rec: &BurstRecord, g: &CpuCgroup, cfg: &Config) -> Result<u64, String> {
    let limits = g.limits().map_err(|e| e.to_string())?;
    let Some(us) = rec.burst_for_quota(limits.quota_us) else {
        return Ok(0); // no quota: nothing to burst
    };
    g.set_burst(us)
        .map_err(|e| format!("{} = {us}: {e}", g.burst_file().display()))?;
    let new = BurstRecord {
        applied_us: us,
        ..rec.clone()
    };
    burst_record::save(&cfg.state_dir, &new).map_err(|e| e.to_string())?;
    Ok(us)
}

#[cfg(test)]
mod tests {
    use throttlewatch_cgroup::CgroupMode;
    use throttlewatch_hook::burst_record::BurstRequest;

    use super::*;

    #[test]
    fn restore_clamps_to_the_new_quota() {
        let d = tempfile::tempdir().unwrap();
        let h = Hierarchies {
            mode: CgroupMode::V1,
            cpu: d.path().join("cpu"),
            cpuset: None,
            extra_v1: vec![],
        };
        let g = CpuCgroup::at(&h, "/tw/c");
        std::fs::create_dir_all(&g.cpu_dir).unwrap();
        std::fs::write(g.cpu_dir.join("cpu.cfs_quota_us"), "15000").unwrap();
        std::fs::write(g.cpu_dir.join("cpu.cfs_period_us"), "100000").unwrap();
        let cfg = Config {
            state_dir: d.path().join("state"),
            ..Config::default()
        };
        let rec = BurstRecord {
            v: RECORD_VERSION,
            container_id: "c".into(),
            cgroup_path: "/tw/c".into(),
            request: BurstRequest::Micros(20_000),
            cap_percent: 100,
            applied_us: 20_000,
        };
        assert_eq!(restore(&rec, &g, &cfg).unwrap(), 15_000);
        assert_eq!(
            std::fs::read_to_string(g.cpu_dir.join("cpu.cfs_burst_us")).unwrap(),
            "15000"
        );
        assert_eq!(
            burst_record::load(&cfg.state_dir, "c")
                .unwrap()
                .unwrap()
                .applied_us,
            15_000
        );
    }

    #[test]
    fn record_derived_from_annotation_or_environment() {
        let cfg = Config::default();
        let log = RuncLog::default();
        let spec = |ann: &[(&str, &str)], env: &[&str]| BundleSpec {
            annotations: ann
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            process: Some(throttlewatch_hook::spec::Process {
                env: env.iter().map(|s| s.to_string()).collect(),
            }),
            ..Default::default()
        };
        let s = spec(&[("throttlewatch.io/cpu-burst", "20ms")], &[]);
        let r = derive_from_spec(&cfg, "c", &s, |_| Some("/tw/c".into()), &log).unwrap();
        assert_eq!(
            (r.request, r.cgroup_path.as_str(), r.container_id.as_str()),
            (BurstRequest::Micros(20_000), "/tw/c", "c")
        );
        assert_eq!(r.burst_for_quota(Some(15_000)), Some(15_000));
        let s = spec(&[], &["PATH=/bin", "THROTTLEWATCH_CPU_BURST=10ms"]);
        assert_eq!(
            derive_from_spec(&cfg, "c", &s, |_| Some("/tw/c".into()), &log)
                .unwrap()
                .request,
            BurstRequest::Micros(10_000)
        );
        // No request, a refused value, or no cgroup: no record.
        assert!(derive_from_spec(
            &cfg,
            "c",
            &spec(&[], &["PATH=/bin"]),
            |_| Some("/x".into()),
            &log
        )
        .is_none());
        assert!(derive_from_spec(
            &cfg,
            "c",
            &spec(&[("throttlewatch.io/cpu-burst", "abc")], &[]),
            |_| Some("/x".into()),
            &log
        )
        .is_none());
        assert!(derive_from_spec(&cfg, "c", &s, |_| None, &log).is_none());
    }
}
