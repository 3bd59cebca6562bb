//! `nvraid detail`.

use super::{bytes_text, time_text};
use anyhow::Result;
use clap::Args;
use nvraid_array::reshape::{MidReshape, ReshapeDetail, ShapeDetail};
use nvraid_array::{assemble, info};

#[derive(Args, Debug)]
pub struct DetailArgs {
    /// Print JSON (fields documented in docs/cli.md).
    #[arg(long)]
    json: bool,
    /// Members of the array, in any order.
    #[arg(required = true)]
    members: Vec<String>,
}

pub fn run(args: &DetailArgs, direct: bool) -> Result<u8> {
    if let Some(mid) = MidReshape::open(&args.members, direct)? {
        let detail = mid.detail();
        if args.json {
            println!("{}", serde_json::to_string_pretty(&detail)?);
        } else {
            print_reshape(&detail);
        }
        return Ok(0);
    }
    let array = assemble(&args.members, super::read_only(direct))?;
    let detail = info::detail(&array);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&detail)?);
    } else {
        print_text(&detail);
    }
    Ok(0)
}

pub fn print_text(d: &info::ArrayDetail) {
    println!("          UUID : {}", d.uuid);
    println!("          Name : {}", d.name);
    println!("    Raid Level : {}", d.level_name());
    if let Some(layout) = &d.layout {
        println!("        Layout : {layout}");
    }
    if let Some(chunk) = d.chunk_bytes {
        println!("    Chunk Size : {}", bytes_text(chunk));
    }
    println!("    Array Size : {}", bytes_text(d.size_bytes));
    println!("   Sector Size : {}", d.sector_bytes);
    println!("  Raid Devices : {}", d.raid_disks);
    println!("         State : {}", d.state);
    println!("        Events : {}", d.events);
    println!(" Creation Time : {}", time_text(d.creation_time));
    println!("   Update Time : {}", time_text(d.update_time));
    println!("   Data Offset : {}", bytes_text(d.data_offset_bytes));
    if d.level >= 4 || d.consistency_policy == "ppl" {
        println!("   Consistency : {}", d.consistency_policy);
    }
    if let Some(b) = &d.bitmap {
        println!(
            "        Bitmap : internal, {} chunks, {} of {} dirty",
            bytes_text(b.chunk_bytes),
            b.dirty_chunks,
            b.chunks
        );
    }
    if let Some(from) = d.resync_from_bytes {
        println!(
            "   Resync From : {} ({:.1}% in sync; `nvraid repair`, or `serve`, resyncs the rest)",
            bytes_text(from),
            100.0 * from as f64 / d.size_bytes.max(1) as f64
        );
    }
    println!();
    println!(
        "  {:>4}  {:<10}  {:>8}  {:<6}  path",
        "role", "state", "events", "direct"
    );
    for m in &d.members {
        let role = m.role.map_or("-".into(), |r| r.to_string());
        let events = m.events.map_or("-".into(), |e| e.to_string());
        let direct = m.direct_io.map_or("-", |d| if d { "yes" } else { "no" });
        println!(
            "  {role:>4}  {:<10}  {events:>8}  {direct:<6}  {}{}",
            m.state,
            m.path.as_deref().unwrap_or("(missing)"),
            member_notes(m)
        );
    }
}

/// One shape of a reshape, as `raid5 (left-symmetric), 64 KiB chunks, 4
/// members, 45.0 MiB`.
fn shape_text(s: &ShapeDetail) -> String {
    let mut text = s.level.clone();
    if let Some(layout) = &s.layout {
        text += &format!(" ({layout})");
    }
    if let Some(chunk) = s.chunk_bytes {
        text += &format!(", {} chunks", bytes_text(chunk));
    }
    format!(
        "{text}, {} members, {}",
        s.raid_disks,
        bytes_text(s.size_bytes)
    )
}

/// `detail` of an array part-way through a reshape.
fn print_reshape(d: &ReshapeDetail) {
    println!("          UUID : {}", d.uuid);
    println!("          Name : {}", d.name);
    println!("    Array Size : {}", bytes_text(d.size_bytes));
    println!("   Sector Size : {}", d.sector_bytes);
    println!(
        "         State : {} (read-only until the reshape is finished)",
        d.state
    );
    println!("        Events : {}", d.events);
    println!("     Old Shape : {}", shape_text(&d.old));
    println!("     New Shape : {}", shape_text(&d.new));
    println!(
        " Reshape Pos'n : {} ({}; {:.1}% done)",
        bytes_text(d.position_bytes),
        d.direction,
        d.percent_done
    );
    println!();
    println!(
        "  {:>4}  {:<10}  {:>8}  {:>12}  {:>12}  path",
        "role", "state", "events", "old offset", "new offset"
    );
    for m in &d.members {
        let role = m.role.map_or("-".into(), |r| r.to_string());
        let offset = |o: Option<u64>| o.map_or("-".into(), bytes_text);
        println!(
            "  {role:>4}  {:<10}  {:>8}  {:>12}  {:>12}  {}",
            m.state,
            m.events,
            offset(m.data_offset_bytes),
            offset(m.new_data_offset_bytes),
            m.path
        );
    }
}

/// What the member table says after a member's path: why it is out, how
/// far its recovery is, its bad blocks ("" when nothing).
fn member_notes(m: &info::MemberDetail) -> String {
    let mut notes = Vec::new();
    if let Some(reason) = &m.reason {
        notes.push(reason.clone());
    }
    if let Some(in_sync) = m.in_sync_bytes {
        notes.push(format!(
            "being recovered: in sync below {}, read from the other copies above",
            bytes_text(in_sync)
        ));
    }
    if !m.bad_ranges.is_empty() {
        let ranges: Vec<String> = m
            .bad_ranges
            .iter()
            .map(|(s, e)| format!("{s}..{e}"))
            .collect();
        notes.push(format!("bad blocks (never read): {}", ranges.join(", ")));
    }
    if notes.is_empty() {
        String::new()
    } else {
        format!("  ({})", notes.join("; "))
    }
}
