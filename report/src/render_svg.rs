//! The heatmaps as SVG (plotters' SVG backend). Each non-empty cell is one
//! `<rect>`; the only other `<rect>` is the background, so a reader (or a
//! test) can count cells.

use plotters::prelude::*;

use crate::heatmap::Grid;
use crate::summary::ContainerReport;

/// (file stem, SVG) for each heatmap of one container.
pub fn all(r: &ContainerReport) -> Vec<(&'static str, String)> {
    vec![
        ("latency", grid(&r.heatmaps.latency, "freeze duration")),
        ("offset", grid(&r.heatmaps.offset, "offset in the period")),
        ("threads", grid(&r.heatmaps.threads, "thread")),
    ]
}

/// White (nothing) through yellow to dark red (the most), on a square-root scale.
fn shade(v: u64, max: u64) -> RGBColor {
    let f = (v as f64 / max.max(1) as f64).sqrt().clamp(0.0, 1.0);
    let lerp = |a: f64, b: f64| (a + (b - a) * f) as u8;
    RGBColor(lerp(255.0, 140.0), lerp(224.0, 0.0), lerp(130.0, 20.0))
}

/// One heatmap: x = seconds since the log's start, y = the grid's rows.
pub fn grid(g: &Grid, y_desc: &str) -> String {
    let cols = g.cells.len().max(1);
    let rows = g.row_labels.len().max(1);
    let bin_s = g.bin_ns as f64 / 1e9;
    let height = (rows as u32 * 18 + 90).clamp(200, 600);
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (760, height)).into_drawing_area();
        // Into a String: plotters' errors are its backends' I/O, which a
        // String does not have; a chart it could not lay out stays empty.
        let _ = draw(&root, g, y_desc, cols, rows, bin_s);
        let _ = root.present();
    }
    out
}

fn draw(
    root: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    g: &Grid,
    y_desc: &str,
    cols: usize,
    rows: usize,
    bin_s: f64,
) -> Result<(), DrawingAreaErrorKind<std::io::Error>> {
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(root)
        .caption(&g.title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(110)
        .build_cartesian_2d(0f64..cols as f64 * bin_s, 0usize..rows)?;
    let labels = g.row_labels.clone();
    chart
        .configure_mesh()
        .disable_mesh()
        .x_desc("seconds since the start")
        .y_desc(y_desc)
        .y_labels(rows.min(20))
        .y_label_formatter(&move |y| labels.get(*y).cloned().unwrap_or_default())
        .draw()?;
    let max = g.max();
    chart.draw_series(g.cells.iter().enumerate().flat_map(|(c, col)| {
        col.iter()
            .enumerate()
            .filter(|(_, v)| **v > 0)
            .map(move |(r, v)| {
                Rectangle::new(
                    [(c as f64 * bin_s, r), ((c + 1) as f64 * bin_s, r + 1)],
                    shade(*v, max).filled(),
                )
            })
    }))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rect_per_nonempty_cell_plus_the_background() {
        let g = Grid {
            title: "t".into(),
            bin_ns: 100_000_000,
            origin_ns: 0,
            row_ns: 0,
            row_labels: vec!["a".into(), "b".into(), "c".into()],
            value: "n",
            cells: vec![vec![0, 1, 0], vec![2, 0, 5], vec![0, 0, 0]],
        };
        let s = grid(&g, "rows");
        assert!(s.starts_with("<svg"), "{}", &s[..40]);
        assert_eq!(s.matches("<rect").count(), 3 + 1, "{s}");
    }
}
