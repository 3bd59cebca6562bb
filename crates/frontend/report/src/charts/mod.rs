//! The figures: one module per kind of chart, each turning a model into
//! [`Figure`]s, and what they share: the SVG canvas, colours, fonts and
//! the legend.
//!
//! Charts are drawn with plotters' SVG backend, which writes text as SVG
//! `<text>` for the browser to set in its own sans-serif font. Without a
//! font feature plotters estimates text widths from the character count,
//! which is all the layout needs, so no font file is embedded.

pub(crate) mod atto;
pub(crate) mod axis;
pub(crate) mod bars;
pub(crate) mod cdm;
pub(crate) mod heatmap;
pub(crate) mod jobs;
pub(crate) mod latency;
pub(crate) mod legend;
pub(crate) mod stripe;
pub(crate) mod topology;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::ReportError;

/// The drawing area of a chart.
pub(crate) type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
/// What drawing on an [`Area`] can fail with.
pub(crate) type DrawError = DrawingAreaErrorKind<std::io::Error>;

/// One figure of the page: a chart or a table under a heading.
pub(crate) struct Figure {
    /// Shown above the figure.
    pub heading: String,
    /// The `data-chart` name when the figure is a chart.
    pub chart: Option<&'static str>,
    /// The figure's HTML: an `<svg>` or a table, and any notes.
    pub body: String,
}

/// Width of every chart, in SVG pixels; CSS scales it down in a narrow
/// window.
pub(crate) const WIDTH: u32 = 860;
/// The font plotters names in the SVG; the browser picks its face.
pub(crate) const FONT: &str = "sans-serif";
/// Size of tick labels.
pub(crate) const LABEL_SIZE: u32 = 15;
/// Size of axis titles.
pub(crate) const DESC_SIZE: u32 = 16;

/// Reads, in every chart that has both directions.
pub(crate) const READ: RGBColor = RGBColor(0x00, 0x72, 0xB2);
/// Writes, in every chart that has both directions.
pub(crate) const WRITE: RGBColor = RGBColor(0xD5, 0x5E, 0x00);
/// Colours of series beyond read and write, told apart with colour
/// blindness too (after Okabe and Ito's palette, with darker yellows).
pub(crate) const SERIES: [RGBColor; 8] = [
    RGBColor(0x00, 0x72, 0xB2),
    RGBColor(0xD5, 0x5E, 0x00),
    RGBColor(0x00, 0x9E, 0x73),
    RGBColor(0xCC, 0x79, 0xA7),
    RGBColor(0xB8, 0x86, 0x00),
    RGBColor(0x56, 0xB4, 0xE9),
    RGBColor(0x33, 0x33, 0x33),
    RGBColor(0x88, 0x88, 0x22),
];
/// Grid lines.
pub(crate) const GRID: RGBColor = RGBColor(0xDD, 0xDD, 0xDD);
/// Axis lines and text.
pub(crate) const INK: RGBColor = RGBColor(0x22, 0x22, 0x22);

/// The colour of the `index`th series.
pub(crate) fn series_colour(index: usize) -> RGBColor {
    SERIES[index % SERIES.len()]
}

/// Roughly how wide `text` is at font `size`, in pixels; plotters' own
/// estimate without a font feature, for sizing label areas. (plotters
/// writes a font of size `s` as `font-size` `s / 1.24` in the SVG.)
pub(crate) fn text_width(text: &str, size: u32) -> u32 {
    (f64::from(size) * 0.46 * text.chars().count() as f64).ceil() as u32
}

/// A text style in the chart font.
pub(crate) fn text_style(size: u32) -> TextStyle<'static> {
    (FONT, size).into_font().color(&INK)
}

/// Draws a chart of `size` pixels with `draw` and returns its `<svg>`;
/// a failure becomes an error naming `file` and the chart.
pub(crate) fn svg(
    file: &str,
    chart: &'static str,
    size: (u32, u32),
    draw: impl FnOnce(&Area<'_>) -> Result<(), DrawError>,
) -> Result<String, ReportError> {
    let mut out = String::new();
    let drawn = {
        let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
        root.fill(&WHITE)
            .and_then(|()| draw(&root))
            .and_then(|()| root.present())
    };
    drawn.map_err(|error| ReportError::Draw {
        file: file.to_string(),
        chart,
        reason: error.to_string(),
    })?;
    Ok(out)
}
