//! The cold-start timeline of one container: the runtime's create (stamped
//! into the spec by the wrapper), the container init's creation, the hook,
//! and from the kernel the entrypoint's exec (where it first runs: the
//! exec'ing thread is on a CPU and goes on into the new image) and the
//! moment the entrypoint with every thread and process it started had its
//! first N ms of CPU, with the time in between split into running,
//! run-queue wait, frozen and blocked. One `cold_start` record, written when
//! the last stage arrives or when watching ends.

use std::time::Duration;

use throttlewatch_bpf::{ColdStartEvent, ProbeStage};
use throttlewatch_core::logfmt::{self, ColdStart, ColdStartSplit};

use crate::clock::Clock;

/// CPU that completes a cold start unless the container's
/// `throttlewatch.io/cold-start-cpu` annotation says otherwise.
pub(crate) const DEFAULT_CPU_TARGET: Duration = Duration::from_millis(10);
/// A cold start not complete after this long is written as it is.
pub(crate) const GIVE_UP_AFTER: Duration = Duration::from_secs(120);

/// The stages of a cold start, in the order of the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// The runtime wrapper's `create` (stamped into the spec).
    Create,
    /// The container's init process was created.
    Init,
    /// The createRuntime hook ran.
    Hook,
    /// The entrypoint's exec (kernel).
    Exec,
    /// It first ran after the exec: the exec's moment (the exec'ing
    /// thread is on a CPU and returns to user space in the new image).
    FirstRun,
    /// It and what it started had its CPU target (kernel).
    Cpu,
}

impl Stage {
    pub(crate) const ALL: [Stage; 6] = [
        Stage::Create,
        Stage::Init,
        Stage::Hook,
        Stage::Exec,
        Stage::FirstRun,
        Stage::Cpu,
    ];

    /// The name in the log's `stages` and the metrics' `kind` label.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Stage::Create => "create",
            Stage::Init => "init",
            Stage::Hook => "hook",
            Stage::Exec => "exec",
            Stage::FirstRun => "first_run",
            Stage::Cpu => "cpu",
        }
    }

    /// The stage a kernel event reports.
    fn of_event(s: ProbeStage) -> Stage {
        match s {
            ProbeStage::Exec => Stage::Exec,
            ProbeStage::Cpu => Stage::Cpu,
        }
    }
}

/// When each stage was seen, Unix ns.
#[derive(Debug, Clone, Default)]
struct Timeline([Option<u64>; Stage::ALL.len()]);

impl Timeline {
    fn get(&self, s: Stage) -> Option<u64> {
        self.0[s as usize]
    }
    fn set(&mut self, s: Stage, unix_ns: Option<u64>) {
        self.0[s as usize] = unix_ns;
    }
}

/// What is known before the kernel reports anything.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ColdStartSpec {
    pub created_unix_ns: Option<u64>,
    pub hook_unix_ns: Option<u64>,
    /// The container's init (the OCI state's pid): its creation comes from
    /// the exec event (task start_time), else /proc/<pid>/stat.
    pub init_pid: Option<u32>,
    pub cpu_target_ns: u64,
}

#[derive(Debug, Clone)]
pub(crate) struct ColdStartTracker {
    spec: ColdStartSpec,
    at: Timeline,
    pid: Option<u32>,
    comm: String,
    split: Option<ColdStartSplit>,
    armed_mono: u64,
    written: bool,
}

impl ColdStartTracker {
    pub(crate) fn new(spec: ColdStartSpec, armed_mono: u64) -> ColdStartTracker {
        let mut at = Timeline::default();
        at.set(Stage::Create, spec.created_unix_ns);
        at.set(Stage::Init, spec.init_pid.and_then(proc_start_unix_ns));
        at.set(Stage::Hook, spec.hook_unix_ns);
        ColdStartTracker {
            spec,
            at,
            pid: None,
            comm: String::new(),
            split: None,
            armed_mono,
            written: false,
        }
    }

    /// Account a kernel stage; returns the record when the timeline is complete.
    pub(crate) fn on_event(&mut self, ev: &ColdStartEvent, clock: &Clock) -> Option<ColdStart> {
        if self.written {
            return None;
        }
        let stage = Stage::of_event(ev.stage);
        self.at.set(stage, Some(clock.to_unix_ns(ev.at_ns)));
        if stage == Stage::Cpu {
            self.split = ev.split.map(split_of);
        }
        if stage == Stage::Exec {
            self.at
                .set(Stage::FirstRun, Some(clock.to_unix_ns(ev.at_ns)));
            self.pid = Some(ev.tgid);
            self.comm = ev.comm.clone();
            // The exec'd process is the container's init: its start_time
            // is exact where /proc's starttime has clock-tick resolution.
            if ev.ref_ns > 0
                && (self.spec.init_pid.is_none() || self.spec.init_pid == Some(ev.tgid))
            {
                self.at.set(Stage::Init, Some(clock.to_unix_ns(ev.ref_ns)));
            }
        }
        let kernel_stages = [Stage::Exec, Stage::Cpu];
        if kernel_stages.iter().all(|s| self.at.get(*s).is_some()) {
            return Some(self.record(None));
        }
        None
    }

    /// The kernel's split so far of a cold start still pending (up to its
    /// threads' last change of state): written with the record when
    /// watching ends first.
    pub(crate) fn progress(&mut self, split: Option<throttlewatch_bpf::ExecToCpu>) {
        if !self.written && self.at.get(Stage::Cpu).is_none() {
            self.split = split.map(split_of).or(self.split);
        }
    }

    /// Whether it is time to give up waiting for the kernel stages.
    pub(crate) fn expired(&self, mono_ns: u64) -> bool {
        !self.written && mono_ns.saturating_sub(self.armed_mono) > GIVE_UP_AFTER.as_nanos() as u64
    }

