//! PNG line charts (plotters' bitmap backend; text through `ab_glyph` with a TrueType font
//! found on the machine, so no font library is linked).

use std::path::Path;

use plotters::prelude::*;
use watukuy_core::BoxError;

/// Fonts tried in order when `--font` is not given.
const FONT_CANDIDATES: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

/// Registers a sans-serif font for the charts' text. Fails when none is readable.
pub(crate) fn register_font(explicit: Option<&Path>) -> Result<(), BoxError> {
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None => FONT_CANDIDATES
            .iter()
            .map(Path::new)
            .find(|p| p.exists())
            .ok_or("no TrueType font found for the plots (pass --font FILE.ttf)")?
            .to_path_buf(),
    };
    let bytes: &'static [u8] = Box::leak(std::fs::read(&path)?.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| format!("{} is not a usable font", path.display()))?;
    Ok(())
}

/// One line of a chart.
#[derive(Clone, Debug)]
pub(crate) struct Series {
    /// The legend.
    pub(crate) label: String,
    /// `(x, events/s)` points, x ascending.
    pub(crate) points: Vec<(f64, f64)>,
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
];

/// Draws `series` against a log₂ x axis (concurrency or keys) and a log₁₀ y axis (events/s).
pub(crate) fn chart(
    path: &Path,
    title: &str,
    x_label: &str,
    series: &[Series],
) -> Result<(), BoxError> {
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let ys = series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
    let x_max = xs.fold(1.0_f64, f64::max) * 1.5;
    let (y_min, y_max) = ys
        .filter(|y| *y > 0.0)
        .fold((f64::MAX, 1.0_f64), |(lo, hi), y| (lo.min(y), hi.max(y)));
    let y_min = if y_min == f64::MAX { 1.0 } else { y_min / 2.0 };
    let root = BitMapBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(90)
        .build_cartesian_2d(
            (0.75_f64..x_max).log_scale(),
            (y_min..y_max * 8.0).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc("events/s")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| crate::measure::group_digits(*y))
        .label_style(("sans-serif", 15))
        .draw()?;
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                s.points.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(s.label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(
            s.points
                .iter()
                .map(|&(x, y)| Circle::new((x, y), 4, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 16))
        .draw()?;
    root.present()?;
    Ok(())
}
