//! The chunk-size sweep of `nvraid tune`: every metric relative to its
//! best chunk, the recommended chunk marked, and a table of the values.

use plotters::prelude::*;

use super::axis::Ticked;

use super::legend::{self, Entry, Swatch};
use super::{
    series_colour, svg, text_style, Area, DrawError, Figure, DESC_SIZE, GRID, LABEL_SIZE, WIDTH,
};
use crate::error::ReportError;
use crate::format::{grouped, significant, size};
use crate::html::escape;
use crate::model::{Chunk, Metric, Tune};

/// Fill of the band that marks the recommended chunk.
const RECOMMENDED: RGBColor = RGBColor(0xCF, 0xEB, 0xD6);

/// The sweep's chart and its table.
pub(crate) fn figures(file: &str, tune: &Tune) -> Result<Vec<Figure>, ReportError> {
    let mut entries: Vec<Entry> = tune
        .metrics
        .iter()
        .enumerate()
        .map(|(i, metric)| Entry::new(metric.key.clone(), series_colour(i), Swatch::Line))
        .collect();
    if let Some(chosen) = &tune.recommendation {
        let label = format!("recommended: {}", size(chosen.chunk_bytes as f64));
        entries.push(Entry::new(label, RECOMMENDED, Swatch::Box));
    }
    let height = 420 + legend::height(&entries, WIDTH);
    let chart = svg(file, "stripe", (WIDTH, height), |area| {
        draw(area, tune, &entries)
    })?;
    Ok(vec![
        Figure {
            heading: "Chunk size sweep: each metric relative to its best chunk".to_string(),
            chart: Some("stripe"),
            body: chart,
        },
        Figure {
            heading: "Chunk size sweep: measured values".to_string(),
            chart: None,
            body: table(tune),
        },
    ])
}

/// `value` of `metric` as a percentage of the metric's best chunk.
fn relative(tune: &Tune, metric: &Metric, value: f64) -> f64 {
    match tune.best(&metric.key) {
        Some(best) if best > 0.0 => value / best * 100.0,
        _ => 0.0,
    }
}

/// Position of a chunk size on the x axis.
fn position(chunk_bytes: u64) -> f64 {
    (chunk_bytes.max(1) as f64).log2()
}

/// Draws the legend, the recommended chunk's band and one line per metric.
fn draw(area: &Area<'_>, tune: &Tune, entries: &[Entry]) -> Result<(), DrawError> {
    let plot = legend::draw_above(area, entries)?;
    let ticks: Vec<f64> = tune
        .chunks
        .iter()
        .map(|c| position(c.chunk_bytes))
        .collect();
    let left = ticks.iter().copied().fold(f64::INFINITY, f64::min);
    let right = ticks.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut chart = ChartBuilder::on(&plot)
        .margin_right(24)
        .margin_left(8)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d(Ticked::new(left - 0.5..right + 0.5, ticks), 0.0..108.0)?;
    chart
        .configure_mesh()
        .bold_line_style(GRID)
        .light_line_style(WHITE)
        .label_style(text_style(LABEL_SIZE))
        .axis_desc_style(text_style(DESC_SIZE))
        .x_desc("chunk size (log scale)")
        .y_desc("% of the metric's best chunk")
        .y_labels(12)
        .x_label_formatter(&|x| size(x.exp2()))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()?;
    if let Some(chosen) = &tune.recommendation {
        let x = position(chosen.chunk_bytes);
        chart.draw_series([Rectangle::new(
            [(x - 0.2, 0.0), (x + 0.2, 108.0)],
            RECOMMENDED.filled(),
        )])?;
    }
    for (i, metric) in tune.metrics.iter().enumerate() {
        let colour = series_colour(i);
        let line = tune.chunks.iter().filter_map(|chunk| {
            let value = chunk.value(&metric.key)?;
            Some((position(chunk.chunk_bytes), relative(tune, metric, value)))
        });
        chart.draw_series(LineSeries::new(line.clone(), colour.stroke_width(2)))?;
        chart.draw_series(line.map(|point| Circle::new(point, 4, colour.filled())))?;
    }
    Ok(())
}

/// A table cell of `chunk`'s value of `metric`, with its share of the best.
fn value_cell(tune: &Tune, metric: &Metric, chunk: &Chunk, recommended: bool) -> String {
    let class = if recommended { " class=\"rec\"" } else { "" };
    match chunk.value(&metric.key) {
        Some(value) => format!(
            "<td{class}>{}<small>{}%</small></td>",
            grouped(value, if value < 100.0 { 1 } else { 0 }),
            significant(relative(tune, metric, value), 3)
        ),
        None => format!("<td{class}>&mdash;</td>"),
    }
}

/// The values of every metric by chunk, the recommended column marked,
/// then the reason and the chunks within noise of it.
fn table(tune: &Tune) -> String {
    let chosen = tune.recommendation.as_ref().map(|r| r.chunk_bytes);
    let mut html = format!(
        "<p>{} of {} member{}, workload <code>{}</code>; noise allowance {} %.</p>\
         <div class=\"scroll\"><table class=\"values\"><thead><tr><th>metric</th>",
        escape(&tune.level),
        tune.members.len(),
        if tune.members.len() == 1 { "" } else { "s" },
        escape(&tune.workload),
        significant(tune.noise_pct, 3)
    );
    for chunk in &tune.chunks {
        let class = if Some(chunk.chunk_bytes) == chosen {
            " class=\"rec\""
        } else {
            ""
        };
        html.push_str(&format!(
            "<th{class}>{}</th>",
            size(chunk.chunk_bytes as f64)
        ));
    }
    html.push_str("</tr></thead><tbody>");
    for metric in &tune.metrics {
        html.push_str(&format!(
            "<tr><th>{} <small>{}</small></th>",
            escape(&metric.key),
            escape(&metric.unit)
        ));
        for chunk in &tune.chunks {
            html.push_str(&value_cell(
                tune,
                metric,
                chunk,
                Some(chunk.chunk_bytes) == chosen,
            ));
        }
        html.push_str("</tr>");
    }
    html.push_str("</tbody></table></div>");
    html.push_str(&recommendation(tune));
    html
}

/// The recommendation in words.
fn recommendation(tune: &Tune) -> String {
    let Some(chosen) = &tune.recommendation else {
        return "<p class=\"note\">No chunk size recommended.</p>".to_string();
    };
    let close: Vec<String> = chosen
        .within_noise
        .iter()
        .map(|&bytes| size(bytes as f64))
        .collect();
    let close = if close.is_empty() {
        "none".to_string()
    } else {
        close.join(", ")
    };
    format!(
        "<p class=\"verdict\"><strong>Recommended chunk: {}.</strong> {}</p>\
         <p class=\"note\">Tied, within {} % of the best score: {}.</p>",
        size(chosen.chunk_bytes as f64),
        escape(&chosen.reason),
        significant(tune.noise_pct, 3),
        close
    )
}
