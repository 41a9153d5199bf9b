//! The node's GPU sampling, opened lazily: NVML is loaded and initialised
//! when a watched container first uses a GPU, in a thread of its own
//! (`nvmlInit` can take seconds on a node without NVIDIA's persistence
//! daemon), so neither the agent's start nor a registration waits for it;
//! the ticks read nothing until it is open. What it found, or why there
//! is no GPU sampling, is said once, then. A node whose PCI sysfs shows no
//! NVIDIA GPU (no container there can have one) is said at the start.

use std::collections::BTreeMap;
use std::thread::JoinHandle;

use super::nvml::Nvml;
use super::nvml::NVML_LIBRARY;
use super::source::{GpuReading, GpuSource, NvmlError, MAX_GPUS, NVML_LIB_ENV};

/// Where the node's GPU source stands.
enum NvmlState {
    /// Not opened yet: at the first read that wants a GPU.
    Closed {
        path: String,
    },
    /// Being opened in its thread.
    Opening {
        path: String,
        thread: JoinHandle<Result<Nvml, NvmlError>>,
    },
    Open(Box<dyn GpuSource>),
    /// No library or no GPU (said once).
    Unavailable,
}

/// The node's GPU source, if any, and what has been said about it.
pub(crate) struct GpuSampler {
    state: NvmlState,
    /// One line: how GPUs will be read, what was found, or why not.
    status: String,
    /// A refused read was said (once per agent; later ones are skipped).
    said_read_error: bool,
}

/// The line the agent prints, once, without GPU sampling.
pub(crate) fn unavailable_line(e: &NvmlError) -> String {
    format!(
        "throttlewatch agent: GPU utilisation is not sampled: {e}; freezes are watched as before (nvml_library in throttlewatch.toml or {NVML_LIB_ENV} names the library if it is elsewhere)"
    )
}

/// The line the agent prints, once, with GPU sampling: the library, its
/// GPUs, and those with SM activity.
fn found_line(path: &str, src: &dyn GpuSource) -> String {
    let uuids = src.uuids();
    let sm = src.sm_active_gpus();
    let sm = match sm.len() {
        0 => "no SM activity (GPM not supported): utilisation only".to_string(),
        n if n == uuids.len() => "SM activity (GPM) on every GPU".to_string(),
        _ => {
            let gpus: Vec<String> = sm.iter().map(|g| g.to_string()).collect();
            format!(
                "SM activity (GPM) on GPU {}, utilisation only on the others",
                gpus.join(", ")
            )
        }
    };
    format!(
        "throttlewatch agent: GPU utilisation from {path}: {} GPUs ({}); {sm}",
        uuids.len(),
        uuids.join(", ")
    )
}

/// NVML from `path` with its GPUs; no GPU is an error.
fn open_nvml(path: &str) -> Result<Nvml, NvmlError> {
    Nvml::open(path).and_then(|n| match n.uuids().len() {
        0 => Err(NvmlError::NoGpu),
        _ => Ok(n),
    })
}

