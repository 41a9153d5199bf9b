//! `throttlewatch report`: per-container logs (docs/log-format.md) turned into
//! a summary, heatmaps and recommendations with their predicted effect
//! (docs/report.md).

pub mod diagnosis;
pub mod format;
pub mod gpu;
pub mod gpu_samples;
pub mod heatmap;
pub mod histogram;
pub mod html_escape;
pub mod levels;
pub mod log_source;
pub mod model;
pub mod placement;
pub mod read_error;
pub mod reader;
pub mod recommend;
pub mod recommendation;
pub mod render_html;
pub mod render_svg;
pub mod render_terminal;
pub mod replay;
pub mod summary;
pub mod wake_graph;
pub mod wakeups;
mod wakeups_path;
pub mod wakeups_svg;
pub mod what_if;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;

pub use reader::{LineError, ReadError};

#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// Logs, log directories (a node report), or container ids/names in the configured log_dir.
    #[arg(required = true, num_args = 1..)]
    pub logs: Vec<String>,
    /// Everything as one JSON document on stdout (recommendations included).
    #[arg(long)]
    pub json: bool,
    /// Also write one self-contained HTML page (heatmaps and tables) to FILE.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Also write the heatmaps as SVG files into DIR (created if missing).
    #[arg(long, value_name = "DIR")]
    pub svg: Option<PathBuf>,
    /// Predict the throttled time under other settings, e.g. `quota=30ms,burst=10ms` or `cpus=1.5`
    /// (keys quota, cpus, burst; the rest as in the log).
    #[arg(long, value_name = "SETTINGS")]
    #[arg(allow_hyphen_values = true)]
    pub what_if: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    WhatIf(#[from] what_if::WhatIfError),
    #[error("{path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Read one log into its report; `progress` gets (bytes read, bytes in all).
pub fn report_one(
    src: &reader::LogSource,
    mut progress: impl FnMut(u64, u64),
) -> Result<summary::ContainerReport, ReadError> {
    let total = src.total_bytes();
    let mut c = model::Container::default();
    let mut wakes = wakeups::IntervalEdges::default();
    let stats = reader::read(
        src,
        |ts, rec| {
            wakes.add(&rec);
            c.add(ts, rec)
        },
        |b| progress(b, total),
    )?;
    let mut r = summary::container(src.path().display().to_string(), &c, stats);
    r.wakeups = wakes.report(&c);
    Ok(r)
}

/// Every log, ranked by frozen share (most first).
pub fn report_all(
    srcs: &[reader::LogSource],
    mut progress: impl FnMut(&Path, u64, u64),
) -> Result<Vec<summary::ContainerReport>, ReadError> {
    let mut out = Vec::new();
    for s in srcs {
        out.push(report_one(s, |b, t| progress(s.path(), b, t))?);
    }
    out.sort_by(|a, b| {
        b.frozen_share
            .unwrap_or(0.0)
            .total_cmp(&a.frozen_share.unwrap_or(0.0))
    });
    Ok(out)
}

/// A progress line on stderr for reads that take more than a second (terminal only).
struct Progress {
    began: Instant,
    tty: bool,
    shown: bool,
}

impl Progress {
    fn new() -> Progress {
        use std::io::IsTerminal;
        Progress {
            began: Instant::now(),
            tty: std::io::stderr().is_terminal(),
            shown: false,
        }
    }
    fn show(&mut self, path: &Path, done: u64, total: u64) {
        if !self.tty || self.began.elapsed().as_secs_f64() < 1.0 || total == 0 {
            return;
        }
        let f = (done as f64 / total as f64).min(1.0);
        let n = (f * 30.0) as usize;
        eprint!(
            "\r  [{}{}] {:>3.0}%  {}",
            "#".repeat(n),
            " ".repeat(30 - n),
            f * 100.0,
            path.display()
        );
        self.shown = true;
    }
    fn done(&self) {
        if self.shown {
            eprint!("\r\x1b[2K");
        }
    }
}

/// The command: resolve, read, print, write the files asked for.
pub fn run(args: &ReportArgs, log_dir: &Path) -> Result<(), ReportError> {
    let what_if = args
        .what_if
        .as_deref()
        .map(what_if::WhatIf::parse)
        .transpose()?;
    let srcs = reader::resolve(&args.logs, log_dir)?;
    let mut p = Progress::new();
    let mut reports = report_all(&srcs, |path, b, t| p.show(path, b, t))?;
    if let Some(w) = &what_if {
        // A second pass per log: the first one's model is not kept, to keep memory flat.
        for r in reports.iter_mut() {
            let src = reader::with_rotated_parts(Path::new(&r.log));
            let mut c = model::Container::default();
            reader::read(&src, |ts, rec| c.add(ts, rec), |_| {})?;
            r.what_if = Some(w.predict(&c));
        }
    }
    p.done();
    let write = |path: &Path, bytes: &[u8]| {
        std::fs::write(path, bytes).map_err(|source| ReportError::Write {
            path: path.to_path_buf(),
            source,
        })
    };
    if let Some(dir) = &args.svg {
        std::fs::create_dir_all(dir).map_err(|source| ReportError::Write {
            path: dir.clone(),
            source,
        })?;
        for (i, r) in reports.iter().enumerate() {
            for (name, svg) in render_svg::all(r) {
                let file = if reports.len() == 1 {
                    dir.join(format!("{name}.svg"))
                } else {
                    dir.join(format!("{}-{name}.svg", file_stem(r, i)))
                };
                write(&file, svg.as_bytes())?;
            }
            if let Some(w) = &r.wakeups {
                let file = match reports.len() {
                    1 => dir.join("wakeups.svg"),
                    _ => dir.join(format!("{}-wakeups.svg", file_stem(r, i))),
                };
                write(&file, wakeups_svg::svg(w).as_bytes())?;
            }
        }
    }
    if let Some(file) = &args.html {
        write(file, render_html::page(&reports).as_bytes())?;
    }
    let out = if args.json {
        let doc = serde_json::json!({ "containers": reports });
        serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n"
    } else {
        let st = render_terminal::Style::detect();
        let mut s = String::new();
        if reports.len() > 1 {
            s.push_str(&render_terminal::ranking(&reports, st));
            s.push('\n');
        }
        for r in &reports {
            s.push_str(&render_terminal::container(r, st));
            s.push('\n');
        }
        render_terminal::fit::fit(&s, render_terminal::fit::width())
    };
    let mut so = std::io::stdout().lock();
    // A closed pipe (| head) is not an error worth a message.
    let _ = so.write_all(out.as_bytes()).and_then(|_| so.flush());
    Ok(())
}

fn file_stem(r: &summary::ContainerReport, i: usize) -> String {
    let id = throttlewatch_core::logfmt::log_file_name(&r.container_id);
    let id = id.trim_end_matches(".jsonl");
    format!("{i:02}-{}", id.chars().take(32).collect::<String>())
}
