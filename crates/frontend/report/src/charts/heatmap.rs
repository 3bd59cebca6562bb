//! Workers × queue depth: a grid of IOPS, one cell per job, for jobs of
//! the same mode and transfer size that vary both (the `sweep` presets).

use plotters::prelude::*;

use super::axis::Ticked;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::{svg, text_style, Area, DrawError, Figure, DESC_SIZE, INK, LABEL_SIZE, WIDTH};
use crate::error::ReportError;
use crate::format::compact;
use crate::model::{Bench, Job};

/// Width of the colour scale beside the grid.
const SCALE_PX: u32 = 140;
/// Height of one grid row.
const ROW_PX: u32 = 58;

/// Jobs of one mode and size laid out by worker count and queue depth.
struct Grid<'a> {
    /// `randread 4K`.
    name: String,
    /// Worker counts (rows, bottom up) and queue depths (columns), sorted.
    workers: Vec<u32>,
    depths: Vec<u32>,
    /// IOPS of (row, column).
    cells: Vec<(usize, usize, f64)>,
    jobs: Vec<&'a Job>,
}

/// The distinct values of `key` over `jobs`, sorted.
fn distinct(jobs: &[&Job], key: impl Fn(&Job) -> u32) -> Vec<u32> {
    let mut values: Vec<u32> = jobs.iter().map(|job| key(job)).collect();
    values.sort_unstable();
    values.dedup();
    values
}

impl<'a> Grid<'a> {
    /// A grid of `jobs` if they vary both worker count and queue depth and
    /// ran every combination of the two.
    fn of(jobs: Vec<&'a Job>) -> Option<Grid<'a>> {
        let workers = distinct(&jobs, |job| job.numjobs);
        let depths = distinct(&jobs, |job| job.iodepth);
        if workers.len() < 2 || depths.len() < 2 {
            return None;
        }
        let mut cells = Vec::new();
        for (row, &numjobs) in workers.iter().enumerate() {
            for (column, &iodepth) in depths.iter().enumerate() {
                let job = jobs
                    .iter()
                    .find(|job| job.numjobs == numjobs && job.iodepth == iodepth)?;
                cells.push((row, column, job.total_iops()));
            }
        }
        Some(Grid {
            name: format!("{} {}", jobs[0].rw.as_str(), jobs[0].bs),
            workers,
            depths,
            cells,
            jobs,
        })
    }

    /// Lowest and highest IOPS, apart even when every cell is equal.
    fn range(&self) -> (f64, f64) {
        let values = || self.cells.iter().map(|cell| cell.2);
        let high = values().fold(0.0, f64::max);
        let low = values().fold(f64::INFINITY, f64::min);
        if high > low {
            (low, high)
        } else {
            (0.0, high.max(1.0))
        }
    }
}

/// Jobs grouped by mode and transfer size, in the order groups first appear.
fn grids(bench: &Bench) -> Vec<Grid<'_>> {
    let mut groups: Vec<Vec<&Job>> = Vec::new();
    for job in &bench.jobs {
        match groups
            .iter_mut()
            .find(|group| group[0].rw == job.rw && group[0].bs_bytes == job.bs_bytes)
        {
            Some(group) => group.push(job),
            None => groups.push(vec![job]),
        }
    }
    groups.into_iter().filter_map(Grid::of).collect()
}

/// One heat map per group of `bench`'s jobs that forms a full grid.
pub(crate) fn charts(file: &str, bench: &Bench) -> Result<Vec<Figure>, ReportError> {
    grids(bench)
        .iter()
        .map(|grid| {
            let height = ROW_PX * grid.workers.len() as u32 + 110;
            let body = svg(file, "heatmap", (WIDTH, height), |area| draw(area, grid))?;
            Ok(Figure {
                heading: format!(
                    "IOPS by workers × queue depth: {} ({} jobs)",
                    grid.name,
                    grid.jobs.len()
                ),
                chart: Some("heatmap"),
                body,
            })
        })
        .collect()
}

