//! `nvraid examine`.

use super::{bytes_text, time_text};
use anyhow::Result;
use clap::Args;
use nvraid_array::{info, read_superblock};
use nvraid_member::{Member, OpenOptions};
use nvraid_metadata::format_uuid;

#[derive(Args, Debug)]
pub struct ExamineArgs {
    /// Print JSON: one object per member, in a list.
    #[arg(long)]
    json: bool,
    /// Members to examine.
    #[arg(required = true)]
    members: Vec<String>,
}

pub fn run(args: &ExamineArgs) -> Result<u8> {
    let mut reports = Vec::new();
    for spec in &args.members {
        let member = Member::open(
            spec,
            OpenOptions {
                write: false,
                create_bytes: None,
                direct: false,
                ..Default::default()
            },
        )?;
        let sb = read_superblock(&member)?;
        reports.push(info::examine(spec, &sb));
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    } else {
        for report in &reports {
            print_text(report);
        }
    }
    Ok(0)
}

fn print_text(r: &info::Examine) {
    let sb = &r.superblock;
    println!("{}:", r.path);
    println!("          Magic : a92b4efc");
    println!("        Version : {}", r.version);
    let features = nvraid_metadata::features::names(sb.feature_map);
    if features.is_empty() {
        println!("    Feature Map : {:#x}", sb.feature_map);
    } else {
        println!(
            "    Feature Map : {:#x} ({})",
            sb.feature_map,
            features.join(", ")
        );
    }
    println!("     Array UUID : {}", format_uuid(&sb.set_uuid));
    println!("           Name : {}", sb.name());
    println!("  Creation Time : {}", time_text(sb.ctime.seconds));
    println!("     Raid Level : raid{}", sb.level);
    println!("   Raid Devices : {}", sb.raid_disks);
    println!(" Avail Dev Size : {} sectors", sb.data_size_sectors);
    if let Some(size) = r.array_size_bytes {
        println!("     Array Size : {}", bytes_text(size));
    }
    println!("    Data Offset : {} sectors", sb.data_offset_sectors);
    println!("   Super Offset : {} sectors", sb.super_offset_sectors);
    if sb.feature_map & nvraid_metadata::features::RECOVERY_OFFSET != 0 {
        println!("Recovery Offset : {} sectors", sb.recovery_offset);
    }
    if sb.resync_offset != nvraid_metadata::RESYNC_CLEAN {
        println!("  Resync Offset : {} sectors", sb.resync_offset);
    }
    if sb.feature_map & nvraid_metadata::features::NEW_OFFSET != 0 {
        println!(
            "     New Offset : {} sectors",
            sb.data_offset_sectors as i64 + i64::from(sb.new_offset as i32)
        );
    }
    println!("          State : {}", r.state);
    println!("    Device UUID : {}", format_uuid(&sb.device_uuid));
    if sb.feature_map & nvraid_metadata::features::RESHAPE_ACTIVE != 0 {
        let delta = sb.delta_disks as i32;
        let old = i64::from(sb.raid_disks) - i64::from(delta);
        println!(
            "  Reshape Pos'n : {} sectors ({})",
            sb.reshape_position,
            bytes_text(sb.reshape_position.saturating_mul(512))
        );
        println!("  Delta Devices : {delta} ({old}->{})", sb.raid_disks);
        if sb.new_level as i32 != sb.level {
            println!("      New Level : raid{}", sb.new_level as i32);
        }
        if sb.new_layout != sb.layout {
            println!("     New Layout : {:#x}", sb.new_layout);
        }
        if sb.new_chunk != sb.chunk_sectors {
            println!("      New Chunk : {}K", sb.new_chunk / 2);
        }
    }
    println!("    Update Time : {}", time_text(sb.utime.seconds));
    println!("       Checksum : {} - correct", r.checksum);
    println!("         Events : {}", sb.events);
    if let Some(layout) = &r.layout_text {
        println!("         Layout : {layout}");
    }
    if sb.chunk_sectors > 0 {
        println!("     Chunk Size : {}K", sb.chunk_sectors / 2);
    }
    println!("    Device Role : {}", r.role);
    let table: Vec<String> = r
        .role_table
        .iter()
        .map(|e| match e.slot {
            Some(n) => format!("{}:{n}", e.device),
            None => format!("{}:{}", e.device, e.role),
        })
        .collect();
    println!("     Role Table : {}", table.join(" "));
    println!();
}
