//! A container's CFS burst across a low-level `update`: runc 1.1 has no CFS
//! burst and a quota below the burst is refused by the kernel, so the burst
//! is cleared before the update and written back, clamped to the new quota,
//! after it. Used by the runtime wrapper and the shim.
//!
//! Without a record (`<state_dir>/bursts/<id>.json` lost, e.g. a state dir
//! on tmpfs after a reboot of the wrapper's host while the runtime kept its
//! own state, or a container created before the hook recorded bursts), the
//! burst is derived again from the bundle's annotations and environment:
//! the cgroup from the kernel.

use std::path::{Path, PathBuf};

use throttlewatch_cgroup::proc::cpu_cgroup_of_pid;
use throttlewatch_cgroup::{CgroupError, CpuCgroup, Hierarchies};
use throttlewatch_core::config::Config;
use throttlewatch_core::{ContainerKey, StateDir};

use crate::bundle_spec::BundleSpec;
use crate::burst_record::{self, BurstRecord, RECORD_VERSION};

/// Where warnings go: the wrapper's runc log, or the shim's log.
pub type Warn<'a> = &'a mut dyn FnMut(&str);

/// A container's CFS burst, held across a low-level `update`: runc clears
/// what it does not know, and a burst above the new quota would make the
/// kernel refuse the quota. Used by the wrapper and by the shim.
#[derive(Debug)]
pub struct HeldBurst {
    record: BurstRecord,
    group: CpuCgroup,
}

impl HeldBurst {
    /// Before the update: the container's burst record (or, without one,
    /// what `derive` finds in its bundle), its cgroup; the burst is cleared.
    /// None when the container has no burst or its cgroup is gone.
    pub fn take(
        cfg: &Config,
        key: &ContainerKey,
        derive: impl FnOnce(Warn) -> Option<BurstRecord>,
        warn: Warn,
    ) -> Option<HeldBurst> {
        let record = match burst_record::load(&StateDir::new(&cfg.state_dir), key) {
            Ok(Some(r)) => r,
            Ok(None) => derive(&mut *warn)?,
            Err(e) => {
                warn(&format!(
                    "cannot read the recorded burst: {e}; the burst may be lost by this update"
                ));
                return None;
            }
        };
        let group = open_group(&record, warn)?;
        let _ = group.set_burst(0);
        Some(HeldBurst { record, group })
    }

    /// After the update: the burst again, clamped to the new quota, and
    /// recorded; the ancestors with a quota follow (a pod cgroup's burst
    /// fits the containers' new quotas: [`crate::pod_burst`]), what they
    /// could not do goes to `warn`. Returns the burst written (µs).
    pub fn restore(self, cfg: &Config, warn: Warn) -> Result<u64, HeldBurstError> {
        let us = restore(&self.record, &self.group, cfg).map_err(|source| HeldBurstError {
            container_id: self.record.container_id.clone(),
            source,
        })?;
        let state = StateDir::new(&cfg.state_dir);
        for w in crate::pod_burst::share_here(&state, &self.record.cgroup_path, us).warnings {
            warn(&w);
        }
        Ok(us)
    }
}

/// The burst record for the container of `bundle` whose init is `pid`.
pub fn derive_for_bundle(
    cfg: &Config,
    key: &ContainerKey,
    bundle: &Path,
    pid: u32,
    warn: Warn,
) -> Option<BurstRecord> {
    let spec = BundleSpec::load(bundle)
        .map_err(|e| warn(&format!("no burst record for {key} and {e}")))
        .ok()?;
    derive_from_spec(
        cfg,
        key,
        &spec,
        |mode| cpu_cgroup_of_pid(Path::new("/proc"), pid, mode).ok(),
        warn,
    )
}

/// The record for `spec`'s burst request; `cgroup_of` gives the cgroup path
/// for the hierarchy's mode.
pub fn derive_from_spec(
    cfg: &Config,
    key: &ContainerKey,
    spec: &BundleSpec,
    cgroup_of: impl FnOnce(throttlewatch_cgroup::CgroupMode) -> Option<String>,
    warn: Warn,
) -> Option<BurstRecord> {
    let (req, _) = crate::qos::request(cfg, spec);
    let burst = req.burst?;
    let h = Hierarchies::discover()
        .map_err(|e| warn(&format!("cgroup hierarchies: {e}")))
        .ok()?;
    let Some(cgroup_path) = cgroup_of(h.mode) else {
        warn(&format!(
            "container {key}: no cgroup for its init process; its burst is not restored"
        ));
        return None;
    };
    Some(BurstRecord {
        v: RECORD_VERSION,
        container_id: key.id.clone(),
        scope: key.scope.clone(),
        cgroup_path,
        request: burst.into(),
        cap_percent: req.burst_cap_percent,
        applied_us: 0,
    })
}

