//! Completion-latency percentiles per job, on an axis that spreads the
//! tail: x = -log10(1 - p/100) puts 90, 99, 99.9 and 99.99 one step apart.

use plotters::prelude::*;

use super::axis::Ticked;

use super::legend::{self, Entry, Swatch};
use super::{
    series_colour, svg, text_style, Area, DrawError, Figure, DESC_SIZE, GRID, LABEL_SIZE, WIDTH,
};
use crate::error::ReportError;
use crate::format::significant;
use crate::html::escape;
use crate::model::{Bench, Job};

/// Most jobs drawn in one chart; more lines are unreadable.
pub(crate) const MAX_LINES: usize = 8;
/// The percentiles the axis labels.
const TICKS: [f64; 5] = [50.0, 90.0, 99.0, 99.9, 99.99];

/// Position of percentile `p` on the x axis.
fn spread(p: f64) -> f64 {
    -(1.0 - p / 100.0).log10()
}

/// A job's points the axis can show: every percentile below 100 (the
/// maximum would sit at infinity), as (x, log10 of µs).
fn points(job: &Job) -> impl Iterator<Item = (f64, f64)> + Clone + '_ {
    job.percentiles
        .iter()
        .filter(|(p, _)| *p < 100.0)
        .map(|&(p, ns)| (spread(p), height_of(ns)))
}

/// The percentile at position `x`, as a label: `99.9`.
fn percentile_label(x: f64) -> String {
    let p = 100.0 * (1.0 - 10f64.powf(-x));
    let text = format!("{p:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The percentile chart of `bench`'s first jobs, or `None` when no job
/// recorded latencies.
pub(crate) fn chart(file: &str, bench: &Bench) -> Result<Option<Figure>, ReportError> {
    let (with, without): (Vec<&Job>, Vec<&Job>) = bench
        .jobs
        .iter()
        .partition(|job| points(job).next().is_some());
    if with.is_empty() {
        return Ok(None);
    }
    let drawn = &with[..with.len().min(MAX_LINES)];
    let entries: Vec<Entry> = drawn
        .iter()
        .enumerate()
        .map(|(i, job)| Entry::new(job.name.clone(), series_colour(i), Swatch::Line))
        .collect();
    let height = 440 + legend::height(&entries, WIDTH);
    let mut body = svg(file, "latency", (WIDTH, height), |area| {
        draw(area, drawn, &entries)
    })?;
    body.push_str(&notes(&with[drawn.len()..], &without));
    Ok(Some(Figure {
        heading: "Completion latency percentiles".to_string(),
        chart: Some("latency"),
        body,
    }))
}

/// Which jobs are not drawn, and why.
fn notes(omitted: &[&Job], without: &[&Job]) -> String {
    let names = |jobs: &[&Job]| {
        jobs.iter()
            .map(|job| escape(&job.name))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut html = String::new();
    if !omitted.is_empty() {
        html.push_str(&format!(
            "<p class=\"note\">Only the first {MAX_LINES} jobs are drawn; not drawn: {}.</p>",
            names(omitted)
        ));
    }
    if !without.is_empty() {
        html.push_str(&format!(
            "<p class=\"note\">No latency samples: {}.</p>",
            names(without)
        ));
    }
    html
}

/// Ticks of a log axis from `low` to `high` (both > 0), as log10 of
/// 1, 2 and 5 times each power of ten, or the powers alone over many
/// decades.
fn log_ticks(low: f64, high: f64) -> Vec<f64> {
    let (first, last) = (low.log10().floor() as i32, high.log10().ceil() as i32);
    let steps: &[f64] = if last - first > 4 {
        &[1.0]
    } else {
        &[1.0, 2.0, 5.0]
    };
    (first..=last)
        .flat_map(|power| steps.iter().map(move |step| step * 10f64.powi(power)))
        .filter(|value| (low..=high).contains(value))
        .map(f64::log10)
        .collect()
}

/// A latency in ns as the y position: log10 of µs.
fn height_of(ns: f64) -> f64 {
    (ns / 1000.0).max(0.001).log10()
}

/// Draws the legend, the axes and one line per job.
fn draw(area: &Area<'_>, jobs: &[&Job], entries: &[Entry]) -> Result<(), DrawError> {
    let plot = legend::draw_above(area, entries)?;
    let all = || jobs.iter().flat_map(|job| points(job));
    let right = all().map(|(x, _)| x).fold(0.0, f64::max);
    let bottom = all().map(|(_, y)| y).fold(f64::INFINITY, f64::min) - 0.1;
    let top = all().map(|(_, y)| y).fold(f64::NEG_INFINITY, f64::max) + 0.1;
    let x_ticks: Vec<f64> = TICKS
        .iter()
        .map(|&p| spread(p))
        .filter(|&x| x <= right + 1e-9)
        .collect();
    let y_ticks = log_ticks(10f64.powf(bottom), 10f64.powf(top));
    let mut chart = ChartBuilder::on(&plot)
        .margin_right(24)
        .margin_left(8)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(
            Ticked::new(0.0..right + 0.1, x_ticks),
            Ticked::new(bottom..top, y_ticks),
        )?;
    chart
        .configure_mesh()
        .bold_line_style(GRID)
        .light_line_style(WHITE)
        .label_style(text_style(LABEL_SIZE))
        .axis_desc_style(text_style(DESC_SIZE))
        .x_desc("percentile (tail spread out)")
        .y_desc("completion latency (µs, log scale)")
        .x_label_formatter(&|x| percentile_label(*x))
        .y_label_formatter(&|y| significant(10f64.powf(*y), 3))
        .draw()?;
    for (i, job) in jobs.iter().enumerate() {
        let colour = series_colour(i);
        chart.draw_series(LineSeries::new(points(job), colour.stroke_width(2)))?;
        chart.draw_series(points(job).map(|point| Circle::new(point, 2, colour.filled())))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_ticks_are_one_step_apart() {
        assert!((spread(90.0) - 1.0).abs() < 1e-9);
        assert!((spread(99.99) - 4.0).abs() < 1e-9);
        assert_eq!(percentile_label(spread(99.9)), "99.9");
        assert_eq!(percentile_label(spread(50.0)), "50");
    }

    #[test]
    fn log_ticks_at_one_two_five() {
        let ticks: Vec<String> = log_ticks(0.4, 30.0)
            .iter()
            .map(|y| significant(10f64.powf(*y), 3))
            .collect();
        assert_eq!(ticks, ["0.5", "1", "2", "5", "10", "20"]);
    }
}
