//! The `nvraid topology` command: flags and the function the binary calls.
//!
//! Exit codes: 0 = report printed and every device read completely; 1 = report printed, but
//! some device or measurement had a problem (each is listed with its reason); an `Err` from
//! [`run`] is exit code 2 ([`Error::exit_code`]): not a sysfs tree, unknown device, bad flags,
//! or the report could not be written.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use crate::advice::{plan_advice, topology_advice};
use crate::error::Error;
use crate::measure::{classify, DirectReadMeasurer, Measurer};
use crate::model::{known_drive_rating, DriveRating, RatingSource};
use crate::plan::{members_from_topology, parse_level, plan, plan_members, Level};
use crate::report::{write_text, MeasurementRow, Report, SCHEMA};
use crate::scan::{scan, Topology};

/// Read the PCIe tree and say where an array's ceiling is, and why.
#[derive(clap::Args, Debug, Clone)]
pub struct TopologyArgs {
    /// Root of the sysfs tree to read: /sys, or a copy or fixture of it.
    #[arg(long, value_name = "DIR", default_value = "/sys")]
    pub sysfs_root: PathBuf,

    /// Print the report as JSON (schema "nvraid-topology/1", see docs/topology.md).
    #[arg(long)]
    pub json: bool,

    /// Plan an array of the DEVs: sequential read and write ceiling, what limits it, advice.
    #[arg(long, requires = "devices")]
    pub plan: bool,

    /// RAID level the plan assumes: 0, 1, 10, 4, 5 or 6.
    #[arg(long, value_parser = parse_level, default_value = "0")]
    pub level: Level,

    /// Read each device (the DEVs, or all) sequentially for a few seconds, read-only, and put
    /// the result beside its predicted ceiling: link-, device- or CPU-limited.
    #[arg(long)]
    pub measure: bool,

    /// Seconds each device is read for by --measure.
    #[arg(long, value_name = "SECS", default_value_t = 3)]
    pub measure_secs: u64,

    /// Directory --measure opens devices in (DIR/NAME).
    #[arg(long, value_name = "DIR", default_value = "/dev")]
    pub dev_dir: PathBuf,

    /// Block devices (nvme0n1 or /dev/nvme0n1) to report on, measure or plan; all when omitted.
    /// With --plan, NBD members (nbd://HOST/EXPORT) and NVMe/TCP members
    /// (nvme+tcp://HOST/NQN) too: their ceiling is their network link's.
    #[arg(value_name = "DEV")]
    pub devices: Vec<String>,
}

/// Runs the command, writing the report to `out`; returns the exit code (0 or 1, see the
/// module doc). `measurer` is used by `--measure`; `None` uses [`DirectReadMeasurer`].
pub fn run(
    args: &TopologyArgs,
    measurer: Option<&dyn Measurer>,
    out: &mut dyn Write,
) -> Result<i32, Error> {
    let mut topology = scan(&args.sysfs_root)?;
    // NBD and NVMe/TCP members are planned by their network link
    // (network.rs).
    let (remote, local): (Vec<String>, Vec<String>) = args
        .devices
        .iter()
        .cloned()
        .partition(|d| nvraid_remote::is_nbd_uri(d) || nvraid_remote::is_nvme_uri(d));
    if !remote.is_empty() && !args.plan {
        return Err(Error::Usage(
            "NBD and NVMe/TCP members (nbd://..., nvme+tcp://...) can only be planned: add --plan"
                .into(),
        ));
    }
    let names = if local.is_empty() && !remote.is_empty() {
        Vec::new()
    } else {
        selected_names(&topology, &local)?
    };
    if !args.devices.is_empty() && !args.plan {
        keep_only(&mut topology, &names);
    }
    let fallback = DirectReadMeasurer::default();
    let measurer = measurer.unwrap_or(&fallback);
    let measurements = if args.measure {
        measure_all(&topology, &names, measurer, args)
    } else {
        Vec::new()
    };
    let plan = if args.plan && remote.is_empty() {
        let ratings = measured_ratings(&topology, &measurements);
        Some(plan(&topology, &names, args.level, &ratings)?)
    } else if args.plan {
        let ratings = measured_ratings(&topology, &measurements);
        let mut members = members_from_topology(&topology, &names, &ratings)?;
        members.extend(crate::network::remote_members(&remote)?);
        Some(plan_members(args.level, members)?)
    } else {
        None
    };
    let mut advice = plan
        .as_ref()
        .map_or(Vec::new(), |p| plan_advice(&topology, p));
    for line in topology_advice(&topology) {
        if !advice.contains(&line) {
            advice.push(line);
        }
    }
    let report = Report {
        schema: SCHEMA,
        topology,
        plan,
        measurements,
        advice,
    };
    if args.json {
        serde_json::to_writer_pretty(&mut *out, &report)?;
        writeln!(out)?;
    } else {
        write_text(&report, out)?;
    }
    Ok(report.exit_code())
}

/// The DEVs without "/dev/", checked against the tree; every device when none were named.
fn selected_names(topology: &Topology, devices: &[String]) -> Result<Vec<String>, Error> {
    if devices.is_empty() {
        return Ok(topology.devices.iter().map(|d| d.name.clone()).collect());
    }
    devices
        .iter()
        .map(|raw| {
            let name = raw.strip_prefix("/dev/").unwrap_or(raw);
            let known = topology.devices.iter().any(|d| d.name == name);
            known
                .then(|| name.to_string())
                .ok_or_else(|| Error::UnknownDevice(raw.clone()))
        })
        .collect()
}

fn keep_only(topology: &mut Topology, names: &[String]) {
    topology.devices.retain(|d| names.contains(&d.name));
    for group in &mut topology.uplinks {
        group.devices.retain(|d| names.contains(d));
    }
    topology.uplinks.retain(|g| !g.devices.is_empty());
}

fn measure_all(
    topology: &Topology,
    names: &[String],
    measurer: &dyn Measurer,
    args: &TopologyArgs,
) -> Vec<MeasurementRow> {
    let duration = Duration::from_secs(args.measure_secs.max(1));
    names
        .iter()
        .filter_map(|name| topology.devices.iter().find(|d| &d.name == name))
        .map(|device| {
            let path = args.dev_dir.join(&device.name);
            let predicted = device.link_ceiling_bytes_per_sec;
            let result = measurer.seq_read(&path, duration);
            let (measured, error) = match result {
                Ok(m) => (Some(m), None),
                Err(e) => (None, Some(format!("{}: {e}", path.display()))),
            };
            MeasurementRow {
                device: device.name.clone(),
                path: path.display().to_string(),
                predicted_ceiling_bytes_per_sec: predicted,
                bottleneck: measured.as_ref().map(|m| classify(m, predicted)),
                measured,
                error,
            }
        })
        .collect()
}

/// Measured read speeds as drive ratings for the planner, keeping SEEDS write ratings.
fn measured_ratings(topology: &Topology, rows: &[MeasurementRow]) -> BTreeMap<String, DriveRating> {
    rows.iter()
        .filter_map(|row| {
            let measured = row.measured?;
            let seeds_write = topology
                .devices
                .iter()
                .find(|d| d.name == row.device)
                .and_then(|d| d.model.as_deref())
                .and_then(known_drive_rating)
                .and_then(|r| r.write_bytes_per_sec);
            let rating = DriveRating {
                read_bytes_per_sec: measured.bytes_per_sec,
                write_bytes_per_sec: seeds_write,
                source: RatingSource::Measured,
            };
            Some((row.device.clone(), rating))
        })
        .collect()
}
