//! The container's GPUs on its timeline in the HTML page: each GPU's
//! utilisation (a line per GPU, 0-100 %) and, where it has GPM, its SM
//! activity (dashed, the GPU's colour) over the share of each moment the
//! container was frozen (red bars), with a legend, the axes' scales and a
//! table of the figures (utilisation and SM activity while frozen and not,
//! idle while frozen).

use std::fmt::Write;

use crate::gpu::{pct, GpuReport, GpuTimeline};
use crate::heatmap::short;
use crate::html_escape::esc;

const W: f64 = 600.0;
const H: f64 = 120.0;
/// The GPUs' line colours, in the order of the legend.
const COLOURS: [&str; 8] = [
    "#47a", "#2a7", "#e90", "#85c", "#0aa", "#a63", "#555", "#c6a",
];

/// The panel: nothing without GPU samples.
pub(super) fn gpus(s: &mut String, i: usize, g: Option<&GpuReport>) {
    let Some(g) = g else { return };
    let t = &g.timeline;
    let n = t.frozen_share.len().max(1) as f64;
    let x = |b: usize| b as f64 * W / n;
    let y = |pct: f64| H - pct.clamp(0.0, 100.0) * H / 100.0;
    legend(s, i, g);
    let _ = write!(
        s,
        "<svg class=\"gpu\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{}\" viewBox=\"0 0 {W} {}\">",
        H + 14.0,
        H + 14.0
    );
    for (b, f) in t.frozen_share.iter().enumerate().filter(|(_, f)| **f > 0.0) {
        let _ = write!(
            s,
            "<rect class=\"frozen\" x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"#c40\" fill-opacity=\"0.35\"><title>{}: frozen {:.0}%</title></rect>",
            x(b),
            y(f * 100.0),
            (W / n).max(0.5),
            H - y(f * 100.0),
            short(b as u64 * t.bucket_ns),
            f * 100.0
        );
    }
    for (k, (gpu, util)) in t.gpus.iter().enumerate() {
        let _ = write!(
            s,
            "<polyline class=\"util\" data-gpu=\"{gpu}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"{}\"/>",
            COLOURS[k % COLOURS.len()],
            points(util, &x, &y, W / n / 2.0)
        );
    }
    for (gpu, sm) in &t.sm {
        let k = colour_of(t, *gpu);
        let _ = write!(
            s,
            "<polyline class=\"sm\" data-gpu=\"{gpu}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" stroke-dasharray=\"4 3\" points=\"{}\"/>",
            COLOURS[k % COLOURS.len()],
            points(sm, &x, &y, W / n / 2.0)
        );
    }
    axes(s, t);
    table(s, g);
}

/// The colour index of `gpu`: its place among the utilisation lines.
fn colour_of(t: &GpuTimeline, gpu: usize) -> usize {
    t.gpus
        .iter()
        .position(|(g, _)| *g == gpu)
        .unwrap_or(t.gpus.len())
}

/// The heading and the legend (a swatch per GPU and the frozen share).
fn legend(s: &mut String, i: usize, g: &GpuReport) {
    let mut keys = String::new();
    for (k, (gpu, _)) in g.timeline.gpus.iter().enumerate() {
        let _ = write!(
            keys,
            " GPU {gpu} <span style=\"color:{}\">&#9472;</span>",
            COLOURS[k % COLOURS.len()]
        );
    }
    let sm = match g.timeline.sm.is_empty() {
        true => "",
        false => "; dashed in the GPU's colour: SM activity (GPM, the share of SMs busy)",
    };
    let _ = write!(
        s,
        "<h3>GPUs while frozen</h3><p>Utilisation (NVML) of the container's GPUs:{keys}{sm}; \
         share of the time the container was frozen <span style=\"color:#c40\">&#9608;</span> \
         (all 0-100 %), {} a bucket.</p><figure class=\"gpu\" id=\"c{i}-gpu\">",
        short(g.timeline.bucket_ns)
    );
}

/// A GPU's line: a point per bucket with a sample, at the bucket's middle.
fn points(
    util: &[Option<f64>],
    x: &dyn Fn(usize) -> f64,
    y: &dyn Fn(f64) -> f64,
    half: f64,
) -> String {
    let mut pts = String::new();
    for (b, u) in util.iter().enumerate() {
        if let Some(u) = u {
            let _ = write!(pts, "{:.1},{:.1} ", x(b) + half, y(*u));
        }
    }
    pts.trim_end().to_string()
}

/// The y scale (0 % and 100 %) and the time scale (0 and the end).
fn axes(s: &mut String, t: &GpuTimeline) {
    let end = t.bucket_ns * t.frozen_share.len() as u64;
    let _ = writeln!(
        s,
        "<text x=\"2\" y=\"10\" font-size=\"11\">100%</text><text x=\"2\" y=\"{:.0}\" font-size=\"11\">0%</text>\
         <text x=\"0\" y=\"{:.0}\" font-size=\"11\">0</text><text x=\"{W}\" y=\"{:.0}\" font-size=\"11\" text-anchor=\"end\">{}</text></svg></figure>",
        H - 2.0,
        H + 12.0,
        H + 12.0,
        esc(&short(end))
    );
}

