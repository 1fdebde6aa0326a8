//! Bandwidth-against-size plots as SVG (plotters' SVG backend: text is written as SVG
//! `<text>` elements, so no system fonts are needed).
//!
//! Both axes are logarithmic, so a sweep from 8 B to 1 GB (eight orders of magnitude of
//! size, and as many of bandwidth) stays readable: labels at every power of ten (`1 kB`,
//! `10 MB/s`), a title, and caption lines under it that say what was measured.

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

/// The text around a plot.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Captions {
    /// The title, on top.
    pub title: String,
    /// Lines under the title (what was measured, where, which build).
    pub lines: Vec<String>,
}

/// Width and height of the SVG in pixels.
const SIZE: (u32, u32) = (1000, 640);
/// Pixels per caption line, and above the first one (the title's).
const LINE_HEIGHT: u32 = 20;
const TITLE_HEIGHT: u32 = 36;

/// `value` with an SI prefix and at most three significant digits, trailing zeros
/// dropped: `1 kB`, `250 MB/s`, `1.5 TB/s` (`unit` follows the prefix). Axis labels sit
/// at powers of ten and their multiples, so this is exact there.
pub fn si_label(value: f64, unit: &str) -> String {
    const PREFIXES: [(f64, &str); 5] = [(1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")];
    let magnitude = value.abs() * (1.0 + 1e-9);
    let (scale, prefix) = PREFIXES.iter().copied().find(|&(scale, _)| magnitude >= scale).unwrap_or((1.0, ""));
    let scaled = value / scale;
    let integer_digits = if scaled.abs() >= 1.0 { scaled.abs().log10().floor() as i32 + 1 } else { 1 };
    let decimals = (3 - integer_digits).max(0) as usize;
    let mut number = format!("{scaled:.decimals$}");
    if number.contains('.') {
        number = number.trim_end_matches('0').trim_end_matches('.').to_owned();
    }
    format!("{number} {prefix}{unit}")
}

/// A log axis range holding every value in `values` (positive and finite ones only),
/// widened by `margin` (a factor) each side, and to the enclosing powers of ten when it
/// would hold none (so there is at least one label). `None` without such a value.
fn log_range(values: impl Iterator<Item = f64>, margin: f64) -> Option<std::ops::Range<f64>> {
    let (lo, hi) = values
        .filter(|v| v.is_finite() && *v > 0.0)
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        return None;
    }
    let (lo, hi) = (lo / margin, hi * margin);
    let first_power = 10f64.powf(lo.log10().ceil());
    Some(if first_power <= hi { lo..hi } else { 10f64.powf(lo.log10().floor())..10f64.powf(hi.log10().ceil()) })
}

/// Draws `series` (bandwidth in GB/s against message size, both axes logarithmic) to an
/// SVG file, with `captions` on top. Points that a log axis cannot show (zero, negative,
/// infinite) are left out; an error when no point is left.
pub fn draw_sweep(path: &Path, captions: &Captions, series: &[Series]) -> Result<(), String> {
    let plottable = |(x, y): (u64, f64)| x > 0 && y.is_finite() && y > 0.0;
    let all = || series.iter().flat_map(|s| s.points.iter().copied()).filter(|&p| plottable(p));
    let x_range = log_range(all().map(|(x, _)| x as f64), 1.5).ok_or("nothing to plot")?;
    let y_range = log_range(all().map(|(_, y)| y), 2.0).ok_or("nothing to plot")?;
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    let e = |e: DrawingAreaErrorKind<_>| format!("drawing {}: {e}", path.display());
    root.fill(&WHITE).map_err(e)?;
    let header_height = TITLE_HEIGHT + LINE_HEIGHT * captions.lines.len() as u32 + 8;
    let (header, body) = root.split_vertically(header_height);
    header.draw_text(&captions.title, &("sans-serif", 22).into_font().color(&BLACK), (16, 10)).map_err(e)?;
    let caption_style = ("sans-serif", 15).into_font().color(&RGBColor(60, 60, 60));
    for (i, line) in captions.lines.iter().enumerate() {
        let y = (TITLE_HEIGHT + LINE_HEIGHT * i as u32) as i32;
        header.draw_text(line, &caption_style, (16, y)).map_err(e)?;
    }
    let mut chart = ChartBuilder::on(&body)
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(80)
        .build_cartesian_2d(x_range.log_scale(), y_range.log_scale())
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_labels(12)
        .y_labels(12)
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .x_desc("message size (log scale)")
        .y_desc("bandwidth (log scale)")
        .x_label_formatter(&|x| si_label(*x, "B"))
        .y_label_formatter(&|y| si_label(*y * 1e9, "B/s"))
        .draw()
        .map_err(e)?;
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let pts: Vec<(f64, f64)> =
            s.points.iter().copied().filter(|&p| plottable(p)).map(|(x, y)| (x as f64, y)).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(e)?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled()))).map_err(e)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .label_font(("sans-serif", 15))
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

    fn captions(title: &str) -> Captions {
        Captions { title: title.into(), lines: vec!["native lane, host memory".into(), "commit 0123abc".into()] }
    }

    /// The text of every `<text>` element in `svg` (plotters writes it on a line of its
    /// own), in order.
    fn texts(svg: &str) -> Vec<&str> {
        svg.split("<text").skip(1).filter_map(|t| t.split_once(">\n")?.1.split_once("\n</text>")).map(|t| t.0).collect()
    }

    /// The (cx, cy) of every `<circle` in `svg`, in order.
    fn circles(svg: &str) -> Vec<(f64, f64)> {
        let attr = |tag: &str, name: &str| {
            let at = tag.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
            tag[at..].split('"').next().unwrap().parse::<f64>().unwrap()
        };
        svg.split("<circle").skip(1).map(|tag| (attr(tag, "cx"), attr(tag, "cy"))).collect()
    }

    #[test]
    fn writes_an_svg_with_both_series_and_the_captions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sweep.svg");
        let series = vec![
            Series { name: "native".into(), points: vec![(1_000_000, 1.0), (2_000_000, 2.0), (4_000_000, 3.5)] },
            Series { name: "ceiling".into(), points: vec![(1_000_000, 5.0), (4_000_000, 6.0)] },
        ];
        draw_sweep(&path, &captions("local-send-recv"), &series).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{svg}");
        for text in ["local-send-recv", "native", "ceiling", "native lane, host memory", "commit 0123abc"] {
            assert!(texts(&svg).contains(&text), "no {text} in {svg}");
        }
        assert_eq!(circles(&svg).len(), 5, "{svg}");
        assert!(draw_sweep(&path, &captions("empty"), &[]).is_err());
        let unplottable = [Series { name: "zero".into(), points: vec![(0, 1.0), (8, 0.0), (16, f64::INFINITY)] }];
        assert!(draw_sweep(&path, &captions("zero"), &unplottable).is_err());
    }

    /// Sizes and bandwidths ten times apart lie evenly spaced on both axes, from 8 B to
    /// 800 MB and from 1 kB/s to 100 GB/s, with a label at each power of ten between.
    #[test]
    fn both_axes_are_logarithmic_over_eight_orders_of_magnitude() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("loglog.svg");
        let points: Vec<(u64, f64)> = (0..9).map(|k| (8 * 10u64.pow(k), 1e-6 * 10f64.powi(k as i32))).collect();
        draw_sweep(&path, &captions("log-log"), &[Series { name: "decades".into(), points }]).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let at = circles(&svg);
        assert_eq!(at.len(), 9, "{svg}");
        let (dx, dy) = (at[1].0 - at[0].0, at[1].1 - at[0].1);
        assert!(dx > 50.0 && dy < -30.0, "x grows right, y up: {at:?}");
        for pair in at.windows(2) {
            assert!((pair[1].0 - pair[0].0 - dx).abs() <= 1.0, "x steps differ: {at:?}");
            assert!((pair[1].1 - pair[0].1 - dy).abs() <= 1.0, "y steps differ: {at:?}");
        }
        for label in ["10 B", "1 kB", "1 MB", "100 MB", "10 kB/s", "1 GB/s", "10 GB/s"] {
            assert!(texts(&svg).contains(&label), "no label {label} in {svg}");
        }
    }

    #[test]
    fn labels_use_si_prefixes_and_three_digits() {
        assert_eq!(si_label(8.0, "B"), "8 B");
        assert_eq!(si_label(1000.0, "B"), "1 kB");
        assert_eq!(si_label(999.9999999, "B"), "1 kB");
        assert_eq!(si_label(250e6, "B/s"), "250 MB/s");
        assert_eq!(si_label(1.5e12, "B/s"), "1.5 TB/s");
        assert_eq!(si_label(1e9, "B"), "1 GB");
        assert_eq!(si_label(0.5, "B/s"), "0.5 B/s");
        assert_eq!(si_label(123_456.0, "B"), "123 kB");
    }

    #[test]
    fn a_range_within_one_decade_widens_to_hold_a_power_of_ten() {
        assert_eq!(log_range([2000.0, 5000.0].into_iter(), 1.1), Some(1000.0..10_000.0));
        let r = log_range([8.0, 1e9, 0.0, f64::NAN].into_iter(), 1.5).unwrap();
        assert!((r.start - 8.0 / 1.5).abs() < 1e-9 && (r.end - 1.5e9).abs() < 1e-3, "{r:?}");
        assert_eq!(log_range([0.0, -1.0].into_iter(), 1.5), None);
    }
}
