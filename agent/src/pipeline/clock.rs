//! BPF timestamps are CLOCK_MONOTONIC; logs speak wall-clock time.

#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    /// realtime - monotonic, nanoseconds.
    offset: i128,
}

fn now(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
}

impl Clock {
    pub(crate) fn new() -> Clock {
        Clock {
            offset: now(libc::CLOCK_REALTIME) - now(libc::CLOCK_MONOTONIC),
        }
    }

    pub(crate) fn monotonic_ns() -> u64 {
        now(libc::CLOCK_MONOTONIC) as u64
    }

    pub(crate) fn to_unix_ns(self, mono_ns: u64) -> u64 {
        (mono_ns as i128 + self.offset).max(0) as u64
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}
