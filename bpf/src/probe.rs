//! Loading, attaching and reading the throttle probe.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};

use libbpf_rs::{Link, MapCore, MapFlags, RingBuffer};

use crate::event::{Event, ProbeStage};

mod coldstart;
use crate::load;
use crate::runq::RunqTotals;
use crate::skel::types::{tw_bandwidth, tw_runq};
use crate::skel::ThrottleSkel;

/// The `coldstarts` map's value is a `tw_coldstart` behind a `bpf_spin_lock`
/// and its padding (struct tw_coldstart_locked in coldstart.bpf.h).
const COLDSTART_LOCK_BYTES: usize = 8;

pub use crate::episodes::EpisodeTotals;
use crate::episodes::{episode_key, read_episode};
pub use crate::options::{
    ProbeError, ProbeKind, ProbeOptions, ThrottleModel, ENV_PROBE_EPISODES, ENV_PROBE_SKIP,
};

/// Slots of the `map_full` array: `enum tw_map_full` of throttle.h.
const MAP_FULL_EPISODES: u32 = 0;
const MAP_FULL_FROZEN_BY_TID: u32 = 1;
const MAP_FULL_BANDWIDTH_TIMERS: u32 = 2;

/// Inserts refused by a full map, per map (node-wide, cumulative).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MapFullCounts {
    /// `episodes`: a (cgroup, CPU) episode that was not counted.
    pub episodes: u64,
    /// `frozen_by_tid` (LRU): a thread's freeze that was not recorded.
    pub frozen_by_tid: u64,
    /// `bandwidth_timers` (LRU): a throttled group whose timers were not followed.
    pub bandwidth_timers: u64,
}

/// A group's CFS bandwidth counters from the kernel's own struct (what its
/// `cpu.stat` prints), as [`ThrottleProbe::exit_bandwidth`] keeps them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExitBandwidth {
    pub throttled_ns: u64,
    pub nr_periods: u64,
    pub nr_throttled: u64,
    pub nr_bursts: u64,
    pub burst_ns: u64,
}

pub struct ThrottleProbe {
    skel: ThrottleSkel<'static>,
    fentry: Option<crate::fentry::FentryProbe>,
    fentry_error: Option<String>,
    rb: RingBuffer<'static>,
    queue: load::EventQueue,
    _links: Vec<Link>,
    model: ThrottleModel,
    kind: ProbeKind,
    ncpus: u32,
    /// Run-queue latency and cold start loaded (tp_btf only).
    runq: Option<RunqControl>,
    /// Why they are not, when they are not.
    runq_error: Option<String>,
}

/// User space's side of the run-queue / cold-start counters in .bss.
struct RunqControl {
    bss: *mut crate::skel::types::bss,
    /// The task iterator that gives tasks already in a watched group their
    /// task storage (see `watch`).
    iter: Link,
    /// Cold starts armed and not finished (their count gates the kernel side).
    armed: RefCell<BTreeSet<u64>>,
    /// The cgroups in the watch map (their count gates the kernel side;
    /// kept here: counting the map's keys is a syscall per watched group).
    watched: RefCell<BTreeSet<u64>>,
}

impl RunqControl {
    fn counter(&self, f: impl FnOnce(*mut crate::skel::types::bss) -> *mut u64) -> &AtomicU64 {
        // SAFETY: the .bss map is mmapped for the life of the skeleton, which
        // the probe owns; the kernel updates the same words with atomics.
        unsafe { AtomicU64::from_ptr(f(self.bss)) }
    }
}

