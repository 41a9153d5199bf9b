//! Loading, attaching and reading the throttle probe.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::mem::MaybeUninit;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject, RingBuffer, RingBufferBuilder};

use crate::event::Event;
use crate::runq::RunqTotals;
use crate::skel::types::{tw_coldstart, tw_episode, tw_episode_key, tw_runq};
use crate::skel::{ThrottleSkel, ThrottleSkelBuilder};

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("loading the throttle probe: {0} (are you root, and does the kernel have BTF at /sys/kernel/btf/vmlinux?)")]
    Load(#[source] libbpf_rs::Error),
    #[error("attaching {prog}: {source}")]
    Attach {
        prog: &'static str,
        #[source]
        source: libbpf_rs::Error,
    },
    #[error("watch map: {0}")]
    Map(#[source] libbpf_rs::Error),
    #[error("{ENV_PROBE_SKIP}: unknown program group '{0}' (accepted: a comma-separated list of fentry, runq, hrtimer)")]
    Skip(String),
}

/// Leaves program groups out of the probe: `fentry` (the optional
/// fexit/fentry view), `runq` (run-queue latency and cold start), `hrtimer`
/// (the bandwidth-timer programs: dequeue-model episodes then end at the
/// switch-in). For diagnosis — the VM lane's soak uses it to tell which of
/// our programs a kernel problem needs — not for production.
pub const ENV_PROBE_SKIP: &str = "THROTTLEWATCH_PROBE_SKIP";

/// How the running kernel throttles, chosen at load time with CO-RE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThrottleModel {
    /// Linux >= 6.18: threads are frozen one by one (`task_struct.throttled`).
    Task,
    /// Older kernels: a throttled cfs_rq is dequeued whole.
    RunQueue,
}

impl ThrottleModel {
    pub fn as_str(&self) -> &'static str {
        match self {
            ThrottleModel::Task => "task",
            ThrottleModel::RunQueue => "runqueue",
        }
    }

    /// Ask the kernel's BTF: does `task_struct` have `throttled`?
    pub fn detect() -> ThrottleModel {
        let has = libbpf_rs::btf::Btf::from_vmlinux()
            .ok()
            .and_then(|btf| {
                let s = btf.type_by_name::<libbpf_rs::btf::types::Struct<'_>>("task_struct")?;
                let found = s.iter().any(|m| m.name.is_some_and(|n| n == "throttled"));
                Some(found)
            })
            .unwrap_or(false);
        if has {
            ThrottleModel::Task
        } else {
            ThrottleModel::RunQueue
        }
    }
}

/// Which program flavour is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    TpBtf,
    RawTp,
}

impl ProbeKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            ProbeKind::TpBtf => "tp_btf",
            ProbeKind::RawTp => "raw_tp",
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct ProbeOptions {
    /// Use raw_tp even where tp_btf would load (tests, old kernels).
    pub force_raw_tp: bool,
    /// Do not try the optional fentry/fexit view.
    pub no_fentry: bool,
    /// Wake the reader when this many bytes are waiting (0: never; the
    /// reader polls on a timer). Waking per event makes the reader preempt
    /// the watched threads, which then produce more events.
    pub wakeup_bytes: u32,
    /// Do not load the run-queue latency / cold-start programs.
    pub no_runq: bool,
    /// Ring buffer size in bytes (a power of two, at least a page); 0: the default 4 MiB.
    pub ringbuf_bytes: u32,
    /// Do not attach the bandwidth-timer programs (diagnosis only).
    pub no_hrtimer: bool,
    /// Cgroups watched at most: sizes the per-cgroup maps (`watched`,
    /// `runq_hist`, `coldstarts`) before load. `runq_hist` is a preallocated
    /// per-CPU hash, so its kernel memory is entries × 328 B × CPUs. 0: the
    /// object's own sizes (16384).
    pub max_watched: u32,
}

