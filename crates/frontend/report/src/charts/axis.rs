//! A linear axis with ticks exactly where a chart wants them: at rows of
//! a bar chart, cells of a heat map, powers of two, chosen percentiles.

use std::ops::Range;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};

/// A linear `f64` axis over a range, ticked at given values. (plotters'
/// own `with_key_points` on an `f64` range cannot take label formatters.)
pub(crate) struct Ticked {
    range: Range<f64>,
    ticks: Vec<f64>,
}

impl Ticked {
    /// An axis over `range` with ticks at `ticks`.
    pub(crate) fn new(range: Range<f64>, ticks: Vec<f64>) -> Ticked {
        Ticked { range, ticks }
    }
}

impl Ranged for Ticked {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, (from, to): (i32, i32)) -> i32 {
        let span = self.range.end - self.range.start;
        let share = if span == 0.0 {
            0.0
        } else {
            (value - self.range.start) / span
        };
        from + (share * f64::from(to - from)).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        // Bold ticks only: light grid lines between them would mean nothing.
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> Range<f64> {
        self.range.clone()
    }
}
