//! `nvraid create`.

use super::{bytes_text, size_arg};
use anyhow::{bail, Result};
use clap::Args;
use nvraid_array::{create_with_spares, info, CreateOptions, CHUNK_BYTES_DEFAULT};
use nvraid_layout::Level;

#[derive(Args, Debug)]
pub struct CreateArgs {
    /// RAID level: 0 (stripe), 1 (mirror) or 10 (striped mirrors; --layout).
    #[arg(long, short = 'l')]
    level: String,
    /// RAID 10 layout, md's names: nN (near, default n2), fN (far) or oN
    /// (offset), N copies.
    #[arg(long, short = 'p', value_name = "LAYOUT")]
    layout: Option<String>,
    /// Chunk (stripe unit) size for levels 0 and 10: a power of two from 4K
    /// to 4M. Default 64K.
    #[arg(long, short = 'c', value_parser = size_arg)]
    chunk: Option<u64>,
    /// Array name stored in the superblock.
    #[arg(long, short = 'N', default_value = "nvraid")]
    name: String,
    /// How much of each member to use: missing member files are created and
    /// smaller ones extended to this size; larger members are used only up
    /// to it. Needed when members differ in size by more than 1%.
    #[arg(long, short = 'z', value_parser = size_arg)]
    size: Option<u64>,
    /// The last N members are hot spares (RAID 1/10): they hold no data
    /// until `nvraid rebuild` puts one into a missing role.
    #[arg(long, default_value_t = 0, value_name = "N")]
    spares: usize,
    /// md's write-intent bitmap: `internal` (the default for RAID 1/10:
    /// after a crash only the regions written just before it are resynced)
    /// or `none`.
    #[arg(long, short = 'b', value_name = "internal|none")]
    bitmap: Option<String>,
    /// Bytes per bitmap bit (a power of two, 4K or more). Default: mdadm's
    /// (64M, or larger when the array needs more bits than fit).
    #[arg(long, value_parser = size_arg, value_name = "SIZE")]
    bitmap_chunk: Option<u64>,
    /// Overwrite members that carry a filesystem or md superblock.
    #[arg(long, short = 'f')]
    force: bool,
    /// Print the new array as JSON (as `detail --json`).
    #[arg(long)]
    json: bool,
    /// Members, in role order: files, block devices, mem:SIZE or null:SIZE.
    #[arg(required = true)]
    members: Vec<String>,
}

/// Parse `0`, `1`, `10` (also `raid0`…) into a level.
pub fn parse_level(text: &str) -> Result<Level> {
    match text.trim_start_matches("raid") {
        "0" => Ok(Level::Raid0),
        "1" => Ok(Level::Raid1),
        "10" => Ok(Level::Raid10 { near: 2 }),
        other => bail!("unsupported level {other:?}: use 0, 1 or 10"),
    }
}

/// md's RAID 10 layout names: `n2`, `f2`, `o2` (any copy count).
pub fn parse_raid10_layout(text: &str) -> Result<Level> {
    let bad = || {
        anyhow::anyhow!(
            "unknown raid10 layout {text:?}: use nN (near), fN (far) or oN (offset), e.g. n2, f2, o2"
        )
    };
    let (kind, copies) = text.split_at(text.len().min(1));
    let copies: u32 = copies.parse().map_err(|_| bad())?;
    match kind {
        "n" => Ok(Level::Raid10 { near: copies }),
        "f" => Ok(Level::Raid10Far {
            copies,
            offset: false,
        }),
        "o" => Ok(Level::Raid10Far {
            copies,
            offset: true,
        }),
        _ => Err(bad()),
    }
}

pub fn run(args: &CreateArgs, direct: bool) -> Result<u8> {
    let mut level = parse_level(&args.level)?;
    match (&args.layout, level) {
        (Some(layout), Level::Raid10 { .. }) => level = parse_raid10_layout(layout)?,
        (Some(_), _) => bail!("--layout applies to raid10 only"),
        (None, _) => {}
    }
    if level == Level::Raid1 && args.chunk.is_some() {
        bail!("--chunk does not apply to raid1 (mirrors have no chunks)");
    }
    let bitmap = match (args.bitmap.as_deref(), args.bitmap_chunk) {
        (None, None) => nvraid_array::BitmapChoice::Auto,
        (None | Some("internal"), chunk) => {
            nvraid_array::BitmapChoice::Internal { chunk_bytes: chunk }
        }
        (Some("none"), None) => nvraid_array::BitmapChoice::None,
        (Some("none"), Some(_)) => {
            bail!("--bitmap-chunk needs a bitmap; it cannot go with --bitmap none")
        }
        (Some(other), _) => bail!("unknown --bitmap {other:?}: use internal or none"),
    };
    let options = CreateOptions {
        level,
        chunk_bytes: args.chunk.unwrap_or(CHUNK_BYTES_DEFAULT),
        name: args.name.clone(),
        size_bytes: args.size,
        force: args.force,
        direct,
        bitmap,
    };
    let array = create_with_spares(&args.members, args.spares, &options)?;
    let detail = info::detail(&array);
    array.close()?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&detail)?);
    } else {
        println!(
            "nvraid: created {} array {} ({}) of {} members{}, {}",
            detail.level_name(),
            detail.uuid,
            detail.name,
            detail.raid_disks,
            if args.spares > 0 {
                format!(" and {} spares", args.spares)
            } else {
                String::new()
            },
            bytes_text(detail.size_bytes)
        );
    }
    Ok(0)
}
