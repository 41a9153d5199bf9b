use std::os::unix::fs::PermissionsExt;
use std::sync::{Arc, Barrier};

use super::*;

/// 48 cores (i, i + 48), as on the training node.
fn cores() -> Vec<CpuList> {
    (0..48).map(|i| CpuList::from_iter([i, i + 48])).collect()
}

fn overlap_free(sets: &[CpuList]) -> bool {
    let total: usize = sets.iter().map(CpuList::len).sum();
    sets.iter()
        .fold(CpuList::default(), |a, s| a.union(s))
        .len()
        == total
}

fn stat_line(pid: u32, state: char, start: u64) -> String {
    format!("{pid} (sleep me) {state} 1 {pid} {pid} 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 {start} 2000000 100 0\n")
}

#[test]
fn containers_get_whole_disjoint_cores_until_exhausted() {
    let d = tempfile::tempdir().unwrap();
    let a = ExclusiveAllocator::open(&d.path().join("state")).unwrap();
    let c = cores();
    let x = a.allocate("a", &c, 3, None).unwrap();
    assert_eq!(
        x.to_string(),
        "0-1,48-49",
        "3 CPUs round up to two whole cores"
    );
    let y = a.allocate("b", &c, 4, None).unwrap();
    assert_eq!(y.to_string(), "2-3,50-51");
    assert_eq!(
        a.allocate("a", &c, 3, None).unwrap(),
        x,
        "same container, same CPUs"
    );
    let rest = a.allocate("c", &c, 88, None).unwrap();
    assert!(overlap_free(&[x.clone(), y.clone(), rest.clone()]));
    let e = a.allocate("d", &c, 2, None).unwrap_err().to_string();
    assert!(
        e.contains("2 CPUs needed in whole free cores, only 0 free")
            && e.contains("held by a, b, c"),
        "{e}"
    );
    assert_eq!(a.release("b").unwrap(), Some(y.clone()));
    assert_eq!(a.release("b").unwrap(), None);
    assert_eq!(
        a.allocate("d", &c, 4, None).unwrap(),
        y,
        "released cores are handed out again"
    );
    assert_eq!(a.held_cpus_except("d").unwrap(), x.union(&rest));
    let e = a.allocate("e", &c[..2], 0, None).unwrap_err().to_string();
    assert!(
        e.contains("1 CPUs needed") && e.contains("held by a"),
        "{e}"
    );
}

#[test]
fn files_are_private_and_corruption_is_reported() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("run/throttlewatch/cpusets");
    let a = ExclusiveAllocator::open(&dir).unwrap();
    a.allocate("a", &cores(), 2, None).unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join(STATE_FILE)), 0o600);
    assert_eq!(mode(&dir.join(LOCK_FILE)), 0o600);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(a.state_path()).unwrap()).unwrap();
    assert_eq!(json["version"], 1);
    assert_eq!(json["holdings"]["a"]["cpus"], "0,48");
    std::fs::write(a.state_path(), "{not json").unwrap();
    let e = a.allocate("b", &cores(), 2, None).unwrap_err().to_string();
    assert!(
        e.contains("cpusets.json") && e.contains("remove it to reset"),
        "{e}"
    );
}

#[test]
fn dead_holders_are_reclaimed() {
    let d = tempfile::tempdir().unwrap();
    let a = ExclusiveAllocator::open(d.path()).unwrap();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let c = cores();
    a.allocate("gone", &c[..1], 2, Some(dead)).unwrap();
    let me = std::process::id();
    a.allocate("alive", &c[1..2], 2, Some(me)).unwrap();
    assert!(a
        .holdings()
        .unwrap()
        .get("alive")
        .unwrap()
        .start_time
        .is_some());
    assert_eq!(
        a.allocate("new", &c[..2], 2, Some(me)).unwrap().to_string(),
        "0,48"
    );
    assert!(!a.holdings().unwrap().contains_key("gone"));
}

