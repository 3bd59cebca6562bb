//! A table of every job, for results laid out one line per job.

use super::Figure;
use crate::format::{grouped, significant, MB};
use crate::html::escape;
use crate::model::{Bench, Job};

/// The completion latency at percentile `p` in µs, if the job recorded it.
fn latency_us(job: &Job, p: f64) -> String {
    job.percentiles
        .iter()
        .find(|(percent, _)| (percent - p).abs() < 1e-6)
        .map_or("&mdash;".to_string(), |(_, ns)| significant(ns / 1000.0, 3))
}

/// One job's table row.
fn row(job: &Job) -> String {
    let mb_s = job.total_bw_bytes() / MB;
    format!(
        "<tr><th>{}</th><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
         <td>{}</td><td>{}</td></tr>",
        escape(&job.label),
        job.rw.as_str(),
        escape(&job.bs),
        job.iodepth,
        job.numjobs,
        grouped(mb_s, if mb_s < 100.0 { 1 } else { 0 }),
        grouped(job.total_iops(), 0),
        latency_us(job, 50.0),
        latency_us(job, 99.0)
    )
}

/// Every job's settings and results.
pub(crate) fn table(bench: &Bench) -> Figure {
    let rows: String = bench.jobs.iter().map(row).collect();
    Figure {
        heading: "Results per job".to_string(),
        chart: None,
        body: format!(
            "<div class=\"scroll\"><table class=\"plain numbers\"><thead><tr><th>job</th>\
             <th>rw</th><th>bs</th><th>queue depth</th><th>workers</th><th>MB/s</th>\
             <th>IOPS</th><th>p50 µs</th><th>p99 µs</th></tr></thead><tbody>{rows}\
             </tbody></table></div>"
        ),
    }
}
