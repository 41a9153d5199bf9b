//! Events from the kernel, decoded from the ABI in `bpf/throttle.h`.

use crate::skel::types::tw_event;

/// `TW_ABI_VERSION` of `bpf/throttle.h` that this decoder reads; the
/// object's is checked at load.
pub const ABI_VERSION: u32 = 4;

pub const KIND_FREEZE: u32 = 1;
/// Kind 2 was a per-episode event that user space never needed (the totals
/// are in the `episodes` map); retired, never reused.
pub const KIND_COLDSTART: u32 = 3;
pub const KIND_FREEZE_QUEUED: u32 = 4;
pub const KIND_THREAD_CPU: u32 = 5;

/// One thread frozen by CFS bandwidth control.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FreezeEvent {
    pub tid: u32,
    pub tgid: u32,
    pub comm: String,
    pub cpu_out: u32,
    pub cpu_in: u32,
    /// CLOCK_MONOTONIC nanoseconds.
    pub start_ns: u64,
    pub end_ns: u64,
    /// The watched cgroup the thread belongs to.
    pub cgroup_id: u64,
    /// The thread's own cpu cgroup (may be below the watched one).
    pub task_cgroup_id: u64,
    /// The cgroup whose run-queue was throttled, and its depth.
    pub throttled_cgroup_id: u64,
    pub throttled_level: u32,
    /// Dequeue model (before 6.18): the thread was waiting on the run-queue
    /// when its group was throttled, not switched out throttled; the freeze
    /// is the part of its wait the throttle episode covered.
    pub queued: bool,
}

impl FreezeEvent {
    pub fn frozen_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

/// A cold-start stage of a watched cgroup's entrypoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColdStartStage {
    /// `sched_process_exec` of the first task in the cgroup after it was armed.
    Exec,
    /// The moment the entrypoint and the threads and processes it started
    /// had the armed amount of CPU between them since the exec. (Stage 2,
    /// the first switch-in after the exec, is retired: the exec'ing thread
    /// runs from its exec on.)
    Cpu,
}

/// The time from the exec to the CPU target, by what the entrypoint's
/// threads were doing (one state at a time, by precedence: one ran; else
/// one was frozen by the quota; else one waited on a run-queue; else all
/// were blocked). The four sum to the time to the target.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ColdStartSplit {
    pub running_ns: u64,
    pub runq_ns: u64,
    pub frozen_ns: u64,
    pub blocked_ns: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColdStartEvent {
    pub cgroup_id: u64,
    pub stage: ColdStartStage,
    pub tid: u32,
    pub tgid: u32,
    pub comm: String,
    /// CLOCK_MONOTONIC ns of the stage.
    pub at_ns: u64,
    /// Exec: the process's creation (task start_time, CLOCK_MONOTONIC);
    /// other stages: the exec.
    pub ref_ns: u64,
    /// Cpu: the split of exec..at_ns (filled by `ThrottleProbe::poll` from
    /// the `coldstarts` map; None where it could not be read).
    pub split: Option<ColdStartSplit>,
}

/// What the scheduler counted for a thread of a watched cgroup that exited
/// (its `/proc/<tid>/schedstat`, which goes with it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadCpuEvent {
    pub cgroup_id: u64,
    pub tid: u32,
    pub tgid: u32,
    pub comm: String,
    /// CPU time (`se.sum_exec_runtime`), ns.
    pub running_ns: u64,
    /// Waits on run-queues (`sched_info.run_delay`, frozen time included), ns.
    pub run_delay_ns: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Freeze(FreezeEvent),
    ColdStart(ColdStartEvent),
    ThreadCpu(ThreadCpuEvent),
}

impl Event {
    /// The watched cgroup the event is about.
    pub fn cgroup_id(&self) -> u64 {
        match self {
            Event::Freeze(f) => f.cgroup_id,
            Event::ColdStart(c) => c.cgroup_id,
            Event::ThreadCpu(t) => t.cgroup_id,
        }
    }
}

