//! Phase timings for profiling container start: with
//! `THROTTLEWATCH_TIMING=FILE` in the environment (runc passes its own
//! environment to hooks that declare none), the hook, the runtime wrapper,
//! the shim and the agent's register each append one line per run to FILE:
//! `throttlewatch-hook createRuntime total=1234us config=80us state=20us ...`,
//! which bench/container-start.sh summarises.
//! Without the variable nothing is measured beyond one `Instant::now()`.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::time::Instant;

pub const ENV_TIMING: &str = "THROTTLEWATCH_TIMING";

pub struct Phases {
    what: String,
    start: Instant,
    last: Instant,
    marks: Option<Vec<(&'static str, u128)>>,
}

impl Phases {
    /// Start timing; measures only when `THROTTLEWATCH_TIMING` names a file.
    pub fn start(what: &str) -> Phases {
        let now = Instant::now();
        let on = std::env::var_os(ENV_TIMING).is_some_and(|v| !v.is_empty());
        Phases {
            what: what.to_string(),
            start: now,
            last: now,
            marks: on.then(Vec::new),
        }
    }

    /// Name the run more precisely once known (`throttlewatch-hook createRuntime`).
    pub fn name(&mut self, what: &str) {
        if self.marks.is_some() {
            self.what = what.to_string();
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

    /// Append the line (also called on drop; written once).
    pub fn finish(&mut self) {
        let Some(marks) = self.marks.take() else {
            return;
        };
        let Some(path) = std::env::var_os(ENV_TIMING).filter(|v| !v.is_empty()) else {
            return;
        };
        let mut line = format!("{} total={}us", self.what, self.start.elapsed().as_micros());
        for (n, us) in marks {
            line.push_str(&format!(" {n}={us}us"));
        }
        line.push('\n');
        if let Ok(mut f) = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(path)
        {
            let _ = f.write_all(line.as_bytes());
        }
    }
}

impl Drop for Phases {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_run_only_when_asked() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("timing");
        // No other test of this crate reads the variable.
        std::env::set_var(ENV_TIMING, &f);
        let mut t = Phases::start("x");
        t.name("x createRuntime");
        t.mark("config");
        t.mark("register");
        drop(t);
        std::env::remove_var(ENV_TIMING);
        let mut off = Phases::start("y");
        off.mark("config");
        drop(off);
        let text = std::fs::read_to_string(&f).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        let l = text.lines().next().unwrap();
        assert!(
            l.starts_with("x createRuntime total=") && l.contains(" config=") && l.ends_with("us"),
            "{l}"
        );
    }
}
