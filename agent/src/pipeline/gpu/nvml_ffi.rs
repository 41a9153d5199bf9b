//! NVML's C types and entry points as this agent calls them (nvml.rs
//! resolves and calls them; the header lines are there).

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};
use std::time::{Duration, Instant};

/// `NVML_DEVICE_UUID_V2_BUFFER_SIZE`.
pub(super) const UUID_BUFFER: usize = 96;

pub(super) type Device = *mut c_void;
pub(super) type Ret = c_int;

#[repr(C)]
#[derive(Default)]
pub(super) struct Utilization {
    pub(super) gpu: c_uint,
    pub(super) memory: c_uint,
}

#[repr(C)]
#[derive(Default)]
pub(super) struct Memory {
    pub(super) total: c_ulonglong,
    pub(super) free: c_ulonglong,
    pub(super) used: c_ulonglong,
}

/// `NVML_GPM_METRICS_GET_VERSION` and `NVML_GPM_SUPPORT_VERSION` (plain
/// 1 in nvml.h, not `NVML_STRUCT_VERSION`-encoded).
pub(super) const GPM_METRICS_GET_VERSION: c_uint = 1;
pub(super) const GPM_SUPPORT_VERSION: c_uint = 1;
/// `NVML_GPM_METRIC_SM_UTIL`: the share of SMs busy, percent.
pub(super) const GPM_METRIC_SM_UTIL: c_uint = 2;
/// Entries of our `nvmlGpmMetricsGet_t.metrics`: above every
/// `NVML_GPM_METRIC_MAX` published so far (98, 210, 333), with room for
/// drivers to come (see the SAFETY note at `metrics_get`).
pub(super) const GPM_METRICS_CAPACITY: usize = 1024;
/// nvml.h: two GPM samples of a GPU at least 100 ms apart; and at most
/// this far apart for the figure to stand for the tick it is read at.
pub(super) const GPM_MIN_GAP: Duration = Duration::from_millis(100);
pub(super) const GPM_MAX_GAP: Duration = Duration::from_millis(1_500);

pub(super) type GpmSample = *mut c_void;

#[repr(C)]
#[derive(Default)]
pub(super) struct GpmSupport {
    pub(super) version: c_uint,
    pub(super) is_supported_device: c_uint,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct GpmMetricInfo {
    pub(super) short_name: *mut c_char,
    pub(super) long_name: *mut c_char,
    pub(super) unit: *mut c_char,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct GpmMetric {
    pub(super) metric_id: c_uint,
    pub(super) nvml_return: Ret,
    pub(super) value: f64,
    pub(super) metric_info: GpmMetricInfo,
}

impl GpmMetric {
    pub(super) fn asking(metric_id: c_uint) -> GpmMetric {
        let null = std::ptr::null_mut();
        GpmMetric {
            metric_id,
            nvml_return: 0,
            value: 0.0,
            metric_info: GpmMetricInfo {
                short_name: null,
                long_name: null,
                unit: null,
            },
        }
    }
}

/// `nvmlGpmMetricsGet_t` with [`GPM_METRICS_CAPACITY`] entries.
#[repr(C)]
pub(super) struct GpmMetricsGet {
    pub(super) version: c_uint,
    pub(super) num_metrics: c_uint,
    pub(super) sample1: GpmSample,
    pub(super) sample2: GpmSample,
    pub(super) metrics: [GpmMetric; GPM_METRICS_CAPACITY],
}

/// The GPM entry points (all present, or no GPM).
pub(super) struct GpmApi {
    pub(super) query_support: unsafe extern "C" fn(Device, *mut GpmSupport) -> Ret,
    pub(super) sample_alloc: unsafe extern "C" fn(*mut GpmSample) -> Ret,
    pub(super) sample_free: unsafe extern "C" fn(GpmSample) -> Ret,
    pub(super) sample_get: unsafe extern "C" fn(Device, GpmSample) -> Ret,
    pub(super) metrics_get: unsafe extern "C" fn(*mut GpmMetricsGet) -> Ret,
}

/// One GPM-capable GPU: two sample buffers, taken in turn each read.
pub(super) struct GpmGpu {
    pub(super) samples: [GpmSample; 2],
    /// The buffer the next read fills (the other holds the previous).
    pub(super) next: usize,
    /// When the previous sample was taken (None: none usable).
    pub(super) last_at: Option<Instant>,
}

/// GPM where the library has it: the calls, one request buffer, and per
/// GPU (NVML's index) its buffers where the GPU supports GPM.
pub(super) struct Gpm {
    pub(super) api: GpmApi,
    pub(super) request: Box<GpmMetricsGet>,
    pub(super) gpus: Vec<Option<GpmGpu>>,
}

/// The entry points, resolved once.
pub(super) struct Api {
    pub(super) shutdown: unsafe extern "C" fn() -> Ret,
    pub(super) error_string: unsafe extern "C" fn(Ret) -> *const c_char,
    pub(super) count: unsafe extern "C" fn(*mut c_uint) -> Ret,
    pub(super) handle: unsafe extern "C" fn(c_uint, *mut Device) -> Ret,
    pub(super) uuid: unsafe extern "C" fn(Device, *mut c_char, c_uint) -> Ret,
    pub(super) utilization: unsafe extern "C" fn(Device, *mut Utilization) -> Ret,
    pub(super) memory: unsafe extern "C" fn(Device, *mut Memory) -> Ret,
}
