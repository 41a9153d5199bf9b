//! The churn: a containerd 2.3.4 node with the plugin and the agent, pods
//! added and removed through `crictl`, and the three faults.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use throttlewatch_cgroup::Hierarchies;
use throttlewatch_integration::cri::{CriNode, CrictlPod};
use throttlewatch_integration::daemons::{Agent, PrivateConfig};
use throttlewatch_integration::modern_node::{containerd_2_node, logs_in};
use throttlewatch_integration::nri_plugin::{log_lines, NriDaemon};
use throttlewatch_integration::{of_type, read_log};

use super::wait_until;

/// The name the plugin registers under, as containerd's log names it.
pub const PLUGIN: &str = "10-throttlewatch";
/// Every pod opts in: a log, no QoS.
pub const WATCH: (&str, &str) = ("throttlewatch.io/watch", "true");

/// A pod made by the churn and its containers, in start order.
pub struct PodRec {
    pub pod: CrictlPod,
    pub containers: Vec<String>,
}

/// The node, its plugin and agent, and every pod made on it.
pub struct Churn<'a> {
    pub tw: &'a PrivateConfig,
    /// Fields drop in order: the plugin first, then the node (its pods
    /// removed, containerd and the shims stopped), the agent last.
    pub plugin: NriDaemon,
    pub node: CriNode,
    pub agent: Option<Agent>,
    /// containerd's NRI socket.
    socket: PathBuf,
    /// The cpu controller's mount point.
    cpu_root: PathBuf,
    /// How many times containerd has synchronized the plugin so far.
    syncs: usize,
    /// Every `every`-th pod (from the fourth) has 3 containers.
    every: usize,
    pub running: VecDeque<PodRec>,
    pub gone: Vec<PodRec>,
    /// Pods made so far.
    pub made: usize,
    /// `crictl start` of each container, the crictl process included.
    pub starts: Vec<Duration>,
    /// What each fault did, for the output.
    pub events: Vec<String>,
    /// The containers started while no agent listened: the plugin keeps
    /// their registers for the next agent, said once each in hook.log.
    pub kept_for_agent: Vec<String>,
}

/// containerd's log lines saying it closed a connection to the plugin.
fn closed(node: &CriNode) -> usize {
    log_lines(node, PLUGIN, &["connection to plugin", "closed"])
}

fn synchronized(node: &CriNode) -> usize {
    log_lines(node, PLUGIN, &["connected and synchronized"])
}

/// Whether the container `id`'s log has its `start` record.
pub fn has_start(tw: &PrivateConfig, id: &str) -> bool {
    let p = tw.log_of(id);
    p.exists() && !of_type(&read_log(&p), "start").is_empty()
}

