//! The controller's decisions, free of I/O: one interval's throttled time
//! and the node's pressure in, a new burst/quota (or nothing) out.
//!
//! Up: burst first (it only lends the runtime a group left unused, so it
//! costs nothing over a window), up to its ceiling; then quota, in steps of
//! at least the throttled time seen per period, up to its ceiling; at most
//! once per cooldown. Down: after `calm` without throttling, or every
//! cooldown while the node is under pressure: quota first, then burst,
//! never below the originals.

use throttlewatch_core::control_config::ControlConfig;
use throttlewatch_core::logfmt::control::{Bandwidth, ControlSignal};

/// The node's bounds, from `[control]`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Settings {
    pub burst_ceiling_percent: u32,
    pub quota_ceiling_percent: u32,
    pub step_percent: u32,
    pub cooldown_ns: u64,
    pub calm_ns: u64,
    pub pressure_psi: f64,
    pub pressure_idle: f64,
    pub pressure_psi_file: String,
}

impl Settings {
    pub(crate) fn from_config(c: &ControlConfig) -> Settings {
        Settings {
            burst_ceiling_percent: c.burst_ceiling_percent.min(100),
            quota_ceiling_percent: c.quota_ceiling_percent.max(100),
            step_percent: c.step_percent.max(1),
            cooldown_ns: c.cooldown_ms * 1_000_000,
            calm_ns: c.calm_ms * 1_000_000,
            pressure_psi: c.pressure_psi_some_percent,
            pressure_idle: c.pressure_idle_percent,
            pressure_psi_file: c.pressure_psi_file.clone(),
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings::from_config(&ControlConfig::default())
    }
}

/// The node's CPU pressure over the guard's last window (see `node.rs`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Pressure {
    /// Share of the window in which some task waited (PSI `some`), percent.
    pub psi_some_percent: Option<f64>,
    pub idle_percent: Option<f64>,
}

impl Pressure {
    /// Every condition that is on and readable holds, and there is one:
    /// PSI `some` at or above its threshold, idle CPU at or below its own.
    /// With PSI, idle must be low too: a throttled task counts as waiting
    /// in PSI, so a container held at its quota would otherwise trip the
    /// guard by itself while CPUs idle.
    pub(crate) fn is_high(&self, s: &Settings) -> bool {
        let psi = self
            .psi_some_percent
            .filter(|_| s.pressure_psi < 100.0)
            .map(|p| p >= s.pressure_psi);
        let idle = self
            .idle_percent
            .filter(|_| s.pressure_idle > 0.0)
            .map(|i| i <= s.pressure_idle);
        match (psi, idle) {
            (None, None) => false,
            (a, b) => a.unwrap_or(true) && b.unwrap_or(true),
        }
    }
}

/// One interval as the probe saw it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Interval {
    /// CLOCK_MONOTONIC at its end.
    pub now_ns: u64,
    pub length_ns: u64,
    /// Throttled time of the group's (cgroup, CPU) episodes in it.
    pub throttled_ns: u64,
    pub episodes: u64,
    /// CPU the group used in it (cpuacct / cpu.stat usage); 0: unknown.
    pub used_ns: u64,
    /// Periods in it that the kernel counted throttled (`cpu.stat`
    /// `nr_throttled`); 0: unknown.
    pub throttled_periods: u64,
    /// Periods in it in which the group ran (`cpu.stat` `nr_periods`); 0: unknown.
    pub active_periods: u64,
}

impl Interval {
    /// The time `periods` periods of `period_us` cover, when shorter than
    /// the interval: what a per-period figure is measured over. An
    /// interval is normally one poll (50 ms); an agent kept off the CPU
    /// polls late, and averaging a burst over all of a 400 ms interval
    /// would make it look a fraction of what each period it hit saw.
    fn span_ns(&self, periods: u64, period_us: u64) -> u64 {
        match periods {
            0 => self.length_ns,
            n => self
                .length_ns
                .min(n.saturating_mul(period_us).saturating_mul(1000)),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    Throttled,
    Calm,
    NodePressure,
}

impl Cause {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Cause::Throttled => "throttled",
            Cause::Calm => "calm",
            Cause::NodePressure => "node_pressure",
        }
    }
}

/// One decision: the values to write and why.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Change {
    pub before: Bandwidth,
    pub after: Bandwidth,
    pub cause: Cause,
    pub signal: ControlSignal,
}

