//! The HTML page: one section per input, its figures each captioned with
//! where the numbers came from, and an inline stylesheet. Nothing on the
//! page is fetched from anywhere.

use crate::charts::{atto, cdm, heatmap, jobs, latency, stripe, topology, Figure};
use crate::error::ReportError;
use crate::format::utc;
use crate::html::escape;
use crate::input::{Content, Input};
use crate::model::{Bench, Layout, Provenance, Topology, Tune};

/// The page's stylesheet.
const STYLE: &str = include_str!("page.css");

/// Renders `inputs` as one self-contained HTML page titled `title`.
pub fn render_html(inputs: &[Input], title: &str) -> Result<String, ReportError> {
    if inputs.is_empty() {
        return Err(ReportError::NoInputs);
    }
    let mut sections = String::new();
    for (index, input) in inputs.iter().enumerate() {
        sections.push_str(&section(index, input)?);
    }
    let title = escape(title);
    Ok(format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{title}</title>\n<style>\n{STYLE}</style>\n</head>\n<body>\n<main>\n\
         <header><h1>{title}</h1><p class=\"lede\">{}</p>{}</header>\n{sections}</main>\n\
         </body>\n</html>\n",
        lede(inputs),
        contents(inputs)
    ))
}

/// The line under the title.
fn lede(inputs: &[Input]) -> String {
    let count = inputs.len();
    format!(
        "{count} nvraid result{} drawn by nvraid-report {}.",
        if count == 1 { "" } else { "s" },
        env!("CARGO_PKG_VERSION")
    )
}

/// Links to the sections, when there is more than one.
fn contents(inputs: &[Input]) -> String {
    if inputs.len() < 2 {
        return String::new();
    }
    let links: String = inputs
        .iter()
        .enumerate()
        .map(|(index, input)| {
            format!(
                "<li><a href=\"#result-{index}\">{}</a> <small>{}</small></li>",
                escape(input.name()),
                escape(&input.schema())
            )
        })
        .collect();
    format!("<nav><ol>{links}</ol></nav>")
}

/// One input's section.
fn section(index: usize, input: &Input) -> Result<String, ReportError> {
    let file = input.name();
    let caption = caption(&input.content);
    let mut html = format!(
        "<section class=\"result\" id=\"result-{index}\">\n<h2>{}</h2>\n<p class=\"meta\">{}</p>\n",
        escape(file),
        meta(input)
    );
    match &input.content {
        Content::Bench(bench) if bench.jobs.is_empty() => {
            html.push_str("<p class=\"empty\">No job results in this file: no job ran.</p>");
        }
        Content::Tune(tune) if tune.chunks.is_empty() => {
            html.push_str(
                "<p class=\"empty\">No chunk results in this file: no chunk size was measured.</p>",
            );
        }
        content => {
            for figure in figures(file, content)? {
                html.push_str(&figure_html(&figure, &caption));
            }
        }
    }
    if let Content::Bench(bench) = &input.content {
        html.push_str(&skipped(bench));
    }
    html.push_str("</section>\n");
    Ok(html)
}

/// The figures an input supports.
fn figures(file: &str, content: &Content) -> Result<Vec<Figure>, ReportError> {
    match content {
        Content::Bench(bench) => bench_figures(file, bench),
        Content::Tune(tune) => stripe::figures(file, tune),
        Content::Topology(topology) => topology::figures(file, topology),
    }
}

fn bench_figures(file: &str, bench: &Bench) -> Result<Vec<Figure>, ReportError> {
    let mut figures = match bench.layout {
        Layout::Cdm => vec![cdm::table(bench), cdm::chart(file, bench)?],
        Layout::AsSsd => vec![cdm::table(bench)],
        Layout::Atto => vec![atto::chart(file, bench)?],
        Layout::Jobs => Vec::new(),
    };
    figures.extend(heatmap::charts(file, bench)?);
    if bench.layout == Layout::Jobs {
        figures.push(jobs::table(bench));
    }
    figures.extend(latency::chart(file, bench)?);
    Ok(figures)
}

