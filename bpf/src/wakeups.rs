//! Wake-up edges of watched threads, read from the kernel's `wake_edges`
//! map (see `bpf/wakeups.bpf.h`): one per (wakee cgroup, wakee, waker, kind
//! of waker), cumulative since the edge was created.

use libbpf_rs::{MapCore, MapFlags};

use crate::runq::RUNQ_SLOTS;
use crate::skel::types::{tw_wake_edge, tw_wake_key};

/// Who woke the thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WakerKind {
    /// A thread of the wakee's own watched cgroup.
    Same,
    /// A thread of another watched cgroup.
    Other,
    /// Any other thread of the host.
    Host,
    /// A hard or soft interrupt (no thread).
    Interrupt,
}

impl WakerKind {
    fn from_abi(v: u32) -> Option<WakerKind> {
        Some(match v {
            1 => WakerKind::Same,
            2 => WakerKind::Other,
            3 => WakerKind::Host,
            4 => WakerKind::Interrupt,
            _ => return None,
        })
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            WakerKind::Same => "same",
            WakerKind::Other => "other",
            WakerKind::Host => "host",
            WakerKind::Interrupt => "interrupt",
        }
    }
}

/// The identity of an edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WakeKey {
    pub cgroup_id: u64,
    pub wakee_tid: u32,
    pub waker_tid: u32,
    pub waker_tgid: u32,
    pub kind: WakerKind,
}

/// One edge's cumulative figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WakeEdgeTotals {
    pub key: WakeKey,
    pub wakee_tgid: u32,
    pub waker_cgroup_id: u64,
    pub waker_comm: String,
    pub wakee_comm: String,
    /// Wakeups that ended in a switch-in, and their wake -> run times.
    pub count: u64,
    pub wait_ns: u64,
    pub max_ns: u64,
    /// The longest wait since the last `ThrottleProbe::next_runq_interval`.
    pub interval_max_ns: u64,
    /// Freezes in the work these wakeups started, their time, and the
    /// wakeups that saw one.
    pub freezes: u64,
    pub frozen_ns: u64,
    pub frozen_hops: u64,
    /// log2 ns of the wake -> run times.
    pub slots: [u64; RUNQ_SLOTS],
}

fn comm(c: &[std::ffi::c_char]) -> String {
    let b: Vec<u8> = c
        .iter()
        .take_while(|&&x| x != 0)
        .map(|&x| x as u8)
        .collect();
    String::from_utf8_lossy(&b).into_owned()
}

fn decode(k: &[u8], v: &[u8], epoch: u64) -> Option<WakeEdgeTotals> {
    if k.len() < std::mem::size_of::<tw_wake_key>() || v.len() < std::mem::size_of::<tw_wake_edge>()
    {
        return None;
    }
    // SAFETY: lengths checked; both are plain old data.
    let (k, v): (tw_wake_key, tw_wake_edge) = unsafe {
        (
            std::ptr::read_unaligned(k.as_ptr().cast()),
            std::ptr::read_unaligned(v.as_ptr().cast()),
        )
    };
    Some(WakeEdgeTotals {
        key: WakeKey {
            cgroup_id: k.cgroup_id,
            wakee_tid: k.wakee_tid,
            waker_tid: k.waker_tid,
            waker_tgid: k.waker_tgid,
            kind: WakerKind::from_abi(k.kind)?,
        },
        wakee_tgid: v.wakee_tgid,
        waker_cgroup_id: v.waker_cgroup_id,
        waker_comm: comm(&v.waker_comm),
        wakee_comm: comm(&v.wakee_comm),
        count: v.count,
        wait_ns: v.wait_ns,
        max_ns: v.max_ns,
        interval_max_ns: if v.epoch == epoch { v.epoch_max_ns } else { 0 },
        freezes: v.freezes,
        frozen_ns: v.frozen_ns,
        frozen_hops: v.frozen_hops,
        slots: v.slots,
    })
}

/// Every edge in the map (a syscall per entry; the map holds at most
/// its `max_entries`, 4096).
pub(crate) fn read_all(map: &impl MapCore, epoch: u64) -> Vec<WakeEdgeTotals> {
    map.keys()
        .filter_map(|k| {
            let v = map.lookup(&k, MapFlags::ANY).ok()??;
            decode(&k, &v, epoch)
        })
        .collect()
}

/// Remove the edges `drop` says to (those of an unwatched cgroup, or idle ones).
pub(crate) fn remove(map: &impl MapCore, drop: impl Fn(&WakeKey) -> bool) -> usize {
    let doomed: Vec<Vec<u8>> = map
        .keys()
        .filter(|k| {
            k.len() >= std::mem::size_of::<tw_wake_key>() && {
                // SAFETY: length checked; plain old data.
                let key: tw_wake_key = unsafe { std::ptr::read_unaligned(k.as_ptr().cast()) };
                WakerKind::from_abi(key.kind).is_none_or(|kind| {
                    drop(&WakeKey {
                        cgroup_id: key.cgroup_id,
                        wakee_tid: key.wakee_tid,
                        waker_tid: key.waker_tid,
                        waker_tgid: key.waker_tgid,
                        kind,
                    })
                })
            }
        })
        .collect();
    doomed.iter().filter(|k| map.delete(k).is_ok()).count()
}

/// Where the per-CPU preempt count lies from the per-CPU run-queue, in
/// bytes, from the kernel's BTF (`.data..percpu`'s `__preempt_count` and
/// `runqueues`); None where either is missing (not x86, no BTF).
pub(crate) fn preempt_count_from_rq() -> Option<i64> {
    use libbpf_rs::btf::types::{DataSec, Var};
    use libbpf_rs::btf::Btf;

    let btf = Btf::from_vmlinux().ok()?;
    let sec: DataSec<'_> = btf.type_by_name(".data..percpu")?;
    let (mut pc, mut rq) = (None, None);
    for v in sec.iter() {
        let Some(var) = btf.type_by_id::<Var<'_>>(v.ty) else {
            continue;
        };
        match var.name().and_then(|n| n.to_str()) {
            Some("__preempt_count") => pc = Some(i64::from(v.offset)),
            Some("runqueues") => rq = Some(i64::from(v.offset)),
            _ => {}
        }
    }
    Some(pc? - rq?)
}
