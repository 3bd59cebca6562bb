//! CrystalDiskMark's view: one row per test, read and write side by side,
//! as a table of big numbers and as a bar chart of MB/s.

use super::bars::{Bar, Bars};
use super::legend::{Entry, Swatch};
use super::{svg, Figure, READ, WRITE};
use crate::error::ReportError;
use crate::format::{grouped, MB};
use crate::html::escape;
use crate::model::Bench;

/// A direction's result in a row: (MB/s, IOPS).
type Cell = Option<(f64, f64)>;

/// One test row: its label and what its read and write jobs reached.
struct Row {
    label: String,
    read: Cell,
    write: Cell,
}

/// Adds a job's share to a cell.
fn add(cell: &mut Cell, mb_s: f64, iops: f64) {
    let (sum_mb_s, sum_iops) = cell.get_or_insert((0.0, 0.0));
    *sum_mb_s += mb_s;
    *sum_iops += iops;
}

/// The rows in the order their labels first appear.
fn rows(bench: &Bench) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::new();
    for job in &bench.jobs {
        let index = match rows.iter().position(|row| row.label == job.label) {
            Some(index) => index,
            None => {
                rows.push(Row {
                    label: job.label.clone(),
                    read: None,
                    write: None,
                });
                rows.len() - 1
            }
        };
        let row = &mut rows[index];
        if job.rw.reads() {
            add(&mut row.read, job.read.bw_bytes / MB, job.read.iops);
        }
        if job.rw.writes() {
            add(&mut row.write, job.write.bw_bytes / MB, job.write.iops);
        }
    }
    rows
}

/// A table cell with `value` in `decimals` decimals, or a dash.
fn value_cell(value: Option<f64>, decimals: usize) -> String {
    match value {
        Some(value) => format!("<td>{}</td>", grouped(value, decimals)),
        None => "<td class=\"none\">&mdash;</td>".to_string(),
    }
}

/// The row label in CrystalDiskMark's two lines: `SEQ1M` over `Q8T1`.
fn label_cell(label: &str) -> String {
    match label.split_once(' ') {
        Some((test, queue)) => format!("<th>{}<small>{}</small></th>", escape(test), escape(queue)),
        None => format!("<th>{}</th>", escape(label)),
    }
}

/// The CrystalDiskMark-style table of `bench` (also used for AS SSD's
/// rows, with its score when the file has one).
pub(crate) fn table(bench: &Bench) -> Figure {
    let mut html = String::from(
        "<div class=\"scroll\"><table class=\"cdm\"><thead><tr><th></th>\
         <th>Read <small>MB/s</small></th><th>Write <small>MB/s</small></th>\
         <th>Read <small>IOPS</small></th><th>Write <small>IOPS</small></th>\
         </tr></thead><tbody>",
    );
    for row in rows(bench) {
        html.push_str("<tr>");
        html.push_str(&label_cell(&row.label));
        html.push_str(&value_cell(row.read.map(|c| c.0), 2));
        html.push_str(&value_cell(row.write.map(|c| c.0), 2));
        html.push_str(&value_cell(row.read.map(|c| c.1), 0));
        html.push_str(&value_cell(row.write.map(|c| c.1), 0));
        html.push_str("</tr>");
    }
    if let Some(score) = bench.as_ssd_score {
        html.push_str(&format!(
            "<tr class=\"score\"><th>Score</th><td>{}</td><td>{}</td>\
             <td colspan=\"2\">total {}</td></tr>",
            grouped(score.read, 0),
            grouped(score.write, 0),
            grouped(score.total, 0)
        ));
    }
    html.push_str("</tbody></table></div>");
    Figure {
        heading: "Results, read and write per test".to_string(),
        chart: None,
        body: html,
    }
}

/// The bar chart of MB/s per row, read and write.
pub(crate) fn chart(file: &str, bench: &Bench) -> Result<Figure, ReportError> {
    let rows = rows(bench);
    let labels: Vec<String> = rows.iter().map(|row| row.label.clone()).collect();
    let mut bars = Vec::new();
    for (group, row) in rows.iter().enumerate() {
        for (cell, colour) in [(row.read, READ), (row.write, WRITE)] {
            if let Some((mb_s, _)) = cell {
                bars.push(Bar {
                    group,
                    value: mb_s,
                    colour,
                    text: grouped(mb_s, if mb_s < 100.0 { 1 } else { 0 }),
                });
            }
        }
    }
    let legend = [
        Entry::new("read", READ, Swatch::Box),
        Entry::new("write", WRITE, Swatch::Box),
    ];
    let chart = Bars {
        groups: &labels,
        bars: &bars,
        legend: &legend,
        axis: "MB/s (10^6 bytes per second)",
    };
    let body = svg(file, "cdm", chart.size(), |area| chart.draw(area))?;
    Ok(Figure {
        heading: "Throughput per test (MB/s)".to_string(),
        chart: Some("cdm"),
        body,
    })
}