    /// The record as it stands (watching ends, or give up); None once written.
    pub(crate) fn finish(&mut self, why: &str) -> Option<ColdStart> {
        if self.written {
            return None;
        }
        Some(self.record(Some(why.to_string())))
    }

    fn record(&mut self, note: Option<String>) -> ColdStart {
        self.written = true;
        let create = self.at.get(Stage::Create);
        let stages: Vec<logfmt::ColdStartStage> = Stage::ALL
            .iter()
            .filter_map(|s| {
                self.at.get(*s).map(|t| logfmt::ColdStartStage {
                    stage: s.name().to_string(),
                    unix_ns: t,
                    since_create_ns: create.map(|c| t as i64 - c as i64),
                })
            })
            .collect();
        let complete = stages.len() == Stage::ALL.len();
        ColdStart {
            pid: self.pid,
            comm: self.comm.clone(),
            cpu_target_ns: self.spec.cpu_target_ns,
            stages,
            complete,
            note: if complete { None } else { note },
            exec_to_cpu: self.split,
        }
    }
}

fn split_of(s: throttlewatch_bpf::ExecToCpu) -> ColdStartSplit {
    ColdStartSplit {
        running_ns: s.running_ns,
        runq_ns: s.runq_ns,
        frozen_ns: s.frozen_ns,
        blocked_ns: s.blocked_ns,
    }
}

/// A process's creation from /proc/<pid>/stat (clock ticks since boot) as
/// Unix ns; resolution one tick (10 ms at USER_HZ 100).
pub(crate) fn proc_start_unix_ns(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    // Fields after the comm start at field 3 (state); starttime is field 22.
    let ticks: u64 = after.split_whitespace().nth(22 - 3)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let start_boot_ns = ticks * (1_000_000_000 / hz);
    let boot = clock_ns(libc::CLOCK_BOOTTIME)?;
    let real = clock_ns(libc::CLOCK_REALTIME)?;
    real.checked_sub(boot.checked_sub(start_boot_ns)?)
}

fn clock_ns(c: libc::clockid_t) -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    (unsafe { libc::clock_gettime(c, &mut ts) } == 0)
        .then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(stage: ProbeStage, at: u64) -> ColdStartEvent {
        ColdStartEvent {
            cgroup_id: 1,
            stage,
            tid: 9,
            tgid: 9,
            comm: "app".into(),
            at_ns: at,
            ref_ns: 50,
            split: (stage == ProbeStage::Cpu).then_some(throttlewatch_bpf::ExecToCpu {
                running_ns: 120,
                runq_ns: 30,
                frozen_ns: 40,
                blocked_ns: 10,
            }),
        }
    }

    #[test]
    fn complete_timeline_in_order() {
        let clock = Clock::new();
        let create = clock.to_unix_ns(10);
        let spec = ColdStartSpec {
            created_unix_ns: Some(create),
            hook_unix_ns: Some(clock.to_unix_ns(80)),
            init_pid: None,
            cpu_target_ns: 10,
        };
        let mut t = ColdStartTracker::new(spec, 0);
        assert!(t.on_event(&ev(ProbeStage::Exec, 100), &clock).is_none());
        let r = t.on_event(&ev(ProbeStage::Cpu, 300), &clock).unwrap();
        assert!(r.complete && r.note.is_none());
        let names: Vec<&str> = r.stages.iter().map(|s| s.stage.as_str()).collect();
        assert_eq!(names, Stage::ALL.map(Stage::name));
        assert_eq!(
            r.stages[1].since_create_ns,
            Some(40),
            "init from the exec event's start_time"
        );
        assert_eq!(
            r.stages[4].since_create_ns,
            Some(90),
            "first run: the exec, where the entrypoint is on a CPU"
        );
        assert_eq!(r.stages[5].since_create_ns, Some(290));
        let s = r.exec_to_cpu.expect("the split from the CPU stage");
        assert_eq!(
            s.running_ns + s.runq_ns + s.frozen_ns + s.blocked_ns,
            200,
            "{s:?}"
        );
        assert!(t.finish("end").is_none(), "written once");
    }

    #[test]
    fn cut_short_keeps_the_split_so_far() {
        let clock = Clock::new();
        let mut t = ColdStartTracker::new(
            ColdStartSpec {
                cpu_target_ns: 10,
                ..Default::default()
            },
            0,
        );
        assert!(t.on_event(&ev(ProbeStage::Exec, 100), &clock).is_none());
        let so_far = throttlewatch_bpf::ExecToCpu {
            running_ns: 5,
            blocked_ns: 70,
            ..Default::default()
        };
        t.progress(Some(so_far));
        let r = t.finish("container ended").unwrap();
        assert!(!r.complete);
        assert_eq!(
            r.exec_to_cpu.map(|s| (s.running_ns, s.blocked_ns)),
            Some((5, 70))
        );
    }

    #[test]
    fn incomplete_at_the_end_says_why() {
        let mut t = ColdStartTracker::new(
            ColdStartSpec {
                cpu_target_ns: 10,
                ..Default::default()
            },
            0,
        );
        assert!(t.expired(GIVE_UP_AFTER.as_nanos() as u64 + 1));
        let r = t.finish("container ended").unwrap();
        assert!(!r.complete && r.stages.is_empty() && r.note.as_deref() == Some("container ended"));
    }

    #[test]
    fn own_start_time_from_proc() {
        let t = proc_start_unix_ns(std::process::id()).unwrap();
        let now = logfmt::now_unix_ns();
        assert!(t <= now && now - t < 3_600_000_000_000, "{t} vs {now}");
    }
}
