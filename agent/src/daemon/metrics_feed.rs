//! How the engine's outputs feed the series (`Metrics::observe`): each
//! output into its families, at the container's level of detail, and a
//! new container's counters held back until a scrape has seen them at 0.

use throttlewatch_bpf::runq::RUNQ_SLOTS;

use super::held::HELD_AT_MOST;
use super::{
    ContainerLabels, GpuLabels, MapLabels, Metrics, PreemptLabels, StageLabels, WaitLabels,
};
use crate::output::Output;

impl Metrics {
    /// The one way metrics are fed: what the engine's poll returned. A
    /// container no scrape has seen yet keeps its cpu.stat counters back,
    /// summed (constant memory), until one has, or for [`HELD_AT_MOST`]:
    /// that scrape sees them at 0, so their growth over the container's
    /// life counts its first seconds too (a counter first scraped at its
    /// first tick's value loses that value: 0.07 s of a 0.29 s bursty
    /// container's in the fleet test). Everything else goes through.
    pub(crate) fn observe(&self, o: &Output) {
        if let Output::Counters {
            container,
            kernel,
            probe_throttled_ns,
        } = o
        {
            if let Ok(mut u) = self.unscraped.lock() {
                if let Some(h) = u.get_mut(container.as_ref()) {
                    h.add(kernel, *probe_throttled_ns);
                    if h.since.elapsed() < HELD_AT_MOST {
                        return;
                    }
                    let h = u.remove(container.as_ref()).unwrap_or_default();
                    drop(u);
                    return self.observe_counters(container, &h.kernel, h.probe_ns);
                }
            }
        }
        self.observe_now(o);
    }

    /// After a scrape: every container it saw gets what was kept back.
    pub(super) fn scraped(&self) {
        let held = match self.unscraped.lock() {
            Ok(mut u) => std::mem::take(&mut *u),
            Err(_) => return,
        };
        for (l, h) in held {
            self.observe_counters(&l, &h.kernel, h.probe_ns);
        }
    }

    fn observe_now(&self, o: &Output) {
        match o {
            Output::Freeze {
                container,
                frozen_ns,
                record,
            } => {
                self.freeze_seconds
                    .get_or_create(container)
                    .observe_ns(*frozen_ns);
                let cause = match record {
                    Some(r)
                        if r.throttled_cgroup_id != 0 && r.throttled_cgroup_id != r.cgroup_id =>
                    {
                        "ancestor_limit"
                    }
                    _ => "own_limit",
                };
                self.runnable_waiting_seconds
                    .get_or_create(&WaitLabels::new(container, cause))
                    .inc_by(*frozen_ns as f64 / 1e9);
            }
            Output::ColdStart { container, record } => self.observe_cold_start(container, record),
            Output::Runq {
                container,
                record,
                slots,
            } => self.observe_runq(container, record, slots),
            Output::Counters {
                container,
                kernel,
                probe_throttled_ns,
            } => self.observe_counters(container, kernel, *probe_throttled_ns),
            Output::Gpu {
                container,
                gpu,
                reading,
            } => self.observe_gpu(container, *gpu, reading),
            Output::Control { container, .. } => {
                self.control_changes.get_or_create(container).inc();
            }
            Output::LostEvents { count, map_full } => {
                self.lost_events.inc_by(*count);
                for (map, n) in [
                    ("episodes", map_full.episodes),
                    ("frozen_by_tid", map_full.frozen_by_tid),
                    ("bandwidth_timers", map_full.bandwidth_timers),
                ] {
                    // Every map's series exists from the first poll (0), so
                    // rate() sees the first refusal.
                    self.map_full
                        .get_or_create(&MapLabels { map: map.into() })
                        .inc_by(n);
                }
            }
        }
    }

