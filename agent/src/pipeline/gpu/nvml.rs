//! NVIDIA's management library (NVML), loaded at run time with `dlopen`:
//! nothing links against it, so the agent builds, tests and runs where
//! there is no driver. The only unsafe code of the GPU sampling is here.
//!
//! The C signatures used, from `nvml.h` (`nvmlReturn_t` is a C enum, an
//! `int`; `nvmlDevice_t` is `struct nvmlDevice_st *`):
//!
//! ```c
//! nvmlReturn_t nvmlInit_v2(void);
//! nvmlReturn_t nvmlShutdown(void);
//! const char  *nvmlErrorString(nvmlReturn_t result);
//! nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount);
//! nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
//! nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length);
//! nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization);
//! nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
//! typedef struct { unsigned int gpu; unsigned int memory; } nvmlUtilization_t;
//! typedef struct { unsigned long long total; unsigned long long free; unsigned long long used; } nvmlMemory_t;
//! ```
//!
//! SM activity, where the driver and the GPU have GPM (GPU performance
//! monitoring: Hopper and later, drivers from 12.0), from `nvml.h` of NVML
//! 13.3.29 (NVIDIA/go-nvml `gen/nvml/nvml.h`, commit 8b8585b); every entry
//! point is optional (an older driver lacks them: utilisation only):
//!
//! ```c
//! typedef struct nvmlGpmSample_st *nvmlGpmSample_t;
//! typedef struct {
//!     unsigned int metricId;   // IN: NVML_GPM_METRIC_SM_UTIL = 2
//!     nvmlReturn_t nvmlReturn; // OUT
//!     double value;            // OUT: 0.0 - 100.0
//!     struct { char *shortName; char *longName; char *unit; } metricInfo; // OUT
//! } nvmlGpmMetric_t;
//! typedef struct {
//!     unsigned int version;    // IN: NVML_GPM_METRICS_GET_VERSION = 1
//!     unsigned int numMetrics; // IN: how many of metrics[] to retrieve
//!     nvmlGpmSample_t sample1, sample2;
//!     nvmlGpmMetric_t metrics[NVML_GPM_METRIC_MAX]; // 98 (12.0-12.8), 210 (12.9-13.1), 333 (13.3)
//! } nvmlGpmMetricsGet_t;
//! typedef struct { unsigned int version; unsigned int isSupportedDevice; } nvmlGpmSupport_t; // version = 1
//! nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *gpmSupport);
//! nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *gpmSample);
//! nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t gpmSample);
//! nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t gpmSample);
//! nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *metricsGet);
//! ```

use std::ffi::{c_char, c_uint, c_void, CStr, CString};
use std::time::Instant;

use super::source::{GpuReadError, GpuReading, GpuSource, NvmlError};

/// The library's name as the driver installs it.
pub(crate) const NVML_LIBRARY: &str = "libnvidia-ml.so.1";

use super::nvml_ffi::*;

/// An initialised NVML with the handles of its GPUs (NVML's index order).
pub(crate) struct Nvml {
    lib: *mut c_void,
    api: Api,
    devices: Vec<Device>,
    uuids: Vec<String>,
    /// None: no GPM entry points in this library.
    gpm: Option<Gpm>,
}

// SAFETY: NVML is documented thread-safe; the handles (devices and GPM
// samples) are opaque values that stay valid until nvmlGpmSampleFree and
// nvmlShutdown, which only `Drop` calls; the request buffer is owned.
unsafe impl Send for Nvml {}

/// `dlsym` of `name`, as a function pointer of type `F`.
///
/// # Safety
/// `lib` is a live `dlopen` handle and `F` is the exact type of the symbol.
unsafe fn symbol<F: Copy>(
    lib: *mut c_void,
    path: &str,
    name: &'static str,
) -> Result<F, NvmlError> {
    let c = CString::new(name).map_err(|_| NvmlError::NoSymbol {
        path: path.into(),
        symbol: name,
    })?;
    // SAFETY: `lib` is live (caller); `c` is NUL-terminated.
    let p = unsafe { libc::dlsym(lib, c.as_ptr()) };
    if p.is_null() {
        return Err(NvmlError::NoSymbol {
            path: path.into(),
            symbol: name,
        });
    }
    // SAFETY: a function pointer has the size of a data pointer on the
    // platforms dlsym exists on; the caller names the symbol's real type.
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

/// `dlerror()`'s text, or `fallback`.
fn dl_error(fallback: &str) -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated thread-local string.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        return fallback.into();
    }
    // SAFETY: non-null, NUL-terminated (above).
    unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
}

