//! A container's CFS burst under a pod quota. kubelet gives a pod whose
//! containers all have CPU limits the sum of those limits as the pod
//! cgroup's own quota (kubelet v1.35 `pkg/kubelet/cm/helpers_linux.go`,
//! `ResourceConfigForPod`), and the kernel enforces every level of the
//! hierarchy: a burst written on the container alone only moves the
//! throttling up to the pod cgroup. So each ancestor with a quota gets, on
//! top of the burst it had before us (its base), the bursts of the
//! containers recorded below it (`bursts/*.json`), at most its quota and
//! at most the sum of its children's quotas: kubelet's in-place resize
//! shrinks the containers first and the pod after
//! (`pkg/kubelet/kuberuntime/kuberuntime_manager.go`, `doPodResizeAction`),
//! and the kernel refuses a quota below the burst, so the pod's burst must
//! already fit the pod quota kubelet is about to write.
//!
//! What was written on each ancestor (`<state_dir>/pod-bursts/<escaped
//! path>.json`, one file per ancestor, under the node-wide flock
//! `pod-bursts.lock`) keeps its base and its members: an ancestor's burst
//! that is no longer what we wrote was written by someone else (an
//! operator, kubelet) and becomes the new base. When the last container
//! below an ancestor is gone its base is written back and its file goes.
//! A container's create reads and writes its own ancestors' files only, so
//! it costs the same with 1 or 1,000 containers on the node (a single
//! table of every pod, as before, grew with them: bench/README.md).

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use throttlewatch_cgroup::{CpuCgroup, Hierarchies};
use throttlewatch_core::state_dir::{write_atomic, StateDir, WriteOptions};

use crate::burst_record::BurstRecord;

/// The single table of every ancestor an earlier version kept: split into
/// [`DIR`] at the first share.
const TABLE: &str = "pod-bursts.json";
const DIR: &str = "pod-bursts";
const LOCK: &str = "pod-bursts.lock";

/// One ancestor's file: its path (the file name is escaped, and hashed
/// when long) and what we wrote on it.
#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    cgroup_path: String,
    #[serde(flatten)]
    burst: AncestorBurst,
}

/// What we wrote on one ancestor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct AncestorBurst {
    /// The ancestor's burst before us (or as someone else last wrote it).
    base_us: u64,
    written_us: u64,
    /// The containers below it with a burst (cgroup path → µs): kept here
    /// so that a container's create reads its pod's members, not every
    /// container's burst record on the node. None: a table written before
    /// it was kept (the records are read once for that ancestor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    members: Option<BTreeMap<String, u64>>,
}

/// One ancestor with a quota, after [`share`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Level {
    pub cgroup_path: String,
    pub quota_us: u64,
    pub period_us: u64,
    /// Its burst now.
    pub burst_us: u64,
    /// Of that, the bursts of the containers below it.
    pub from_containers_us: u64,
}

/// What [`share`] did: the ancestors with a quota, nearest first, and what
/// could not be done (none of it fails the container).
#[derive(Debug, Default)]
pub struct Shared {
    pub levels: Vec<Level>,
    pub warnings: Vec<String>,
}

/// Bring the burst of every ancestor of `container_rel` that has a quota
/// in line with the bursts of the containers below it, the container's own
/// now `applied_us` (its record saved with it; 0: removed). Reads the
/// members of each ancestor kept in the table (a stat of each one's
/// cgroup), not every burst record on the node.
pub fn share(state: &StateDir, h: &Hierarchies, container_rel: &str, applied_us: u64) -> Shared {
    let mut out = Shared::default();
    let mut lock = None;
    let mut records = None;
    let mut at = CpuCgroup::at(h, container_rel).parent(h);
    while let Some(g) = at {
        if g.rel == "/" {
            break;
        }
        at = g.parent(h);
        let Ok(bw) = g.bandwidth() else { continue };
        let (Some(quota), Some(current)) = (bw.quota_us, bw.burst_us) else {
            continue;
        };
        if lock.is_none() {
            match take_lock(state) {
                Ok(l) => lock = Some(l),
                Err(e) => {
                    out.warnings.push(format!(
                        "cannot lock {}: {e}; the burst of {} is left as it is",
                        state.root().join(LOCK).display(),
                        g.rel
                    ));
                    return out;
                }
            }
            split_table(state, &mut out.warnings);
        }
        let prev = load_entry(state, &g.rel, &mut out.warnings);
        let mut members = match &prev {
            Some(AncestorBurst {
                members: Some(m), ..
            }) => m.clone(),
            // Kept by an earlier version without its members: read once.
            Some(_) => {
                let below = format!("{}/", g.rel);
                records
                    .get_or_insert_with(|| live_records(state, h))
                    .iter()
                    .filter(|r| r.cgroup_path.starts_with(&below))
                    .map(|r| (r.cgroup_path.clone(), r.applied_us))
                    .collect()
            }
            None => BTreeMap::new(),
        };
        if applied_us > 0 {
            members.insert(container_rel.to_string(), applied_us);
        } else {
            members.remove(container_rel);
        }
        // A member whose cgroup is gone without its end (a killed runtime).
        members.retain(|rel, _| CpuCgroup::at(h, rel).cpu_dir.is_dir());
        let (level, next) = share_level(
            h,
            &g,
            (quota, current, bw.period_us),
            prev.as_ref(),
            members,
            &mut out.warnings,
        );
        if next != prev {
            if let Err(e) = save_entry(state, &g.rel, next.as_ref()) {
                out.warnings.push(format!(
                    "cannot write {}: {e}",
                    entry_path(state, &g.rel).display()
                ));
            }
        }
        out.levels.push(level);
    }
    drop(lock);
    out
}

