//! nvraid-report: one self-contained HTML page from nvraid's JSON results,
//! read like the CrystalDiskMark and ATTO screenshots people compare.
//!
//! It reads the results of `nvraid bench --json` (`nvraid-bench/1`),
//! `nvraid tune --json` (`nvraid-tune/1`) and `nvraid topology --json`
//! (`nvraid-topology/1`). [`load`] and [`from_value`] check a result's
//! `schema` (a version newer than this build knows is refused, never
//! guessed) and every field the page uses; errors name the file and the
//! field. [`render_html`] draws one section per result:
//!
//! * CrystalDiskMark layout: the read/write table and a bar chart of MB/s;
//! * ATTO layout: throughput against transfer size;
//! * jobs that vary worker count and queue depth (the `sweep` presets): a
//!   heat map of IOPS;
//! * every bench: completion-latency percentiles per job;
//! * tune: each metric against chunk size, the recommendation marked;
//! * topology: devices, uplinks, their ceilings and the planned array.
//!
//! Charts are SVG drawn with plotters, inline in the page with an inline
//! stylesheet: the page fetches nothing (no fonts, scripts or images).
//! Every chart's `<figure>` carries `data-chart` (`cdm`, `atto`,
//! `heatmap`, `latency`, `stripe`, `topology`), and every figure is
//! captioned with the machine, the array and the command behind it.

mod charts;
mod error;
mod format;
mod html;
mod input;
mod json;
mod model;
mod page;

pub use error::ReportError;
pub use input::{from_value, load, Input};
pub use page::render_html;