impl ThrottleProbe {
    pub fn load(opts: &ProbeOptions) -> Result<ThrottleProbe, ProbeError> {
        let opts = &opts.with_env_skips()?;
        load::route_libbpf_messages();
        load::bump_memlock();
        let mut l = load::load(opts)?;
        let model = load::model(&l)?;
        let links = load::attach(&mut l, model, opts)?;
        let runq = match (&l.runq_error, l.skel.maps.bss_data.as_deref_mut()) {
            (None, Some(bss)) => Some(RunqControl {
                bss: bss as *mut crate::skel::types::bss,
                iter: l.skel.progs.tw_iter_watched.attach().map_err(|source| {
                    ProbeError::Attach {
                        prog: "runq (task iterator)",
                        source,
                    }
                })?,
                armed: RefCell::default(),
                watched: RefCell::default(),
            }),
            (why, _) => {
                let why = why.as_deref().unwrap_or("no .bss");
                tracing::info!("run-queue latency and cold start unavailable: {why}");
                None
            }
        };
        let (rb, queue) = load::ring_buffer(&l.skel)?;
        let (fentry, fentry_error) = if opts.no_fentry {
            (None, Some("disabled".to_string()))
        } else {
            match crate::fentry::FentryProbe::load(&l.skel.maps.watched) {
                Ok(f) => (Some(f), None),
                Err(e) => {
                    tracing::info!("optional fentry view not loaded: {e}");
                    (None, Some(e.to_string()))
                }
            }
        };
        Ok(ThrottleProbe {
            skel: l.skel,
            fentry,
            fentry_error,
            rb,
            queue,
            _links: links,
            model,
            kind: l.kind,
            ncpus: libbpf_rs::num_possible_cpus().unwrap_or(1) as u32,
            runq,
            runq_error: l.runq_error,
        })
    }

    pub fn model(&self) -> ThrottleModel {
        self.model
    }

    pub fn kind(&self) -> ProbeKind {
        self.kind
    }

    /// What is attached, for the log's `start` record: "tp_btf", or
    /// "tp_btf+fentry" when the optional fentry view loaded too.
    pub fn description(&self) -> String {
        match self.fentry {
            Some(_) => format!("{}+fentry", self.kind.as_str()),
            None => self.kind.as_str().to_string(),
        }
    }

    /// Why the fentry view is not there (None when it is).
    pub fn fentry_error(&self) -> Option<&str> {
        self.fentry_error.as_deref()
    }

    /// Episode totals from fexit(throttle_cfs_rq)/fentry(unthrottle_cfs_rq), where loaded.
    pub fn fentry_totals(&self, cgroup_id: u64) -> Option<EpisodeTotals> {
        self.fentry
            .as_ref()
            .map(|f| f.totals(cgroup_id, self.ncpus))
    }

    /// Start producing events for a cgroup (cpu-controller kernfs id).
    pub fn watch(&self, cgroup_id: u64) -> Result<(), ProbeError> {
        self.watch_tasks(cgroup_id, None).map(|_| ())
    }

    /// [`ThrottleProbe::watch`], giving task storage only to the threads of
    /// the processes listed in `procs` (the group's `cgroup.procs`, read
    /// after the group is in the watch map: tasks that enter later get it at
    /// fork, exec or attach) instead of walking every task on the node.
    /// Returns whether the group's processes alone were walked (false: the
    /// per-process walk failed, every task was walked instead).
    pub fn watch_group(&self, cgroup_id: u64, procs: &std::path::Path) -> Result<bool, ProbeError> {
        self.watch_tasks(cgroup_id, Some(procs))
    }

    fn watch_tasks(
        &self,
        cgroup_id: u64,
        procs: Option<&std::path::Path>,
    ) -> Result<bool, ProbeError> {
        if self.runq.is_some() {
            // The histogram first: the kernel only looks it up.
            let zero = vec![0u8; std::mem::size_of::<tw_runq>()];
            let values = vec![zero; self.ncpus as usize];
            self.skel
                .maps
                .runq_hist
                .update_percpu(&cgroup_id.to_ne_bytes(), &values, MapFlags::ANY)
                .map_err(ProbeError::Map)?;
        }
        self.skel
            .maps
            .watched
            .update(&cgroup_id.to_ne_bytes(), &1u32.to_ne_bytes(), MapFlags::ANY)
            .map_err(ProbeError::Map)?;
        if let Some(r) = &self.runq {
            r.watched.borrow_mut().insert(cgroup_id);
            // A fresh clock offset before the group's next timer run, which
            // may open an episode at the kernel's throttle stamp from before
            // this watch (dequeue.bpf.h): the next switch on any CPU learns
            // it again.
            r.counter(|b| unsafe { (&raw mut (*b).clock_offset).cast::<u64>() })
                .store(0, Ordering::SeqCst);
        }
        self.sync_watch_counters();
        if let Some(r) = &self.runq {
            // Tasks already in the group get their task storage here, in
            // this process's context: the scheduler-side programs only look
            // it up (creating it under the run-queue lock can deadlock
            // kernels before 6.4); new tasks get it at fork, exec or attach.
            // The group's processes only where that works, else every task.
            let prog = self.skel.progs.tw_iter_watched.as_fd();
            let group_walked = procs.is_some_and(|f| {
                crate::task_iter::run_for_group(prog, f)
                    .inspect_err(|e| {
                        tracing::debug!(
                            "task iterator over {}: {e}; walking every task",
                            f.display()
                        )
                    })
                    .is_ok()
            });
            if group_walked {
                return Ok(true);
            }
            let mut it = libbpf_rs::Iter::new(&r.iter).map_err(ProbeError::Map)?;
            std::io::copy(&mut it, &mut std::io::sink())
                .map_err(|e| ProbeError::Map(libbpf_rs::Error::from(e)))?;
        }
        Ok(false)
    }