/// One ancestor's burst: its base (what it had before any container's)
/// plus the bursts recorded below it, within its children's quotas and its
/// own; written when it changes, and kept in the table.
fn share_level(
    h: &Hierarchies,
    g: &CpuCgroup,
    (quota, current, period_us): (u64, u64, u64),
    prev: Option<&AncestorBurst>,
    members: BTreeMap<String, u64>,
    warnings: &mut Vec<String>,
) -> (Level, Option<AncestorBurst>) {
    let sum: u64 = members.values().sum();
    let base = match prev {
        Some(w) if w.written_us == current => w.base_us,
        _ => current,
    };
    let target = if sum == 0 {
        base
    } else {
        (base + sum)
            .min(children_quota(h, g, period_us).unwrap_or(quota).max(base))
            .min(quota)
    };
    let mut now = current;
    if target != current {
        match g.set_burst(target) {
            Ok(()) => now = target,
            Err(e) => warnings.push(format!(
                "the kernel refused {} = {target}: {e}; the containers below it burst only within its quota",
                g.burst_file().display()
            )),
        }
    }
    let next = (sum > 0).then_some(AncestorBurst {
        base_us: base,
        written_us: now,
        members: Some(members),
    });
    let level = Level {
        cgroup_path: g.rel.clone(),
        quota_us: quota,
        period_us,
        burst_us: now,
        from_containers_us: now.saturating_sub(base),
    };
    (level, next)
}

/// [`share`] on the hierarchies of this host.
pub fn share_here(state: &StateDir, container_rel: &str, applied_us: u64) -> Shared {
    match Hierarchies::discover() {
        Ok(h) => share(state, &h, container_rel, applied_us),
        Err(e) => Shared {
            levels: Vec::new(),
            warnings: vec![format!(
                "cgroup hierarchies: {e}; the bursts of the ancestors of {container_rel} are left as they are"
            )],
        },
    }
}

/// The quotas of `g`'s children summed, in `g`'s period; None when none has one.
fn children_quota(h: &Hierarchies, g: &CpuCgroup, period_us: u64) -> Option<u64> {
    let mut sum = None;
    for e in std::fs::read_dir(&g.cpu_dir).ok()?.flatten() {
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let c = CpuCgroup::at(h, &format!("{}/{name}", g.rel));
        if let Ok(bw) = c.bandwidth() {
            if let (Some(q), true) = (bw.quota_us, bw.period_us > 0) {
                *sum.get_or_insert(0) += q * period_us / bw.period_us;
            }
        }
    }
    sum
}

/// The burst records of containers whose cgroup is still there.
fn live_records(state: &StateDir, h: &Hierarchies) -> Vec<BurstRecord> {
    let Ok(dir) = std::fs::read_dir(state.bursts_dir()) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let bytes = read_private(&e.path()).ok()?;
            serde_json::from_slice::<BurstRecord>(&bytes).ok()
        })
        .filter(|r| r.applied_us > 0 && CpuCgroup::at(h, &r.cgroup_path).cpu_dir.is_dir())
        .collect()
}

fn read_private(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    let mut bytes = Vec::new();
    f.take(64 * 1024).read_to_end(&mut bytes)?;
    Ok(bytes)
}

fn take_lock(state: &StateDir) -> std::io::Result<Flock<File>> {
    StateDir::create_dir(state.root())?;
    let f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(lock_path(state))?;
    Flock::lock(f, FlockArg::LockExclusive).map_err(|(_, e)| e.into())
}

fn lock_path(state: &StateDir) -> PathBuf {
    state.root().join(LOCK)
}

fn entry_path(state: &StateDir, rel: &str) -> PathBuf {
    state.root().join(DIR).join(format!(
        "{}.json",
        throttlewatch_core::container_key::escape_id(rel)
    ))
}