/// The steps of a bench that did not run.
fn skipped(bench: &Bench) -> String {
    if bench.skipped.is_empty() {
        return String::new();
    }
    let items: String = bench
        .skipped
        .iter()
        .map(|(label, reason)| format!("<li>{}: {}</li>", escape(label), escape(reason)))
        .collect();
    format!("<p class=\"note\">Skipped:</p><ul class=\"skipped\">{items}</ul>")
}

/// A figure: heading, body and the provenance caption.
fn figure_html(figure: &Figure, caption: &str) -> String {
    let chart = figure
        .chart
        .map_or(String::new(), |name| format!(" data-chart=\"{name}\""));
    format!(
        "<figure{chart}>\n<h3>{}</h3>\n{}\n{caption}</figure>\n",
        escape(&figure.heading),
        figure.body
    )
}

/// The line under an input's heading: schema, preset, version, time.
fn meta(input: &Input) -> String {
    let mut parts = vec![escape(&input.schema())];
    let provenance = match &input.content {
        Content::Bench(bench) => {
            if let Some(preset) = &bench.preset {
                parts.push(format!("preset {}", escape(preset)));
            }
            Some(&bench.provenance)
        }
        Content::Tune(tune) => {
            parts.push(format!("workload {}", escape(&tune.workload)));
            Some(&tune.provenance)
        }
        Content::Topology(_) => None,
    };
    if let Some(provenance) = provenance {
        if let Some(version) = &provenance.version {
            parts.push(format!("nvraid {}", escape(version)));
        }
        if let Some(time) = provenance.timestamp {
            parts.push(utc(time));
        }
    }
    parts.join(" · ")
}

/// What is not recorded in a result.
const UNRECORDED: &str = "<span class=\"unrecorded\">not recorded</span>";

/// The caption under every figure of an input: machine, subject, command.
fn caption(content: &Content) -> String {
    let lines = match content {
        Content::Bench(Bench { provenance, .. }) | Content::Tune(Tune { provenance, .. }) => {
            provenance_lines(provenance)
        }
        Content::Topology(topology) => topology_lines(topology),
    };
    let rows: String = lines
        .iter()
        .map(|(key, value)| format!("<dt>{key}</dt><dd>{value}</dd>"))
        .collect();
    format!("<figcaption><dl>{rows}</dl></figcaption>\n")
}

fn provenance_lines(provenance: &Provenance) -> Vec<(&'static str, String)> {
    let machine = provenance
        .machine
        .as_ref()
        .map_or(UNRECORDED.to_string(), |m| {
            escape(&format!(
                "{}: {} × {}, Linux {}",
                m.hostname, m.nproc, m.cpu_model, m.kernel
            ))
        });
    let text = |value: &Option<String>, wrap: fn(String) -> String| {
        value
            .as_deref()
            .map_or(UNRECORDED.to_string(), |v| wrap(escape(v)))
    };
    vec![
        ("Machine", machine),
        ("Array", text(&provenance.subject, |v| v)),
        (
            "Command",
            text(&provenance.command, |v| format!("<code>{v}</code>")),
        ),
    ]
}

fn topology_lines(topology: &Topology) -> Vec<(&'static str, String)> {
    let cpus = topology
        .cpus_online
        .map_or(String::new(), |n| format!(", {n} CPUs online"));
    let array = topology
        .plan
        .as_ref()
        .map_or("none planned".to_string(), |plan| {
            escape(&format!(
                "{} of {} (planned)",
                plan.level,
                plan.members.join(", ")
            ))
        });
    vec![
        (
            "Machine",
            format!(
                "sysfs at <code>{}</code>{cpus}",
                escape(&topology.sysfs_root)
            ),
        ),
        ("Array", array),
        ("Command", UNRECORDED.to_string()),
    ]
}
