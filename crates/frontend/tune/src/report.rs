//! A run's result as `nvraid tune` shows it: the table (a row per metric,
//! a column per chunk, the score row, the recommendation and its reason)
//! and the JSON document (schema `nvraid-tune/1`; docs/tune.md has every
//! field). Both are written to what the caller gives.

use crate::measure::Outcome;
use crate::score::{chunk_text, scores};
use crate::Plan;
use nvraid_bench::units::format_duration;
use nvraid_bench::RunContext;
use serde_json::{json, Value};
use std::io::{self, Write};

/// The `schema` of tune's JSON.
pub const SCHEMA: &str = "nvraid-tune/1";

/// The JSON document; `context` is the command line and machine of the
/// run, over [`Plan::subject`].
pub fn to_json(context: &RunContext, plan: &Plan, outcome: &Outcome) -> Value {
    let metrics: Vec<Value> = outcome
        .metrics
        .iter()
        .map(|k| json!({"key": k.key, "unit": k.unit.as_str()}))
        .collect();
    let chunks: Vec<Value> = outcome
        .runs
        .iter()
        .zip(&outcome.values)
        .map(|(run, row)| {
            let values: serde_json::Map<String, Value> = outcome
                .metrics
                .iter()
                .zip(row)
                .map(|(k, &v)| (k.key.clone(), json!(v)))
                .collect();
            json!({
                "chunk_bytes": run.chunk_bytes,
                "values": values,
                "bench": nvraid_bench::report::to_json(&run.report),
            })
        })
        .collect();
    let recommendation = &outcome.recommendation;
    json!({
        "schema": SCHEMA,
        "nvraid version": env!("CARGO_PKG_VERSION"),
        "command": context.command,
        "subject": context.subject,
        "machine": context.machine.to_json(),
        "level": plan.level_name(),
        "members": plan.request().members,
        "workload": plan.workload().name,
        "noise_pct": plan.request().noise_pct,
        "metrics": metrics,
        "chunks": chunks,
        "recommendation": {
            "chunk_bytes": recommendation.chunk_bytes,
            "reason": recommendation.reason,
            "within_noise": recommendation.within_noise,
        },
    })
}

/// The text report: a head line on what was measured and how, the table,
/// and a line for each step skipped on these members.
pub fn write_text(out: &mut dyn Write, plan: &Plan, outcome: &Outcome) -> io::Result<()> {
    let request = plan.request();
    let runs_text = match request.rounds {
        1 => format!("{} per step", format_duration(request.runtime)),
        n => format!(
            "best of {n} runs of {} per step",
            format_duration(request.runtime)
        ),
    };
    let ramp_text = match request.ramp.is_zero() {
        true => "no ramp".to_string(),
        false => format!("after a {} ramp", format_duration(request.ramp)),
    };
    let head = format!(
        "nvraid tune: {}; workload {}; {} of each array, {runs_text}, {ramp_text}",
        plan.subject(),
        plan.workload().name,
        nvraid_member::format_size(plan.region_bytes()),
    );
    write_table(out, &head, outcome)?;
    for (label, reason) in plan.skipped() {
        writeln!(out, "skipped {label}: {reason}")?;
    }
    Ok(())
}

/// A table cell: IOPS and large rates whole, small rates to a tenth.
fn value_text(value: f64) -> String {
    if value >= 1000.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

/// The table: a row per metric, a column per chunk, the best of each row
/// starred; the score row; the recommendation and its reason.
pub fn write_table(out: &mut dyn Write, head: &str, outcome: &Outcome) -> io::Result<()> {
    let Outcome {
        runs,
        metrics: keys,
        values,
        recommendation,
    } = outcome;
    let scores = scores(values);
    let label_width = keys
        .iter()
        .map(|k| k.key.len())
        .chain(["metric".len(), "score".len()])
        .max()
        .unwrap_or(6);
    let cell_width = values
        .iter()
        .flatten()
        .map(|&v| value_text(v).len() + 1)
        .chain([7])
        .max()
        .unwrap_or(7)
        + 1;
    writeln!(out, "{head}")?;
    write!(out, "{:<label_width$} {:<4}", "metric", "unit")?;
    for run in runs {
        write!(out, " {:>cell_width$}", chunk_text(run.chunk_bytes) + " ")?;
    }
    writeln!(out)?;
    for (m, metric) in keys.iter().enumerate() {
        write!(
            out,
            "{:<label_width$} {:<4}",
            metric.key,
            metric.unit.as_str()
        )?;
        let best = values.iter().map(|row| row[m]).fold(0.0, f64::max);
        for row in values {
            let star = if row[m] >= best { "*" } else { " " };
            write!(out, " {:>cell_width$}", value_text(row[m]) + star)?;
        }
        writeln!(out)?;
    }
    write!(out, "{:<label_width$} {:<4}", "score", "")?;
    let best = scores.iter().copied().fold(0.0, f64::max);
    for &score in &scores {
        let star = if score >= best { "*" } else { " " };
        write!(out, " {:>cell_width$}", format!("{score:.3}{star}"))?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "* best of the row; score: geometric mean over the rows of value / the row's best"
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "Recommended chunk: {}",
        chunk_text(recommendation.chunk_bytes)
    )?;
    writeln!(out, "Reason: {}", recommendation.reason)?;
    if !recommendation.within_noise.is_empty() {
        let names: Vec<String> = recommendation
            .within_noise
            .iter()
            .map(|&c| chunk_text(c))
            .collect();
        writeln!(out, "Within noise: {}", names.join(", "))?;
    }
    Ok(())
}
