//! Opening, loading and attaching the throttle object in the richest
//! flavour the kernel takes: tp_btf with the run-queue and cold-start
//! programs, else tp_btf alone, else raw_tp.

use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::rc::Rc;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, OpenObject, RingBuffer, RingBufferBuilder};

use crate::event::Event;
use crate::options::{ProbeError, ProbeKind, ProbeOptions, ThrottleModel};
use crate::skel::{ThrottleSkel, ThrottleSkelBuilder};

/// `enum tw_model` of throttle.h.
const TW_MODEL_TASK: u32 = 1;
const TW_MODEL_RQ: u32 = 2;

/// A loaded object and what it holds.
pub(crate) struct Loaded {
    pub skel: ThrottleSkel<'static>,
    pub kind: ProbeKind,
    /// Why the run-queue / cold-start programs are not loaded (None: they are).
    pub runq_error: Option<String>,
}

/// The skeleton borrows its object for its whole life; the probe is loaded
/// once per process (a failed flavour: once more), so objects are leaked on purpose.
fn leak() -> &'static mut MaybeUninit<OpenObject> {
    Box::leak(Box::new(MaybeUninit::uninit()))
}

/// One attempt: open the object, set what is set before load, choose the
/// programs of the flavour, load.
fn open_and_load(
    opts: &ProbeOptions,
    kind: ProbeKind,
    runq: bool,
) -> Result<ThrottleSkel<'static>, ProbeError> {
    let mut open = ThrottleSkelBuilder::default()
        .open(leak())
        .map_err(ProbeError::Load)?;
    if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
        if ro.tw_abi_version != crate::event::ABI_VERSION {
            return Err(ProbeError::Abi {
                found: ro.tw_abi_version,
                expected: crate::event::ABI_VERSION,
            });
        }
        ro.ringbuf_wakeup_bytes = opts.wakeup_bytes;
        ro.nr_cpus = libbpf_rs::num_possible_cpus().unwrap_or(1) as u32;
        ro.runq_enabled = runq;
        if let Some(d) = crate::wakeups::preempt_count_from_rq() {
            ro.tw_pc_known = true;
            ro.tw_pc_from_rq = d;
        }
    }
    let ncpus = libbpf_rs::num_possible_cpus().unwrap_or(1) as u32;
    crate::memory::size_maps(&mut open, opts, ncpus)?;
    let btf = kind == ProbeKind::TpBtf;
    let p = &mut open.progs;
    for (prog, on) in [
        (&mut p.tw_switch_btf, btf),
        (&mut p.tw_switch_raw, !btf),
        (&mut p.tw_hrtimer_btf, btf),
        (&mut p.tw_hrtimer_raw, !btf),
        (&mut p.tw_hrtimer_exit_btf, btf),
        (&mut p.tw_hrtimer_exit_raw, !btf),
        (&mut p.tw_wakeup_new_btf, runq),
        (&mut p.tw_waking_btf, runq),
        (&mut p.tw_cgroup_attach_btf, runq),
        (&mut p.tw_exec_btf, runq),
        (&mut p.tw_fork_btf, runq),
        (&mut p.tw_exit_btf, runq),
        (&mut p.tw_iter_watched, runq),
        // Loaded with the others; attached on the dequeue model only.
        (&mut p.tw_migrate_btf, runq),
    ] {
        prog.set_autoload(on);
    }
    open.load().map_err(ProbeError::Load)
}

/// The throttle programs alone: tp_btf, else raw_tp. `why`: why the
/// run-queue programs are left out.
fn throttle_only(opts: &ProbeOptions, why: String) -> Result<Loaded, ProbeError> {
    let (skel, kind) = match open_and_load(opts, ProbeKind::TpBtf, false) {
        Ok(s) => (s, ProbeKind::TpBtf),
        Err(e) => {
            tracing::warn!("tp_btf/sched_switch did not load ({e}); falling back to raw_tp");
            let s = open_and_load(opts, ProbeKind::RawTp, false)?;
            (s, ProbeKind::RawTp)
        }
    };
    Ok(Loaded {
        skel,
        kind,
        runq_error: Some(why),
    })
}

