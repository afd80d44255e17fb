//! PNG charts of the end-to-end benchmark, drawn with plotters.
//!
//! Two kinds of chart are drawn: [`line_chart`] (one line per series, e.g. a
//! rate or latency against the offered load) and [`admitted_chart`] (admitted
//! against expected traffic, with the ideal `y = x` diagonal). Every point
//! carries a median and a min..max range over the repeated runs, drawn as a
//! marker with a vertical range bar.
//!
//! Text goes through plotters' `ab_glyph` renderer so that no system
//! fontconfig/freetype is needed: the DejaVu Sans file of the Debian package
//! `fonts-dejavu-core` is read once per process and registered as
//! `"sans-serif"`, the family plotters uses by default for captions, axis
//! labels and legends.

use std::ops::Range;
use std::path::Path;
use std::sync::OnceLock;

use anyhow::{anyhow, Context};
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::element::DashedPathElement;
use plotters::prelude::*;

/// Where a chart goes, its title and its axis descriptions.
pub struct Chart<'a> {
    pub path: &'a Path,
    pub title: &'a str,
    pub x_desc: &'a str,
    pub y_desc: &'a str,
}

/// One line of a chart: a label and points (x, y median, y min, y max).
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64, f64, f64)>,
}

const FONT_PATH: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
const SIZE: (u32, u32) = (900, 540);
/// Tableau 10 colours: distinct for the usual colour-vision deficiencies and
/// on a white background. Series past the eighth reuse them.
const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];
const DIAGONAL_GREY: RGBColor = RGBColor(150, 150, 150);
/// Half width, in pixels, of the caps at the ends of a range bar.
const CAP: i32 = 4;

/// Line chart with one line per series, markers at the medians and a
/// vertical min..max range bar at each point; legend with the labels;
/// x and y axis descriptions given; both axes start at 0; y uses a log
/// scale when `log_y` is true (then starts at the smallest positive min / 1.5).
/// 900x540 pixels, white background, distinct colours per series (up to 8).
pub fn line_chart(spec: &Chart, log_y: bool, series: &[Series]) -> anyhow::Result<()> {
    ensure_font()?;
    let points = || series.iter().flat_map(|s| s.points.iter());
    let x_max = upper(points().map(|p| p.0), 1.05);
    if log_y {
        // A log axis cannot reach 0; start a bit below the lowest range bar
        // so it stays visible, falling back to the medians if no min is > 0.
        let lowest = |v: &mut dyn Iterator<Item = f64>| {
            v.filter(|v| *v > 0.0 && v.is_finite())
                .fold(f64::NAN, f64::min)
        };
        let mut low = lowest(&mut points().map(|p| p.2));
        if low.is_nan() {
            low = lowest(&mut points().map(|p| p.1));
        }
        let y_min = if low.is_nan() { 1.0 } else { low / 1.5 };
        let y_max = upper(points().flat_map(|p| [p.1, p.3]), 1.5).max(y_min * 10.0);
        let y_range = (y_min..y_max).log_scale();
        draw(spec, series, Kind::Lines, 0.0..x_max, y_range, y_min)
    } else {
        let y_max = upper(points().flat_map(|p| [p.1, p.3]), 1.1);
        draw(spec, series, Kind::Lines, 0.0..x_max, 0.0..y_max, 0.0)
    }
}

/// Grouped-bar-free scatter for "admitted vs expected": for each series,
/// points (expected, admitted median, admitted min, admitted max) drawn as
/// markers with range bars; plus a dashed grey y = x diagonal labelled
/// "expected"; both axes linear from 0 to the largest value * 1.05.
pub fn admitted_chart(spec: &Chart, series: &[Series]) -> anyhow::Result<()> {
    ensure_font()?;
    // One limit for both axes keeps the diagonal at 45 degrees in data terms.
    let max = upper(
        series
            .iter()
            .flat_map(|s| s.points.iter())
            .flat_map(|p| [p.0, p.1, p.3]),
        1.05,
    );
    draw(spec, series, Kind::Admitted, 0.0..max, 0.0..max, 0.0)
}

/// What [`draw`] puts on the chart besides the markers and range bars.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// Lines through the medians.
    Lines,
    /// The `y = x` diagonal, no lines between points.
    Admitted,
}

