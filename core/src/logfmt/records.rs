//! The log's records: one `Line` per JSON line, its `Record` by type, and
//! the types each record holds (docs/log-format.md).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::control::Control;
use super::gpu::GpuSample;
use super::wakeups::Wakeups;
/// Bumped on any incompatible change; additions of fields keep the version.
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Line {
    pub v: u32,
    /// Wall-clock time the record was written, Unix epoch nanoseconds.
    pub ts: u64,
    #[serde(flatten)]
    pub record: Record,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Record {
    Start(Start),
    /// The agent restarted while the container ran; the log continues.
    Resume(Resume),
    Throttle(Throttle),
    /// A process first seen frozen: its parent, executable and command line.
    Process(Process),
    /// Freezes of one thread over one snapshot interval that the log's byte
    /// budget did not take as `throttle` records.
    ThrottleSummary(ThrottleSummary),
    CpuStat(CpuStatSnapshot),
    /// Run-queue latency over the last snapshot interval.
    Runq(Runq),
    /// The container's cold-start timeline.
    ColdStart(ColdStart),
    /// The dynamic CPU controller changed the container's bandwidth.
    Control(Control),
    End(End),
}

/// Run-queue latency of the watched threads: wakeup or preemption (switched
/// out runnable, not throttled) until the next switch-in. Waits that ended in
/// a thaw are freezes and only counted in `excluded_thaws`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Runq {
    /// The interval covered (the whole watch in `end`).
    pub interval_ns: u64,
    pub count: u64,
    pub total_ns: u64,
    /// From the kernel's log2 histogram (interpolated in the bucket, at most `max_ns`); null without waits.
    pub p50_ns: Option<u64>,
    pub p99_ns: Option<u64>,
    pub max_ns: u64,
    /// A watched thread switched out runnable, by a task of the same
    /// container, of another watched container, or of the host.
    pub preempted_by_same: u64,
    pub preempted_by_other: u64,
    pub preempted_by_host: u64,
    pub excluded_thaws: u64,
    /// Who woke the threads and what each hop cost (tp_btf probe; absent
    /// in a span without wake-ups).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wakeups: Option<Wakeups>,
}

/// One stage of a cold start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColdStartStage {
    /// `create`, `init`, `hook`, `exec`, `first_run`, `cpu`.
    pub stage: String,
    pub unix_ns: u64,
    /// unix_ns - the `create` stage's (null when create is not known).
    pub since_create_ns: Option<i64>,
}

/// From the runtime's create to the entrypoint's first `cpu_target_ns` of CPU.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColdStart {
    /// The entrypoint process (the exec'd tgid) and its name after exec.
    pub pid: Option<u32>,
    pub comm: String,
    pub cpu_target_ns: u64,
    /// Stages known, in the order above; missing ones are left out.
    pub stages: Vec<ColdStartStage>,
    /// All six stages were seen.
    pub complete: bool,
    /// Why it is incomplete (e.g. "entrypoint used less CPU than the target").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The time from `exec` to `cpu` by what the entrypoint's threads did
    /// (absent when the kernel part could not tell).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec_to_cpu: Option<ColdStartSplit>,
}

/// A cold start's time to its CPU target, one state at a time by precedence:
/// a thread of the entrypoint ran; else one was frozen by the quota; else one
/// waited on a run-queue; else all were blocked (sleep, I/O, join). Sums to
/// the `cpu` stage's time after `exec`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColdStartSplit {
    pub running_ns: u64,
    pub runq_ns: u64,
    pub frozen_ns: u64,
    pub blocked_ns: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Start {
    pub container_id: String,
    pub container_name: String,
    pub pid: Option<u32>,
    pub cgroup_path: String,
    pub cgroup_id: u64,
    pub cgroup_mode: String,
    pub quota_us: Option<u64>,
    pub period_us: u64,
    pub burst_us: Option<u64>,
    pub cpus: Option<String>,
    pub mems: Option<String>,
    pub kernel_release: String,
    /// "task" (Linux >= 6.18) or "runqueue" (older kernels).
    pub throttle_model: String,
    /// "tp_btf", "raw_tp" or "fentry".
    pub probe: String,
    pub threshold_ns: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// QoS settings applied from annotations, with what was refused and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<serde_json::Value>,
    /// The machine's NUMA nodes and GPUs and the container's GPUs, on
    /// machines with more than one node or any GPU (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<StartTopology>,
    /// The ancestors with a CFS quota of their own, nearest first (a
    /// kubelet pod cgroup: the sum of its containers' limits). They
    /// throttle the container too; a `throttle` record's
    /// `throttled_cgroup_id` says which level froze it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limits_above: Vec<LimitAbove>,
}

