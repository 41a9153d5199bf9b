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

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr, CString};

use super::{GpuReadError, GpuReading, GpuSource, NvmlError};

/// The library's name as the driver installs it.
pub(crate) const NVML_LIBRARY: &str = "libnvidia-ml.so.1";

/// `NVML_DEVICE_UUID_V2_BUFFER_SIZE`.
const UUID_BUFFER: usize = 96;

type Device = *mut c_void;
type Ret = c_int;

#[repr(C)]
#[derive(Default)]
struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

#[repr(C)]
#[derive(Default)]
struct Memory {
    total: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

/// The entry points, resolved once.
struct Api {
    shutdown: unsafe extern "C" fn() -> Ret,
    error_string: unsafe extern "C" fn(Ret) -> *const c_char,
    count: unsafe extern "C" fn(*mut c_uint) -> Ret,
    handle: unsafe extern "C" fn(c_uint, *mut Device) -> Ret,
    uuid: unsafe extern "C" fn(Device, *mut c_char, c_uint) -> Ret,
    utilization: unsafe extern "C" fn(Device, *mut Utilization) -> Ret,
    memory: unsafe extern "C" fn(Device, *mut Memory) -> Ret,
}

/// An initialised NVML with the handles of its GPUs (NVML's index order).
pub(crate) struct Nvml {
    lib: *mut c_void,
    api: Api,
    devices: Vec<Device>,
    uuids: Vec<String>,
}

// SAFETY: NVML is documented thread-safe; the handles are opaque values
// that stay valid until nvmlShutdown, which only `Drop` calls.
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

    fn call_error(&self, call: &'static str, index: usize, code: Ret) -> GpuReadError {
        GpuReadError {
            call,
            index,
            code,
            message: self.message(code),
        }
    }
}

impl GpuSource for Nvml {
    fn uuids(&self) -> Vec<String> {
        self.uuids.clone()
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
        Ok(GpuReading {
            util_pct: u.gpu.min(100),
            mem_util_pct: u.memory.min(100),
            mem_used_bytes: used,
            mem_total_bytes: total,
        })
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        // SAFETY: initialised in `resolve` (a failed init never builds a
        // droppable Nvml); shut down and closed once, here.
        unsafe {
            (self.api.shutdown)();
            libc::dlclose(self.lib);
        }
    }
}