impl Event {
    /// Decode one ring-buffer record; None for a record of the wrong size or kind.
    pub fn decode(data: &[u8]) -> Option<Event> {
        if data.len() < std::mem::size_of::<tw_event>() {
            return None;
        }
        // SAFETY: tw_event is plain old data and the length was checked; the
        // ring buffer only aligns to 8 bytes, so read unaligned.
        let e: tw_event = unsafe { std::ptr::read_unaligned(data.as_ptr().cast()) };
        let comm: Vec<u8> = e
            .comm
            .iter()
            .take_while(|c| **c != 0)
            .map(|c| *c as u8)
            .collect();
        match e.kind {
            KIND_FREEZE | KIND_FREEZE_QUEUED => Some(Event::Freeze(FreezeEvent {
                tid: e.tid,
                tgid: e.tgid,
                comm: String::from_utf8_lossy(&comm).into_owned(),
                cpu_out: e.cpu_out,
                cpu_in: e.cpu_in,
                start_ns: e.start_ns,
                end_ns: e.end_ns,
                cgroup_id: e.cgroup_id,
                task_cgroup_id: e.task_cgroup_id,
                throttled_cgroup_id: e.throttled_cgroup_id,
                throttled_level: e.throttled_level,
                queued: e.kind == KIND_FREEZE_QUEUED,
            })),
            KIND_COLDSTART => {
                let stage = match e.cpu_out {
                    1 => ColdStartStage::Exec,
                    3 => ColdStartStage::Cpu,
                    _ => return None,
                };
                Some(Event::ColdStart(ColdStartEvent {
                    cgroup_id: e.cgroup_id,
                    stage,
                    tid: e.tid,
                    tgid: e.tgid,
                    comm: String::from_utf8_lossy(&comm).into_owned(),
                    at_ns: e.end_ns,
                    ref_ns: e.start_ns,
                    split: None,
                }))
            }
            KIND_THREAD_CPU => Some(Event::ThreadCpu(ThreadCpuEvent {
                cgroup_id: e.cgroup_id,
                tid: e.tid,
                tgid: e.tgid,
                comm: String::from_utf8_lossy(&comm).into_owned(),
                running_ns: e.end_ns,
                run_delay_ns: e.start_ns,
            })),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(kind: u32) -> Vec<u8> {
        let mut e = tw_event {
            kind,
            tid: 42,
            tgid: 40,
            start_ns: 1000,
            end_ns: 3500,
            cgroup_id: 7,
            cpu_out: 1,
            ..Default::default()
        };
        for (i, c) in b"worker".iter().enumerate() {
            e.comm[i] = *c as _;
        }
        let p = (&e as *const tw_event).cast::<u8>();
        // SAFETY: reading the bytes of a POD value.
        unsafe { std::slice::from_raw_parts(p, std::mem::size_of::<tw_event>()) }.to_vec()
    }

    #[test]
    fn the_decoders_abi_version_is_the_headers() {
        let h = include_str!("bpf/throttle.h");
        let v: u32 = h
            .lines()
            .find_map(|l| l.strip_prefix("#define TW_ABI_VERSION "))
            .and_then(|v| v.trim().parse().ok())
            .expect("TW_ABI_VERSION in throttle.h");
        assert_eq!(v, ABI_VERSION, "bump both together");
    }

    #[test]
    fn abi_size_is_fixed() {
        // 6 x u32 + 5 x u64 + comm[16]
        assert_eq!(std::mem::size_of::<tw_event>(), 24 + 40 + 16);
    }

    #[test]
    fn decodes_freeze() {
        let Some(Event::Freeze(f)) = Event::decode(&raw(KIND_FREEZE)) else {
            panic!()
        };
        assert_eq!(
            (f.tid, f.tgid, f.cgroup_id, f.frozen_ns()),
            (42, 40, 7, 2500)
        );
        assert_eq!(f.comm, "worker");
    }

    #[test]
    fn decodes_cold_start_and_rejects_garbage() {
        assert_eq!(Event::decode(&raw(99)), None);
        assert_eq!(Event::decode(&raw(2)), None, "the retired episode kind");
        let mut cs = raw(KIND_COLDSTART);
        cs[12] = 3; // cpu_out: the stage
        let Some(Event::ColdStart(c)) = Event::decode(&cs) else {
            panic!()
        };
        assert_eq!(
            (c.stage, c.at_ns, c.ref_ns, c.comm.as_str()),
            (ColdStartStage::Cpu, 3500, 1000, "worker")
        );
        cs[12] = 2; // the retired first-switch-in stage
        assert_eq!(Event::decode(&cs), None);
        let Some(Event::ThreadCpu(t)) = Event::decode(&raw(KIND_THREAD_CPU)) else {
            panic!()
        };
        assert_eq!(
            (t.tid, t.cgroup_id, t.running_ns, t.run_delay_ns),
            (42, 7, 3500, 1000)
        );
        assert_eq!(Event::decode(&[0u8; 8]), None);
    }
}