fn open_group(rec: &BurstRecord, warn: Warn) -> Option<CpuCgroup> {
    let h = Hierarchies::discover()
        .map_err(|e| warn(&format!("cgroup hierarchies: {e}")))
        .ok()?;
    CpuCgroup::open(&h, &rec.cgroup_path)
        .map_err(|e| {
            warn(&format!(
                "container {:?}: {e}; its burst is not restored",
                rec.container_id
            ))
        })
        .ok()
}

/// A held burst not written back after the update: the container and why.
#[derive(Debug, thiserror::Error)]
#[error("container {container_id:?}: cannot restore the CFS burst after update: {source}")]
pub struct HeldBurstError {
    pub container_id: String,
    pub source: RestoreError,
}

/// A burst that could not be written back after an update: the cgroup's
/// limits unreadable, the burst file refused, or the record not saved.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// The cgroup's quota could not be read.
    #[error(transparent)]
    Limits(CgroupError),
    /// The kernel refused the burst: the file and the value written.
    #[error("{} = {us}: {source}", file.display())]
    Write {
        file: PathBuf,
        us: u64,
        source: CgroupError,
    },
    /// The burst is written but its record (`bursts/<id>.json`) is not.
    #[error(transparent)]
    Record(std::io::Error),
}

/// Write the burst for the current quota and record what was applied.
pub fn restore(rec: &BurstRecord, g: &CpuCgroup, cfg: &Config) -> Result<u64, RestoreError> {
    let limits = g.limits().map_err(RestoreError::Limits)?;
    let Some(us) = rec.burst_for_quota(limits.quota_us) else {
        return Ok(0); // no quota: nothing to burst
    };
    g.set_burst(us).map_err(|source| RestoreError::Write {
        file: g.burst_file(),
        us,
        source,
    })?;
    let new = BurstRecord {
        applied_us: us,
        ..rec.clone()
    };
    burst_record::save(&StateDir::new(&cfg.state_dir), &new).map_err(RestoreError::Record)?;
    Ok(us)
}

#[cfg(test)]
mod tests {
    use throttlewatch_cgroup::CgroupMode;

    use crate::burst_record::BurstRequest;

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
            scope: None,
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
            burst_record::load(&StateDir::new(&cfg.state_dir), &rec.key())
                .unwrap()
                .unwrap()
                .applied_us,
            15_000
        );
    }

    #[test]
    fn a_refused_burst_names_the_file_and_the_value() {
        let e = RestoreError::Write {
            file: "/sys/fs/cgroup/tw/c/cpu.max.burst".into(),
            us: 15_000,
            source: CgroupError::Invalid("refused".into()),
        };
        assert_eq!(
            e.to_string(),
            "/sys/fs/cgroup/tw/c/cpu.max.burst = 15000: refused"
        );
        let held = HeldBurstError {
            container_id: "c".into(),
            source: e,
        };
        assert_eq!(
            held.to_string(),
            "container \"c\": cannot restore the CFS burst after update: /sys/fs/cgroup/tw/c/cpu.max.burst = 15000: refused"
        );
    }

    #[test]
    fn record_derived_from_annotation_or_environment() {
        let cfg = Config::default();
        let mut quiet = |_: &str| {};
        let spec = BundleSpec::with;
        let c = ContainerKey::new("c", None);
        let s = spec(&[("throttlewatch.io/cpu-burst", "20ms")], &[]);
        let r = derive_from_spec(&cfg, &c, &s, |_| Some("/tw/c".into()), &mut quiet).unwrap();
        assert_eq!(
            (r.request, r.cgroup_path.as_str(), r.container_id.as_str()),
            (BurstRequest::Micros(20_000), "/tw/c", "c")
        );
        assert_eq!(r.burst_for_quota(Some(15_000)), Some(15_000));
        let s = spec(&[], &["PATH=/bin", "THROTTLEWATCH_CPU_BURST=10ms"]);
        assert_eq!(
            derive_from_spec(&cfg, &c, &s, |_| Some("/tw/c".into()), &mut quiet)
                .unwrap()
                .request,
            BurstRequest::Micros(10_000)
        );
        // No request, a refused value, or no cgroup: no record.
        assert!(derive_from_spec(
            &cfg,
            &c,
            &spec(&[], &["PATH=/bin"]),
            |_| Some("/x".into()),
            &mut quiet
        )
        .is_none());
        assert!(derive_from_spec(
            &cfg,
            &c,
            &spec(&[("throttlewatch.io/cpu-burst", "abc")], &[]),
            |_| Some("/x".into()),
            &mut quiet
        )
        .is_none());
        assert!(derive_from_spec(&cfg, &c, &s, |_| None, &mut quiet).is_none());
    }
}
