//! The GPUs a watched container uses, sampled once a second: utilisation,
//! memory and, where the GPU has GPM, SM activity from NVML (nvml.rs,
//! loaded at run time), behind [`GpuSource`] so tests feed recorded
//! series. One [`GpuSampler`] per agent (sampler.rs) opens NVML when a
//! watched container first uses a GPU, in a thread of its own, and reads
//! each GPU once per tick whatever the number of containers on it; each
//! session keeps its samples in a bounded [`GpuSeries`] (series.rs) that
//! its next `cpu_stat` record carries.
//!
//! Where the node has no NVIDIA GPU (PCI sysfs) the agent says so once at
//! its start; where there is no library, or NVML sees no GPU, once when a
//! container first needs it. It watches as before: GPU sampling never
//! fails or delays a watch.

mod nvml;
mod nvml_ffi;
mod sampler;
mod series;
mod source;

pub(crate) use sampler::GpuSampler;
pub(crate) use series::GpuSeries;
pub(crate) use source::{GpuReading, MAX_GPUS};

#[cfg(test)]
#[path = "stub_tests.rs"]
mod stub_tests;

#[cfg(test)]
mod tests {
    use super::sampler::unavailable_line;
    use super::source::*;
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
}
