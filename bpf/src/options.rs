//! What a probe is loaded with (its options, the model and kind chosen)
//! and how loading fails.

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
    #[error("the BPF object's record layout is version {found}, this program decodes version {expected}: rebuild both from one tree")]
    Abi { found: u32, expected: u32 },
    #[error("the probe's tw_model program answered {0}: expected 1 (task) or 2 (runqueue)")]
    Model(u32),
    #[error("{ENV_PROBE_SKIP}: unknown program group '{0}' (accepted: a comma-separated list of fentry, runq, hrtimer)")]
    Skip(String),
    #[error("{ENV_PROBE_EPISODES}={0:?}: expected a whole number of entries from 1 to 4294967295")]
    Episodes(String),
}

/// Leaves program groups out of the probe: `fentry` (the optional
/// fexit/fentry view), `runq` (run-queue latency and cold start), `hrtimer`
/// (the bandwidth-timer programs: dequeue-model episodes then end at the
/// switch-in). For diagnosis — the VM lane's soak uses it to tell which of
/// our programs a kernel problem needs — not for production.
pub const ENV_PROBE_SKIP: &str = "THROTTLEWATCH_PROBE_SKIP";

/// Entries of the `episodes` map instead of max_containers x CPUs: a test
/// knob (a full map is counted in `end.map_full`), not for production.
pub const ENV_PROBE_EPISODES: &str = "THROTTLEWATCH_PROBE_EPISODES";

/// How the running kernel throttles, as the loaded object decided it with
/// CO-RE (`tw_dequeue_model()` in core_fixes.bpf.h; read back by `load::model`).
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
    /// per-CPU hash, so its kernel memory is entries × 336 B × CPUs. 0: the
    /// object's own sizes (16384).
    pub max_watched: u32,
    /// Entries of the `episodes` map; 0: `max_watched` x CPUs (the
    /// object's 65536 when `max_watched` is 0). See `memory::episodes_entries`.
    pub max_episodes: u32,
}

impl ProbeOptions {
    /// These options with the groups named in `THROTTLEWATCH_PROBE_SKIP` left out.
    pub fn with_env_skips(&self) -> Result<ProbeOptions, ProbeError> {
        let mut o = self.clone();
        if let Some(v) = std::env::var_os(ENV_PROBE_EPISODES) {
            let v = v.to_string_lossy();
            o.max_episodes = match v.trim().parse::<u32>() {
                Ok(n) if n > 0 => n,
                _ => return Err(ProbeError::Episodes(v.into_owned())),
            };
        }
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
