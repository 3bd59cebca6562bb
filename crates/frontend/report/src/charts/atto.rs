//! ATTO's view: throughput against transfer size, read and write.

use plotters::prelude::*;

use super::axis::Ticked;

use super::legend::{self, Entry, Swatch};
use super::{
    svg, text_style, Area, DrawError, Figure, DESC_SIZE, GRID, LABEL_SIZE, READ, WIDTH, WRITE,
};
use crate::error::ReportError;
use crate::format::{significant, size, MB};
use crate::model::Bench;

/// Above this many MB/s the axis counts GB/s.
const GB_AXIS_FROM_MB_S: f64 = 10_000.0;

/// One line: (log2 of the transfer size, MB/s), by size.
type Line = Vec<(f64, f64)>;

/// The read and write lines of `bench`.
fn lines(bench: &Bench) -> (Line, Line) {
    let (mut read, mut write) = (Vec::new(), Vec::new());
    for job in &bench.jobs {
        let x = (job.bs_bytes.max(1) as f64).log2();
        if job.rw.reads() {
            read.push((x, job.read.bw_bytes / MB));
        }
        if job.rw.writes() {
            write.push((x, job.write.bw_bytes / MB));
        }
    }
    read.sort_by(|a, b| a.0.total_cmp(&b.0));
    write.sort_by(|a, b| a.0.total_cmp(&b.0));
    (read, write)
}

/// The transfer-size curve of `bench`.
pub(crate) fn chart(file: &str, bench: &Bench) -> Result<Figure, ReportError> {
    let (read, write) = lines(bench);
    let body = svg(file, "atto", (WIDTH, 460), |area| draw(area, &read, &write))?;
    Ok(Figure {
        heading: "Throughput by transfer size".to_string(),
        chart: Some("atto"),
        body,
    })
}

/// Draws the legend, the axes and both lines.
fn draw(area: &Area<'_>, read: &Line, write: &Line) -> Result<(), DrawError> {
    let entries = [
        Entry::new("read", READ, Swatch::Line),
        Entry::new("write", WRITE, Swatch::Line),
    ];
    let plot = legend::draw_above(area, &entries)?;
    let all = || read.iter().chain(write);
    let top = all().map(|p| p.1).fold(0.0, f64::max);
    let (scale, unit) = if top >= GB_AXIS_FROM_MB_S {
        (1000.0, "GB/s (10^9 bytes per second)")
    } else {
        (1.0, "MB/s (10^6 bytes per second)")
    };
    let low = all().map(|p| p.0).fold(f64::INFINITY, f64::min).floor();
    let high = all().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max).ceil();
    let ticks: Vec<f64> = (low as i32..=high as i32).map(f64::from).collect();
    let mut chart = ChartBuilder::on(&plot)
        .margin_right(24)
        .margin_left(8)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(
            Ticked::new(low - 0.5..high + 0.5, ticks),
            0.0..(top / scale * 1.08).max(1e-9),
        )?;
    chart
        .configure_mesh()
        .bold_line_style(GRID)
        .light_line_style(WHITE)
        .label_style(text_style(LABEL_SIZE))
        .axis_desc_style(text_style(DESC_SIZE))
        .x_desc("transfer size (bytes, log scale)")
        .y_desc(unit)
        .x_label_formatter(&|x| size(x.exp2()))
        .y_label_formatter(&|y| significant(*y, 4))
        .draw()?;
    for (line, colour) in [(read, READ), (write, WRITE)] {
        let scaled = line.iter().map(|&(x, y)| (x, y / scale));
        chart.draw_series(LineSeries::new(scaled.clone(), colour.stroke_width(2)))?;
        chart.draw_series(scaled.map(|point| Circle::new(point, 3, colour.filled())))?;
    }
    Ok(())
}