impl<'a> Churn<'a> {
    /// The agent on `tw`, a containerd 2.3.4 node, the plugin connected and
    /// synchronized; every `every`-th pod will have 3 containers.
    pub fn start(tw: &'a PrivateConfig, every: usize) -> Churn<'a> {
        let agent = Agent::start(tw);
        let mut node = containerd_2_node(tw);
        node.start();
        let socket = node.dir.0.join("nri/nri.sock");
        wait_until("containerd's NRI socket", || socket.exists(), || node.log());
        let plugin = plugin_up(&node, tw, &socket, 1);
        Churn {
            tw,
            plugin,
            node,
            agent: Some(agent),
            socket,
            cpu_root: Hierarchies::discover().unwrap().cpu,
            syncs: 1,
            every,
            running: VecDeque::new(),
            gone: vec![],
            made: 0,
            starts: vec![],
            events: vec![],
            kept_for_agent: vec![],
        }
    }

    /// How many containers pod `i` has.
    pub fn shape(&self, i: usize) -> usize {
        if i % self.every == 3 {
            3
        } else {
            1
        }
    }

    /// One pod (`runp`), its containers created and started one by one,
    /// as kubelet does; each container's cgroup checked to be where the
    /// clean-up check looks for it.
    pub fn add_pod(&mut self) {
        let i = self.made;
        self.made += 1;
        let pod = self.node.crictl_run_pod(&format!("churn-{i}"), &[WATCH]);
        self.assert_cgroup(&pod, &pod.id);
        let mut containers = vec![];
        for k in 0..self.shape(i) {
            let (id, _) = self
                .node
                .crictl_create(&pod, &format!("c{k}"), &["sleep", "600"]);
            let (_, took) = self.node.crictl_timed(&["start", &id]);
            self.starts.push(took);
            self.assert_cgroup(&pod, &id);
            containers.push(id);
        }
        self.running.push_back(PodRec { pod, containers });
    }

    /// The cgroup of `id` (a container or the sandbox of `pod`) is where
    /// the clean-up check looks for it.
    fn assert_cgroup(&self, pod: &CrictlPod, id: &str) {
        let cg = self.node.crictl_cgroup_dir(&self.cpu_root, pod, id);
        assert!(
            cg.is_dir(),
            "{id}'s cgroup is not {}: the clean-up check would look in the wrong place",
            cg.display()
        );
    }

    pub fn add_pods(&mut self, n: usize) {
        for _ in 0..n {
            self.add_pod();
        }
    }

    /// The `n` oldest pods stopped and removed (`stopp`, `rmp`); in a pod
    /// of several containers the second is stopped and removed first, on
    /// its own (`stop`, `rm`), as a container kubelet replaces.
    pub fn remove_oldest(&mut self, n: usize) {
        for _ in 0..n {
            let Some(p) = self.running.pop_front() else {
                return;
            };
            if let Some(second) = p.containers.get(1) {
                self.node.crictl_ok(&["stop", "--timeout", "0", second]);
                self.node.crictl_ok(&["rm", second]);
            }
            self.node.crictl_ok(&["stopp", &p.pod.id]);
            self.node.crictl_ok(&["rmp", &p.pod.id]);
            self.gone.push(p);
        }
    }

    pub fn remove_all(&mut self) {
        self.remove_oldest(self.running.len());
    }

    /// Wait until every running container's log has its `start` record.
    pub fn wait_watched(&self) {
        let tw = self.tw;
        wait_until(
            "every running container's start record",
            || {
                self.running
                    .iter()
                    .flat_map(|p| &p.containers)
                    .all(|id| has_start(tw, id))
            },
            || self.seen(),
        );
    }

    /// What the plugin, the agent and the logs say, for a failure.
    pub fn seen(&self) -> String {
        let unwatched: Vec<&String> = self
            .running
            .iter()
            .flat_map(|p| &p.containers)
            .filter(|id| !has_start(self.tw, id))
            .collect();
        format!(
            "running containers without a start record: {unwatched:?}\n{} logs\nplugin:\n{}\nagent:\n{}\nhook.log:\n{}",
            logs_in(&self.tw.log_dir).len(),
            self.plugin.output(),
            self.agent.as_ref().map(Agent::output).unwrap_or_default(),
            self.tw.hook_log()
        )
    }

    /// The three faults one at a time, `k` pods removed and started around
    /// each and `k` more of each after it.
    pub fn faults(&mut self, k: usize) {
        self.kill_agent(k);
        self.churn(k);
        self.restart_plugin(k);
        self.churn(k);
        self.restart_containerd(k);
        self.churn(k);
    }

    /// `k` pods removed, `k` started, all watched.
    pub fn churn(&mut self, k: usize) {
        self.remove_oldest(k);
        self.add_pods(k);
        self.wait_watched();
    }

    /// SIGKILL the agent; `k` pods stopped and removed while it is down
    /// (the plugin cannot tell it: the restarted agent finds their cgroups
    /// gone) and `k` started (no agent listens: the plugin keeps their
    /// registers in `pending/`, which the restarted agent takes); the agent
    /// started again.
    pub fn kill_agent(&mut self, k: usize) {
        let t0 = Instant::now();
        self.agent.take().expect("an agent").kill();
        self.remove_oldest(k);
        self.add_pods(k);
        let started: Vec<String> = self
            .running
            .iter()
            .rev()
            .take(k)
            .flat_map(|p| p.containers.clone())
            .collect();
        self.kept_for_agent.extend(started);
        let kept = std::fs::read_dir(self.tw.state_dir.join("pending"))
            .map(|d| d.flatten().count())
            .unwrap_or(0);
        assert!(
            kept >= k,
            "{k} pods started with no agent, {kept} registers kept for it\n{}",
            self.seen()
        );
        let down = t0.elapsed();
        self.agent = Some(Agent::start(self.tw));
        self.events.push(format!(
            "agent SIGKILLed: {k} pods removed and {k} started while it was down ({} ms, {kept} registers kept for it), answering again {} ms after the kill",
            down.as_millis(),
            t0.elapsed().as_millis()
        ));
        self.wait_watched();
    }

    /// Stop the plugin; once containerd has seen it go, `k` pods started
    /// (no plugin: no log yet) and `k` removed (watched: no end yet); the
    /// plugin started again, whose `Synchronize` registers the first and
    /// ends the second.
    pub fn restart_plugin(&mut self, k: usize) {
        let t0 = Instant::now();
        let before = closed(&self.node);
        self.plugin.stop();
        wait_until(
            "containerd to see the plugin gone",
            || closed(&self.node) > before,
            || self.node.log(),
        );
        self.add_pods(k);
        self.remove_oldest(k);
        self.syncs += 1;
        let t1 = Instant::now();
        self.plugin = plugin_up(&self.node, self.tw, &self.socket, self.syncs);
        self.wait_watched();
        self.events.push(format!(
            "plugin restarted: {k} pods started and {k} removed while it was down ({} ms); synchronized, all watched {} ms after its start",
            (t1 - t0).as_millis(),
            t1.elapsed().as_millis()
        ));
    }

    /// Stop containerd (SIGTERM) under the running pods, SIGKILL the
    /// newest pod's first container meanwhile, and start containerd again;
    /// the plugin dials again and is synchronized; `k` pods removed at
    /// once (the Synchronize's registrations may still run) and `k` started.
    pub fn restart_containerd(&mut self, k: usize) {
        let (t0, under) = (Instant::now(), self.running.len());
        // A container whose process dies while containerd is down (an OOM
        // kill, a crash): containerd learns of it at its restart.
        let victim = self.running.back().expect("running pods").containers[0].clone();
        let pid = self
            .node
            .container_pid(&victim)
            .unwrap_or_else(|e| panic!("{e}\n{}", self.node.log()));
        self.node.stop();
        kill(Pid::from_raw(pid as i32), Signal::SIGKILL).unwrap();
        self.node.start();
        self.syncs += 1;
        let syncs = self.syncs;
        wait_until(
            "the restarted containerd to synchronize the plugin",
            || synchronized(&self.node) >= syncs,
            || {
                format!(
                    "plugin:\n{}\ncontainerd:\n{}",
                    self.plugin.output(),
                    self.node.log()
                )
            },
        );
        let synced = t0.elapsed();
        // Removed while the Synchronize's registrations may still run.
        self.remove_oldest(k);
        self.add_pods(k);
        self.wait_watched();
        let out = self.plugin.output();
        let skipped = out
            .lines()
            .filter(|l| l.contains("after it was listed"))
            .count();
        self.events.push(format!(
            "containerd restarted under {} running pods, one container's process SIGKILLed while it was down: the plugin synchronized again {} ms after the stop; {k} pods removed at once ({skipped} containers skipped by the Synchronize's registrations)",
            under,
            synced.as_millis()
        ));
    }
}

/// Start the plugin and wait until containerd has synchronized it `n` times in all.
pub fn plugin_up(
    node: &CriNode,
    tw: &PrivateConfig,
    socket: &std::path::Path,
    n: usize,
) -> NriDaemon {
    let out = node.dir.0.join(format!("nri-plugin-{n}.out"));
    let plugin = NriDaemon::start(tw, socket, out, &[]);
    wait_until(
        &format!("containerd to synchronize {PLUGIN} (time {n})"),
        || synchronized(node) >= n,
        || {
            format!(
                "plugin output:\n{}\ncontainerd log:\n{}",
                plugin.output(),
                node.log()
            )
        },
    );
    plugin
}
