//! Reports: a text table, fio-style JSON and CSV.
//!
//! The JSON uses fio's field names and units wherever fio has the field
//! (`jobs[].read.iops`, `bw_bytes`, `bw` in KiB/s, `clat_ns.percentile`,
//! `usr_cpu`...); what fio lacks goes under `jobs[].nvraid`. docs/bench.md
//! lists every field and the fio fields left out.

use std::io::{self, Write};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};

use crate::hist::LatencyHistogram;
use crate::machine::RunContext;
use crate::presets::{AsSsdRates, AsSsdScore, Layout};
use crate::runner::{DirStats, JobResult};
use crate::units::{format_duration, format_size, MB_BYTES, MIB_BYTES};

/// The percentiles reported, fio's default list (`percentile_list`).
pub const PERCENTILES: [f64; 17] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95,
    99.99,
];

/// One step of a run: its label and best result, or why it was skipped.
#[derive(Clone, Debug)]
pub struct StepReport {
    /// Row label (`SEQ1M Q8T1`, `64M`...).
    pub label: String,
    /// The best of the step's runs; `None` when skipped.
    pub result: Option<JobResult>,
    /// Why the step did not run.
    pub skipped: Option<String>,
    /// How many runs the result is the best of.
    pub runs: u32,
}

/// Everything one `nvraid bench` invocation measured.
#[derive(Clone, Debug)]
pub struct BenchReport {
    /// The preset's name, or `None` for a single job from the flags.
    pub preset: Option<String>,
    /// How the text report is laid out.
    pub layout: Layout,
    /// The steps in the order they ran.
    pub steps: Vec<StepReport>,
    /// The command, the machine and what was measured.
    pub context: RunContext,
}

/// The `schema` of bench JSON: its name and format version. A reader
/// refuses a version above the one it knows.
pub const SCHEMA: &str = "nvraid-bench/1";

impl Layout {
    /// The name the JSON gives the layout.
    pub fn as_str(self) -> &'static str {
        match self {
            Layout::CrystalDiskMark => "cdm",
            Layout::Atto => "atto",
            Layout::AsSsd => "as-ssd",
            Layout::Jobs => "jobs",
        }
    }
}

impl BenchReport {
    /// Every step that ran.
    pub fn results(&self) -> impl Iterator<Item = (&str, &JobResult)> {
        self.steps.iter().filter_map(|step| {
            step.result
                .as_ref()
                .map(|result| (step.label.as_str(), result))
        })
    }

    /// The MB/s of the step labelled `label` whose job reads (`writes` =
    /// false) or writes.
    fn mb_s(&self, label: &str, writes: bool) -> Option<f64> {
        self.results()
            .find(|(l, result)| *l == label && result.spec.job_writes() == writes)
            .map(|(_, result)| result.total_bw_bytes() / MB_BYTES)
    }

    /// AS SSD's scores, when every step they need ran.
    pub fn as_ssd_score(&self) -> Option<AsSsdScore> {
        let rates = AsSsdRates {
            seq_read: self.mb_s("Seq", false)?,
            seq_write: self.mb_s("Seq", true)?,
            k4_read: self.mb_s("4K", false)?,
            k4_write: self.mb_s("4K", true)?,
            k4_64_read: self.mb_s("4K-64Thrd", false)?,
            k4_64_write: self.mb_s("4K-64Thrd", true)?,
        };
        Some(rates.score())
    }
}

/// CPU nanoseconds per I/O: (user, system).
fn cpu_ns_per_io(result: &JobResult) -> (f64, f64) {
    let ios = (result.read.ios + result.write.ios).max(1) as f64;
    (
        result.cpu.user_ns as f64 / ios,
        result.cpu.sys_ns as f64 / ios,
    )
}

/// CPU time as a percentage of the runtime (fio's `usr_cpu`, `sys_cpu`;
/// above 100 with several workers).
fn cpu_pct(cpu_ns: u64, runtime_ns: u64) -> f64 {
    if runtime_ns == 0 {
        return 0.0;
    }
    cpu_ns as f64 * 100.0 / runtime_ns as f64
}

// ---------------------------------------------------------------- JSON

/// fio's `clat_ns` object.
fn clat_json(clat: &LatencyHistogram) -> Value {
    let mut percentiles = Map::new();
    if clat.count() > 0 {
        for pct in PERCENTILES {
            percentiles.insert(format!("{pct:.6}"), json!(clat.percentile_ns(pct)));
        }
    }
    json!({
        "min": clat.min_ns(),
        "max": clat.max_ns(),
        "mean": clat.mean_ns(),
        "stddev": clat.stddev_ns(),
        "N": clat.count(),
        "percentile": percentiles,
    })
}

