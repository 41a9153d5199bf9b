//! Where the create and poststop work's errors go, whether the hook or the
//! wrapper does it: one line on stderr (the runtime or its caller shows it
//! when the step fails) and the same line appended to `<log_dir>/hook.log`
//! (0640), the only file either writes in the log directory.

use std::fs::DirBuilder;
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;

use throttlewatch_core::config::Config;
use throttlewatch_core::logfmt::rotate::append_capped;
use throttlewatch_core::logfmt::Rotation;

use crate::stage::HookStage;
use crate::timefmt::now_rfc3339;

pub const HOOK_LOG: &str = "hook.log";

pub struct Reporter {
    /// The program, prefixed to stderr lines (`throttlewatch-hook`, ...).
    name: &'static str,
    log_dir: PathBuf,
    /// hook.log is cut at `log_max_bytes`, keeping `log_keep` parts.
    rotation: Rotation,
    stage: HookStage,
    container: Option<String>,
    failures: usize,
    /// Lines also kept in memory (tests, and the qos summary).
    pub lines: Vec<String>,
}

impl Reporter {
    pub fn new(cfg: &Config, stage: HookStage, name: &'static str) -> Reporter {
        Reporter {
            name,
            log_dir: cfg.log_dir.clone(),
            rotation: cfg.log_rotation(),
            stage,
            container: None,
            failures: 0,
            lines: vec![],
        }
    }

    pub fn set_container(&mut self, id: &str) {
        self.container = Some(id.to_string());
    }

    /// Whether an error was reported (fail-closed turns this into a refusal).
    pub fn failed(&self) -> bool {
        self.failures > 0
    }

    pub fn hook_log_path(&self) -> PathBuf {
        self.log_dir.join(HOOK_LOG)
    }

    /// An error: printed, logged, and counted.
    pub fn error(&mut self, msg: &str) {
        self.failures += 1;
        self.emit(msg);
    }

    /// A problem that does not fail the stage: printed and logged.
    pub fn warn(&mut self, msg: &str) {
        self.emit(msg);
    }

    /// Something worth knowing that is not an error (hook.log only).
    pub fn note(&mut self, msg: &str) {
        self.append(&format!("note: {msg}"));
    }

    fn emit(&mut self, msg: &str) {
        // One line, no terminal escapes: a value with a newline in it must
        // not forge a second line, nor an ESC sequence reach a terminal.
        let msg = throttlewatch_core::printable::printable(msg).into_owned();
        eprintln!("{}: {msg}", self.name);
        self.append(&msg);
        self.lines.push(msg);
    }

    fn append(&self, msg: &str) {
        let id = self
            .container
            .as_deref()
            .map(|c| format!(" container {c:?}"))
            .unwrap_or_default();
        let line = format!(
            "{} {}{id}: {}\n",
            now_rfc3339(),
            self.stage,
            throttlewatch_core::printable::printable(msg)
        );
        if let Err(e) = self.write_line(&line) {
            eprintln!(
                "{}: cannot append to {}: {e}",
                self.name,
                self.hook_log_path().display()
            );
        }
    }

    fn write_line(&self, line: &str) -> std::io::Result<()> {
        if !self.log_dir.is_dir() {
            DirBuilder::new()
                .recursive(true)
                .mode(0o750)
                .create(&self.log_dir)?;
        }
        // Hooks of many containers append at once: under a lock, rotated at the size.
        append_capped(&self.hook_log_path(), line.as_bytes(), self.rotation)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn errors_go_to_hook_log_0640() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config {
            log_dir: d.path().join("logs"),
            ..Config::default()
        };
        let mut r = Reporter::new(&cfg, HookStage::CreateRuntime, "test");
        r.set_container("a..b");
        r.error("throttlewatch.io/cpu-burst=\"abc\": expected a duration\nforged");
        assert!(r.failed());
        let p = d.path().join("logs").join(HOOK_LOG);
        let text = std::fs::read_to_string(&p).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(
            text.contains("createRuntime container \"a..b\": throttlewatch.io/cpu-burst=\"abc\""),
            "{text}"
        );
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o640
        );
    }

    #[test]
    fn hook_log_is_rotated_at_log_max_bytes() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config {
            log_dir: d.path().to_path_buf(),
            log_max_bytes: 4096,
            log_keep: 2,
            ..Config::default()
        };
        let mut r = Reporter::new(&cfg, HookStage::CreateRuntime, "test");
        for i in 0..200 {
            r.warn(&format!(
                "warning number {i} with some words to fill the line"
            ));
        }
        let p = d.path().join(HOOK_LOG);
        for f in [
            p.clone(),
            d.path().join("hook.log.1"),
            d.path().join("hook.log.2"),
        ] {
            let n = std::fs::metadata(&f).unwrap().len();
            assert!(n > 0 && n <= 4096, "{}: {n}", f.display());
        }
        assert!(!d.path().join("hook.log.3").exists());
        assert!(std::fs::read_to_string(&p)
            .unwrap()
            .contains("warning number 199"));
    }
}
