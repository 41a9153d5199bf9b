//! Errors where runc's caller looks for them: runc's own `--log FILE` in
//! `--log-format json` (`{"level":"error","msg":"...","time":"..."}`, what
//! containerd and dockerd parse) or text, and always on stderr.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;

use throttlewatch_lifecycle::timefmt::now_rfc3339;

pub const NAME: &str = "throttlewatch-runtime";

#[derive(Debug, Clone, Default)]
pub struct RuncLog {
    pub path: Option<PathBuf>,
    pub json: bool,
}

impl RuncLog {
    pub fn new(path: Option<PathBuf>, format: Option<&str>) -> RuncLog {
        RuncLog {
            path,
            json: format == Some("json"),
        }
    }

    pub fn error(&self, msg: &str) {
        self.write("error", msg);
    }

    pub fn warning(&self, msg: &str) {
        self.write("warning", msg);
    }

    fn write(&self, level: &str, msg: &str) {
        let msg = format!("{NAME}: {msg}");
        eprintln!("{msg}");
        let Some(path) = &self.path else { return };
        let line = self.format(level, &msg, &now_rfc3339());
        if let Ok(mut f) = OpenOptions::new().append(true).create(true).open(path) {
            let _ = f.write_all(line.as_bytes());
        }
    }

    pub fn format(&self, level: &str, msg: &str, time: &str) -> String {
        if self.json {
            let v = serde_json::json!({"level": level, "msg": msg, "time": time});
            format!("{v}\n")
        } else {
            format!("time={time:?} level={level} msg={msg:?}\n")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines_like_runc() {
        let d = tempfile::tempdir().unwrap();
        let l = RuncLog::new(Some(d.path().join("log.json")), Some("json"));
        l.error("config.json: bad \"x\"");
        let text = std::fs::read_to_string(d.path().join("log.json")).unwrap();
        let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(v["level"], "error");
        assert_eq!(v["msg"], "throttlewatch-runtime: config.json: bad \"x\"");
        assert!(v["time"].as_str().unwrap().ends_with('Z'));
        let t = RuncLog::new(None, None).format("error", "m", "T");
        assert_eq!(t, "time=\"T\" level=error msg=\"m\"\n");
    }
}