/// A process of the container, written once, when its first thread is
/// first seen frozen (`/proc/<pid>` then; absent fields: it had exited).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Process {
    pub pid: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ppid: Option<u32>,
    /// `/proc/<pid>/exe` (the path in the container's mount namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exe: Option<String>,
    /// Arguments joined by spaces, at most 256 bytes (`…` when cut); absent
    /// when `log_cmdline = false`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmdline: Option<String>,
}

/// An ancestor's CFS limit, as the kernel had it at the start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitAbove {
    pub cgroup_path: String,
    pub cgroup_id: u64,
    pub quota_us: u64,
    pub period_us: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst_us: Option<u64>,
}

/// Where the container could run: NUMA nodes with their CPUs, NVIDIA GPUs
/// with their node, and the GPUs the container sees.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartTopology {
    pub nodes: Vec<TopologyNode>,
    pub gpus: Vec<TopologyGpu>,
    /// Indices into `gpus` (NVIDIA_VISIBLE_DEVICES of the container's process).
    pub container_gpus: Vec<usize>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopologyNode {
    pub id: u32,
    /// CPU list, e.g. `0-23,48-71` (empty: a memory-only node).
    pub cpus: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopologyGpu {
    pub index: usize,
    /// None when the kernel does not know it (-1).
    pub numa_node: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Resume {
    pub container_id: String,
    pub cgroup_id: u64,
    pub probe: String,
    /// The kernel's throttled time while no agent watched (not in the
    /// probe's totals; the `end` deltas still start from the original `start`).
    pub unwatched_throttled_ns: u64,
    pub note: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Throttle {
    pub tid: u32,
    pub pid: u32,
    pub comm: String,
    /// CPU the thread was frozen on, and the one it came back on.
    pub cpu: u32,
    pub cpu_in: u32,
    /// Wall-clock start of the freeze, Unix epoch nanoseconds.
    pub start_ns: u64,
    pub frozen_ns: u64,
    pub cgroup_id: u64,
    pub throttled_cgroup_id: u64,
    pub throttled_level: u32,
    /// Dequeue model: waiting on the run-queue when the group was throttled
    /// (never switched out throttled); absent (false) otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub queued: bool,
}

/// Freezes folded past the byte budget: one thread (or, with `tid` 0, the
/// `threads` the budget left no line for) over one snapshot interval.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThrottleSummary {
    /// 0: several threads folded together (`threads` says how many).
    pub tid: u32,
    pub pid: u32,
    pub comm: String,
    pub cgroup_id: u64,
    /// The interval, Unix epoch nanoseconds (when it began and was written).
    pub interval_start_ns: u64,
    pub interval_end_ns: u64,
    pub threads: u64,
    pub freezes: u64,
    pub frozen_ns: u64,
    pub max_frozen_ns: u64,
    /// Of `freezes`, those waiting on the run-queue (`queued` throttles).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub queued: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuStatSnapshot {
    pub nr_periods: u64,
    pub nr_throttled: u64,
    pub throttled_ns: u64,
    pub nr_bursts: u64,
    pub burst_ns: u64,
    /// `cpu.stat.local` throttled time, where the kernel has it.
    pub local_throttled_ns: Option<u64>,
    /// The probe's episode total so far.
    pub probe_throttled_ns: u64,
    /// The container's GPUs sampled since the last `cpu_stat` (logfmt::gpu).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu: Vec<GpuSample>,
    /// GPU samples left out so far, past the log's cap.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gpu_samples_dropped: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadSummary {
    pub tid: u32,
    pub comm: String,
    pub count: u64,
    pub total_frozen_ns: u64,
    pub max_frozen_ns: u64,
}

/// The scheduler's per-thread figures (`/proc/<tid>/schedstat`: run time
/// and run delay) of the container's threads: those that exited while
/// watched (from the kernel at their exit) and those alive at the end.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadCpu {
    /// Threads counted.
    pub threads: u64,
    /// CPU time, summed over the threads: the container's running time.
    pub running_ns: u64,
    /// Waits on run-queues summed; the kernel's run delay includes the time
    /// frozen by the quota: `runq_ns = run_delay_ns - frozen_ns` per thread.
    pub run_delay_ns: u64,
    /// The threads with the most CPU, and those of `top_threads`.
    pub top: Vec<ThreadCpuFigures>,
}

/// One thread's CPU split: running, waiting on a run-queue, frozen.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadCpuFigures {
    pub tid: u32,
    pub comm: String,
    pub running_ns: u64,
    /// Run delay less the thread's frozen time.
    pub runq_ns: u64,
    /// Its freezes summed (all of them, under the threshold too).
    pub frozen_ns: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct End {
    pub reason: String,
    pub duration_ns: u64,
    pub exit_code: Option<i32>,
    pub top_threads: Vec<ThreadSummary>,
    /// Threads seen frozen, freezes, and their summed duration (per-thread
    /// view: exceeds the kernel's time when threads share a CPU).
    pub threads: u64,
    pub freezes: u64,
    pub frozen_ns: u64,
    /// Sum of (cgroup, CPU) throttle episodes: the kernel's view.
    pub probe_throttled_ns: u64,
    pub probe_episodes: u64,
    /// The kernel's own throttled time over the same interval.
    pub kernel_throttled_ns: u64,
    /// "cpu.stat" or "cpu.stat.local" (throttling from an ancestor).
    pub kernel_source: String,
    /// OOM kills in the container's memory cgroup while it was watched (the
    /// kernel's `oom_kill` count); absent when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub oom_kills: u64,
    /// Records the log could not take (a full disk: ENOSPC), counted, not written.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unwritten_records: u64,
    /// Present when the kernel counters could not be read at the end (the
    /// runtime removed the cgroup first): why, and how old the reading is
    /// that the kernel figures come from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_stale: Option<String>,
    pub nr_periods: u64,
    pub nr_throttled: u64,
    pub nr_bursts: u64,
    pub burst_ns: u64,
    /// Events the kernel could not deliver while this container was watched
    /// (node-wide ring buffer; totals above do not depend on delivery).
    pub lost_events: u64,
    /// Throttle records not written because they were under the threshold.
    pub below_threshold: u64,
    /// Freezes at or above the threshold that the log's byte budget folded
    /// into `throttle_summary` records (counted in `freezes` all the same).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub folded_freezes: u64,
    /// Parts the log was cut into past `log_max_bytes` (`<log>.1` is the newest).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rotations: u64,
    /// Kernel throttled time while no agent ran (agent restarts);
    /// probe_throttled_ns + unwatched_throttled_ns tracks kernel_throttled_ns.
    #[serde(default)]
    pub unwatched_throttled_ns: u64,
    /// The same episodes measured by fexit(throttle_cfs_rq) / fentry(unthrottle_cfs_rq),
    /// where the kernel allows fentry and the group holds its own quota.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fentry_throttled_ns: Option<u64>,
    /// Run-queue latency over the whole watch (where the probe measures it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runq: Option<Runq>,
    /// Per-thread CPU: running, run-queue wait, frozen (tp_btf probe only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_cpu: Option<ThreadCpu>,
    /// Inserts the probe's kernel maps refused because they were full while
    /// this container was watched (node-wide, like `lost_events`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub map_full: Option<MapFull>,
}

/// Failed inserts into the probe's kernel maps, per map (`end.map_full`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapFull {
    /// (cgroup, CPU) episodes not counted: `probe_throttled_ns` is short.
    pub episodes: u64,
    /// Thread freezes not recorded (`frozen_by_tid`).
    pub frozen_by_tid: u64,
    /// Throttled groups whose bandwidth timers were not followed.
    pub bandwidth_timers: u64,
}

impl MapFull {
    /// The counts since `start` (both cumulative).
    pub fn since(&self, start: &MapFull) -> MapFull {
        MapFull {
            episodes: self.episodes.saturating_sub(start.episodes),
            frozen_by_tid: self.frozen_by_tid.saturating_sub(start.frozen_by_tid),
            bandwidth_timers: self.bandwidth_timers.saturating_sub(start.bandwidth_timers),
        }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl End {
    /// Relative difference between the probe's and the kernel's throttled time.
    pub fn fidelity_error(&self) -> f64 {
        let probe = self.probe_throttled_ns + self.unwatched_throttled_ns;
        if self.kernel_throttled_ns == 0 {
            return if probe == 0 { 0.0 } else { 1.0 };
        }
        (probe as f64 - self.kernel_throttled_ns as f64).abs() / self.kernel_throttled_ns as f64
    }
}

pub fn now_unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}
