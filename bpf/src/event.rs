//! Events from the kernel, decoded from the ABI in `bpf/throttle.h`.

use crate::skel::types::{
    tw_coldstart_event, tw_event_header, tw_freeze_event, tw_thread_cpu_event,
};

/// `TW_ABI_VERSION` of `bpf/throttle.h` that this decoder reads; the
/// object's is checked at load.
pub const ABI_VERSION: u32 = 6;

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

/// A cold-start stage of a watched cgroup's entrypoint, as the probe sees
/// it (the log's stages, all six, are `throttlewatch_core::logfmt::ColdStartStage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeStage {
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
pub struct ExecToCpu {
    pub running_ns: u64,
    pub runq_ns: u64,
    pub frozen_ns: u64,
    pub blocked_ns: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColdStartEvent {
    pub cgroup_id: u64,
    pub stage: ProbeStage,
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
    pub split: Option<ExecToCpu>,
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

/// A record of the ABI type `T` at the start of `data`; None when `data` is
/// shorter.
fn read_record<T: Copy>(data: &[u8]) -> Option<T> {
    if data.len() < std::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: the record types are plain old data generated from
    // `throttle.h` and the length was checked; the ring buffer only aligns
    // to 8 bytes, so read unaligned.
    Some(unsafe { std::ptr::read_unaligned(data.as_ptr().cast::<T>()) })
}

fn comm(h: &tw_event_header) -> String {
    let comm: Vec<u8> = h
        .comm
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    String::from_utf8_lossy(&comm).into_owned()
}

impl Event {
    /// Decode one ring-buffer record by the kind in its header; None for a
    /// record of an unknown kind or shorter than its kind's struct.
    pub fn decode(data: &[u8]) -> Option<Event> {
        let h: tw_event_header = read_record(data)?;
        match h.kind {
            KIND_FREEZE | KIND_FREEZE_QUEUED => {
                let e: tw_freeze_event = read_record(data)?;
                Some(Event::Freeze(FreezeEvent {
                    tid: h.tid,
                    tgid: h.tgid,
                    comm: comm(&h),
                    cpu_out: e.cpu_out,
                    cpu_in: h.cpu,
                    start_ns: e.start_ns,
                    end_ns: e.end_ns,
                    cgroup_id: h.cgroup_id,
                    task_cgroup_id: e.task_cgroup_id,
                    throttled_cgroup_id: e.throttled_cgroup_id,
                    throttled_level: e.throttled_level,
                    queued: h.kind == KIND_FREEZE_QUEUED,
                }))
            }
            KIND_COLDSTART => {
                let e: tw_coldstart_event = read_record(data)?;
                let stage = match e.stage {
                    1 => ProbeStage::Exec,
                    3 => ProbeStage::Cpu,
                    _ => return None,
                };
                Some(Event::ColdStart(ColdStartEvent {
                    cgroup_id: h.cgroup_id,
                    stage,
                    tid: h.tid,
                    tgid: h.tgid,
                    comm: comm(&h),
                    at_ns: e.at_ns,
                    ref_ns: e.ref_ns,
                    split: None,
                }))
            }
            KIND_THREAD_CPU => {
                let e: tw_thread_cpu_event = read_record(data)?;
                Some(Event::ThreadCpu(ThreadCpuEvent {
                    cgroup_id: h.cgroup_id,
                    tid: h.tid,
                    tgid: h.tgid,
                    comm: comm(&h),
                    running_ns: e.running_ns,
                    run_delay_ns: e.run_delay_ns,
                }))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(kind: u32) -> tw_event_header {
        let mut h = tw_event_header {
            kind,
            tid: 42,
            tgid: 40,
            cpu: 2,
            cgroup_id: 7,
            ..Default::default()
        };
        for (i, c) in b"worker".iter().enumerate() {
            h.comm[i] = *c as _;
        }
        h
    }

    fn bytes<T>(e: &T) -> Vec<u8> {
        let p = (e as *const T).cast::<u8>();
        // SAFETY: reading the bytes of a POD value.
        unsafe { std::slice::from_raw_parts(p, std::mem::size_of::<T>()) }.to_vec()
    }

    fn freeze(kind: u32) -> Vec<u8> {
        bytes(&tw_freeze_event {
            hdr: header(kind),
            cpu_out: 1,
            throttled_level: 3,
            start_ns: 1000,
            end_ns: 3500,
            task_cgroup_id: 8,
            throttled_cgroup_id: 6,
        })
    }

    fn cold_start(stage: u32) -> Vec<u8> {
        bytes(&tw_coldstart_event {
            hdr: header(KIND_COLDSTART),
            stage,
            at_ns: 3500,
            ref_ns: 1000,
            ..Default::default()
        })
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
    fn abi_sizes_are_fixed() {
        use std::mem::size_of;
        // 4 x u32 + u64 + comm[16]
        assert_eq!(size_of::<tw_event_header>(), 16 + 8 + 16);
        assert_eq!(size_of::<tw_freeze_event>(), 40 + 8 + 4 * 8);
        assert_eq!(size_of::<tw_coldstart_event>(), 40 + 8 + 2 * 8);
        assert_eq!(size_of::<tw_thread_cpu_event>(), 40 + 2 * 8);
    }

    #[test]
    fn decodes_freeze() {
        let Some(Event::Freeze(f)) = Event::decode(&freeze(KIND_FREEZE)) else {
            panic!()
        };
        assert_eq!(
            (f.tid, f.tgid, f.cgroup_id, f.frozen_ns()),
            (42, 40, 7, 2500)
        );
        assert_eq!(
            (f.cpu_out, f.cpu_in, f.throttled_level),
            (1, 2, 3),
            "cpu_in: the header's CPU"
        );
        assert_eq!((f.task_cgroup_id, f.throttled_cgroup_id), (8, 6));
        assert_eq!(f.comm, "worker");
        assert!(!f.queued);
        let Some(Event::Freeze(q)) = Event::decode(&freeze(KIND_FREEZE_QUEUED)) else {
            panic!()
        };
        assert!(q.queued);
    }

    #[test]
    fn decodes_cold_start_and_thread_cpu_and_rejects_garbage() {
        assert_eq!(Event::decode(&freeze(99)), None);
        assert_eq!(Event::decode(&freeze(2)), None, "the retired episode kind");
        let Some(Event::ColdStart(c)) = Event::decode(&cold_start(3)) else {
            panic!()
        };
        assert_eq!(
            (c.stage, c.at_ns, c.ref_ns, c.comm.as_str()),
            (ProbeStage::Cpu, 3500, 1000, "worker")
        );
        assert_eq!(
            Event::decode(&cold_start(2)),
            None,
            "the retired first-switch-in stage"
        );
        let t = bytes(&tw_thread_cpu_event {
            hdr: header(KIND_THREAD_CPU),
            running_ns: 3500,
            run_delay_ns: 1000,
        });
        let Some(Event::ThreadCpu(t)) = Event::decode(&t) else {
            panic!()
        };
        assert_eq!(
            (t.tid, t.cgroup_id, t.running_ns, t.run_delay_ns),
            (42, 7, 3500, 1000)
        );
        assert_eq!(Event::decode(&[0u8; 8]), None);
    }

    #[test]
    fn a_record_shorter_than_its_kinds_struct_is_refused() {
        let f = freeze(KIND_FREEZE);
        assert_eq!(Event::decode(&f[..f.len() - 1]), None);
        let h = bytes(&header(KIND_THREAD_CPU));
        assert_eq!(Event::decode(&h), None, "a header alone");
    }
}
