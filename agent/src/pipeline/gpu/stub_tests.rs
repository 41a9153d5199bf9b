//! nvml.rs and the lazy sampler against a stub `libnvidia-ml.so.1`
//! (stub_nvml.c) built here with the C compiler: the real dlopen/dlsym
//! path and the nvml.h signatures and struct layouts, GPM included,
//! without a driver.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::nvml::Nvml;
use super::source::{GpuSource, NvmlError};
use super::GpuSampler;

/// The stub's source (integration/tests/gpu.rs builds it too).
const STUB: &str = include_str!("stub_nvml.c");

/// The stub built into `dir` with `defines` (`NAME=VALUE` or `NAME`);
/// None: no C compiler on this machine.
fn build(dir: &Path, defines: &[&str]) -> Option<PathBuf> {
    let tag: String = defines
        .join("-")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let src = dir.join("stub_nvml.c");
    let lib = dir.join(format!("libnvidia-ml-{tag}.so.1"));
    std::fs::write(&src, STUB).ok()?;
    let st = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .args(defines.iter().map(|d| format!("-D{d}")))
        .arg(&src)
        .status()
        .ok()?;
    assert!(st.success(), "cc failed on the stub");
    Some(lib)
}

macro_rules! stub {
    ($dir:expr, $($d:expr),*) => {
        match build($dir, &[$($d),*]) {
            Some(l) => l.to_str().unwrap().to_string(),
            None => {
                eprintln!("no C compiler: the stub test is skipped");
                return;
            }
        }
    };
}

#[test]
fn the_stub_library_is_read_through_the_c_signatures() {
    let d = tempfile::tempdir().unwrap();
    let lib = stub!(d.path(), "GPUS=2", "FAIL_HANDLE=2", "GPM_GPUS=1");
    let mut n = match Nvml::open(&lib) {
        Ok(n) => n,
        Err(e) => panic!("{e}"),
    };
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
    let s = GpuSampler::from_path(&lib);
    assert!(s.available());
    assert!(
        s.status().contains(": 2 GPUs (GPU-stub-1, GPU-stub-2); SM activity (GPM) on GPU 0, utilisation only on the others"),
        "{}",
        s.status()
    );
}

#[test]
fn sm_activity_comes_from_two_gpm_samples_of_a_tick_apart() {
    let d = tempfile::tempdir().unwrap();
    let lib = stub!(d.path(), "GPUS=1");
    let mut n = Nvml::open(&lib).unwrap();
    assert_eq!(n.sm_active_gpus(), vec![0]);
    // The first sample has nothing before it; one under 100 ms later is
    // not taken (nvml.h's minimum).
    assert_eq!(n.read(0).unwrap().sm_active_pct, None);
    assert_eq!(n.read(0).unwrap().sm_active_pct, None);
    std::thread::sleep(Duration::from_millis(150));
    // The stub's 37.5 % between two samples of one GPU, in order.
    assert_eq!(n.read(0).unwrap().sm_active_pct, Some(38));
    std::thread::sleep(Duration::from_millis(1_600));
    assert_eq!(
        n.read(0).unwrap().sm_active_pct,
        None,
        "a previous sample over 1.5 s old stands for more than the tick"
    );
    std::thread::sleep(Duration::from_millis(150));
    assert_eq!(n.read(0).unwrap().sm_active_pct, Some(38));
}

#[test]
fn without_gpm_utilisation_only_and_said_so() {
    let d = tempfile::tempdir().unwrap();
    // An older driver: no GPM entry points at all.
    let old = stub!(d.path(), "GPUS=2", "NO_GPM");
    // A GPU before Hopper: the entry points, and the query says no.
    let no = stub!(d.path(), "GPUS=2", "GPM_GPUS=0");
    for lib in [old, no] {
        let mut n = Nvml::open(&lib).unwrap();
        assert!(n.sm_active_gpus().is_empty(), "{lib}");
        for _ in 0..2 {
            let r = n.read(1).unwrap();
            assert_eq!((r.util_pct, r.sm_active_pct), (90, None));
            std::thread::sleep(Duration::from_millis(120));
        }
        let s = GpuSampler::from_path(&lib);
        assert!(
            s.status()
                .ends_with(": 2 GPUs (GPU-stub-1, GPU-stub-2); no SM activity (GPM not supported): utilisation only"),
            "{}",
            s.status()
        );
    }
    let all = stub!(d.path(), "GPUS=2");
    let s = GpuSampler::from_path(&all);
    assert!(
        s.status().ends_with("; SM activity (GPM) on every GPU"),
        "{}",
        s.status()
    );
}

#[test]
fn a_slow_nvml_init_delays_no_read() {
    let d = tempfile::tempdir().unwrap();
    let lib = stub!(d.path(), "GPUS=1", "INIT_SLEEP_MS=1500");
    let mut s = GpuSampler::lazy(&lib);
    let t = Instant::now();
    assert!(s.read([0]).is_empty(), "not open yet");
    let first = t.elapsed();
    eprintln!("first read (opening started): {first:?}");
    assert!(first < Duration::from_millis(200), "{first:?}");
    let mut slowest = Duration::ZERO;
    let got = loop {
        assert!(t.elapsed() < Duration::from_secs(10), "never opened");
        std::thread::sleep(Duration::from_millis(50));
        let r0 = Instant::now();
        let got = s.read([0]);
        slowest = slowest.max(r0.elapsed());
        if !got.is_empty() {
            break got;
        }
    };
    let opened = t.elapsed();
    eprintln!("readings from {opened:?} on; slowest read while opening {slowest:?}");
    assert!(opened >= Duration::from_millis(1_400), "{opened:?}");
    assert!(slowest < Duration::from_millis(200), "{slowest:?}");
    assert_eq!(got[&0].util_pct, 90);
    assert!(
        s.status().contains("GPU utilisation from "),
        "{}",
        s.status()
    );
}

#[test]
fn a_driver_that_does_not_initialise_or_has_no_gpu_is_said() {
    let d = tempfile::tempdir().unwrap();
    let fails = stub!(d.path(), "INIT_RETURN=9", "GPUS=2");
    match Nvml::open(&fails) {
        Err(NvmlError::Init { code, message }) => {
            assert_eq!((code, message.as_str()), (9, "Driver Not Loaded"))
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("init failed, yet opened"),
    }
    let none = stub!(d.path(), "GPUS=0");
    let s = GpuSampler::from_path(&none);
    assert!(!s.available());
    assert!(s.status().ends_with("GPU utilisation is not sampled: NVML sees no GPU; freezes are watched as before (nvml_library in throttlewatch.toml or THROTTLEWATCH_NVML_LIB names the library if it is elsewhere)"), "{}", s.status());
}
