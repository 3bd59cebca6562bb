//! The report: what `nvraid topology` prints, as a serialisable value and as text.

use std::io::{self, Write};

use serde::Serialize;

use crate::measure::{Bottleneck, Measured};
use crate::model::format_rate;
use crate::plan::{Ceiling, Limit, Plan};
use crate::scan::{link_label, Attachment, BlockDevice, PciFunction, PciRole, Topology};

/// JSON schema identifier; bumped on incompatible changes.
pub const SCHEMA: &str = "nvraid-topology/1";

/// One `--measure` result beside its prediction.
#[derive(Debug, Clone, Serialize)]
pub struct MeasurementRow {
    pub device: String,
    pub path: String,
    pub predicted_ceiling_bytes_per_sec: Option<f64>,
    pub measured: Option<Measured>,
    pub bottleneck: Option<Bottleneck>,
    pub error: Option<String>,
}

/// Everything one run found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub schema: &'static str,
    pub topology: Topology,
    pub plan: Option<Plan>,
    pub measurements: Vec<MeasurementRow>,
    pub advice: Vec<String>,
}

impl Report {
    /// 0 when every device was read completely, 1 when some device or measurement had a problem.
    pub fn exit_code(&self) -> i32 {
        let device_problem = self.topology.devices.iter().any(|d| !d.problems.is_empty());
        let measure_problem = self.measurements.iter().any(|m| m.error.is_some());
        i32::from(device_problem || measure_problem)
    }
}

/// Writes the text form of the report.
pub fn write_text(report: &Report, out: &mut dyn Write) -> io::Result<()> {
    let topology = &report.topology;
    let cpus = topology
        .cpus_online
        .map_or(String::new(), |c| format!(", {c} CPUs online"));
    writeln!(out, "nvraid topology: {}{cpus}", topology.sysfs_root)?;
    if topology.devices.is_empty() {
        writeln!(out, "\nno block devices with data found")?;
    }
    for group in &topology.uplinks {
        let ceiling = group
            .ceiling_bytes_per_sec
            .map_or(String::new(), |c| format!(", ceiling {}", format_rate(c)));
        let shared = if group.shared { " (shared)" } else { "" };
        let assumed = if group.assumed {
            " [width assumed]"
        } else {
            ""
        };
        writeln!(out, "\n{}{shared}{ceiling}{assumed}", group.description)?;
        for name in &group.devices {
            if let Some(device) = topology.devices.iter().find(|d| &d.name == name) {
                write_device(device, out)?;
            }
        }
    }
    if !topology.idle_devices.is_empty() {
        writeln!(out, "\nidle (size 0): {}", topology.idle_devices.join(", "))?;
    }
    if let Some(plan) = &report.plan {
        write_plan(plan, out)?;
    }
    write_measurements(&report.measurements, out)?;
    if !report.advice.is_empty() {
        writeln!(out, "\nadvice:")?;
        for line in &report.advice {
            writeln!(out, "  - {line}")?;
        }
    }
    Ok(())
}

fn write_device(device: &BlockDevice, out: &mut dyn Write) -> io::Result<()> {
    let model = device.model.as_deref().unwrap_or("(no model)");
    let kind = serde_json::to_value(device.kind).unwrap_or_default();
    let kind = kind.as_str().unwrap_or("?");
    let ctrl = device
        .controller
        .as_ref()
        .map_or(String::new(), |c| format!(", {c}"));
    writeln!(out, "  {}  {model}  ({kind}{ctrl})", device.name)?;
    if !device.pci_path.is_empty() {
        writeln!(out, "      path      {}", path_text(device))?;
    }
    writeln!(out, "      link      {}", link_text(device))?;
    writeln!(out, "      placement {}", placement_text(device))?;
    writeln!(out, "      queues    {}", queue_text(device))?;
    for problem in &device.problems {
        writeln!(out, "      problem   {problem}")?;
    }
    Ok(())
}

fn path_text(device: &BlockDevice) -> String {
    let mut parts: Vec<String> = Vec::new();
    for function in &device.pci_path {
        let top = matches!(
            function.role,
            PciRole::RootPort | PciRole::IntegratedEndpoint
        );
        if top {
            parts.extend(device.root_complex.iter().cloned());
        }
        parts.push(function_text(function));
    }
    parts.join(" > ")
}

fn function_text(function: &PciFunction) -> String {
    let ids = match (function.vendor_id, function.device_id) {
        (Some(v), Some(d)) => format!(" {v:04x}:{d:04x}"),
        _ => String::new(),
    };
    let role = match function.role {
        PciRole::RootPort => " root port",
        PciRole::IntegratedEndpoint => " integrated",
        PciRole::Vmd => " VMD",
        PciRole::SwitchUpstream => " switch up",
        PciRole::SwitchDownstream => " switch down",
        PciRole::Endpoint => "",
    };
    format!("{} [{}{role}]", function.address, ids.trim_start())
}