/// The richest flavour that loads (or the one `opts` asks for).
pub(crate) fn load(opts: &ProbeOptions) -> Result<Loaded, ProbeError> {
    if opts.force_raw_tp {
        return Ok(Loaded {
            skel: open_and_load(opts, ProbeKind::RawTp, false)?,
            kind: ProbeKind::RawTp,
            runq_error: Some("raw_tp: needs tp_btf (task local storage)".into()),
        });
    }
    if opts.no_runq {
        return throttle_only(opts, "disabled".into());
    }
    match open_and_load(opts, ProbeKind::TpBtf, true) {
        Ok(skel) => Ok(Loaded {
            skel,
            kind: ProbeKind::TpBtf,
            runq_error: None,
        }),
        Err(e) => {
            tracing::warn!(
                "run-queue latency / cold-start programs did not load ({e}); throttling only"
            );
            throttle_only(opts, e.to_string())
        }
    }
}

/// The throttling model the object decided at load (core_fixes.bpf.h): its
/// `tw_model` program answers it, run once and never attached.
pub(crate) fn model(l: &Loaded) -> Result<ThrottleModel, ProbeError> {
    let out = l
        .skel
        .progs
        .tw_model
        .test_run(libbpf_rs::ProgramInput::default())
        .map_err(ProbeError::Load)?;
    match out.return_value {
        TW_MODEL_TASK => Ok(ThrottleModel::Task),
        TW_MODEL_RQ => Ok(ThrottleModel::RunQueue),
        other => Err(ProbeError::Model(other)),
    }
}

/// Attach what was loaded (the timer programs unless `opts` leaves them out).
pub(crate) fn attach(
    l: &mut Loaded,
    model: ThrottleModel,
    opts: &ProbeOptions,
) -> Result<Vec<Link>, ProbeError> {
    let k = l.kind.as_str();
    let attach = |prog: &'static str, r: Result<Link, libbpf_rs::Error>| {
        r.map_err(|source| ProbeError::Attach { prog, source })
    };
    let p = &mut l.skel.progs;
    let btf = l.kind == ProbeKind::TpBtf;
    let mut links = vec![attach(
        k,
        if btf {
            p.tw_switch_btf.attach()
        } else {
            p.tw_switch_raw.attach_raw_tracepoint("sched_switch")
        },
    )?];
    if !opts.no_hrtimer {
        let (entry, exit) = if btf {
            (p.tw_hrtimer_btf.attach(), p.tw_hrtimer_exit_btf.attach())
        } else {
            (
                p.tw_hrtimer_raw
                    .attach_raw_tracepoint("hrtimer_expire_entry"),
                p.tw_hrtimer_exit_raw
                    .attach_raw_tracepoint("hrtimer_expire_exit"),
            )
        };
        links.push(attach(k, entry)?);
        links.push(attach(k, exit)?);
    }
    if l.runq_error.is_some() {
        return Ok(links);
    }
    for prog in [
        &p.tw_wakeup_new_btf,
        &p.tw_waking_btf,
        &p.tw_cgroup_attach_btf,
        &p.tw_exec_btf,
        &p.tw_fork_btf,
        &p.tw_exit_btf,
    ] {
        links.push(attach("runq", prog.attach())?);
    }
    if model == ThrottleModel::RunQueue {
        links.push(attach(
            "runq (sched_migrate_task)",
            p.tw_migrate_btf.attach(),
        )?);
    }
    Ok(links)
}

/// Decoded events waiting for `ThrottleProbe::poll`.
pub(crate) type EventQueue = Rc<RefCell<Vec<Event>>>;

/// The events ring buffer; its callback decodes into the returned queue.
pub(crate) fn ring_buffer(
    skel: &ThrottleSkel<'static>,
) -> Result<(RingBuffer<'static>, EventQueue), ProbeError> {
    let queue: EventQueue = Rc::default();
    let q = queue.clone();
    let mut b = RingBufferBuilder::new();
    b.add(&skel.maps.events, move |data: &[u8]| {
        if let Some(ev) = Event::decode(data) {
            q.borrow_mut().push(ev);
        }
        0
    })
    .map_err(ProbeError::Map)?;
    Ok((b.build().map_err(ProbeError::Map)?, queue))
}

/// libbpf's own messages go to `tracing` (debug), not straight to stderr:
/// the optional programs (fentry) are expected to fail on some kernels, and
/// real failures come back as errors that name what failed.
pub(crate) fn route_libbpf_messages() {
    fn forward(level: libbpf_rs::PrintLevel, msg: String) {
        let msg = msg.trim_end();
        match level {
            libbpf_rs::PrintLevel::Warn => tracing::debug!(target: "libbpf", "{msg}"),
            _ => tracing::trace!(target: "libbpf", "{msg}"),
        }
    }
    libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Debug, forward)));
}

pub(crate) fn bump_memlock() {
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
