//! After the churn: nothing lost, nothing duplicated, nothing left behind.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use throttlewatch_core::protocol::{call, Request};
use throttlewatch_integration::modern_node::logs_in;
use throttlewatch_integration::nri_plugin::leftovers;
use throttlewatch_integration::{of_type, read_log};

use super::churn::Churn;
use super::WAIT;

/// What the checks counted.
pub struct Summary {
    pub lifetimes: usize,
    /// `end` records by reason.
    pub reasons: BTreeMap<String, usize>,
    /// `resume` records (an agent restarted under a running container).
    pub resumes: usize,
}

impl Summary {
    pub fn line(&self) -> String {
        format!(
            "{} lifetimes, each one log with one start and one end (end reasons {:?}; {} resume records); no state, cgroup or watch entry left",
            self.lifetimes, self.reasons, self.resumes
        )
    }
}

/// Every pod of the churn is gone: check what it left.
pub fn nothing_lost(c: &Churn) -> Summary {
    assert!(c.running.is_empty(), "pods still running");
    let tw = c.tw;
    let ids: Vec<&String> = c.gone.iter().flat_map(|p| &p.containers).collect();
    let ended = |id: &str| {
        let p = tw.log_of(id);
        p.exists() && !of_type(&read_log(&p), "end").is_empty()
    };
    let t0 = Instant::now();
    while !ids.iter().all(|id| ended(id)) && t0.elapsed() < WAIT {
        std::thread::sleep(Duration::from_millis(100));
    }
    let unended: Vec<_> = ids.iter().filter(|id| !ended(id)).collect();
    assert!(
        unended.is_empty(),
        "{} of {} container lifetimes have no log with an end record after {WAIT:?}: {unended:?}\n{}",
        unended.len(),
        ids.len(),
        c.seen()
    );
    // One log per lifetime and no other: no second file for a container
    // registered again (`<id>@<scope>+<ts>.jsonl`), none for a pod sandbox.
    let mut logs = logs_in(&tw.log_dir);
    logs.sort();
    let mut want: Vec<PathBuf> = ids.iter().map(|id| tw.log_of(id)).collect();
    want.sort();
    assert_eq!(
        logs, want,
        "the log files against one per container lifetime"
    );
    let mut s = Summary {
        lifetimes: ids.len(),
        reasons: BTreeMap::new(),
        resumes: 0,
    };
    for p in &want {
        let log = read_log(p);
        let ty = |r: Option<&serde_json::Value>| r.map(|r| r["type"].clone());
        assert_eq!(
            ty(log.first()),
            Some("start".into()),
            "{}: {log:?}",
            p.display()
        );
        assert_eq!(
            ty(log.last()),
            Some("end".into()),
            "{}: {log:?}",
            p.display()
        );
        assert_eq!(of_type(&log, "start").len(), 1, "{}: {log:?}", p.display());
        let ends = of_type(&log, "end");
        assert_eq!(ends.len(), 1, "{}: {log:?}", p.display());
        let reason = ends[0]["reason"].as_str().unwrap_or("?").to_string();
        *s.reasons.entry(reason).or_default() += 1;
        s.resumes += of_type(&log, "resume").len();
    }
    assert_eq!(leftovers(tw), Vec::<PathBuf>::new(), "state left behind");
    let left = left_cgroups(c);
    assert_eq!(
        left,
        Vec::<PathBuf>::new(),
        "container or sandbox cgroups left"
    );
    let st = call(&tw.socket, &Request::Status, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("the agent's status: {e}"));
    assert_eq!(st.watched, Some(vec![]), "containers still watched");
    assert_eq!(
        st.watch_map_entries,
        Some(0),
        "entries left in the kernel's watch map"
    );
    // hook.log: one warning for each container started while no agent
    // listened (its register kept for the next agent), nothing else.
    let said = tw.hook_log();
    let other: Vec<&str> = said
        .lines()
        .filter(|l| {
            !(l.contains("its register waits in")
                && c.kept_for_agent.iter().any(|id| l.contains(id.as_str())))
        })
        .collect();
    assert_eq!(
        other,
        Vec::<&str>::new(),
        "the plugin reported problems in hook.log"
    );
    assert_eq!(
        said.lines().count(),
        c.kept_for_agent.len(),
        "one line per register kept for the agent: {said}"
    );
    s
}

/// The cgroup directories of the churn's containers and pod sandboxes
/// still there, in any controller's hierarchy (`<cgroup_root>/pod<uid>/<id>`).
fn left_cgroups(c: &Churn) -> Vec<PathBuf> {
    let hierarchies: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    let mut left = vec![];
    for p in &c.gone {
        let ids = std::iter::once(&p.pod.id).chain(&p.containers);
        for id in ids {
            for h in &hierarchies {
                let d = c.node.crictl_cgroup_dir(h, &p.pod, id);
                if d.exists() {
                    left.push(d);
                }
            }
        }
    }
    left
}
