//! The GPUs a watched container uses, sampled once a second: utilisation
//! and memory from NVML (nvml.rs, loaded at run time), behind
//! [`GpuSource`] so tests feed recorded series. One [`GpuSampler`] per
//! agent reads each GPU once per tick whatever the number of containers
//! on it; each session keeps its samples in a bounded [`GpuSeries`]
//! (series.rs) that its next `cpu_stat` record carries.
//!
//! Where there is no library or no GPU the agent says so once and watches
//! as before: GPU sampling never fails a watch.

mod nvml;
mod series;

use std::collections::BTreeMap;

pub(crate) use nvml::NVML_LIBRARY;
pub(crate) use series::GpuSeries;

/// Overrides the library's path (tests: a path that does not exist).
pub(crate) const NVML_LIB_ENV: &str = "THROTTLEWATCH_NVML_LIB";

/// GPUs read per tick at most (the series' and the metrics' bound).
pub(crate) const MAX_GPUS: usize = 64;

/// One GPU at one moment, as NVML reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct GpuReading {
    pub util_pct: u32,
    pub mem_util_pct: u32,
    pub mem_used_bytes: u64,
    pub mem_total_bytes: u64,
}

/// A read of one GPU that NVML refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} for GPU {index}: {message} (NVML return {code})")]
pub(crate) struct GpuReadError {
    pub call: &'static str,
    pub index: usize,
    pub code: i32,
    pub message: String,
}

/// Why there is no GPU sampling on this node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NvmlError {
    #[error("no NVIDIA management library ({path}: {reason})")]
    NoLibrary { path: String, reason: String },
    #[error("{path} has no {symbol} (not NVIDIA's management library, or too old)")]
    NoSymbol { path: String, symbol: &'static str },
    #[error("nvmlInit_v2: {message} (NVML return {code})")]
    Init { code: i32, message: String },
    #[error("NVML sees no GPU")]
    NoGpu,
}

/// Where GPU readings come from: NVML, or a recorded series in tests.
pub(crate) trait GpuSource: Send {
    /// The GPUs' UUIDs in index order (empty strings where unknown).
    fn uuids(&self) -> Vec<String>;
    fn read(&mut self, index: usize) -> Result<GpuReading, GpuReadError>;
}

/// The node's GPU source, if any, and what has been said about it.
pub(crate) struct GpuSampler {
    source: Option<Box<dyn GpuSource>>,
    /// What was found, one line (the agent prints it once at its start).
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

impl GpuSampler {
    /// NVML from `THROTTLEWATCH_NVML_LIB`, else `configured` (the
    /// configuration's `nvml_library`), else the driver's library; what it
    /// found, or why there is none, is [`GpuSampler::status`].
    pub(crate) fn open(configured: &str) -> GpuSampler {
        let path = std::env::var(NVML_LIB_ENV)
            .ok()
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| match configured {
                "" => NVML_LIBRARY.into(),
                c => c.into(),
            });
        GpuSampler::from_path(&path)
    }

    /// NVML from the library at `path`.
    pub(crate) fn from_path(path: &str) -> GpuSampler {
        let opened = nvml::Nvml::open(path).and_then(|n| match n.uuids().len() {
            0 => Err(NvmlError::NoGpu),
            _ => Ok(n),
        });
        match opened {
            Ok(n) => {
                let status = format!(
                    "throttlewatch agent: GPU utilisation from {path}: {} GPUs ({})",
                    n.uuids().len(),
                    n.uuids().join(", ")
                );
                GpuSampler::with(Some(Box::new(n))).said(status)
            }
            Err(e) => GpuSampler::with(None).said(unavailable_line(&e)),
        }
    }

    fn said(mut self, status: String) -> GpuSampler {
        tracing::debug!("{status}");
        self.status = status;
        self
    }

    /// One line: the library and its GPUs, or why GPUs are not sampled.
    pub(crate) fn status(&self) -> &str {
        &self.status
    }

    pub(crate) fn with(source: Option<Box<dyn GpuSource>>) -> GpuSampler {
        GpuSampler {
            source,
            status: String::new(),
            said_read_error: false,
        }
    }

    pub(crate) fn available(&self) -> bool {
        self.source.is_some()
    }

    /// Read each GPU in `wanted` once (at most [`MAX_GPUS`]); a GPU that
    /// cannot be read is left out (said once per agent).
    pub(crate) fn read(
        &mut self,
        wanted: impl IntoIterator<Item = usize>,
    ) -> BTreeMap<usize, GpuReading> {
        let mut out = BTreeMap::new();
        let Some(src) = self.source.as_mut() else {
            return out;
        };
        let mut wanted: Vec<usize> = wanted.into_iter().collect();
        wanted.sort_unstable();
        wanted.dedup();
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
#[path = "stub_tests.rs"]
mod stub_tests;

#[cfg(test)]
mod tests {
    use super::*;

    /// A recorded series per GPU, one reading per call; GPU 3 fails.
    pub(crate) struct Recorded(pub Vec<Vec<u32>>, pub usize);

    impl GpuSource for Recorded {
        fn uuids(&self) -> Vec<String> {
            vec![String::new(); self.0.len()]
        }
        fn read(&mut self, index: usize) -> Result<GpuReading, GpuReadError> {
            let at = self.1;
            self.1 += 1;
            let util = self
                .0
                .get(index)
                .filter(|s| !s.is_empty())
                .and_then(|s| s.get(at % s.len()).copied());
            util.map(|u| GpuReading {
                util_pct: u,
                ..Default::default()
            })
            .ok_or(GpuReadError {
                call: "recorded",
                index,
                code: 2,
                message: "none".into(),
            })
        }
    }

    #[test]
    fn a_missing_library_is_said_and_nothing_is_sampled() {
        let e = nvml::Nvml::open("/nonexistent/libnvidia-ml.so.1").err();
        let Some(e) = e else {
            panic!("a library that does not exist opened")
        };
        assert!(matches!(e, NvmlError::NoLibrary { .. }), "{e:?}");
        let line = unavailable_line(&e);
        assert!(
            line.contains("GPU utilisation is not sampled: no NVIDIA management library (/nonexistent/libnvidia-ml.so.1:"),
            "{line}"
        );
        let mut s = GpuSampler::with(None);
        assert!(!s.available());
        assert!(s.read([0, 1]).is_empty());
    }

    #[test]
    fn a_library_without_nvml_names_the_symbol() {
        // libc is loaded everywhere and has none of NVML's entry points.
        match nvml::Nvml::open("libc.so.6") {
            Err(NvmlError::NoSymbol { symbol, .. }) => assert_eq!(symbol, "nvmlInit_v2"),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("libc passed for NVML"),
        }
    }

    #[test]
    fn each_gpu_is_read_once_and_failures_are_left_out() {
        let rec = Recorded(vec![vec![90], vec![10], vec![]], 0);
        let mut s = GpuSampler::with(Some(Box::new(rec)));
        let got = s.read([1, 0, 1, 2]);
        assert_eq!(got.keys().copied().collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(got[&0].util_pct, 90);
        assert!(s.said_read_error);
    }
}