impl ProbeOptions {
    /// These options with the groups named in `THROTTLEWATCH_PROBE_SKIP` left out.
    pub fn with_env_skips(&self) -> Result<ProbeOptions, ProbeError> {
        let mut o = self.clone();
        let Some(v) = std::env::var_os(ENV_PROBE_SKIP) else {
            return Ok(o);
        };
        for w in v.to_string_lossy().split(',').map(str::trim) {
            match w {
                "" => {}
                "fentry" => o.no_fentry = true,
                "runq" => o.no_runq = true,
                "hrtimer" => o.no_hrtimer = true,
                other => return Err(ProbeError::Skip(other.to_string())),
            }
        }
        Ok(o)
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EpisodeTotals {
    pub total_ns: u64,
    pub count: u64,
    /// Episodes still open (throttled right now).
    pub open: u32,
}

pub struct ThrottleProbe {
    skel: ThrottleSkel<'static>,
    fentry: Option<crate::fentry::FentryProbe>,
    fentry_error: Option<String>,
    rb: RingBuffer<'static>,
    queue: Rc<RefCell<Vec<Event>>>,
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
}

impl RunqControl {
    fn counter(&self, f: impl FnOnce(*mut crate::skel::types::bss) -> *mut u64) -> &AtomicU64 {
        // SAFETY: the .bss map is mmapped for the life of the skeleton, which
        // the probe owns; the kernel updates the same words with atomics.
        unsafe { AtomicU64::from_ptr(f(self.bss)) }
    }
}

/// libbpf's own messages go to `tracing` (debug), not straight to stderr:
/// the optional programs (fentry) are expected to fail on some kernels, and
/// real failures come back as errors that name what failed.
fn route_libbpf_messages() {
    fn forward(level: libbpf_rs::PrintLevel, msg: String) {
        let msg = msg.trim_end();
        match level {
            libbpf_rs::PrintLevel::Warn => tracing::debug!(target: "libbpf", "{msg}"),
            _ => tracing::trace!(target: "libbpf", "{msg}"),
        }
    }
    libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Debug, forward)));
}

fn bump_memlock() {
    let r = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: plain syscall with a valid struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &r) } != 0 {
        tracing::debug!(
            "could not raise RLIMIT_MEMLOCK ({}); kernels >= 5.11 account BPF memory to the cgroup instead",
            std::io::Error::last_os_error()
        );
    }
}

