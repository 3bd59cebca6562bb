//! Horizontal bar charts: one band per group (a CrystalDiskMark row, a
//! link), one bar per value in it, its value written at its end.

use plotters::prelude::*;

use super::axis::Ticked;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::legend::{self, Entry};
use super::{text_style, text_width, Area, DrawError, DESC_SIZE, GRID, LABEL_SIZE, WIDTH};
use crate::format::significant;

/// One bar.
pub(crate) struct Bar {
    /// Index of its group.
    pub group: usize,
    /// Length, in the axis unit.
    pub value: f64,
    pub colour: RGBColor,
    /// Written at the bar's end.
    pub text: String,
}

/// What a bar chart shows.
pub(crate) struct Bars<'a> {
    /// Band labels, top to bottom.
    pub groups: &'a [String],
    pub bars: &'a [Bar],
    pub legend: &'a [Entry],
    /// Title of the value axis.
    pub axis: &'a str,
}

/// Height of one bar and the gap around a band, in pixels.
const BAR_PX: u32 = 20;
const BAND_PAD_PX: u32 = 16;
/// Height of the value axis' labels and title.
const AXIS_PX: u32 = 48;

impl Bars<'_> {
    /// The most bars any group has.
    fn per_group(&self) -> usize {
        (0..self.groups.len())
            .map(|group| self.bars.iter().filter(|bar| bar.group == group).count())
            .max()
            .unwrap_or(1)
            .max(1)
    }

    /// Pixel size of the chart.
    pub(crate) fn size(&self) -> (u32, u32) {
        let band = BAR_PX * self.per_group() as u32 + BAND_PAD_PX;
        let height = legend::height(self.legend, WIDTH) + band * self.groups.len() as u32;
        (WIDTH, height + AXIS_PX + 10)
    }

    /// Draws the chart on `area`, which has [`Bars::size`].
    pub(crate) fn draw(&self, area: &Area<'_>) -> Result<(), DrawError> {
        let plot = legend::draw_above(area, self.legend)?;
        let bands = self.groups.len() as f64;
        let longest = self.bars.iter().map(|bar| bar.value).fold(0.0, f64::max);
        let widest_text = self
            .bars
            .iter()
            .map(|bar| text_width(&bar.text, LABEL_SIZE))
            .max();
        // Room right of the longest bar for its value.
        let headroom = 1.0 + f64::from(widest_text.unwrap_or(0) + 12) / f64::from(WIDTH / 2);
        let label_px = self.groups.iter().map(|g| text_width(g, LABEL_SIZE)).max();
        let centres: Vec<f64> = (0..self.groups.len())
            .map(|i| bands - i as f64 - 0.5)
            .collect();
        let mut chart = ChartBuilder::on(&plot)
            .margin_right(16)
            .margin_left(8)
            .x_label_area_size(AXIS_PX)
            .y_label_area_size(label_px.unwrap_or(0) + 16)
            .build_cartesian_2d(
                0.0..(longest * headroom).max(1e-9),
                Ticked::new(0.0..bands, centres),
            )?;
        let group_of = |y: &f64| {
            let index = (bands - y - 0.5).round();
            self.groups.get(index as usize).cloned().unwrap_or_default()
        };
        chart
            .configure_mesh()
            .disable_y_mesh()
            .bold_line_style(GRID)
            .light_line_style(WHITE)
            .label_style(text_style(LABEL_SIZE))
            .axis_desc_style(text_style(DESC_SIZE))
            .x_desc(self.axis)
            .x_labels(8)
            .x_label_formatter(&|x| significant(*x, 4))
            .y_label_formatter(&group_of)
            .draw()?;
        chart.draw_series(self.placed().map(|(bar, bottom, top)| {
            Rectangle::new([(0.0, bottom), (bar.value, top)], bar.colour.filled())
        }))?;
        let value_style = text_style(LABEL_SIZE).pos(Pos::new(HPos::Left, VPos::Center));
        chart.draw_series(self.placed().map(|(bar, bottom, top)| {
            EmptyElement::at((bar.value, (bottom + top) / 2.0))
                + Text::new(bar.text.clone(), (5, 0), value_style.clone())
        }))?;
        Ok(())
    }

    /// Each bar with its bottom and top on the band axis: a group's bars
    /// share 80% of its band, the first on top.
    fn placed(&self) -> impl Iterator<Item = (&Bar, f64, f64)> {
        let bands = self.groups.len() as f64;
        let slot = 0.8 / self.per_group() as f64;
        self.bars.iter().enumerate().map(move |(index, bar)| {
            let before = self.bars[..index]
                .iter()
                .filter(|other| other.group == bar.group)
                .count() as f64;
            let top = bands - bar.group as f64 - 0.1 - slot * before;
            (bar, top - slot * 0.9, top)
        })
    }
}