impl Nvml {
    /// Load `path`, initialise NVML and take every GPU's handle.
    pub(crate) fn open(path: &str) -> Result<Nvml, NvmlError> {
        let cpath = CString::new(path).map_err(|_| NvmlError::NoLibrary {
            path: path.into(),
            reason: "the path holds a NUL byte".into(),
        })?;
        // SAFETY: a NUL-terminated path; RTLD_NOW resolves everything here.
        let lib = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if lib.is_null() {
            // dlerror names the path itself: said once.
            let e = dl_error("dlopen failed");
            let reason = e.strip_prefix(&format!("{path}: ")).unwrap_or(&e);
            return Err(NvmlError::NoLibrary {
                path: path.into(),
                reason: reason.into(),
            });
        }
        let mut nvml = match Self::resolve(lib, path) {
            Ok(n) => n,
            Err(e) => {
                // SAFETY: the handle dlopen returned, closed once.
                unsafe { libc::dlclose(lib) };
                return Err(e);
            }
        };
        nvml.take_devices()?;
        nvml.gpm = nvml.take_gpm(path);
        Ok(nvml)
    }

    /// The entry points, then `nvmlInit_v2`.
    fn resolve(lib: *mut c_void, path: &str) -> Result<Nvml, NvmlError> {
        // SAFETY: `lib` is live; each type is the nvml.h signature above.
        let (init, api) = unsafe {
            let init: unsafe extern "C" fn() -> Ret = symbol(lib, path, "nvmlInit_v2")?;
            let api = Api {
                shutdown: symbol(lib, path, "nvmlShutdown")?,
                error_string: symbol(lib, path, "nvmlErrorString")?,
                count: symbol(lib, path, "nvmlDeviceGetCount_v2")?,
                handle: symbol(lib, path, "nvmlDeviceGetHandleByIndex_v2")?,
                uuid: symbol(lib, path, "nvmlDeviceGetUUID")?,
                utilization: symbol(lib, path, "nvmlDeviceGetUtilizationRates")?,
                memory: symbol(lib, path, "nvmlDeviceGetMemoryInfo")?,
            };
            (init, api)
        };
        let nvml = Nvml {
            lib,
            api,
            devices: Vec::new(),
            uuids: Vec::new(),
            gpm: None,
        };
        // SAFETY: takes no arguments; paired with nvmlShutdown in Drop.
        let rc = unsafe { init() };
        if rc != 0 {
            let message = nvml.message(rc);
            // Not initialised: no nvmlShutdown; `open` closes the library.
            let _ = std::mem::ManuallyDrop::new(nvml);
            return Err(NvmlError::Init { code: rc, message });
        }
        Ok(nvml)
    }

    fn take_devices(&mut self) -> Result<(), NvmlError> {
        let mut n: c_uint = 0;
        // SAFETY: NVML is initialised; `n` is a valid out-pointer.
        let rc = unsafe { (self.api.count)(&mut n) };
        if rc != 0 {
            return Err(NvmlError::Init {
                code: rc,
                message: self.message(rc),
            });
        }
        for i in 0..n {
            let mut d: Device = std::ptr::null_mut();
            // SAFETY: initialised; `i` < the count; `d` a valid out-pointer.
            let rc = unsafe { (self.api.handle)(i, &mut d) };
            if rc != 0 {
                continue;
            }
            let mut buf = [0 as c_char; UUID_BUFFER];
            // SAFETY: a handle NVML gave; the buffer's real length is passed.
            let rc = unsafe { (self.api.uuid)(d, buf.as_mut_ptr(), UUID_BUFFER as c_uint) };
            let uuid = if rc == 0 {
                // SAFETY: NVML NUL-terminates within the length on success.
                unsafe { CStr::from_ptr(buf.as_ptr()) }
                    .to_string_lossy()
                    .into_owned()
            } else {
                String::new()
            };
            self.devices.push(d);
            self.uuids.push(uuid);
        }
        Ok(())
    }

