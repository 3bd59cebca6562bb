//! `nvraid topology`: the devices and the links they sit behind, a bar
//! chart of the known ceilings, and the plan of an array when there is one.

use super::bars::{Bar, Bars};
use super::legend::{Entry, Swatch};
use super::{series_colour, svg, Figure};
use crate::error::ReportError;
use crate::format::rate;
use crate::html::escape;
use crate::model::{Ceiling, Device, Measurement, Plan, Topology, Uplink};

/// Every figure of a topology result.
pub(crate) fn figures(file: &str, topology: &Topology) -> Result<Vec<Figure>, ReportError> {
    let mut figures = vec![devices(topology), uplinks(topology)];
    if let Some(chart) = chart(file, topology)? {
        figures.push(chart);
    }
    if let Some(plan) = &topology.plan {
        figures.push(plan_figure(plan));
    }
    if !topology.measurements.is_empty() {
        figures.push(measurements(&topology.measurements));
    }
    Ok(figures)
}

/// A table with `header` cells and `rows` of already escaped cells.
fn table(header: &[&str], rows: impl Iterator<Item = Vec<String>>) -> String {
    let mut html = String::from("<div class=\"scroll\"><table class=\"plain\"><thead><tr>");
    for cell in header {
        html.push_str(&format!("<th>{cell}</th>"));
    }
    html.push_str("</tr></thead><tbody>");
    for row in rows {
        html.push_str("<tr>");
        for cell in row {
            html.push_str(&format!("<td>{cell}</td>"));
        }
        html.push_str("</tr>");
    }
    html.push_str("</tbody></table></div>");
    html
}

/// An optional rate, or a dash.
fn maybe_rate(value: Option<f64>) -> String {
    value.map_or("&mdash;".to_string(), rate)
}

/// "cpu_lanes" as "CPU lanes", a chipset with its name.
fn attachment(device: &Device) -> String {
    let place = match device.attachment.as_str() {
        "cpu_lanes" => "CPU lanes".to_string(),
        "chipset" => format!(
            "chipset ({})",
            device.chipset.as_deref().unwrap_or("unknown")
        ),
        other => other.replace('_', " "),
    };
    escape(&place)
}

/// The label of the uplink whose id is `id`.
fn uplink_label<'a>(topology: &'a Topology, id: &'a str) -> &'a str {
    topology
        .uplinks
        .iter()
        .find(|uplink| uplink.id == id)
        .map_or(id, |uplink| uplink.label.as_str())
}

/// The devices table, with the idle devices and the advice under it.
fn devices(topology: &Topology) -> Figure {
    let any_problems = topology.devices.iter().any(|d| !d.problems.is_empty());
    let rows = topology.devices.iter().map(|device| {
        let ceiling = match (&device.link_ceiling, &device.limiting_link) {
            (Some(c), Some(at)) => format!("{} <small>at {}</small>", rate(*c), escape(at)),
            (c, _) => maybe_rate(*c),
        };
        let mut cells = vec![
            format!("<code>{}</code>", escape(&device.name)),
            escape(&device.kind),
            escape(device.model.as_deref().unwrap_or("")),
            attachment(device),
            ceiling,
            escape(uplink_label(topology, &device.uplink)),
        ];
        if any_problems {
            cells.push(escape(&device.problems.join("; ")));
        }
        cells
    });
    let mut header = vec![
        "device",
        "kind",
        "model",
        "attachment",
        "link ceiling",
        "uplink",
    ];
    if any_problems {
        header.push("problems");
    }
    let mut body = table(&header, rows);
    if topology.devices.is_empty() {
        body = "<p class=\"empty\">No block devices with data found.</p>".to_string();
    }
    if !topology.idle_devices.is_empty() {
        body.push_str(&format!(
            "<p class=\"note\">Idle (size 0): {}.</p>",
            escape(&topology.idle_devices.join(", "))
        ));
    }
    if !topology.advice.is_empty() {
        body.push_str("<p class=\"note\">Advice:</p><ul class=\"advice\">");
        for line in &topology.advice {
            body.push_str(&format!("<li>{}</li>", escape(line)));
        }
        body.push_str("</ul>");
    }
    Figure {
        heading: "Block devices".to_string(),
        chart: None,
        body,
    }
}

