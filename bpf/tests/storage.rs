//! Per-task state is never created by the programs that run under the
//! scheduler's run-queue lock (creating task storage there allocates, and
//! before Linux 6.4 that can wake kswapd and deadlock the CPU): tasks get it
//! in process context. The case that needs user space: tasks that were in
//! the group before it was watched (a `watch` of a running container, an
//! agent restart) get theirs from the task iterator `watch()` runs (over
//! every task) or `watch_group()` runs (over the group's processes only).

use std::process::{Child, Command};
use std::time::Duration;

use throttlewatch_bpf::{ProbeOptions, ThrottleProbe};
use throttlewatch_cgroup::{Hierarchies, TransientCgroup};

struct Spinners(Vec<Child>);

impl Drop for Spinners {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn tasks_in_the_group_before_the_watch_get_run_queue_records() {
    records_for_tasks_there_before(false);
}

/// The same through the per-process walk (`bpf_iter_link_info.task.pid`,
/// Linux 6.1+; this kernel has it, so no fallback to the node-wide walk).
#[test]
fn tasks_in_the_group_before_a_group_walk_get_run_queue_records() {
    records_for_tasks_there_before(true);
}

fn records_for_tasks_there_before(group_walk: bool) {
    let p = ThrottleProbe::load(&ProbeOptions::default()).expect("load");
    assert!(p.runq_available(), "runq: {:?}", p.runq_error());
    let h = Hierarchies::discover().unwrap();
    let cg = TransientCgroup::create(
        &h,
        &format!("/tw-test-storage-{}-{group_walk}", std::process::id()),
    )
    .unwrap();
    // Two spinners on one CPU preempt each other; they are in the group
    // (moved there while it was not watched: no fork, exec or attach of
    // theirs happens after the watch begins).
    let mut s = Spinners(vec![]);
    for _ in 0..2 {
        let c = Command::new("taskset")
            .args(["-c", "0", "sh", "-c", "while :; do :; done"])
            .spawn()
            .expect("taskset");
        cg.group.add_pid(c.id()).unwrap();
        s.0.push(c);
    }
    std::thread::sleep(Duration::from_millis(200));
    let id = cg.group.id().unwrap();
    if group_walk {
        let procs = cg.group.cpu_dir.join("cgroup.procs");
        assert!(
            p.watch_group(id, &procs).unwrap(),
            "the per-process walk fell back to every task"
        );
    } else {
        p.watch(id).unwrap();
    }
    std::thread::sleep(Duration::from_millis(1500));
    let t = p.runq_totals(id).expect("histogram");
    drop(s);
    p.unwatch(id).unwrap();
    assert!(
        t.count > 0,
        "no run-queue wait was recorded for tasks that were in the group before the watch: {t:?}"
    );
}