    /// `nvmlErrorString(rc)`.
    fn message(&self, rc: Ret) -> String {
        // SAFETY: callable before init; returns a static string or NULL.
        let p = unsafe { (self.api.error_string)(rc) };
        if p.is_null() {
            return format!("NVML error {rc}");
        }
        // SAFETY: non-null, NUL-terminated, static.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// GPM where the library has its entry points: for each GPU that says
    /// it supports GPM, two sample buffers. None: utilisation only.
    fn take_gpm(&self, path: &str) -> Option<Gpm> {
        // SAFETY: `self.lib` is live; each type is the nvml.h signature
        // in the module's comment.
        let api = unsafe {
            GpmApi {
                query_support: symbol(self.lib, path, "nvmlGpmQueryDeviceSupport").ok()?,
                sample_alloc: symbol(self.lib, path, "nvmlGpmSampleAlloc").ok()?,
                sample_free: symbol(self.lib, path, "nvmlGpmSampleFree").ok()?,
                sample_get: symbol(self.lib, path, "nvmlGpmSampleGet").ok()?,
                metrics_get: symbol(self.lib, path, "nvmlGpmMetricsGet").ok()?,
            }
        };
        let gpus = self.devices.iter().map(|d| gpm_gpu(&api, *d)).collect();
        let request = Box::new(GpmMetricsGet {
            version: GPM_METRICS_GET_VERSION,
            num_metrics: 0,
            sample1: std::ptr::null_mut(),
            sample2: std::ptr::null_mut(),
            metrics: [GpmMetric::asking(0); GPM_METRICS_CAPACITY],
        });
        Some(Gpm { api, request, gpus })
    }

    fn call_error(&self, call: &'static str, index: usize, code: Ret) -> GpuReadError {
        GpuReadError {
            call,
            index,
            code,
            message: self.message(code),
        }
    }
}

/// The GPM buffers of GPU `d`, if it supports GPM.
fn gpm_gpu(api: &GpmApi, d: Device) -> Option<GpmGpu> {
    let mut support = GpmSupport {
        version: GPM_SUPPORT_VERSION,
        ..Default::default()
    };
    // SAFETY: a handle NVML gave; `support` is nvmlGpmSupport_t with its
    // version set as nvml.h asks.
    let rc = unsafe { (api.query_support)(d, &mut support) };
    if rc != 0 || support.is_supported_device == 0 {
        return None;
    }
    let mut samples: [GpmSample; 2] = [std::ptr::null_mut(); 2];
    for s in samples.iter_mut() {
        // SAFETY: `s` is a valid out-pointer for one nvmlGpmSample_t.
        let rc = unsafe { (api.sample_alloc)(s) };
        if rc != 0 || s.is_null() {
            // Not allocated: whatever the call left there is not freed.
            *s = std::ptr::null_mut();
            free_samples(api, &samples);
            return None;
        }
    }
    Some(GpmGpu {
        samples,
        next: 0,
        last_at: None,
    })
}

/// nvmlGpmSampleFree of each allocated sample (null ones skipped).
fn free_samples(api: &GpmApi, samples: &[GpmSample; 2]) {
    for s in samples.iter().filter(|s| !s.is_null()) {
        // SAFETY: allocated by nvmlGpmSampleAlloc, freed once (the caller
        // drops the buffers with them).
        unsafe { (api.sample_free)(*s) };
    }
}

impl Gpm {
    /// The share of SMs busy on GPU `index` (handle `d`) since its previous
    /// sample, percent; None without GPM, on the first sample, or when the
    /// previous is under [`GPM_MIN_GAP`] or over [`GPM_MAX_GAP`] old.
    fn sm_active(&mut self, index: usize, d: Device) -> Option<u32> {
        let g = self.gpus.get_mut(index)?.as_mut()?;
        let now = Instant::now();
        if g.last_at.is_some_and(|at| now - at < GPM_MIN_GAP) {
            return None;
        }
        let (prev, cur) = (g.samples[1 - g.next], g.samples[g.next]);
        // SAFETY: a handle NVML gave; `cur` a sample buffer it allocated.
        let rc = unsafe { (self.api.sample_get)(d, cur) };
        if rc != 0 {
            g.last_at = None;
            return None;
        }
        let since = g.last_at.replace(now).map(|at| now - at);
        g.next = 1 - g.next;
        since.filter(|s| *s <= GPM_MAX_GAP)?;
        let r = &mut *self.request;
        r.version = GPM_METRICS_GET_VERSION;
        r.num_metrics = 1;
        r.sample1 = prev;
        r.sample2 = cur;
        r.metrics[0] = GpmMetric::asking(GPM_METRIC_SM_UTIL);
        // SAFETY: `r` is nvmlGpmMetricsGet_t with `version` set as nvml.h
        // says and both samples taken of this GPU, in time order. The
        // struct's `metrics[NVML_GPM_METRIC_MAX]` has grown with drivers
        // (98 in 12.0-12.8, 210 in 12.9-13.1, 333 in 13.3), so the driver
        // and we may disagree on its size; the version field does not
        // change with it. What keeps the call in bounds: the driver reads
        // and writes the entries up to `numMetrics` (1 here, below every
        // driver's MAX, so none refuses it), and our array has
        // GPM_METRICS_CAPACITY (1024) entries, more than any MAX so far,
        // so even a driver that touched its whole array stays inside
        // ours. The header fields before `metrics` are the same in all
        // versions. The metric's name pointers are the driver's (static)
        // and are never read here.
        let rc = unsafe { (self.api.metrics_get)(r) };
        let m = r.metrics[0];
        (rc == 0 && m.nvml_return == 0 && m.value.is_finite())
            .then(|| m.value.clamp(0.0, 100.0).round() as u32)
    }