/// fio's `read` / `write` object.
fn dir_json(dir: &DirStats, runtime_ns: u64) -> Value {
    let runtime_ms = if dir.ios > 0 {
        runtime_ns / 1_000_000
    } else {
        0
    };
    json!({
        "io_bytes": dir.bytes,
        "io_kbytes": dir.bytes / 1024,
        "bw_bytes": dir.bw_bytes(runtime_ns).round() as u64,
        "bw": (dir.bw_bytes(runtime_ns) / 1024.0).round() as u64,
        "iops": dir.iops(runtime_ns),
        "runtime": runtime_ms,
        "total_ios": dir.ios,
        "short_ios": 0,
        "drop_ios": 0,
        "clat_ns": clat_json(&dir.clat),
    })
}

fn job_options_json(result: &JobResult) -> Value {
    let spec = &result.spec;
    let size = spec.size_bytes.map(format_size).unwrap_or_default();
    json!({
        "rw": spec.rw.as_str(),
        "bs": format_size(u64::from(spec.bs_bytes)),
        "iodepth": spec.iodepth.to_string(),
        "numjobs": spec.numjobs.to_string(),
        "runtime": format_duration(spec.runtime),
        "ramp_time": format_duration(spec.ramp),
        "time_based": "1",
        "size": size,
        "offset": spec.offset_bytes.to_string(),
        "rwmixread": spec.rwmixread_pct.to_string(),
        "direct": if spec.direct { "1" } else { "0" },
        "norandommap": "1",
        "file_service_type": "roundrobin",
    })
}

fn nvraid_json(step: &StepReport, result: &JobResult) -> Value {
    let (usr_ns_per_io, sys_ns_per_io) = cpu_ns_per_io(result);
    let threads: Vec<Value> = result
        .workers
        .iter()
        .map(|worker| {
            json!({
                "read_iops": worker.read.iops(result.runtime_ns),
                "write_iops": worker.write.iops(result.runtime_ns),
                "usr_cpu": cpu_pct(worker.cpu.user_ns, result.runtime_ns),
                "sys_cpu": cpu_pct(worker.cpu.sys_ns, result.runtime_ns),
            })
        })
        .collect();
    json!({
        "label": step.label,
        "targets": result.targets,
        "runs": step.runs,
        "iops": result.total_iops(),
        "mb_s": result.total_bw_bytes() / MB_BYTES,
        "mib_s": result.total_bw_bytes() / MIB_BYTES,
        "usr_cpu_ns_per_io": usr_ns_per_io,
        "sys_cpu_ns_per_io": sys_ns_per_io,
        "clat_ns": clat_json(&result.total_clat()),
        "threads": threads,
    })
}

fn job_json(groupid: usize, step: &StepReport, result: &JobResult) -> Value {
    let spec = &result.spec;
    json!({
        "jobname": spec.name,
        "groupid": groupid,
        "error": 0,
        "elapsed": (spec.ramp + spec.runtime).as_secs(),
        "job options": job_options_json(result),
        "read": dir_json(&result.read, result.runtime_ns),
        "write": dir_json(&result.write, result.runtime_ns),
        "job_runtime": result.runtime_ns / 1_000_000,
        "usr_cpu": cpu_pct(result.cpu.user_ns, result.runtime_ns),
        "sys_cpu": cpu_pct(result.cpu.sys_ns, result.runtime_ns),
        "nvraid": nvraid_json(step, result),
    })
}

/// The whole report as fio-style JSON.
pub fn to_json(report: &BenchReport) -> Value {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let mut jobs = Vec::new();
    let mut skipped = Vec::new();
    for step in &report.steps {
        match &step.result {
            Some(result) => jobs.push(job_json(jobs.len(), step, result)),
            None => skipped.push(json!({
                "label": step.label,
                "reason": step.skipped.clone().unwrap_or_default(),
            })),
        }
    }
    let context = &report.context;
    let mut root = json!({
        "schema": SCHEMA,
        "nvraid version": env!("CARGO_PKG_VERSION"),
        "command": context.command,
        "subject": context.subject,
        "machine": context.machine.to_json(),
        "layout": report.layout.as_str(),
        "timestamp": now.as_secs(),
        "timestamp_ms": now.as_millis() as u64,
        "preset": report.preset,
        "jobs": jobs,
        "skipped": skipped,
    });
    if let Some(score) = report.as_ssd_score() {
        root["as_ssd_score"] = json!({
            "read": score.read,
            "write": score.write,
            "total": score.total,
        });
    }
    root
}

/// Writes [`to_json`], pretty-printed, and a newline.
pub fn write_json(report: &BenchReport, out: &mut dyn Write) -> io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, &to_json(report))?;
    writeln!(out)
}

// ---------------------------------------------------------------- CSV

