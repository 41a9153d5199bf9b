//! A private containerd 1.6 that runs our shim
//! (`ctr run --runtime io.containerd.throttlewatch.v2`), with a private
//! throttlewatch configuration and the busybox image imported: what the
//! containerd*.rs tests share. Set TW_SHIM_DIR to a folder holding another
//! build of the shim (e.g. target/release) to run that one.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::containerd::{build_busybox_image, Containerd, IMAGE_NAME, SHIM_RUNTIME};
use crate::{bin, Scratch};

/// A private throttlewatch config (logs, socket, state under `dir`).
fn tw_config(dir: &Path) -> PathBuf {
    let p = dir.join("throttlewatch.toml");
    let text = format!(
        "log_dir = \"{0}/logs\"\nsocket = \"{0}/agent.sock\"\nstate_dir = \"{0}/state\"\n\
         start_agent = false\nmetrics_addr = \"\"\nsnapshot_interval_s = 1\n",
        dir.display()
    );
    std::fs::write(&p, text).unwrap();
    p
}

/// The running containerd, the scratch folder of the throttlewatch
/// configuration (logs, socket, state) and the configuration file.
pub struct Setup {
    pub ctd: Containerd,
    pub tw: Scratch,
    pub config: PathBuf,
}

/// containerd started with the shim on its PATH (TW_SHIM_DIR first, then
/// this build's) and THROTTLEWATCH_CONFIG pointing at a private file.
pub fn setup() -> Setup {
    let tw = Scratch::new("twcfg");
    let config = tw_config(&tw.0);
    let shim_dir = std::env::var_os("TW_SHIM_DIR").map(PathBuf::from);
    let mut dirs: Vec<PathBuf> = shim_dir.into_iter().collect();
    dirs.push(
        bin("containerd-shim-throttlewatch-v2")
            .parent()
            .unwrap()
            .to_path_buf(),
    );
    let ctd = Containerd::start(&dirs, &[("THROTTLEWATCH_CONFIG", config.to_str().unwrap())]);
    let img = Scratch::new("img");
    ctd.import(&build_busybox_image(&img.0));
    Setup { ctd, tw, config }
}

/// `ctr run --rm --runtime <ours> EXTRA.. <image> ID CMD..`.
pub fn run_args<'a>(id: &'a str, extra: &[&'a str], cmd: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["run", "--rm", "--runtime", SHIM_RUNTIME];
    a.extend_from_slice(extra);
    a.extend_from_slice(&[IMAGE_NAME, id]);
    a.extend_from_slice(cmd);
    a
}

/// Polls `f` every 50 ms; panics naming `what` after `timeout`.
pub fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Bytes a process wrote, as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}
