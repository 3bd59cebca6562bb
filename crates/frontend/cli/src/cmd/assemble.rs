//! `nvraid assemble`.

use super::detail::print_text;
use anyhow::{bail, Result};
use clap::Args;
use nvraid_array::{assemble, info, scan, ScanReport};

#[derive(Args, Debug)]
pub struct AssembleArgs {
    /// Treat the paths as places to search: files, block devices, and the
    /// entries of directories. Report every array found.
    #[arg(long)]
    scan: bool,
    /// What udev runs as each md member appears: if the configuration
    /// lists DEV's array, record DEV (in /run/nvraid, or $NVRAID_RUN_DIR)
    /// and start nvraid@NAME.service once every member is present, else arm
    /// nvraid-last-resort@NAME.timer (through systemctl, or
    /// $NVRAID_SYSTEMCTL). An array not listed: nothing done, exit 0.
    #[arg(long, value_name = "DEV", conflicts_with_all = ["scan", "json", "paths"])]
    incremental: Option<String>,
    /// With --incremental: the configuration file (default: $NVRAID_CONF,
    /// else /etc/nvraid/nvraid.conf).
    #[arg(long, value_name = "FILE", requires = "incremental")]
    config: Option<std::path::PathBuf>,
    /// With --incremental: DEV went away (udev's remove event). Its record
    /// is dropped, and the array's running daemon fails and removes it,
    /// so that its return is re-added by the bitmap.
    #[arg(long, requires = "incremental")]
    removed: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Members (or, with --scan, paths to search).
    #[arg(required_unless_present = "incremental")]
    paths: Vec<String>,
}

pub fn run(args: &AssembleArgs, direct: bool) -> Result<u8> {
    if let Some(device) = &args.incremental {
        if args.removed {
            return super::run::incremental_removed(device, args.config.as_deref());
        }
        return super::run::incremental(device, args.config.as_deref());
    }
    if !args.scan {
        let array = assemble(&args.paths, super::read_only(direct))?;
        let detail = info::detail(&array);
        if args.json {
            println!("{}", serde_json::to_string_pretty(&detail)?);
        } else {
            print_text(&detail);
        }
        return Ok(if array.is_degraded() { 3 } else { 0 });
    }
    let report = scan(&args.paths);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    if report.arrays.is_empty() {
        bail!("no md members found in {}", args.paths.join(", "));
    }
    Ok(exit_code(&report))
}

fn exit_code(report: &ScanReport) -> u8 {
    let any = |status| report.arrays.iter().any(|a| a.status == status);
    if any("not startable") {
        4
    } else if any("degraded") {
        3
    } else {
        0
    }
}

fn print_report(report: &ScanReport) {
    for array in &report.arrays {
        println!(
            "array {} name {:?} raid{} with {} members, events {}: {}{}",
            array.uuid,
            array.name,
            array.level,
            array.raid_disks,
            array.events,
            array.status,
            array
                .reason
                .as_ref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        );
        for m in &array.members {
            let role = m.role.map_or("-".into(), |r| r.to_string());
            let note = if m.state == "stale" {
                format!(" (events {} < {})", m.events, array.events)
            } else {
                String::new()
            };
            println!("  role {role:>3}  {:<9} {}{note}", m.state, m.path);
        }
    }
    for ignored in &report.ignored {
        println!("ignored {}: {}", ignored.path, ignored.reason);
    }
}
