//! `update`: runc 1.1 has no CFS burst and a quota below the burst is
//! refused by the kernel, so the wrapper clears the recorded burst, runs the
//! low-level update as a child, and writes the burst back clamped to the new
//! quota. Exits with the runtime's status.

use std::path::Path;

use throttlewatch_cgroup::{CpuCgroup, Hierarchies};
use throttlewatch_core::config::{Config, FailMode};
use throttlewatch_hook::burst_record::{self, BurstRecord};

use crate::args::RuncArgs;
use crate::lowlevel;
use crate::runlog::RuncLog;

pub fn update(runtime: &Path, args: &RuncArgs, cfg: &Config, log: &RuncLog) -> i32 {
    let id = args.container_id().map(|i| i.to_string_lossy().into_owned());
    let record = match id.as_deref().map(|id| burst_record::load(&cfg.state_dir, id)) {
        Some(Ok(r)) => r,
        Some(Err(e)) => {
            log.warning(&format!("cannot read the recorded burst: {e}; the burst may be lost by this update"));
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
            log.error(&format!("container {:?}: cannot restore the CFS burst after update: {e}", rec.container_id));
            if code == 0 && cfg.fail_mode == FailMode::Closed {
                return 1;
            }
        }
    }
    code
}

fn open_group(rec: &BurstRecord, log: &RuncLog) -> Option<CpuCgroup> {
    let h = Hierarchies::discover().map_err(|e| log.warning(&format!("cgroup hierarchies: {e}"))).ok()?;
    CpuCgroup::open(&h, &rec.cgroup_path)
        .map_err(|e| log.warning(&format!("container {:?}: {e}; its burst is not restored", rec.container_id)))
        .ok()
}

/// Write the burst for the current quota and record what was applied.
pub fn restore(rec: &BurstRecord, g: &CpuCgroup, cfg: &Config) -> Result<u64, String> {
    let limits = g.limits().map_err(|e| e.to_string())?;
    let Some(us) = rec.burst_for_quota(limits.quota_us) else {
        return Ok(0); // no quota: nothing to burst
    };
    g.set_burst(us).map_err(|e| format!("{} = {us}: {e}", g.burst_file().display()))?;
    let new = BurstRecord { applied_us: us, ..rec.clone() };
    burst_record::save(&cfg.state_dir, &new).map_err(|e| e.to_string())?;
    Ok(us)
}

#[cfg(test)]
mod tests {
    use throttlewatch_cgroup::CgroupMode;
    use throttlewatch_hook::burst_record::{BurstRequest, RECORD_VERSION};

    use super::*;

    #[test]
    fn restore_clamps_to_the_new_quota() {
        let d = tempfile::tempdir().unwrap();
        let h = Hierarchies { mode: CgroupMode::V1, cpu: d.path().join("cpu"), cpuset: None, extra_v1: vec![] };
        let g = CpuCgroup::at(&h, "/tw/c");
        std::fs::create_dir_all(&g.cpu_dir).unwrap();
        std::fs::write(g.cpu_dir.join("cpu.cfs_quota_us"), "15000").unwrap();
        std::fs::write(g.cpu_dir.join("cpu.cfs_period_us"), "100000").unwrap();
        let cfg = Config { state_dir: d.path().join("state"), ..Config::default() };
        let rec = BurstRecord {
            v: RECORD_VERSION,
            container_id: "c".into(),
            cgroup_path: "/tw/c".into(),
            request: BurstRequest::Micros(20_000),
            cap_percent: 100,
            applied_us: 20_000,
        };
        assert_eq!(restore(&rec, &g, &cfg).unwrap(), 15_000);
        assert_eq!(std::fs::read_to_string(g.cpu_dir.join("cpu.cfs_burst_us")).unwrap(), "15000");
        assert_eq!(burst_record::load(&cfg.state_dir, "c").unwrap().unwrap().applied_us, 15_000);
    }
}