impl GpuSampler {
    /// NVML from `THROTTLEWATCH_NVML_LIB`, else `configured` (the
    /// configuration's `nvml_library`), else the driver's library, opened
    /// when first needed ([`GpuSampler::read`]); none where PCI sysfs shows
    /// no NVIDIA GPU (the containers' GPUs are those of sysfs).
    pub(crate) fn open(configured: &str) -> GpuSampler {
        let path = std::env::var(NVML_LIB_ENV)
            .ok()
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| match configured {
                "" => NVML_LIBRARY.into(),
                c => c.into(),
            });
        let mut s = GpuSampler::lazy(&path);
        let pci_gpus = crate::placement::start_topology(None).map_or(0, |t| t.gpus.len());
        if pci_gpus == 0 {
            s.state = NvmlState::Unavailable;
            s.status = unavailable_line(&NvmlError::NoPciGpu { path });
        }
        s
    }

    /// NVML from the library at `path`, opened when first needed.
    pub(crate) fn lazy(path: &str) -> GpuSampler {
        GpuSampler {
            state: NvmlState::Closed { path: path.into() },
            status: format!(
                "throttlewatch agent: GPU sampling: NVML ({path}) is opened when a watched container first uses a GPU"
            ),
            said_read_error: false,
        }
    }

    /// NVML from the library at `path`, opened now (tests).
    #[cfg(test)]
    pub(crate) fn from_path(path: &str) -> GpuSampler {
        let mut s = GpuSampler::lazy(path);
        s.settle(path, open_nvml(path));
        s
    }

    /// One line: how GPUs will be read, what was found, or why not.
    pub(crate) fn status(&self) -> &str {
        &self.status
    }

    #[cfg(test)]
    pub(crate) fn with(source: Option<Box<dyn GpuSource>>) -> GpuSampler {
        GpuSampler {
            state: source.map_or(NvmlState::Unavailable, NvmlState::Open),
            status: String::new(),
            said_read_error: false,
        }
    }

    /// False once it is known there is no library or no GPU.
    pub(crate) fn available(&self) -> bool {
        !matches!(self.state, NvmlState::Unavailable)
    }

    /// The outcome of opening `path`, said once.
    fn settle(&mut self, path: &str, opened: Result<Nvml, NvmlError>) {
        match opened {
            Ok(n) => {
                self.status = found_line(path, &n);
                self.state = NvmlState::Open(Box::new(n));
            }
            Err(e) => {
                self.status = unavailable_line(&e);
                self.state = NvmlState::Unavailable;
            }
        }
        eprintln!("{}", self.status);
    }

    /// True once open. `wanted`: a GPU is wanted (starts the opening).
    /// Never waits: an opening not finished reads nothing this tick.
    fn ready(&mut self, wanted: bool) -> bool {
        match &self.state {
            NvmlState::Open(_) => return true,
            NvmlState::Unavailable => return false,
            NvmlState::Closed { .. } if !wanted => return false,
            NvmlState::Opening { thread, .. } if !thread.is_finished() => return false,
            _ => {}
        }
        match std::mem::replace(&mut self.state, NvmlState::Unavailable) {
            NvmlState::Closed { path } => {
                let p = path.clone();
                let spawned = std::thread::Builder::new()
                    .name("tw-nvml-open".into())
                    .spawn(move || open_nvml(&p));
                match spawned {
                    Ok(thread) => self.state = NvmlState::Opening { path, thread },
                    Err(e) => self.settle(&path, Err(NvmlError::Thread(e.to_string()))),
                }
                false
            }
            NvmlState::Opening { path, thread } => {
                let opened = thread
                    .join()
                    .unwrap_or_else(|_| Err(NvmlError::Thread("it panicked".into())));
                self.settle(&path, opened);
                matches!(self.state, NvmlState::Open(_))
            }
            other => {
                self.state = other;
                false
            }
        }
    }

    /// Read each GPU in `wanted` once (at most [`MAX_GPUS`]); a GPU that
    /// cannot be read is left out (said once per agent). The first call
    /// with a GPU starts opening NVML; until it is open, nothing is read.
    pub(crate) fn read(
        &mut self,
        wanted: impl IntoIterator<Item = usize>,
    ) -> BTreeMap<usize, GpuReading> {
        let mut out = BTreeMap::new();
        let mut wanted: Vec<usize> = wanted.into_iter().collect();
        wanted.sort_unstable();
        wanted.dedup();
        if !self.ready(!wanted.is_empty()) {
            return out;
        }
        let NvmlState::Open(src) = &mut self.state else {
            return out;
        };
        for i in wanted.into_iter().take(MAX_GPUS) {
            match src.read(i) {
                Ok(r) => {
                    out.insert(i, r);
                }
                Err(e) if !self.said_read_error => {
                    self.said_read_error = true;
                    eprintln!("throttlewatch agent: {e}; GPUs that cannot be read are left out of the logs, not reported again");
                }
                Err(_) => {}
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::Recorded;
    use super::*;

    #[test]
    fn each_gpu_is_read_once_and_failures_are_left_out() {
        let rec = Recorded(vec![vec![90], vec![10], vec![]], 0);
        let mut s = GpuSampler::with(Some(Box::new(rec)));
        let got = s.read([1, 0, 1, 2]);
        assert_eq!(got.keys().copied().collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(got[&0].util_pct, 90);
        assert!(s.said_read_error);
    }

    #[test]
    fn nothing_is_opened_until_a_gpu_is_wanted() {
        let mut s = GpuSampler::lazy("/nonexistent/libnvidia-ml.so.1");
        assert!(s
            .status()
            .contains("is opened when a watched container first uses a GPU"));
        for _ in 0..3 {
            assert!(s.read([]).is_empty());
        }
        assert!(matches!(s.state, NvmlState::Closed { .. }));
        assert!(s.available());
        // Wanted: opened in its thread; the missing library found there.
        assert!(s.read([0]).is_empty());
        let t = std::time::Instant::now();
        while s.available() {
            assert!(t.elapsed().as_secs() < 10, "the opening did not finish");
            std::thread::sleep(std::time::Duration::from_millis(10));
            assert!(s.read([0]).is_empty());
        }
        assert!(
            s.status()
                .contains("GPU utilisation is not sampled: no NVIDIA management library"),
            "{}",
            s.status()
        );
    }
}