/// What we wrote on `rel`, if anything (a file of another path, whose
/// long name hashed the same, counts as nothing).
fn load_entry(state: &StateDir, rel: &str, warnings: &mut Vec<String>) -> Option<AncestorBurst> {
    let path = entry_path(state, rel);
    let bytes = read_private(&path).ok()?;
    match serde_json::from_slice::<Entry>(&bytes) {
        Ok(e) if e.cgroup_path == rel => Some(e.burst),
        Ok(_) => None,
        Err(e) => {
            warnings.push(format!(
                "{}: {e}; the burst of {rel} is taken as it is now",
                path.display()
            ));
            None
        }
    }
}

/// Write what we wrote on `rel` (None: nothing any more, its file goes).
fn save_entry(state: &StateDir, rel: &str, b: Option<&AncestorBurst>) -> std::io::Result<()> {
    let path = entry_path(state, rel);
    let Some(b) = b else {
        return match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    };
    let e = Entry {
        cgroup_path: rel.to_string(),
        burst: b.clone(),
    };
    let write = || write_atomic(&path, &serde_json::to_vec(&e)?, &WriteOptions::STATE);
    match write() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            StateDir::create_dir(&state.root().join(DIR))?;
            write()
        }
        r => r,
    }
}

/// An earlier version's single table, if there is one: each ancestor to
/// its own file, then the table goes (under the lock).
fn split_table(state: &StateDir, warnings: &mut Vec<String>) {
    let path = state.root().join(TABLE);
    let Ok(bytes) = read_private(&path) else {
        return;
    };
    match serde_json::from_slice::<BTreeMap<String, AncestorBurst>>(&bytes) {
        Ok(t) => {
            for (rel, b) in &t {
                if let Err(e) = save_entry(state, rel, Some(b)) {
                    warnings.push(format!(
                        "cannot write {}: {e}",
                        entry_path(state, rel).display()
                    ));
                    return;
                }
            }
        }
        Err(e) => warnings.push(format!(
            "{}: {e}; the ancestors' bursts are taken as they are now",
            path.display()
        )),
    }
    let _ = std::fs::remove_file(&path);
}

#[cfg(test)]
mod tests {
    use throttlewatch_cgroup::CgroupMode;

    use super::*;
    use crate::burst_record::{self, BurstRequest, RECORD_VERSION};

    /// A v2-shaped tree: `/kubepods/burstable/pod1/{c1,c2}` with `cpu.max`
    /// and `cpu.max.burst` files (plain files: the kernel's checks are in
    /// the root tests).
    fn tree(root: &std::path::Path) -> Hierarchies {
        let h = Hierarchies {
            mode: CgroupMode::V2,
            cpu: root.join("cg"),
            cpuset: None,
            extra_v1: vec![],
        };
        for (rel, max) in [
            ("/kubepods", "max 100000"),
            ("/kubepods/burstable", "max 100000"),
            ("/kubepods/burstable/pod1", "60000 100000"),
            ("/kubepods/burstable/pod1/c1", "30000 100000"),
            ("/kubepods/burstable/pod1/c2", "30000 100000"),
            ("/kubepods/burstable/pod1/pause", "max 100000"),
        ] {
            let d = CpuCgroup::at(&h, rel).cpu_dir;
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cpu.max"), max).unwrap();
            std::fs::write(d.join("cpu.max.burst"), "0").unwrap();
        }
        h
    }

    fn record(state: &StateDir, id: &str, rel: &str, us: u64) {
        burst_record::save(
            state,
            &BurstRecord {
                v: RECORD_VERSION,
                container_id: id.into(),
                scope: None,
                cgroup_path: rel.into(),
                request: BurstRequest::Micros(us),
                cap_percent: 100,
                applied_us: us,
            },
        )
        .unwrap();
    }

    fn burst(h: &Hierarchies, rel: &str) -> u64 {
        CpuCgroup::at(h, rel).bandwidth().unwrap().burst_us.unwrap()
    }

    const POD: &str = "/kubepods/burstable/pod1";

    /// The tree and a state directory in a temporary directory.
    fn fixture() -> (tempfile::TempDir, Hierarchies, StateDir) {
        let d = tempfile::tempdir().unwrap();
        let h = tree(d.path());
        let state = StateDir::new(d.path().join("state"));
        (d, h, state)
    }

    /// Container `id` of pod1 records `us` and shares it, as a create does.
    fn put(state: &StateDir, h: &Hierarchies, id: &str, us: u64) -> Shared {
        let rel = format!("{POD}/{id}");
        record(state, id, &rel, us);
        share(state, h, &rel, us)
    }

    /// Container `id` of pod1 ends, as poststop does.
    fn end(state: &StateDir, h: &Hierarchies, id: &str) {
        burst_record::remove(state, &throttlewatch_core::ContainerKey::new(id, None));
        share(state, h, &format!("{POD}/{id}"), 0);
    }

