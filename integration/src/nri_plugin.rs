//! `throttlewatch-nri` run by a test as an external plugin (a daemon that
//! dials the runtime's NRI socket), what containerd's log says of it, and
//! what a container can leave in the agent's state dir.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use throttlewatch_core::state_dir::StateDir;

use crate::bin;
use crate::cri::CriNode;
use crate::daemons::{stop_child, PrivateConfig};

/// `throttlewatch-nri --socket SOCK --config CFG` as a child, its output
/// in a file; stopped (SIGTERM, by its PID) on drop.
pub struct NriDaemon {
    /// None once stopped (never signalled twice: its PID may be reused).
    child: Option<Child>,
    pub output: PathBuf,
}

impl NriDaemon {
    pub fn start(tw: &PrivateConfig, socket: &Path, output: PathBuf, extra: &[&str]) -> NriDaemon {
        let f = std::fs::File::create(&output).unwrap();
        let child = Command::new(bin("throttlewatch-nri"))
            .arg("--socket")
            .arg(socket)
            .arg("--config")
            .arg(&tw.path)
            .args(extra)
            .env("THROTTLEWATCH_NRI_TIMINGS", "1")
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .unwrap();
        NriDaemon {
            child: Some(child),
            output,
        }
    }

    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.output).unwrap_or_default()
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            stop_child(&mut c, Duration::from_secs(5));
        }
    }
}

impl Drop for NriDaemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// containerd's log lines naming `plugin` (its registered name, e.g.
/// `10-throttlewatch`) and each of `words` (its text format escapes the
/// quotes around the name).
pub fn log_lines(node: &CriNode, plugin: &str, words: &[&str]) -> usize {
    node.log()
        .lines()
        .filter(|l| l.contains(plugin) && words.iter().all(|w| l.contains(w)))
        .count()
}

/// The state dir's files (the agent's own state and lock files aside):
/// what a container left behind.
pub fn leftovers(tw: &PrivateConfig) -> Vec<PathBuf> {
    let st = StateDir::new(&tw.state_dir);
    let dirs = [
        st.containers_dir(),
        st.bursts_dir(),
        st.control_dir(),
        st.unwatched_dir(),
        st.pending_dir(),
        st.nri_dir(),
    ];
    dirs.iter()
        .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
        .map(|e| e.path())
        .collect()
}