#[test]
fn reused_pids_and_zombies_do_not_hold_cores() {
    let d = tempfile::tempdir().unwrap();
    let proc = d.path().join("proc");
    for (pid, state) in [(100, 'S'), (200, 'S')] {
        std::fs::create_dir_all(proc.join(pid.to_string())).unwrap();
        std::fs::write(
            proc.join(format!("{pid}/stat")),
            stat_line(pid, state, 5000),
        )
        .unwrap();
    }
    let a = ExclusiveAllocator::open(&d.path().join("state"))
        .unwrap()
        .with_procfs(&proc);
    let c = cores();
    a.allocate("x", &c[..1], 2, Some(100)).unwrap();
    a.allocate("y", &c[1..2], 2, Some(200)).unwrap();
    assert_eq!(a.holdings().unwrap()["x"].start_time, Some(5000));
    assert!(
        a.allocate("z", &c[..2], 2, None).is_err(),
        "both holders alive"
    );
    std::fs::write(proc.join("100/stat"), stat_line(100, 'S', 9999)).unwrap(); // pid reused
    std::fs::write(proc.join("200/stat"), stat_line(200, 'Z', 5000)).unwrap(); // exited, not reaped
    assert_eq!(
        a.allocate("z", &c[..2], 4, None).unwrap().to_string(),
        "0-1,48-49"
    );
}

#[test]
fn holder_can_be_set_later() {
    let d = tempfile::tempdir().unwrap();
    let a = ExclusiveAllocator::open(d.path())
        .unwrap()
        .for_holder(Some(7));
    assert_eq!(a.holder(), Some(7));
    a.allocate("c", &cores(), 2, None).unwrap();
    assert!(a.set_holder("c", std::process::id()).unwrap());
    assert!(!a.set_holder("nobody", 1).unwrap());
    assert_eq!(a.holdings().unwrap()["c"].pid, Some(std::process::id()));
}

#[test]
fn concurrent_threads_never_overlap() {
    let d = tempfile::tempdir().unwrap();
    let dir = Arc::new(d.path().join("state"));
    let barrier = Arc::new(Barrier::new(12));
    let handles: Vec<_> = (0..12)
        .map(|i| {
            let (dir, barrier) = (dir.clone(), barrier.clone());
            std::thread::spawn(move || {
                let a = ExclusiveAllocator::open(&dir).unwrap();
                barrier.wait();
                a.allocate(&format!("c{i}"), &cores(), 8, None).unwrap()
            })
        })
        .collect();
    let got: Vec<CpuList> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(got.iter().all(|s| s.len() == 8));
    assert!(overlap_free(&got), "{got:?}");
    let a = ExclusiveAllocator::open(&dir).unwrap();
    assert_eq!(a.holdings().unwrap().len(), 12);
    assert!(
        a.allocate("late", &cores(), 2, None).is_err(),
        "all 96 CPUs are held"
    );
}

const CHILD_ENV: &str = "THROTTLEWATCH_QOS_TEST_ALLOC";

/// Run by `concurrent_processes_never_overlap` in child processes.
#[test]
fn child_process_allocates() {
    let Ok(arg) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (dir, id) = arg.split_once('|').unwrap();
    let a = ExclusiveAllocator::open(Path::new(dir)).unwrap();
    // The test process holds the cores, so that they outlive this child.
    a.allocate(id, &cores(), 6, Some(std::os::unix::process::parent_id()))
        .unwrap();
}

#[test]
fn concurrent_processes_never_overlap() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("state");
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..8)
        .map(|i| {
            std::process::Command::new(&exe)
                .args([
                    "--exact",
                    "exclusive::tests::child_process_allocates",
                    "--test-threads=1",
                    "-q",
                ])
                .env(CHILD_ENV, format!("{}|p{i}", dir.display()))
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let a = ExclusiveAllocator::open(&dir).unwrap();
    let holdings = a.holdings().unwrap();
    assert_eq!(holdings.len(), 8);
    assert!(holdings.values().all(|h| h.pid == Some(std::process::id())));
    let sets: Vec<CpuList> = holdings.values().map(|h| parse_held(&h.cpus)).collect();
    assert!(sets.iter().all(|s| s.len() == 6));
    assert!(overlap_free(&sets), "{sets:?}");
}
