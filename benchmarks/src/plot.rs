//! Bandwidth-against-size plots as SVG (plotters' SVG backend: text is written as SVG
//! `<text>` elements, so no system fonts are needed).

use crate::size::format_bytes;
use plotters::prelude::*;
use std::path::Path;

/// One line of a plot: a name and (size in bytes, GB/s) points.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// (bytes, GB/s), sizes ascending.
    pub points: Vec<(u64, f64)>,
}

/// Draws `series` (bandwidth in GB/s against message size, log-scale sizes) to an SVG file.
pub fn draw_sweep(path: &Path, title: &str, series: &[Series]) -> Result<(), String> {
    let all = || series.iter().flat_map(|s| s.points.iter().copied());
    let (min_x, max_x) = all().fold((u64::MAX, 0u64), |(lo, hi), (x, _)| (lo.min(x), hi.max(x)));
    if min_x > max_x {
        return Err("nothing to plot".into());
    }
    let max_y = all().map(|(_, y)| y).filter(|y| y.is_finite()).fold(0.0f64, f64::max).max(1e-3) * 1.1;
    let (lo, hi) = (min_x as f64 / 1.5, max_x as f64 * 1.5);
    let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
    let e = |e: DrawingAreaErrorKind<_>| format!("drawing {}: {e}", path.display());
    root.fill(&WHITE).map_err(e)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0..max_y)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("message size")
        .y_desc("GB/s")
        .x_label_formatter(&|x| format_bytes(*x))
        .draw()
        .map_err(e)?;
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let pts: Vec<(f64, f64)> = s.points.iter().map(|&(x, y)| (x as f64, y)).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(e)?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled()))).map_err(e)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_an_svg_with_text_elements() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sweep.svg");
        let series = vec![
            Series { name: "native".into(), points: vec![(1_000_000, 1.0), (2_000_000, 2.0), (4_000_000, 3.5)] },
            Series { name: "ceiling".into(), points: vec![(1_000_000, 5.0), (4_000_000, 6.0)] },
        ];
        draw_sweep(&path, "local-send-recv", &series).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("<text") && svg.contains("native"), "{svg}");
        assert!(draw_sweep(&path, "empty", &[]).is_err());
    }
}
