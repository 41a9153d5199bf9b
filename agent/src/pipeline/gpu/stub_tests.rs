//! nvml.rs against a stub `libnvidia-ml.so.1` built here with the C
//! compiler: the real dlopen/dlsym path and the nvml.h signatures and
//! struct layouts, without a driver.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::nvml::Nvml;
use super::{GpuSampler, NvmlError};

const STUB: &str = r#"
#include <stdio.h>
typedef struct { unsigned int gpu; unsigned int memory; } nvmlUtilization_t;
typedef struct { unsigned long long total; unsigned long long free; unsigned long long used; } nvmlMemory_t;
int nvmlInit_v2(void) { return INIT_RETURN; }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int r) { return r == 3 ? "Not Supported" : r == 9 ? "Driver Not Loaded" : "Unknown Error"; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = GPUS; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **d) { *d = (void *)(unsigned long)(i + 1); return 0; }
int nvmlDeviceGetUUID(void *d, char *u, unsigned int len) { snprintf(u, len, "GPU-stub-%lu", (unsigned long)d); return 0; }
int nvmlDeviceGetUtilizationRates(void *d, nvmlUtilization_t *u) {
    if ((unsigned long)d == 2) return 3;
    u->gpu = 90; u->memory = 40; return 0;
}
int nvmlDeviceGetMemoryInfo(void *d, nvmlMemory_t *m) {
    m->total = 80ULL << 30; m->used = 4ULL << 30; m->free = m->total - m->used; return 0;
}
"#;

/// The stub built into `dir` (None: no C compiler on this machine).
fn build(dir: &Path, init_return: i32, gpus: u32) -> Option<PathBuf> {
    let src = dir.join(format!("stub-{init_return}-{gpus}.c"));
    let lib = dir.join(format!("libnvidia-ml-{init_return}-{gpus}.so.1"));
    std::fs::write(&src, STUB).ok()?;
    let st = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(format!("-DINIT_RETURN={init_return}"))
        .arg(format!("-DGPUS={gpus}"))
        .arg(&src)
        .status()
        .ok()?;
    assert!(st.success(), "cc failed on the stub");
    Some(lib)
}

#[test]
fn the_stub_library_is_read_through_the_c_signatures() {
    let d = tempfile::tempdir().unwrap();
    let Some(lib) = build(d.path(), 0, 2) else {
        eprintln!("no C compiler: the stub test is skipped");
        return;
    };
    let mut n = match Nvml::open(lib.to_str().unwrap()) {
        Ok(n) => n,
        Err(e) => panic!("{e}"),
    };
    use super::GpuSource;
    assert_eq!(n.uuids(), vec!["GPU-stub-1", "GPU-stub-2"]);
    let r = n.read(0).unwrap();
    assert_eq!((r.util_pct, r.mem_util_pct), (90, 40));
    assert_eq!((r.mem_used_bytes, r.mem_total_bytes), (4 << 30, 80 << 30));
    let e = n.read(1).unwrap_err();
    assert_eq!(
        (e.call, e.code, e.message.as_str()),
        ("nvmlDeviceGetUtilizationRates", 3, "Not Supported")
    );
    assert!(n.read(7).is_err());
    let s = GpuSampler::from_path(lib.to_str().unwrap());
    assert!(s.available());
    assert!(
        s.status().contains(": 2 GPUs (GPU-stub-1, GPU-stub-2)"),
        "{}",
        s.status()
    );
}

#[test]
fn a_driver_that_does_not_initialise_or_has_no_gpu_is_said() {
    let d = tempfile::tempdir().unwrap();
    let Some(fails) = build(d.path(), 9, 2) else {
        eprintln!("no C compiler: the stub test is skipped");
        return;
    };
    match Nvml::open(fails.to_str().unwrap()) {
        Err(NvmlError::Init { code, message }) => {
            assert_eq!((code, message.as_str()), (9, "Driver Not Loaded"))
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("init failed, yet opened"),
    }
    let none = build(d.path(), 0, 0).unwrap();
    let s = GpuSampler::from_path(none.to_str().unwrap());
    assert!(!s.available());
    assert!(s.status().ends_with("GPU utilisation is not sampled: NVML sees no GPU; freezes are watched as before (nvml_library in throttlewatch.toml or THROTTLEWATCH_NVML_LIB names the library if it is elsewhere)"), "{}", s.status());
}