    /// The GPUs (NVML's index) that support GPM.
    fn gpus(&self) -> Vec<usize> {
        (0..self.gpus.len())
            .filter(|i| self.gpus[*i].is_some())
            .collect()
    }
}

impl Drop for Gpm {
    fn drop(&mut self) {
        for g in self.gpus.iter().flatten() {
            free_samples(&self.api, &g.samples);
        }
    }
}

impl GpuSource for Nvml {
    fn uuids(&self) -> Vec<String> {
        self.uuids.clone()
    }

    fn sm_active_gpus(&self) -> Vec<usize> {
        self.gpm.as_ref().map(Gpm::gpus).unwrap_or_default()
    }

    fn read(&mut self, index: usize) -> Result<GpuReading, GpuReadError> {
        let Some(&d) = self.devices.get(index) else {
            return Err(GpuReadError {
                call: "nvmlDeviceGetHandleByIndex_v2",
                index,
                code: 2,
                message: format!("no GPU {index} (NVML has {})", self.devices.len()),
            });
        };
        let mut u = Utilization::default();
        // SAFETY: a handle NVML gave; `u` is the nvmlUtilization_t layout.
        let rc = unsafe { (self.api.utilization)(d, &mut u) };
        if rc != 0 {
            return Err(self.call_error("nvmlDeviceGetUtilizationRates", index, rc));
        }
        let mut m = Memory::default();
        // SAFETY: a handle NVML gave; `m` is the nvmlMemory_t layout.
        let rc = unsafe { (self.api.memory)(d, &mut m) };
        let (used, total) = if rc == 0 { (m.used, m.total) } else { (0, 0) };
        let sm_active_pct = self.gpm.as_mut().and_then(|g| g.sm_active(index, d));
        Ok(GpuReading {
            util_pct: u.gpu.min(100),
            mem_util_pct: u.memory.min(100),
            mem_used_bytes: used,
            mem_total_bytes: total,
            sm_active_pct,
        })
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        // The GPM samples are freed before NVML shuts down.
        self.gpm = None;
        // SAFETY: initialised in `resolve` (a failed init never builds a
        // droppable Nvml); shut down and closed once, here.
        unsafe {
            (self.api.shutdown)();
            libc::dlclose(self.lib);
        }
    }
}