/// Draws the grid and, right of it, its colour scale.
fn draw(area: &Area<'_>, grid: &Grid<'_>) -> Result<(), DrawError> {
    let (grid_area, scale_area) = area.split_horizontally(WIDTH - SCALE_PX);
    draw_grid(&grid_area, grid)?;
    draw_scale(&scale_area, grid.range())
}

/// Tick positions at the centres of `count` cells.
fn centres(count: usize) -> Vec<f64> {
    (0..count).map(|i| i as f64 + 0.5).collect()
}

/// The value of the cell whose centre is `position`, as a label.
fn cell_label(values: &[u32], position: f64) -> String {
    values
        .get(position.floor().max(0.0) as usize)
        .map_or(String::new(), u32::to_string)
}

/// Draws the cells, coloured by IOPS and labelled with it.
fn draw_grid(area: &Area<'_>, grid: &Grid<'_>) -> Result<(), DrawError> {
    let (columns, rows) = (grid.depths.len(), grid.workers.len());
    let mut chart = ChartBuilder::on(area)
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d(
            Ticked::new(0.0..columns as f64, centres(columns)),
            Ticked::new(0.0..rows as f64, centres(rows)),
        )?;
    chart
        .configure_mesh()
        .disable_mesh()
        .label_style(text_style(LABEL_SIZE))
        .axis_desc_style(text_style(DESC_SIZE))
        .x_desc("queue depth per worker (iodepth)")
        .y_desc("workers (numjobs)")
        .x_label_formatter(&|x| cell_label(&grid.depths, *x))
        .y_label_formatter(&|y| cell_label(&grid.workers, *y))
        .draw()?;
    let (low, high) = grid.range();
    let place = |row: usize, column: usize| {
        let (x, y) = (column as f64, row as f64);
        [(x, y), (x + 1.0, y + 1.0)]
    };
    chart.draw_series(grid.cells.iter().map(|&(row, column, iops)| {
        Rectangle::new(
            place(row, column),
            ViridisRGB::get_color_normalized(iops, low, high).filled(),
        )
    }))?;
    chart.draw_series(
        grid.cells
            .iter()
            .map(|&(row, column, _)| Rectangle::new(place(row, column), WHITE.stroke_width(2))),
    )?;
    let best = grid.cells.iter().map(|cell| cell.2).fold(0.0, f64::max);
    chart.draw_series(grid.cells.iter().map(|&(row, column, iops)| {
        // Viridis is dark at its low end: light text there.
        let light = (iops - low) / (high - low) < 0.55;
        let colour: &'static RGBColor = if light { &WHITE } else { &INK };
        let size = if iops == best { 24 } else { 20 };
        let style = text_style(size)
            .color(colour)
            .pos(Pos::new(HPos::Center, VPos::Center));
        Text::new(
            compact(iops),
            (column as f64 + 0.5, row as f64 + 0.5),
            style,
        )
    }))?;
    Ok(())
}

/// The colour scale: a bar from the lowest to the highest IOPS.
fn draw_scale(area: &Area<'_>, (low, high): (f64, f64)) -> Result<(), DrawError> {
    let mut chart = ChartBuilder::on(area)
        .caption("IOPS", text_style(DESC_SIZE))
        .margin_top(4)
        .margin_bottom(60)
        .margin_left(8)
        .right_y_label_area_size(72)
        .build_cartesian_2d(0.0..1.0, low..high)?;
    chart
        .configure_mesh()
        .disable_mesh()
        .disable_x_axis()
        .label_style(text_style(LABEL_SIZE))
        .y_labels(6)
        .y_label_formatter(&|y| compact(*y))
        .draw()?;
    const STEPS: usize = 48;
    let step = (high - low) / STEPS as f64;
    chart.draw_series((0..STEPS).map(|i| {
        let bottom = low + step * i as f64;
        let colour = ViridisRGB::get_color_normalized(bottom + step / 2.0, low, high);
        Rectangle::new([(0.0, bottom), (1.0, bottom + step)], colour.filled())
    }))?;
    Ok(())
}