    #[test]
    fn the_pod_gets_its_containers_bursts_and_its_own_back() {
        let (d, h, state) = fixture();
        // Someone had set 5ms on the pod before.
        std::fs::write(CpuCgroup::at(&h, POD).burst_file(), "5000").unwrap();
        let s = put(&state, &h, "c1", 30_000);
        assert!(s.warnings.is_empty(), "{:?}", s.warnings);
        assert_eq!(burst(&h, POD), 35_000);
        assert_eq!(
            s.levels.len(),
            1,
            "only the pod has a quota: {:?}",
            s.levels
        );
        assert_eq!(s.levels[0].from_containers_us, 30_000);
        assert_eq!(burst(&h, "/kubepods/burstable"), 0);
        // The second container's burst: capped at the pod's quota (60ms).
        put(&state, &h, "c2", 30_000);
        assert_eq!(burst(&h, POD), 60_000);
        // c1 ends: its part is taken back; c2's stays.
        end(&state, &h, "c1");
        assert_eq!(burst(&h, POD), 35_000);
        end(&state, &h, "c2");
        assert_eq!(burst(&h, POD), 5_000, "the base is written back");
        assert_eq!(
            std::fs::read_dir(d.path().join("state").join(DIR))
                .unwrap()
                .count(),
            0,
            "nothing kept once no container is below"
        );
    }

    #[test]
    fn a_resize_shrinks_the_pods_burst_to_its_containers_new_quotas() {
        let (_d, h, state) = fixture();
        put(&state, &h, "c1", 30_000);
        put(&state, &h, "c2", 30_000);
        assert_eq!(burst(&h, POD), 60_000);
        // kubelet shrinks c1 to 10ms first (the pod's 40ms comes after): the
        // container's burst follows its quota, the pod's fits 40ms.
        let c1 = CpuCgroup::at(&h, "/kubepods/burstable/pod1/c1");
        std::fs::write(c1.cpu_dir.join("cpu.max"), "10000 100000").unwrap();
        put(&state, &h, "c1", 10_000);
        assert_eq!(burst(&h, POD), 40_000);
    }

    #[test]
    fn a_write_by_someone_else_becomes_the_base() {
        let (_d, h, state) = fixture();
        put(&state, &h, "c1", 20_000);
        assert_eq!(burst(&h, POD), 20_000);
        std::fs::write(CpuCgroup::at(&h, POD).burst_file(), "10000").unwrap();
        share(&state, &h, "/kubepods/burstable/pod1/c1", 20_000);
        assert_eq!(burst(&h, POD), 30_000, "10ms of theirs and 20ms of ours");
        end(&state, &h, "c1");
        assert_eq!(burst(&h, POD), 10_000);
    }

    #[test]
    fn the_pods_members_are_read_not_every_record_on_the_node() {
        let (_d, h, state) = fixture();
        put(&state, &h, "c1", 20_000);
        // A record that does not parse would be skipped by a scan; the
        // members are what the pod's containers said.
        std::fs::write(state.bursts_dir().join("junk.json"), "{").unwrap();
        put(&state, &h, "c2", 10_000);
        assert_eq!(burst(&h, POD), 30_000);
        // c1's cgroup goes without its end (a killed runtime): its part goes
        // at the next share.
        std::fs::remove_dir_all(CpuCgroup::at(&h, "/kubepods/burstable/pod1/c1").cpu_dir).unwrap();
        share(&state, &h, "/kubepods/burstable/pod1/c2", 10_000);
        assert_eq!(burst(&h, POD), 10_000);
    }

    #[test]
    fn a_table_without_members_reads_the_records_once() {
        let (_d, h, state) = fixture();
        record(&state, "c1", "/kubepods/burstable/pod1/c1", 20_000);
        std::fs::write(CpuCgroup::at(&h, POD).burst_file(), "20000").unwrap();
        // As an earlier version left it: base 0, 20ms written, no members.
        std::fs::write(
            state.root().join(TABLE),
            format!(r#"{{"{POD}":{{"base_us":0,"written_us":20000}}}}"#),
        )
        .unwrap();
        put(&state, &h, "c2", 10_000);
        assert_eq!(
            burst(&h, POD),
            30_000,
            "c1's 20ms from its record, c2's 10ms"
        );
        assert!(!state.root().join(TABLE).exists(), "the old table is split");
        let t = std::fs::read_to_string(entry_path(&state, POD)).unwrap();
        assert!(t.contains("\"members\"") && t.contains(POD), "{t}");
    }

    #[test]
    fn no_ancestor_with_a_quota_takes_no_lock_and_writes_nothing() {
        let (d, h, state) = fixture();
        let s = share(&state, &h, "/kubepods/burstable/other", 10_000);
        assert!(s.levels.is_empty() && s.warnings.is_empty());
        assert!(!d.path().join("state").exists());
    }
}
