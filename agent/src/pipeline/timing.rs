//! Register phase timings for profiling container start: with
//! `THROTTLEWATCH_TIMING=FILE` in the agent's environment, each register
//! appends one line to FILE, in the format of the hook's and the wrapper's
//! (`throttlewatch_lifecycle::timing`), which bench/container-start.sh
//! summarises: `throttlewatch-agent register total=412us begin=380us ...`.
//! Without the variable nothing is measured beyond one `Instant::now()`.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Instant;

fn file() -> Option<&'static PathBuf> {
    static FILE: OnceLock<Option<PathBuf>> = OnceLock::new();
    FILE.get_or_init(|| {
        std::env::var_os("THROTTLEWATCH_TIMING")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    })
    .as_ref()
}

pub struct Phases {
    what: &'static str,
    start: Instant,
    last: Instant,
    marks: Option<Vec<(&'static str, u128)>>,
}

impl Phases {
    pub fn start(what: &'static str) -> Phases {
        let now = Instant::now();
        Phases {
            what,
            start: now,
            last: now,
            marks: file().map(|_| Vec::new()),
        }
    }

    /// The end of a phase named `name` (since the previous mark).
    pub fn mark(&mut self, name: &'static str) {
        if let Some(m) = &mut self.marks {
            let now = Instant::now();
            m.push((name, now.duration_since(self.last).as_micros()));
            self.last = now;
        }
    }
}

impl Drop for Phases {
    fn drop(&mut self) {
        let (Some(marks), Some(path)) = (self.marks.take(), file()) else {
            return;
        };
        let mut line = format!(
            "throttlewatch-agent {} total={}us",
            self.what,
            self.start.elapsed().as_micros()
        );
        for (n, us) in marks {
            line.push_str(&format!(" {n}={us}us"));
        }
        line.push('\n');
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(path)
        {
            let _ = f.write_all(line.as_bytes());
        }
    }
}