impl ThrottleProbe {
    pub fn load(opts: &ProbeOptions) -> Result<ThrottleProbe, ProbeError> {
        let opts = &opts.with_env_skips()?;
        route_libbpf_messages();
        bump_memlock();
        let model = ThrottleModel::detect();
        // The skeleton borrows its object for its whole life; the probe is
        // loaded once per process, so the object is leaked on purpose.
        let obj: &'static mut MaybeUninit<OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));
        let try_kind = |kind: ProbeKind, runq: bool, obj: &'static mut MaybeUninit<OpenObject>| {
            let mut open = ThrottleSkelBuilder::default()
                .open(obj)
                .map_err(ProbeError::Load)?;
            if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
                ro.ringbuf_wakeup_bytes = opts.wakeup_bytes;
                ro.nr_cpus = libbpf_rs::num_possible_cpus().unwrap_or(1) as u32;
                ro.runq_enabled = runq;
            }
            if opts.max_watched > 0 {
                let m = &mut open.maps;
                for map in [&mut m.watched, &mut m.runq_hist, &mut m.coldstarts] {
                    map.set_max_entries(opts.max_watched)
                        .map_err(ProbeError::Load)?;
                }
            }
            if opts.ringbuf_bytes > 0 {
                open.maps
                    .events
                    .set_max_entries(opts.ringbuf_bytes.next_power_of_two().max(4096))
                    .map_err(ProbeError::Load)?;
            }
            let btf = kind == ProbeKind::TpBtf;
            let p = &mut open.progs;
            for (prog, on) in [
                (&mut p.tw_switch_btf, btf),
                (&mut p.tw_switch_raw, !btf),
                (&mut p.tw_hrtimer_btf, btf),
                (&mut p.tw_hrtimer_raw, !btf),
                (&mut p.tw_hrtimer_exit_btf, btf),
                (&mut p.tw_hrtimer_exit_raw, !btf),
                (&mut p.tw_wakeup_btf, runq),
                (&mut p.tw_wakeup_new_btf, runq),
                (&mut p.tw_cgroup_attach_btf, runq),
                (&mut p.tw_exec_btf, runq),
                (&mut p.tw_fork_btf, runq),
                (&mut p.tw_iter_watched, runq),
                // Only the dequeue model follows waiting tasks across CPUs.
                (
                    &mut p.tw_migrate_btf,
                    runq && model == ThrottleModel::RunQueue,
                ),
            ] {
                prog.set_autoload(on);
            }
            open.load().map_err(ProbeError::Load)
        };
        let leak = || -> &'static mut MaybeUninit<OpenObject> {
            Box::leak(Box::new(MaybeUninit::uninit()))
        };
        // The throttle probe alone: tp_btf, else the raw_tp flavour.
        let throttle_only = |obj: &'static mut MaybeUninit<OpenObject>| match try_kind(
            ProbeKind::TpBtf,
            false,
            obj,
        ) {
            Ok(s) => Ok((s, ProbeKind::TpBtf, false)),
            Err(e) => {
                tracing::warn!("tp_btf/sched_switch did not load ({e}); falling back to raw_tp");
                Ok::<_, ProbeError>((
                    try_kind(ProbeKind::RawTp, false, leak())?,
                    ProbeKind::RawTp,
                    false,
                ))
            }
        };
        let mut runq_error = None;
        let (mut skel, kind, runq) = if opts.force_raw_tp {
            runq_error = Some("raw_tp: needs tp_btf (task local storage)".to_string());
            (
                try_kind(ProbeKind::RawTp, false, obj)?,
                ProbeKind::RawTp,
                false,
            )
        } else if opts.no_runq {
            runq_error = Some("disabled".to_string());
            throttle_only(obj)?
        } else {
            match try_kind(ProbeKind::TpBtf, true, obj) {
                Ok(s) => (s, ProbeKind::TpBtf, true),
                Err(e) => {
                    tracing::warn!("run-queue latency / cold-start programs did not load ({e}); throttling only");
                    runq_error = Some(e.to_string());
                    throttle_only(leak())?
                }
            }
        };
        let attach = |r: Result<Link, libbpf_rs::Error>| {
            r.map_err(|source| ProbeError::Attach {
                prog: kind.as_str(),
                source,
            })
        };
        let mut links = match kind {
            ProbeKind::TpBtf => vec![attach(skel.progs.tw_switch_btf.attach())?],
            ProbeKind::RawTp => vec![attach(
                skel.progs
                    .tw_switch_raw
                    .attach_raw_tracepoint("sched_switch"),
            )?],
        };
        if !opts.no_hrtimer {
            match kind {
                ProbeKind::TpBtf => {
                    links.push(attach(skel.progs.tw_hrtimer_btf.attach())?);
                    links.push(attach(skel.progs.tw_hrtimer_exit_btf.attach())?);
                }
                ProbeKind::RawTp => {
                    links.push(attach(
                        skel.progs
                            .tw_hrtimer_raw
                            .attach_raw_tracepoint("hrtimer_expire_entry"),
                    )?);
                    links.push(attach(
                        skel.progs
                            .tw_hrtimer_exit_raw
                            .attach_raw_tracepoint("hrtimer_expire_exit"),
                    )?);
                }
            }
        }

        if runq {
            for p in [
                &skel.progs.tw_wakeup_btf,
                &skel.progs.tw_wakeup_new_btf,
                &skel.progs.tw_cgroup_attach_btf,
                &skel.progs.tw_exec_btf,
                &skel.progs.tw_fork_btf,
            ] {
                links.push(p.attach().map_err(|source| ProbeError::Attach {
                    prog: "runq",
                    source,
                })?);
            }
            if model == ThrottleModel::RunQueue {
                links.push(skel.progs.tw_migrate_btf.attach().map_err(|source| {
                    ProbeError::Attach {
                        prog: "runq (sched_migrate_task)",
                        source,
                    }
                })?);
            }
        }
        let bss = skel
            .maps
            .bss_data
            .as_deref_mut()
            .map(|b| b as *mut crate::skel::types::bss);
        let runq =
            match bss {
                Some(bss) if runq => Some(RunqControl {
                    bss,
                    iter: skel.progs.tw_iter_watched.attach().map_err(|source| {
                        ProbeError::Attach {
                            prog: "runq (task iterator)",
                            source,
                        }
                    })?,
                    armed: RefCell::default(),
                }),
                _ => None,
            };
        if runq.is_none() {
            tracing::info!(
                "run-queue latency and cold start unavailable: {}",
                runq_error.as_deref().unwrap_or("no .bss")
            );
        }
        let queue: Rc<RefCell<Vec<Event>>> = Rc::default();
        let q = queue.clone();
        let mut b = RingBufferBuilder::new();
        b.add(&skel.maps.events, move |data: &[u8]| {
            if let Some(ev) = Event::decode(data) {
                q.borrow_mut().push(ev);
            }
            0
        })
        .map_err(ProbeError::Map)?;
        let rb = b.build().map_err(ProbeError::Map)?;
        let ncpus = libbpf_rs::num_possible_cpus().unwrap_or(1) as u32;
        let (fentry, fentry_error) = if opts.no_fentry {
            (None, Some("disabled".to_string()))
        } else {
            match crate::fentry::FentryProbe::load(&skel.maps.watched) {
                Ok(f) => (Some(f), None),
                Err(e) => {
                    tracing::info!("optional fentry view not loaded: {e}");
                    (None, Some(e.to_string()))
                }
            }
        };
        Ok(ThrottleProbe {
            skel,
            fentry,
            fentry_error,
            rb,
            queue,
            _links: links,
            model,
            kind,
            ncpus,
            runq,
            runq_error,
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
        self.sync_watch_counters();
        if let Some(r) = &self.runq {
            // Tasks already in the group get their task storage here, in
            // this process's context: the scheduler-side programs only look
            // it up (creating it under the run-queue lock can deadlock
            // kernels before 6.4); new tasks get it at fork, exec or attach.
            let mut it = libbpf_rs::Iter::new(&r.iter).map_err(ProbeError::Map)?;
            std::io::copy(&mut it, &mut std::io::sink())
                .map_err(|e| ProbeError::Map(libbpf_rs::Error::from(e)))?;
        }
        Ok(())
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
        if self.runq.is_some() {
            self.cold_start_finished(cgroup_id);
            self.sync_watch_counters();
            let _ = self.skel.maps.runq_hist.delete(&cgroup_id.to_ne_bytes());
        }
        Ok(())
    }

    /// Tell the kernel side how many cgroups are watched, and that cached
    /// "is this task watched" answers are stale.
    fn sync_watch_counters(&self) {
        if let Some(r) = &self.runq {
            r.counter(|b| unsafe { &raw mut (*b).nr_watched })
                .store(self.watched_count() as u64, Ordering::SeqCst);
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

    /// Start a new interval for `RunqTotals::interval_max_ns`.
    pub fn next_runq_interval(&self) {
        if let Some(r) = &self.runq {
            r.counter(|b| unsafe { &raw mut (*b).runq_epoch })
                .fetch_add(1, Ordering::SeqCst);
        }
    }

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
        // SAFETY: the bytes of a POD value.
        let bytes = unsafe { std::slice::from_raw_parts(p, std::mem::size_of::<tw_coldstart>()) };
        self.skel
            .maps
            .coldstarts
            .update(&cgroup_id.to_ne_bytes(), bytes, MapFlags::ANY)
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

    pub fn watched_count(&self) -> usize {
        self.skel.maps.watched.keys().count()
    }

    pub fn episode_entries(&self) -> usize {
        self.skel.maps.episodes.keys().count()
    }

    /// Drain what the kernel has queued; returns the events in order.
    pub fn poll(&mut self) -> Vec<Event> {
        let _ = self.rb.consume();
        std::mem::take(&mut *self.queue.borrow_mut())
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

    /// Dequeue model: the bandwidth timers' callbacks (period, slack) the
    /// kernel side learnt from the first switches; (0, 0) before that and
    /// on the task model, which does not need them.
    pub fn bandwidth_timer_callbacks(&self) -> (u64, u64) {
        self.skel
            .maps
            .bss_data
            .as_deref()
            .map(|b| (b.period_timer_fn, b.slack_timer_fn))
            .unwrap_or((0, 0))
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

pub(crate) fn read_episode(v: &[u8]) -> Option<tw_episode> {
    if v.len() < std::mem::size_of::<tw_episode>() {
        return None;
    }
    // SAFETY: length checked; tw_episode is plain old data.
    Some(unsafe { std::ptr::read_unaligned(v.as_ptr().cast()) })
}

pub(crate) fn episode_key(cgroup_id: u64, cpu: u32) -> Vec<u8> {
    let k = tw_episode_key {
        cgroup_id,
        cpu,
        pad: 0,
    };
    let p = (&k as *const tw_episode_key).cast::<u8>();
    // SAFETY: reading the bytes of a POD value.
    unsafe { std::slice::from_raw_parts(p, std::mem::size_of::<tw_episode_key>()) }.to_vec()
}