    /// Stop watching and forget the group's episode state.
    pub fn unwatch(&self, cgroup_id: u64) -> Result<(), ProbeError> {
        let _ = self.skel.maps.watched.delete(&cgroup_id.to_ne_bytes());
        for cpu in 0..self.ncpus {
            let _ = self
                .skel
                .maps
                .episodes
                .delete(episode_key(cgroup_id, cpu).as_slice());
        }
        if let Some(f) = &self.fentry {
            f.forget(cgroup_id, self.ncpus);
        }
        if let Some(r) = &self.runq {
            r.watched.borrow_mut().remove(&cgroup_id);
            self.cold_start_finished(cgroup_id);
            self.sync_watch_counters();
            let _ = self.skel.maps.runq_hist.delete(&cgroup_id.to_ne_bytes());
            self.remove_wake_edges(|k| k.cgroup_id == cgroup_id);
            let _ = self
                .skel
                .maps
                .exit_bandwidth
                .delete(&cgroup_id.to_ne_bytes());
        }
        Ok(())
    }

    /// Tell the kernel side how many cgroups are watched, and that cached
    /// "is this task watched" answers are stale.
    fn sync_watch_counters(&self) {
        if let Some(r) = &self.runq {
            let n = r.watched.borrow().len();
            r.counter(|b| unsafe { &raw mut (*b).nr_watched })
                .store(n as u64, Ordering::SeqCst);
            r.counter(|b| unsafe { &raw mut (*b).watch_gen })
                .fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Whether run-queue latency and cold start are measured (tp_btf only).
    pub fn runq_available(&self) -> bool {
        self.runq.is_some()
    }

    /// Why run-queue latency is not measured (None when it is).
    pub fn runq_error(&self) -> Option<&str> {
        match &self.runq {
            Some(_) => None,
            None => Some(self.runq_error.as_deref().unwrap_or("unavailable")),
        }
    }

    /// Run-queue totals of a watched cgroup, summed over CPUs; None when
    /// unavailable. `interval_max_ns` covers the current interval.
    pub fn runq_totals(&self, cgroup_id: u64) -> Option<RunqTotals> {
        let r = self.runq.as_ref()?;
        let epoch = r
            .counter(|b| unsafe { &raw mut (*b).runq_epoch })
            .load(Ordering::SeqCst);
        let vals = self
            .skel
            .maps
            .runq_hist
            .lookup_percpu(&cgroup_id.to_ne_bytes(), MapFlags::ANY)
            .ok()??;
        let mut t = RunqTotals::default();
        for v in vals {
            if v.len() >= std::mem::size_of::<tw_runq>() {
                // SAFETY: length checked; tw_runq is plain old data.
                let h: tw_runq = unsafe { std::ptr::read_unaligned(v.as_ptr().cast()) };
                t.add_cpu(&h, epoch);
            }
        }
        Some(t)
    }

    /// Every watched cgroup's wake-up edges (none without the run-queue part).
    pub fn wake_edges(&self) -> Vec<crate::wakeups::WakeEdgeTotals> {
        let Some(r) = self.runq.as_ref() else {
            return Vec::new();
        };
        let epoch = r
            .counter(|b| unsafe { &raw mut (*b).runq_epoch })
            .load(Ordering::SeqCst);
        crate::wakeups::read_all(&self.skel.maps.wake_edges, epoch)
    }

    /// Remove the wake-up edges `drop` names; how many went.
    pub fn remove_wake_edges(&self, drop: impl Fn(&crate::wakeups::WakeKey) -> bool) -> usize {
        crate::wakeups::remove(&self.skel.maps.wake_edges, drop)
    }

    /// Start a new interval for `RunqTotals::interval_max_ns`.
    pub fn next_runq_interval(&self) {
        if let Some(r) = &self.runq {
            r.counter(|b| unsafe { &raw mut (*b).runq_epoch })
                .fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The watch map's entries, counted in the kernel (a syscall per entry).
    pub fn watched_count(&self) -> usize {
        self.skel.maps.watched.keys().count()
    }

    /// Drain what the kernel has queued; returns the events in order.
    pub fn poll(&mut self) -> Vec<Event> {
        let _ = self.rb.consume();
        let mut events = std::mem::take(&mut *self.queue.borrow_mut());
        for ev in events.iter_mut() {
            if let Event::ColdStart(c) = ev {
                if c.stage == ProbeStage::Cpu {
                    c.split = self.cold_start_split(c.cgroup_id);
                }
            }
        }
        events
    }

    /// Inserts the kernel side's maps refused because they were full,
    /// node-wide since load (the `map_full` per-CPU array, summed).
    pub fn map_full(&self) -> MapFullCounts {
        let slot = |i: u32| -> u64 {
            match self
                .skel
                .maps
                .map_full
                .lookup_percpu(&i.to_ne_bytes(), MapFlags::ANY)
            {
                Ok(Some(per_cpu)) => per_cpu
                    .iter()
                    .filter_map(|v| v.get(..8))
                    .map(|b| u64::from_ne_bytes(b.try_into().unwrap_or([0; 8])))
                    .sum(),
                _ => 0,
            }
        };
        MapFullCounts {
            episodes: slot(MAP_FULL_EPISODES),
            frozen_by_tid: slot(MAP_FULL_FROZEN_BY_TID),
            bandwidth_timers: slot(MAP_FULL_BANDWIDTH_TIMERS),
        }
    }

    /// Events the kernel could not put in the ring buffer, node-wide.
    pub fn lost_events(&self) -> u64 {
        self.skel
            .maps
            .bss_data
            .as_deref()
            .map(|b| b.lost_events)
            .unwrap_or(0)
    }

    /// The bandwidth timers' callbacks (period, slack) the kernel side
    /// learnt from the first switches (both models: a group throttled
    /// before it was watched is found by its timer's runs); (0, 0) before.
    pub fn bandwidth_timer_callbacks(&self) -> (u64, u64) {
        self.skel
            .maps
            .bss_data
            .as_deref()
            .map(|b| (b.period_timer_fn, b.slack_timer_fn))
            .unwrap_or((0, 0))
    }

    /// The group's CFS bandwidth counters as the kernel had them when its
    /// last task so far exited (tp_btf probe only): its `cpu.stat`, for a
    /// group the runtime removed before anyone could read that file.
    pub fn exit_bandwidth(&self, cgroup_id: u64) -> Option<ExitBandwidth> {
        self.runq.as_ref()?;
        let v = self
            .skel
            .maps
            .exit_bandwidth
            .lookup(&cgroup_id.to_ne_bytes(), MapFlags::ANY)
            .ok()??;
        if v.len() < std::mem::size_of::<tw_bandwidth>() {
            return None;
        }
        // SAFETY: length checked; tw_bandwidth is plain old data.
        let b: tw_bandwidth = unsafe { std::ptr::read_unaligned(v.as_ptr().cast()) };
        Some(ExitBandwidth {
            throttled_ns: b.throttled_time,
            nr_periods: b.nr_periods.into(),
            nr_throttled: b.nr_throttled.into(),
            nr_bursts: b.nr_burst.into(),
            burst_ns: b.burst_time,
        })
    }

    /// The kernel-side episode totals of a cgroup, summed over CPUs. They do
    /// not depend on the ring buffer, so they hold when events were lost.
    pub fn episode_totals(&self, cgroup_id: u64) -> EpisodeTotals {
        let mut t = EpisodeTotals::default();
        for cpu in 0..self.ncpus {
            let Ok(Some(v)) = self
                .skel
                .maps
                .episodes
                .lookup(episode_key(cgroup_id, cpu).as_slice(), MapFlags::ANY)
            else {
                continue;
            };
            let Some(e) = read_episode(&v) else { continue };
            t.total_ns += e.total_ns;
            t.count += e.count;
            t.open += u32::from(e.open_ns != 0);
        }
        t
    }
}