/// The figures per GPU (SM activity's columns where a GPU has it).
fn table(s: &mut String, g: &GpuReport) {
    let with_sm = g.gpus.iter().any(|a| a.sm_sampled_ns > 0);
    let _ = writeln!(
        s,
        "<table class=\"gpu\"><tr><th class=\"l\">GPU</th><th>sampled</th><th>frozen</th>\
         <th>busy while frozen</th><th>busy while not</th>{}<th>GPU idle while frozen</th><th>memory used (max)</th></tr>",
        if with_sm {
            "<th>SM active while frozen</th><th>SM active while not</th>"
        } else {
            ""
        }
    );
    for a in &g.gpus {
        let sm = match with_sm {
            true => format!(
                "<td>{}</td><td>{}</td>",
                pct(a.sm_active_frozen_pct),
                pct(a.sm_active_unfrozen_pct)
            ),
            false => String::new(),
        };
        let _ = writeln!(
            s,
            "<tr><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>{sm}<td>{}</td><td>{:.1} GiB</td></tr>",
            a.gpu,
            short(a.sampled_ns),
            short(a.frozen_ns),
            pct(a.util_frozen_pct),
            pct(a.util_unfrozen_pct),
            short(a.idle_while_frozen_ns),
            a.mem_used_max_bytes as f64 / (1u64 << 30) as f64
        );
    }
    s.push_str("</table>\n");
    if g.dropped_samples > 0 {
        let _ = writeln!(
            s,
            "<p class=\"missing\">{} GPU samples past the caps left out.</p>",
            g.dropped_samples
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::GpuAlignment;

    #[test]
    fn the_panel_has_a_line_per_gpu_frozen_bars_a_legend_and_scales() {
        let g = GpuReport {
            gpus: vec![GpuAlignment {
                gpu: 1,
                util_frozen_pct: Some(5.0),
                util_unfrozen_pct: Some(90.0),
                idle_while_frozen_ns: 2_280_000_000,
                ..Default::default()
            }],
            dropped_samples: 0,
            timeline: GpuTimeline {
                from_ns: 0,
                bucket_ns: 1_000_000_000,
                frozen_share: vec![0.0, 0.8, 0.0],
                gpus: vec![(1, vec![Some(90.0), Some(5.0), None])],
                sm: vec![],
            },
        };
        let mut s = String::new();
        gpus(&mut s, 3, Some(&g));
        assert!(s.contains("id=\"c3-gpu\""), "{s}");
        assert!(s.contains("GPU 1 <span style=\"color:#47a\">"), "{s}");
        assert_eq!(s.matches("<rect class=\"frozen\"").count(), 1, "{s}");
        assert!(s.contains("points=\"100.0,12.0 300.0,114.0\""), "{s}");
        assert!(
            s.contains(">100%</text>") && s.contains(">0%</text>"),
            "{s}"
        );
        let idle = short(2_280_000_000);
        assert!(
            s.contains(&format!("<td>5%</td><td>90%</td><td>{idle}</td>")),
            "{s}"
        );
        assert!(
            !s.contains("SM activity") && !s.contains("class=\"sm\""),
            "{s}"
        );
        assert!(!s.contains("SM active while frozen"), "{s}");
        let mut none = String::new();
        gpus(&mut none, 0, None);
        assert!(none.is_empty());
    }

    #[test]
    fn sm_activity_is_a_dashed_line_and_two_columns_where_present() {
        let g = GpuReport {
            gpus: vec![GpuAlignment {
                gpu: 1,
                util_frozen_pct: Some(90.0),
                util_unfrozen_pct: Some(95.0),
                sm_sampled_ns: 3_000_000_000,
                sm_active_frozen_pct: Some(4.0),
                sm_active_unfrozen_pct: Some(61.0),
                ..Default::default()
            }],
            dropped_samples: 0,
            timeline: GpuTimeline {
                from_ns: 0,
                bucket_ns: 1_000_000_000,
                frozen_share: vec![0.0, 0.8, 0.0],
                gpus: vec![(1, vec![Some(95.0), Some(90.0), Some(95.0)])],
                sm: vec![(1, vec![Some(60.0), Some(4.0), None])],
            },
        };
        let mut s = String::new();
        gpus(&mut s, 0, Some(&g));
        assert!(s.contains("dashed in the GPU's colour: SM activity"), "{s}");
        assert!(
            s.contains("<polyline class=\"sm\" data-gpu=\"1\" fill=\"none\" stroke=\"#47a\""),
            "{s}"
        );
        assert!(s.contains("points=\"100.0,48.0 300.0,115.2\""), "{s}");
        assert!(
            s.contains("<th>SM active while frozen</th><th>SM active while not</th>"),
            "{s}"
        );
        assert!(
            s.contains("<td>90%</td><td>95%</td><td>4%</td><td>61%</td>"),
            "{s}"
        );
    }
}