    fn observe_counters(
        &self,
        l: &ContainerLabels,
        d: &throttlewatch_cgroup::CpuStat,
        probe_ns: u64,
    ) {
        let secs = |ns: u64| ns as f64 / 1e9;
        self.kernel_throttled_seconds
            .get_or_create(l)
            .inc_by(secs(d.throttled_ns));
        self.periods.get_or_create(l).inc_by(d.nr_periods as f64);
        self.throttled_periods
            .get_or_create(l)
            .inc_by(d.nr_throttled as f64);
        self.burst_seconds.get_or_create(l).inc_by(secs(d.burst_ns));
        if !self.full(l) {
            return;
        }
        // The probe's own count of what the kernel counts (the fidelity
        // check), and bursts counted by period: `full` only.
        self.bursts.get_or_create(l).inc_by(d.nr_bursts as f64);
        self.throttled_seconds
            .get_or_create(l)
            .inc_by(secs(probe_ns));
    }

    /// A GPU of a container at a tick.
    fn observe_gpu(&self, l: &ContainerLabels, gpu: usize, r: &crate::gpu::GpuReading) {
        if let Ok(mut g) = self.gpus_of.lock() {
            let v = g.entry(l.clone()).or_default();
            if !v.contains(&gpu) {
                if v.len() >= crate::gpu::MAX_GPUS {
                    return;
                }
                v.push(gpu);
            }
        }
        let k = GpuLabels::new(l, gpu);
        self.gpu_utilization
            .get_or_create(&k)
            .set(r.util_pct as f64 / 100.0);
        if !self.full(l) {
            return;
        }
        self.gpu_memory_used
            .get_or_create(&k)
            .set(r.mem_used_bytes as f64);
        if let Some(sm) = r.sm_active_pct {
            self.gpu_sm_active.get_or_create(&k).set(sm as f64 / 100.0);
        }
    }

    /// Export one interval's run-queue histogram and preemptions.
    fn observe_runq(
        &self,
        l: &ContainerLabels,
        r: &throttlewatch_core::logfmt::Runq,
        slots: &[u64; RUNQ_SLOTS],
    ) {
        self.runq_latency
            .get_or_create(l)
            .add_slots(slots, r.total_ns);
        let full = self.full(l);
        let wakers = r.wakeups.iter().flat_map(|w| w.by_waker.iter());
        for (by, t) in wakers.filter(|_| full) {
            let k = PreemptLabels::new(l, by);
            self.wakeups.get_or_create(&k).inc_by(t.count as f64);
            self.wakeup_wait_seconds
                .get_or_create(&k)
                .inc_by(t.wait_ns as f64 / 1e9);
            self.wakeup_frozen_seconds
                .get_or_create(&k)
                .inc_by(t.frozen_ns as f64 / 1e9);
        }
        let by = [
            ("same", "own_threads", r.preempted_by_same),
            ("other", "other_containers", r.preempted_by_other),
            ("host", "host", r.preempted_by_host),
        ];
        let n: u64 = by.iter().map(|b| b.2).sum();
        for (by, cause, k) in by {
            if full {
                self.runq_preemptions
                    .get_or_create(&PreemptLabels::new(l, by))
                    .inc_by(k as f64);
            }
            // The interval's waits split as the report's diagnosis does.
            let share = match n {
                0 => f64::from(u8::from(cause == "host")),
                n => k as f64 / n as f64,
            };
            if share > 0.0 && r.total_ns > 0 {
                self.runnable_waiting_seconds
                    .get_or_create(&WaitLabels::new(l, cause))
                    .inc_by(r.total_ns as f64 * share / 1e9);
            }
        }
    }

    /// Export a `cold_start` record: one observation per stage it reached
    /// after `create` (which is the origin, always 0).
    fn observe_cold_start(&self, l: &ContainerLabels, c: &throttlewatch_core::logfmt::ColdStart) {
        for s in &c.stages {
            let Some(stage) = crate::coldstart::Stage::ALL
                .into_iter()
                .filter(|k| *k != crate::coldstart::Stage::Create)
                .find(|k| k.name() == s.stage)
            else {
                continue;
            };
            if let Some(d) = s.since_create_ns {
                self.cold_start_seconds
                    .get_or_create(&StageLabels {
                        namespace: l.namespace.clone(),
                        qos_class: l.qos_class.clone(),
                        stage: stage.name().into(),
                    })
                    .observe(d as f64 / 1e9);
            }
        }
    }
}