/// Draws either chart. Generic over the y coordinate so that the linear and
/// the log axis share one code path; `y_floor` is where values the y axis
/// cannot show (<= 0 on a log axis) are clamped to.
fn draw<Y>(
    spec: &Chart,
    series: &[Series],
    kind: Kind,
    x_range: Range<f64>,
    y_range: Y,
    y_floor: f64,
) -> anyhow::Result<()>
where
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let root = BitMapBackend::new(spec.path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(spec.title, ("sans-serif", 24))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(x_range.clone(), y_range)?;
    chart
        .configure_mesh()
        .x_desc(spec.x_desc)
        .y_desc(spec.y_desc)
        .axis_desc_style(("sans-serif", 16))
        .label_style(("sans-serif", 13))
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;

    if kind == Kind::Admitted {
        let end = x_range.end;
        chart
            .draw_series(DashedLineSeries::new(
                [(0.0, 0.0), (end, end)],
                8,
                6,
                DIAGONAL_GREY.stroke_width(2),
            ))?
            .label("expected")
            .legend(|(x, y)| {
                DashedPathElement::new([(x, y), (x + 20, y)], 5, 3, DIAGONAL_GREY.stroke_width(2))
            });
    }

    for (i, s) in series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let clamp = |v: f64| if v > y_floor { v } else { y_floor };
        let medians = || s.points.iter().map(move |p| (p.0, clamp(p.1)));

        // Range bars first so the markers stay on top of them.
        chart.draw_series(s.points.iter().map(|p| {
            PathElement::new(
                [(p.0, clamp(p.2)), (p.0, clamp(p.3))],
                color.stroke_width(1),
            )
        }))?;
        for y in [2, 3] {
            chart.draw_series(s.points.iter().map(|p| {
                let end = if y == 2 { p.2 } else { p.3 };
                EmptyElement::at((p.0, clamp(end)))
                    + PathElement::new([(-CAP, 0), (CAP, 0)], color.stroke_width(1))
            }))?;
        }

        let legend_line = kind == Kind::Lines;
        if legend_line {
            chart.draw_series(LineSeries::new(medians(), color.stroke_width(2)))?;
        }
        chart
            .draw_series(medians().map(|p| Circle::new(p, 4, color.filled())))?
            .label(s.label.as_str())
            .legend(move |(x, y)| {
                let line = if legend_line { 10 } else { 0 };
                EmptyElement::at((x + 10, y))
                    + PathElement::new([(-line, 0), (line, 0)], color.stroke_width(2))
                    + Circle::new((0, 0), 4, color.filled())
            });
    }

    chart
        .configure_series_labels()
        .position(match kind {
            // Admitted traffic stays at or below the diagonal, so the upper
            // left is the corner least likely to hide points.
            Kind::Admitted => SeriesLabelPosition::UpperLeft,
            Kind::Lines => SeriesLabelPosition::UpperRight,
        })
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()
        .with_context(|| format!("writing chart {}", spec.path.display()))?;
    Ok(())
}

/// Upper axis limit: the largest finite value times `headroom`, or 1 when
/// there is nothing positive to show (plotters needs a non-empty range).
fn upper(values: impl Iterator<Item = f64>, headroom: f64) -> f64 {
    let max = values.filter(|v| v.is_finite()).fold(0.0, f64::max);
    if max > 0.0 {
        max * headroom
    } else {
        1.0
    }
}

/// Tick label without the trailing ".0" and long fractions plotters' default
/// `Debug` formatting gives on a log axis.
fn tick(v: &f64) -> String {
    let a = v.abs();
    if a >= 1e6 || (a > 0.0 && a < 1e-3) {
        format!("{v:.1e}")
    } else if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// Registers DejaVu Sans as "sans-serif" once per process; later calls return
/// the first outcome, so the font file is read (and leaked) only once.
fn ensure_font() -> anyhow::Result<()> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            let bytes = std::fs::read(FONT_PATH)
                .map_err(|e| format!("cannot read {FONT_PATH} ({e}): install fonts-dejavu-core"))?;
            // plotters keeps the font as a &'static [u8] for the whole process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).map_err(|_| {
                format!("{FONT_PATH} is not a usable font: reinstall fonts-dejavu-core")
            })
        })
        .clone()
        .map_err(|e| anyhow!(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PNG_SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a];

    #[test]
    fn draws_both_charts() {
        let dir = std::env::temp_dir().join(format!(
            "limiter-plot-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let series = [
            Series {
                label: "xdp".into(),
                points: vec![
                    (1000.0, 990.0, 950.0, 1000.0),
                    (2000.0, 1980.0, 1900.0, 2010.0),
                    (4000.0, 3900.0, 3700.0, 4000.0),
                ],
            },
            Series {
                label: "baseline".into(),
                points: vec![
                    (1000.0, 800.0, 600.0, 900.0),
                    (2000.0, 1500.0, 1200.0, 1700.0),
                    (4000.0, 2500.0, 2000.0, 3000.0),
                ],
            },
        ];
        let lines = dir.join("lines.png");
        let admitted = dir.join("admitted.png");
        let spec = |path, title, x_desc, y_desc| Chart {
            path,
            title,
            x_desc,
            y_desc,
        };
        let latency = spec(&lines, "Latency", "offered pps", "latency (us)");
        line_chart(&latency, true, &series).unwrap();
        let passed = spec(&admitted, "Admitted", "expected pps", "admitted pps");
        admitted_chart(&passed, &series).unwrap();
        for file in [&lines, &admitted] {
            let bytes = std::fs::read(file).unwrap();
            assert_eq!(bytes[..8], PNG_SIGNATURE, "{} is not a PNG", file.display());
            assert!(
                bytes.len() > 5 * 1024,
                "{} is only {} bytes",
                file.display(),
                bytes.len()
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
