//! One session's GPU samples until its next `cpu_stat` record: at most
//! `MAX_GPU_SAMPLES_PER_RECORD` (adjacent samples of a GPU merged past
//! that, so the interval stays covered) and `MAX_GPU_SAMPLES_PER_LOG` in
//! the whole log (later ones counted, not written).

use std::collections::BTreeMap;
use std::sync::Arc;

use throttlewatch_core::logfmt::gpu::{MAX_GPU_SAMPLES_PER_LOG, MAX_GPU_SAMPLES_PER_RECORD};
use throttlewatch_core::logfmt::{GpuSample, Record};

use crate::labels::ContainerLabels;
use crate::output::Output;

use super::source::GpuReading;

/// The first sample of a GPU stands for at most this much time before it.
const FIRST_INTERVAL_NS: u64 = 1_000_000_000;

#[derive(Debug, Default)]
pub(crate) struct GpuSeries {
    /// The container's GPUs (`start.topology.container_gpus`).
    gpus: Vec<usize>,
    pending: Vec<GpuSample>,
    /// When each GPU's last sample ended, Unix ns.
    last_ns: BTreeMap<usize, u64>,
    /// Samples taken for the log so far, and those left out past its cap.
    taken: u64,
    dropped: u64,
}

impl GpuSeries {
    /// `gpus`: the container's; `started_ns`: when watching began (Unix ns).
    pub(crate) fn new(mut gpus: Vec<usize>, started_ns: u64) -> GpuSeries {
        gpus.truncate(super::MAX_GPUS);
        let last_ns = gpus
            .iter()
            .map(|g| (*g, started_ns.saturating_sub(FIRST_INTERVAL_NS)))
            .collect();
        GpuSeries {
            gpus,
            last_ns,
            ..Default::default()
        }
    }

    /// The series of the container a log opens with `record`: the GPUs
    /// of its `start` record, or, resumed, of its process now.
    pub(crate) fn of(record: &Record, pid: Option<u32>, started_ns: u64) -> GpuSeries {
        let gpus = match record {
            Record::Start(s) => s.topology.as_ref().map(|t| t.container_gpus.clone()),
            _ => crate::placement::start_topology(pid).map(|t| t.container_gpus),
        };
        GpuSeries::new(gpus.unwrap_or_default(), started_ns)
    }

    /// [`GpuSeries::add`], and one `Output::Gpu` per GPU of the container read.
    pub(crate) fn add_out(
        &mut self,
        now_ns: u64,
        readings: &BTreeMap<usize, GpuReading>,
        container: &Arc<ContainerLabels>,
        out: &mut Vec<Output>,
    ) {
        self.add(now_ns, readings);
        for g in &self.gpus {
            if let Some(r) = readings.get(g) {
                out.push(Output::Gpu {
                    container: container.clone(),
                    gpu: *g,
                    reading: *r,
                });
            }
        }
    }

    pub(crate) fn gpus(&self) -> &[usize] {
        &self.gpus
    }

    /// The readings of the container's GPUs at `now_ns` (Unix ns).
    pub(crate) fn add(&mut self, now_ns: u64, readings: &BTreeMap<usize, GpuReading>) {
        for g in &self.gpus {
            let Some(r) = readings.get(g) else { continue };
            let Some(last) = self.last_ns.get_mut(g) else {
                continue;
            };
            let start_ns = (*last).max(now_ns.saturating_sub(FIRST_INTERVAL_NS));
            *last = now_ns;
            if now_ns <= start_ns {
                continue;
            }
            if self.taken >= MAX_GPU_SAMPLES_PER_LOG {
                self.dropped += 1;
                continue;
            }
            self.taken += 1;
            self.pending.push(GpuSample {
                gpu: *g,
                start_ns,
                interval_ns: now_ns - start_ns,
                util_pct: r.util_pct,
                mem_util_pct: r.mem_util_pct,
                mem_used_bytes: r.mem_used_bytes,
                mem_total_bytes: r.mem_total_bytes,
                sm_active_pct: r.sm_active_pct,
            });
            if self.pending.len() > MAX_GPU_SAMPLES_PER_RECORD {
                self.pending = coarsen(std::mem::take(&mut self.pending));
            }
        }
    }

    /// The samples for the next `cpu_stat` record and the count left out
    /// so far.
    pub(crate) fn take(&mut self) -> (Vec<GpuSample>, u64) {
        (std::mem::take(&mut self.pending), self.dropped)
    }
}

/// Each GPU's samples merged two by two (time order kept per GPU).
fn coarsen(samples: Vec<GpuSample>) -> Vec<GpuSample> {
    let mut by_gpu: BTreeMap<usize, Vec<GpuSample>> = BTreeMap::new();
    for s in samples {
        by_gpu.entry(s.gpu).or_default().push(s);
    }
    let mut out: Vec<GpuSample> = by_gpu
        .into_values()
        .flat_map(|v| {
            v.chunks(2)
                .map(|c| match c {
                    [a, b] => a.merged(b),
                    [a] => *a,
                    _ => GpuSample::default(),
                })
                .collect::<Vec<_>>()
        })
        .collect();
    out.sort_by_key(|s| (s.start_ns, s.gpu));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn at(util: u32) -> BTreeMap<usize, GpuReading> {
        [0, 1, 7]
            .into_iter()
            .map(|g| {
                (
                    g,
                    GpuReading {
                        util_pct: util,
                        ..Default::default()
                    },
                )
            })
            .collect()
    }

    #[test]
    fn samples_cover_the_ticks_of_the_containers_gpus_only() {
        let mut s = GpuSeries::new(vec![0, 7], 100 * S);
        s.add(100 * S + S / 2, &at(50));
        s.add(101 * S + S / 2, &at(90));
        let (v, dropped) = s.take();
        assert_eq!(dropped, 0);
        assert_eq!(v.len(), 4);
        assert!(v.iter().all(|x| x.gpu == 0 || x.gpu == 7));
        // The first stands for the second before it, the next from there on.
        assert_eq!((v[0].start_ns, v[0].interval_ns), (99 * S + S / 2, S));
        assert_eq!((v[2].start_ns, v[2].util_pct), (100 * S + S / 2, 90));
        assert!(s.take().0.is_empty());
    }

    #[test]
    fn a_long_interval_is_merged_not_cut() {
        let mut s = GpuSeries::new(vec![1], 0);
        for i in 1..=200u64 {
            s.add(i * S, &at(if i <= 100 { 100 } else { 0 }));
        }
        let (v, _) = s.take();
        assert!(v.len() <= MAX_GPU_SAMPLES_PER_RECORD, "{}", v.len());
        let covered: u64 = v.iter().map(|x| x.interval_ns).sum();
        assert_eq!(covered, 200 * S);
        let busy: u64 = v
            .iter()
            .map(|x| x.interval_ns * x.util_pct as u64 / 100)
            .sum();
        assert_eq!(busy, 100 * S);
    }

    #[test]
    fn the_log_cap_counts_what_it_leaves_out() {
        let mut s = GpuSeries::new(vec![0], 0);
        s.taken = MAX_GPU_SAMPLES_PER_LOG - 1;
        s.add(S, &at(1));
        s.add(2 * S, &at(1));
        s.add(3 * S, &at(1));
        let (v, dropped) = s.take();
        assert_eq!((v.len(), dropped), (1, 2));
    }
}