impl Change {
    pub(crate) fn action(&self) -> &'static str {
        if self.after.quota_us + self.after.burst_us > self.before.quota_us + self.before.burst_us {
            "raise"
        } else {
            "lower"
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct ControlPolicy {
    s: Settings,
    original: Bandwidth,
    current: Bandwidth,
    last_change_ns: Option<u64>,
    /// The end of the last throttled interval (or the start).
    last_throttled_ns: u64,
    /// The calm needed before a step down: `calm_ns`, doubled (up to
    /// [`CALM_BACKOFF_MAX`] times) by every step down that proved premature,
    /// back to `calm_ns` once at the originals and calm that long.
    calm_now_ns: u64,
    /// The last change, when it was a calm step down: its time and the
    /// values before it (the level that held without throttling).
    last_calm_down: Option<(u64, Bandwidth)>,
    /// The highest CPU use per period seen lately (µs) and when a use at
    /// least 80 % of it was last seen: calm step downs stop above it.
    peak: Option<(u64, u64)>,
}

/// The most a calm wait grows by premature step downs.
pub(crate) const CALM_BACKOFF_MAX: u64 = 16;

impl ControlPolicy {
    pub(crate) fn new(s: Settings, original: Bandwidth, now_ns: u64) -> ControlPolicy {
        ControlPolicy {
            original,
            current: original,
            last_change_ns: None,
            last_throttled_ns: now_ns,
            calm_now_ns: s.calm_ns,
            last_calm_down: None,
            peak: None,
            s,
        }
    }

    /// The calm now needed before a step down.
    #[cfg(test)]
    pub(crate) fn calm_now_ns(&self) -> u64 {
        self.calm_now_ns
    }

    pub(crate) fn original(&self) -> Bandwidth {
        self.original
    }

    pub(crate) fn current(&self) -> Bandwidth {
        self.current
    }

    /// Highest quota and burst.
    pub(crate) fn ceilings(&self) -> (u64, u64) {
        let o = self.original;
        let quota = (o.quota_us * self.s.quota_ceiling_percent as u64 / 100).max(o.quota_us);
        let burst = (o.quota_us * self.s.burst_ceiling_percent as u64 / 100).max(o.burst_us);
        (quota, burst)
    }

    /// The smallest step, µs.
    fn min_step(&self) -> u64 {
        (self.original.quota_us * self.s.step_percent as u64 / 100).max(1)
    }

    /// Decide on one interval; the change is taken as written (the caller
    /// writes it, or calls [`ControlPolicy::undo`] if the write failed).
    pub(crate) fn step(&mut self, iv: &Interval, p: &Pressure) -> Option<Change> {
        let since_change = self
            .last_change_ns
            .map_or(u64::MAX, |t| iv.now_ns.saturating_sub(t));
        if iv.throttled_ns > 0 {
            self.last_throttled_ns = iv.now_ns;
        }
        let quiet_ns = iv.now_ns.saturating_sub(self.last_throttled_ns);
        // Back at the originals and calm a whole wait: the workload has
        // quieted, the next calm wait is the configured one again.
        if self.current == self.original && quiet_ns.min(since_change) >= self.calm_now_ns {
            self.calm_now_ns = self.s.calm_ns;
        }
        self.track_peak(iv);
        let pressure = p.is_high(&self.s);
        let signal = ControlSignal {
            throttled_ns: iv.throttled_ns,
            episodes: iv.episodes,
            interval_ns: iv.length_ns,
            quiet_ns,
            psi_some_percent: p.psi_some_percent,
            idle_percent: p.idle_percent,
        };
        let (after, cause) = if pressure {
            if since_change < self.s.cooldown_ns {
                return None;
            }
            (self.lowered(true, iv.now_ns), Cause::NodePressure)
        } else if iv.throttled_ns > 0 {
            if since_change < self.s.cooldown_ns {
                return None;
            }
            let mut after = self.raised(iv);
            // Throttled right after a calm step down: it was premature.
            // Straight back to the level that held, and wait longer for
            // calm next time (a workload bursting every few seconds is
            // not calm between its bursts).
            if let Some((_, held)) = self
                .last_calm_down
                .filter(|(t, _)| iv.now_ns.saturating_sub(*t) < self.calm_now_ns)
            {
                let (quota_max, burst_max) = self.ceilings();
                after.quota_us = after.quota_us.max(held.quota_us).min(quota_max);
                after.burst_us = after.burst_us.max(held.burst_us).min(burst_max);
                after.burst_us = after.burst_us.min(after.quota_us);
                self.calm_now_ns = (self.calm_now_ns * 2).min(self.s.calm_ns * CALM_BACKOFF_MAX);
            }
            (after, Cause::Throttled)
        } else if quiet_ns >= self.calm_now_ns && since_change >= self.calm_now_ns {
            (self.lowered(false, iv.now_ns), Cause::Calm)
        } else {
            return None;
        };
        if after == self.current {
            return None;
        }
        let before = std::mem::replace(&mut self.current, after);
        self.last_change_ns = Some(iv.now_ns);
        self.last_calm_down = (cause == Cause::Calm).then_some((iv.now_ns, before));
        Some(Change {
            before,
            after,
            cause,
            signal,
        })
    }

    /// Burst first, then quota; a step is the throttled time per period,
    /// at least the minimum step.
    fn raised(&self, iv: &Interval) -> Bandwidth {
        let c = self.current;
        let (quota_max, burst_max) = self.ceilings();
        // Per throttled period: a late poll does not shrink the step.
        let span = iv.span_ns(iv.throttled_periods, c.period_us);
        let per_period_us = if span == 0 {
            0
        } else {
            (iv.throttled_ns as u128 * c.period_us as u128 / span as u128) as u64
        };
        let step = per_period_us.max(self.min_step());
        let mut n = c;
        if c.burst_us < burst_max {
            n.burst_us = (c.burst_us + step).min(burst_max);
        } else if c.quota_us < quota_max {
            n.quota_us = (c.quota_us + step).min(quota_max);
        }
        n.burst_us = n.burst_us.min(n.quota_us);
        n
    }

    /// Quota first, then burst, toward the originals: a fifth of the
    /// current value (Koordinator's ×0.8), at least the minimum step; under
    /// pressure half of what is above the original, at least the same.
    fn lowered(&self, pressure: bool, now_ns: u64) -> Bandwidth {
        let (c, o) = (self.current, self.original);
        let mut n = c;
        // A calm step down keeps quota + burst at the recent peak use per
        // period: a workload that used that much a moment ago will again.
        let floor = if pressure { 0 } else { self.peak_us(now_ns) };
        let step = |cur: u64, orig: u64| {
            let by = if pressure {
                (cur - orig).div_ceil(2)
            } else {
                cur / 5
            };
            cur.saturating_sub(by.max(self.min_step())).max(orig)
        };
        if c.quota_us > o.quota_us {
            n.quota_us = step(c.quota_us, o.quota_us)
                .max(floor.saturating_sub(c.burst_us))
                .min(c.quota_us);
        } else if c.burst_us > o.burst_us {
            n.burst_us = step(c.burst_us, o.burst_us)
                .max(floor.saturating_sub(n.quota_us))
                .min(c.burst_us);
        }
        n.burst_us = n.burst_us.min(n.quota_us);
        n
    }

    /// The peak use per period, while fresh: seen (or 80 % of it) within
    /// two calm waits.
    pub(crate) fn peak_us(&self, now_ns: u64) -> u64 {
        self.peak
            .filter(|(at, _)| now_ns.saturating_sub(*at) <= 2 * self.calm_now_ns)
            .map_or(0, |(_, us)| us)
    }

    fn track_peak(&mut self, iv: &Interval) {
        // Per period the group ran in: a late poll does not lower the peak.
        let span = iv.span_ns(iv.active_periods, self.current.period_us);
        if iv.used_ns == 0 || span == 0 {
            return;
        }
        let per = (iv.used_ns as u128 * self.current.period_us as u128 / span as u128) as u64;
        let fresh = self.peak_us(iv.now_ns);
        if per >= fresh {
            self.peak = Some((iv.now_ns, per));
        } else if per * 5 >= fresh * 4 {
            self.peak = Some((iv.now_ns, fresh));
        }
    }

    /// A change the kernel refused: the values stay what they were.
    pub(crate) fn undo(&mut self, c: &Change) {
        self.current = c.before;
    }

    /// Values read from the cgroup that the controller did not write (an
    /// operator's update, or a write that failed): what changed is the new
    /// original, and control starts over from them. Field by field: an
    /// update of the quota alone (`docker update --cpus`, the shim's
    /// `Update`: both hold the burst across runc's update) leaves the
    /// burst the controller raised its own, to hand back, not a new
    /// original.
    pub(crate) fn adopt(&mut self, read: Bandwidth, now_ns: u64) {
        let (c, o) = (self.current, self.original);
        let quota_changed = (read.quota_us, read.period_us) != (c.quota_us, c.period_us);
        let (quota_us, period_us) = match quota_changed {
            true => (read.quota_us, read.period_us),
            false => (o.quota_us, o.period_us),
        };
        let burst_us = match read.burst_us != c.burst_us {
            true => read.burst_us,
            false => o.burst_us,
        };
        self.original = Bandwidth {
            quota_us,
            period_us,
            burst_us: burst_us.min(quota_us).min(read.burst_us),
        };
        self.current = read;
        self.last_change_ns = Some(now_ns);
        self.last_throttled_ns = now_ns;
        self.calm_now_ns = self.s.calm_ns;
        self.last_calm_down = None;
        self.peak = None;
    }
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