/// The CSV header line's fields.
pub const CSV_COLUMNS: [&str; 24] = [
    "label",
    "jobname",
    "rw",
    "bs",
    "iodepth",
    "numjobs",
    "runtime_ms",
    "direction",
    "ios",
    "io_bytes",
    "iops",
    "bw_bytes",
    "mb_s",
    "mib_s",
    "clat_min_ns",
    "clat_mean_ns",
    "clat_p50_ns",
    "clat_p90_ns",
    "clat_p99_ns",
    "clat_p99_9_ns",
    "clat_p99_99_ns",
    "clat_max_ns",
    "usr_cpu_ns_per_io",
    "sys_cpu_ns_per_io",
];

/// Quotes a CSV field when it needs it.
fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

fn csv_row(label: &str, result: &JobResult, direction: &str, dir: &DirStats) -> String {
    let spec = &result.spec;
    let runtime_ns = result.runtime_ns;
    let bw = dir.bw_bytes(runtime_ns);
    let (usr, sys) = cpu_ns_per_io(result);
    let clat = &dir.clat;
    let fields = [
        csv_field(label),
        csv_field(&spec.name),
        spec.rw.as_str().to_string(),
        spec.bs_bytes.to_string(),
        spec.iodepth.to_string(),
        spec.numjobs.to_string(),
        (runtime_ns / 1_000_000).to_string(),
        direction.to_string(),
        dir.ios.to_string(),
        dir.bytes.to_string(),
        format!("{:.1}", dir.iops(runtime_ns)),
        format!("{bw:.0}"),
        format!("{:.3}", bw / MB_BYTES),
        format!("{:.3}", bw / MIB_BYTES),
        clat.min_ns().to_string(),
        format!("{:.0}", clat.mean_ns()),
        clat.percentile_ns(50.0).to_string(),
        clat.percentile_ns(90.0).to_string(),
        clat.percentile_ns(99.0).to_string(),
        clat.percentile_ns(99.9).to_string(),
        clat.percentile_ns(99.99).to_string(),
        clat.max_ns().to_string(),
        format!("{usr:.0}"),
        format!("{sys:.0}"),
    ];
    fields.join(",")
}

