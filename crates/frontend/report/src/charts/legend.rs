//! A legend drawn in a strip above a chart, in as many columns as fit, so
//! it never covers data.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::{text_style, text_width, Area, DrawError, LABEL_SIZE};

/// How an entry's sample looks.
#[derive(Clone, Copy)]
pub(crate) enum Swatch {
    /// A short line, for line series.
    Line,
    /// A filled square, for bars.
    Box,
}

/// One legend entry.
pub(crate) struct Entry {
    pub label: String,
    pub colour: RGBColor,
    pub swatch: Swatch,
}

/// Height of one legend row.
const ROW: u32 = 22;
/// Width of a swatch and the gap after it.
const SWATCH: u32 = 26;
/// Space between columns and around the legend.
const PAD: u32 = 14;

impl Entry {
    /// An entry for a series drawn in `colour`.
    pub(crate) fn new(label: impl Into<String>, colour: RGBColor, swatch: Swatch) -> Entry {
        Entry {
            label: label.into(),
            colour,
            swatch,
        }
    }
}

/// Columns and column width of the legend of `entries` on `width` pixels.
fn columns(entries: &[Entry], width: u32) -> (usize, u32) {
    let widest = entries
        .iter()
        .map(|entry| text_width(&entry.label, LABEL_SIZE))
        .max()
        .unwrap_or(0);
    let column = SWATCH + widest + PAD;
    let fit = ((width - PAD) / column).max(1) as usize;
    (fit.min(entries.len()).max(1), column)
}

/// Height of the legend of `entries` on a chart `width` pixels wide.
pub(crate) fn height(entries: &[Entry], width: u32) -> u32 {
    let (cols, _) = columns(entries, width);
    entries.len().div_ceil(cols) as u32 * ROW + PAD
}

/// Splits `area` into the legend of `entries`, drawn at the top, and the
/// area below it, which is returned.
pub(crate) fn draw_above<'a>(area: &Area<'a>, entries: &[Entry]) -> Result<Area<'a>, DrawError> {
    let (width, _) = area.dim_in_pixel();
    let (cols, column) = columns(entries, width);
    let (strip, rest) = area.split_vertically(height(entries, width));
    for (index, entry) in entries.iter().enumerate() {
        let x = (PAD + column * (index % cols) as u32) as i32;
        let y = (PAD / 2 + ROW * (index / cols) as u32 + ROW / 2) as i32;
        draw_entry(&strip, entry, (x, y))?;
    }
    Ok(rest)
}

/// Draws one entry with its swatch's left edge at `x`, centred on `y`.
fn draw_entry(area: &Area<'_>, entry: &Entry, (x, y): (i32, i32)) -> Result<(), DrawError> {
    match entry.swatch {
        Swatch::Line => area.draw(&PathElement::new(
            vec![(x, y), (x + 18, y)],
            entry.colour.stroke_width(3),
        ))?,
        Swatch::Box => area.draw(&Rectangle::new(
            [(x + 2, y - 7), (x + 16, y + 7)],
            entry.colour.filled(),
        ))?,
    }
    let style = text_style(LABEL_SIZE).pos(Pos::new(HPos::Left, VPos::Center));
    area.draw(&Text::new(
        entry.label.clone(),
        (x + SWATCH as i32, y),
        style,
    ))
}
