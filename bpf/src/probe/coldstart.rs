//! The cold-start part of [`ThrottleProbe`]: arming, finishing and reading
//! a container's cold start (coldstart.bpf.h).

use std::sync::atomic::Ordering;

use libbpf_rs::{MapCore, MapFlags};

use super::{ProbeError, ThrottleProbe, COLDSTART_LOCK_BYTES};
use crate::event::ExecToCpu;
use crate::skel::types::tw_coldstart;

impl ThrottleProbe {
    /// Arm a cold start: the next exec in the (watched) cgroup is its
    /// entrypoint, complete when its threads had `cpu_ns` of CPU.
    pub fn arm_cold_start(&self, cgroup_id: u64, cpu_ns: u64) -> Result<bool, ProbeError> {
        let Some(r) = &self.runq else {
            return Ok(false);
        };
        let v = tw_coldstart {
            target_ns: cpu_ns.max(1),
            ..Default::default()
        };
        let p = (&v as *const tw_coldstart).cast::<u8>();
        // The value is the struct behind its spin lock (coldstart.bpf.h).
        let mut bytes = vec![0u8; COLDSTART_LOCK_BYTES];
        // SAFETY: the bytes of a POD value.
        bytes.extend_from_slice(unsafe {
            std::slice::from_raw_parts(p, std::mem::size_of::<tw_coldstart>())
        });
        self.skel
            .maps
            .coldstarts
            .update(&cgroup_id.to_ne_bytes(), &bytes, MapFlags::ANY)
            .map_err(ProbeError::Map)?;
        let n = {
            let mut a = r.armed.borrow_mut();
            a.insert(cgroup_id);
            a.len()
        };
        r.counter(|b| unsafe { &raw mut (*b).nr_coldstart })
            .store(n as u64, Ordering::SeqCst);
        Ok(true)
    }

    /// Stop tracking a cold start (complete, timed out or unwatched).
    pub fn cold_start_finished(&self, cgroup_id: u64) {
        let Some(r) = &self.runq else { return };
        let n = {
            let mut a = r.armed.borrow_mut();
            if !a.remove(&cgroup_id) {
                return;
            }
            a.len()
        };
        r.counter(|b| unsafe { &raw mut (*b).nr_coldstart })
            .store(n as u64, Ordering::SeqCst);
        let _ = self.skel.maps.coldstarts.delete(&cgroup_id.to_ne_bytes());
    }

    /// The split of a cold start's time from the exec (final once its CPU
    /// stage was reported: the kernel no longer writes the entry).
    pub fn cold_start_split(&self, cgroup_id: u64) -> Option<ExecToCpu> {
        let v = self
            .skel
            .maps
            .coldstarts
            .lookup(&cgroup_id.to_ne_bytes(), MapFlags::ANY)
            .ok()??;
        let v = v.get(COLDSTART_LOCK_BYTES..)?;
        if v.len() < std::mem::size_of::<tw_coldstart>() {
            return None;
        }
        // SAFETY: length checked; tw_coldstart is plain old data.
        let c: tw_coldstart = unsafe { std::ptr::read_unaligned(v.as_ptr().cast()) };
        if c.exec_ns == 0 {
            return None;
        }
        Some(ExecToCpu {
            running_ns: c.running_ns,
            runq_ns: c.queued_ns,
            frozen_ns: c.frozen_ns,
            blocked_ns: c.blocked_ns,
        })
    }
}