/// One header line, then a row per job and direction that moved data.
pub fn write_csv(report: &BenchReport, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out, "{}", CSV_COLUMNS.join(","))?;
    for (label, result) in report.results() {
        let mut wrote = false;
        for (direction, dir) in [("read", &result.read), ("write", &result.write)] {
            if dir.ios > 0 || (!wrote && direction == "write") {
                writeln!(out, "{}", csv_row(label, result, direction, dir))?;
                wrote = true;
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- text

/// Writes the report as text in the preset's layout.
pub fn write_text(report: &BenchReport, out: &mut dyn Write) -> io::Result<()> {
    match report.layout {
        Layout::CrystalDiskMark => write_cdm(report, out)?,
        Layout::Atto => write_atto(report, out)?,
        Layout::AsSsd => write_as_ssd(report, out)?,
        Layout::Jobs => write_jobs(report, out)?,
    }
    write_footer(report, out)
}

fn write_footer(report: &BenchReport, out: &mut dyn Write) -> io::Result<()> {
    for step in &report.steps {
        if let Some(reason) = &step.skipped {
            writeln!(out, "skipped {}: {reason}", step.label)?;
        }
    }
    let Some((_, first)) = report.results().next() else {
        return Ok(());
    };
    let runs = report.steps.iter().map(|s| s.runs).max().unwrap_or(1);
    let size = first
        .spec
        .size_bytes
        .map_or("whole target".to_string(), |bytes| {
            let short = format_size(bytes);
            match short.ends_with(char::is_alphabetic) {
                true => short + "iB",
                false => short + " bytes",
            }
        });
    writeln!(out)?;
    writeln!(
        out,
        "* MB/s = 1,000,000 bytes/s, MiB/s = 1,048,576 bytes/s; latency is completion latency"
    )?;
    writeln!(
        out,
        "Preset: {}  Test: {size} (x{runs})  Measure: {}  Target: {}",
        report.preset.as_deref().unwrap_or("-"),
        format_duration(first.spec.runtime),
        first.targets.join(", ")
    )
}

/// `<label>: <MB/s> [<IOPS>] <mean latency us>` for one result.
fn cdm_line(label: &str, result: &JobResult) -> String {
    let mean_us = result.total_clat().mean_ns() / 1000.0;
    format!(
        "  {label:<14} {:>10.3} MB/s [{:>10.1} IOPS] <{:>10.2} us>",
        result.total_bw_bytes() / MB_BYTES,
        result.total_iops(),
        mean_us
    )
}

fn write_cdm(report: &BenchReport, out: &mut dyn Write) -> io::Result<()> {
    for (title, writes) in [("[Read]", false), ("[Write]", true)] {
        writeln!(out, "{title}")?;
        for (label, result) in report.results() {
            if result.spec.job_writes() == writes {
                writeln!(out, "{}", cdm_line(label, result))?;
            }
        }
    }
    Ok(())
}

fn write_atto(report: &BenchReport, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "{:>6} {:>12} {:>12} {:>12} {:>12}",
        "Size", "Write MB/s", "Read MB/s", "Write IO/s", "Read IO/s"
    )?;
    let mut labels: Vec<&str> = report.results().map(|(label, _)| label).collect();
    labels.dedup();
    for label in labels {
        let find = |writes: bool| {
            report
                .results()
                .find(|(l, r)| *l == label && r.spec.job_writes() == writes)
                .map(|(_, r)| r)
        };
        let cell = |result: Option<&JobResult>, value: fn(&JobResult) -> f64| {
            result.map_or("-".to_string(), |r| format!("{:.2}", value(r)))
        };
        let (write, read) = (find(true), find(false));
        let mb_s = |r: &JobResult| r.total_bw_bytes() / MB_BYTES;
        let iops = |r: &JobResult| r.total_iops();
        writeln!(
            out,
            "{label:>6} {:>12} {:>12} {:>12} {:>12}",
            cell(write, mb_s),
            cell(read, mb_s),
            cell(write, iops),
            cell(read, iops)
        )?;
    }
    Ok(())
}

fn write_as_ssd(report: &BenchReport, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out, "{:<10} {:>14} {:>14}", "", "Read", "Write")?;
    for label in ["Seq", "4K", "4K-64Thrd", "Acc.time"] {
        let cell = |writes: bool| {
            let found = report
                .results()
                .find(|(l, r)| *l == label && r.spec.job_writes() == writes);
            match found {
                None => "-".to_string(),
                Some((_, r)) if label == "Acc.time" => {
                    format!("{:.3} ms", r.total_clat().mean_ns() / 1e6)
                }
                Some((_, r)) => format!("{:.2} MB/s", r.total_bw_bytes() / MB_BYTES),
            }
        };
        writeln!(out, "{label:<10} {:>14} {:>14}", cell(false), cell(true))?;
    }
    if let Some(score) = report.as_ssd_score() {
        writeln!(
            out,
            "{:<10} {:>14} {:>14}",
            "Score", score.read, score.write
        )?;
        writeln!(out, "{:<10} {:>14}", "Total", score.total)?;
    }
    Ok(())
}

fn write_dir(out: &mut dyn Write, name: &str, dir: &DirStats, runtime_ns: u64) -> io::Result<()> {
    let bw = dir.bw_bytes(runtime_ns);
    writeln!(
        out,
        "  {name}: IOPS={:.1}, BW={:.1}MiB/s ({:.1}MB/s), {} bytes in {:.3}s",
        dir.iops(runtime_ns),
        bw / MIB_BYTES,
        bw / MB_BYTES,
        dir.bytes,
        runtime_ns as f64 / 1e9
    )?;
    let clat = &dir.clat;
    writeln!(
        out,
        "    clat (ns): min={}, max={}, avg={:.1}, stdev={:.1}",
        clat.min_ns(),
        clat.max_ns(),
        clat.mean_ns(),
        clat.stddev_ns()
    )?;
    let list: Vec<String> = [50.0, 90.0, 99.0, 99.9, 99.99]
        .iter()
        .map(|&pct| format!("p{pct}={}", clat.percentile_ns(pct)))
        .collect();
    writeln!(out, "    clat percentiles (ns): {}", list.join(", "))
}

fn write_job(out: &mut dyn Write, label: &str, result: &JobResult) -> io::Result<()> {
    writeln!(out, "{label}: {}", result.spec.summary())?;
    for (name, dir) in [("read", &result.read), ("write", &result.write)] {
        if dir.ios > 0 {
            write_dir(out, name, dir, result.runtime_ns)?;
        }
    }
    let (usr, sys) = cpu_ns_per_io(result);
    writeln!(
        out,
        "  cpu: usr={:.1}%, sys={:.1}%, {usr:.0} ns usr + {sys:.0} ns sys per I/O",
        cpu_pct(result.cpu.user_ns, result.runtime_ns),
        cpu_pct(result.cpu.sys_ns, result.runtime_ns)
    )?;
    if result.workers.len() > 1 {
        let per_thread: Vec<String> = result
            .workers
            .iter()
            .map(|w| {
                format!(
                    "{:.0}",
                    w.read.iops(result.runtime_ns) + w.write.iops(result.runtime_ns)
                )
            })
            .collect();
        writeln!(out, "  IOPS per thread: {}", per_thread.join(" "))?;
    }
    Ok(())
}

fn write_jobs(report: &BenchReport, out: &mut dyn Write) -> io::Result<()> {
    for (label, result) in report.results() {
        write_job(out, label, result)?;
    }
    Ok(())
}