fn link_text(device: &BlockDevice) -> String {
    let own = device.pci_path.last().and_then(|f| f.link.as_ref());
    let mut text = match own {
        Some(link) => {
            let flag = if link.below_max_speed || link.below_max_width {
                "  BELOW MAXIMUM"
            } else {
                ""
            };
            format!(
                "{} (max {}){flag}",
                link_label(link.current_gen, link.current_width_lanes),
                link_label(link.max_gen, link.max_width_lanes)
            )
        }
        None if device.sata_speed_gbps.is_some() => "SATA".to_string(),
        None => "no PCIe link".to_string(),
    };
    if let Some(gbps) = device.sata_speed_gbps {
        text = format!("{text} {gbps:.1} Gb/s");
    }
    match (device.link_ceiling_bytes_per_sec, &device.limiting_link) {
        (Some(c), Some(at)) => format!("{text}; ceiling {} at {at}", format_rate(c)),
        _ => text,
    }
}

fn placement_text(device: &BlockDevice) -> String {
    let place = match device.attachment {
        Attachment::CpuLanes => "CPU lanes".to_string(),
        Attachment::Chipset => format!(
            "behind the chipset ({})",
            device.chipset.as_deref().unwrap_or("?")
        ),
        Attachment::Integrated => "integrated on the root bus".to_string(),
        Attachment::Virtual => "virtual (no PCI)".to_string(),
        Attachment::Unknown => "unknown".to_string(),
    };
    let vmd = device
        .vmd
        .as_ref()
        .map_or(String::new(), |v| format!(", behind Intel VMD {v}"));
    let numa = device
        .numa_node
        .map_or("no NUMA node".to_string(), |n| format!("NUMA node {n}"));
    format!("{place}{vmd}, {numa}")
}

fn queue_text(device: &BlockDevice) -> String {
    let queues = device
        .hw_queues
        .map_or("bio-based (no blk-mq)".to_string(), |q| {
            format!("{q} hardware queue{}", if q == 1 { "" } else { "s" })
        });
    let blocks = match (
        device.logical_block_size_bytes,
        device.physical_block_size_bytes,
    ) {
        (Some(l), Some(p)) => format!("; blocks {l} B logical, {p} B physical"),
        _ => String::new(),
    };
    let size = device
        .size_bytes
        .map_or(String::new(), |s| format!("; {:.1} GB", s as f64 / 1e9));
    format!("{queues}{blocks}{size}")
}

fn write_plan(plan: &Plan, out: &mut dyn Write) -> io::Result<()> {
    let names: Vec<&str> = plan.members.iter().map(|m| m.name.as_str()).collect();
    writeln!(
        out,
        "\nplan: {} of {}",
        crate::plan::level_label(plan.level),
        names.join(", ")
    )?;
    writeln!(out, "  read   {}", ceiling_text(&plan.read))?;
    let note = if plan.write_rating_known {
        ""
    } else {
        " (links only: the drives' write speed is unknown and usually lower)"
    };
    writeln!(out, "  write  {}{note}", ceiling_text(&plan.write))
}

fn ceiling_text(ceiling: &Ceiling) -> String {
    let Some(total) = ceiling.bytes_per_sec else {
        return format!("unknown: {}", limit_text(&ceiling.limited_by));
    };
    let each = ceiling.per_member_bytes_per_sec.map_or(String::new(), |p| {
        format!(" ({} per drive)", format_rate(p))
    });
    format!(
        "{}{each}, limited by {}",
        format_rate(total),
        limit_text(&ceiling.limited_by)
    )
}

/// A limit in a few words.
pub fn limit_text(limit: &Limit) -> String {
    match limit {
        Limit::Link { device, link } => format!("{device}'s link {link}"),
        Limit::SharedUplink { label, members, .. } => {
            format!("{label}, shared by {members} members")
        }
        Limit::Device { device, source } => {
            let how = serde_json::to_value(source).unwrap_or_default();
            format!("the drive {device} ({})", how.as_str().unwrap_or("?"))
        }
        Limit::Unknown { device } => format!("{device} has no modelled link"),
    }
}

fn write_measurements(rows: &[MeasurementRow], out: &mut dyn Write) -> io::Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    writeln!(out, "\nmeasured (sequential read):")?;
    for row in rows {
        let predicted = row
            .predicted_ceiling_bytes_per_sec
            .map_or("no prediction".to_string(), |p| {
                format!("predicted {}", format_rate(p))
            });
        match (&row.measured, &row.error) {
            (Some(m), _) => {
                let verdict = serde_json::to_value(row.bottleneck).unwrap_or_default();
                writeln!(
                    out,
                    "  {}  {} ({:.0} IOPS, CPU {:.0}% busy{}); {predicted}: {}",
                    row.device,
                    format_rate(m.bytes_per_sec),
                    m.iops,
                    m.cpu_busy_fraction * 100.0,
                    if m.direct_io { "" } else { ", buffered" },
                    verdict.as_str().unwrap_or("?").replace('_', "-")
                )?;
            }
            (None, error) => writeln!(
                out,
                "  {}  not measured: {}",
                row.device,
                error.as_deref().unwrap_or("?")
            )?,
        }
    }
    Ok(())
}