/// The uplinks table.
fn uplinks(topology: &Topology) -> Figure {
    let rows = topology.uplinks.iter().map(|uplink: &Uplink| {
        let ceiling = maybe_rate(uplink.ceiling)
            + if uplink.assumed {
                " <small>(width assumed)</small>"
            } else {
                ""
            };
        vec![
            escape(&uplink.label),
            escape(&uplink.kind.replace('_', " ")),
            if uplink.shared { "shared" } else { "own" }.to_string(),
            ceiling,
            escape(&uplink.devices.join(", ")),
            escape(&uplink.description),
        ]
    });
    let header = [
        "uplink",
        "kind",
        "bandwidth",
        "ceiling",
        "devices",
        "description",
    ];
    Figure {
        heading: "Uplinks (devices grouped by the link they share)".to_string(),
        chart: None,
        body: table(&header, rows),
    }
}

/// Bars of every known ceiling: shared uplinks, devices' own links and
/// the plan's array; `None` when no ceiling is known.
fn chart(file: &str, topology: &Topology) -> Result<Option<Figure>, ReportError> {
    let (uplink_colour, link_colour, array_colour) =
        (series_colour(1), series_colour(0), series_colour(2));
    let mut groups = Vec::new();
    let mut bars = Vec::new();
    let mut add = |label: String, bytes_per_sec: f64, colour| {
        bars.push(Bar {
            group: groups.len(),
            value: bytes_per_sec / 1e9,
            colour,
            text: rate(bytes_per_sec),
        });
        groups.push(label);
    };
    for uplink in &topology.uplinks {
        if let Some(ceiling) = uplink.ceiling {
            add(format!("{} (shared)", uplink.label), ceiling, uplink_colour);
        }
    }
    for device in &topology.devices {
        if let Some(ceiling) = device.link_ceiling {
            add(device.name.clone(), ceiling, link_colour);
        }
    }
    if let Some(plan) = &topology.plan {
        for (direction, ceiling) in [("read", &plan.read), ("write", &plan.write)] {
            if let Some(total) = ceiling.bytes_per_sec {
                add(format!("{} {direction}", plan.level), total, array_colour);
            }
        }
    }
    if bars.is_empty() {
        return Ok(None);
    }
    let legend: Vec<Entry> = [
        ("shared uplink", uplink_colour),
        ("device's own link", link_colour),
        ("planned array", array_colour),
    ]
    .into_iter()
    .filter(|(_, colour)| bars.iter().any(|bar| bar.colour == *colour))
    .map(|(label, colour)| Entry::new(label, colour, Swatch::Box))
    .collect();
    let chart = Bars {
        groups: &groups,
        bars: &bars,
        legend: &legend,
        axis: "ceiling, GB/s (10^9 bytes per second)",
    };
    let body = svg(file, "topology", chart.size(), |area| chart.draw(area))?;
    Ok(Some(Figure {
        heading: "Bandwidth ceilings".to_string(),
        chart: Some("topology"),
        body,
    }))
}

/// One direction of the plan in words.
fn ceiling_text(ceiling: &Ceiling) -> String {
    match ceiling.bytes_per_sec {
        Some(total) => {
            let each = ceiling
                .per_member
                .map_or(String::new(), |p| format!(" ({} per member)", rate(p)));
            format!(
                "<strong>{}</strong>{each}, limited by {}",
                rate(total),
                escape(&ceiling.limited_by)
            )
        }
        None => escape(&ceiling.limited_by),
    }
}

/// The planned array's predicted read and write ceilings.
fn plan_figure(plan: &Plan) -> Figure {
    let write_note = if plan.write_rating_known {
        ""
    } else {
        " <small>(links only: the drives' write speed is unknown and usually lower)</small>"
    };
    let body = format!(
        "<p>{} of {}</p><ul class=\"plan\"><li>read: {}</li><li>write: {}{write_note}</li></ul>",
        escape(&plan.level),
        escape(&plan.members.join(", ")),
        ceiling_text(&plan.read),
        ceiling_text(&plan.write)
    );
    Figure {
        heading: "Planned array: predicted sequential ceiling".to_string(),
        chart: None,
        body,
    }
}

/// Measured reads beside their predictions.
fn measurements(rows: &[Measurement]) -> Figure {
    let rows = rows.iter().map(|row| {
        vec![
            format!("<code>{}</code>", escape(&row.device)),
            maybe_rate(row.predicted),
            maybe_rate(row.measured),
            escape(&row.bottleneck.as_deref().unwrap_or("").replace('_', " ")),
            escape(row.error.as_deref().unwrap_or("")),
        ]
    });
    Figure {
        heading: "Measured sequential reads".to_string(),
        chart: None,
        body: table(
            &["device", "predicted", "measured", "verdict", "error"],
            rows,
        ),
    }
}
