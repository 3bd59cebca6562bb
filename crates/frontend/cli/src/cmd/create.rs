//! `nvraid create`.

use super::{bytes_text, size_arg};
use anyhow::{bail, Result};
use clap::Args;
use nvraid_array::{create_with_spares, info, CreateOptions, CHUNK_BYTES_DEFAULT};
use nvraid_layout::Level;

#[derive(Args, Debug)]
pub struct CreateArgs {
    /// RAID level: 0 (stripe), 1 (mirror), 10 (striped mirrors), 4, 5
    /// (single parity) or 6 (double parity).
    #[arg(long, short = 'l')]
    level: String,
    /// md's layout names. RAID 10: nN (near, default n2), fN (far) or oN
    /// (offset), N copies. RAID 5: left-symmetric (default, ls),
    /// left-asymmetric (la), right-symmetric (rs), right-asymmetric (ra),
    /// parity-first, parity-last; RAID 6 also the -6 forms
    /// (left-symmetric-6, ...). RAID 4 is parity-last.
    #[arg(long, short = 'p', value_name = "LAYOUT")]
    layout: Option<String>,
    /// Chunk (stripe unit) size for levels 0, 10, 4, 5 and 6: a power of two
    /// from 4K to 4M. Default 64K.
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
    /// The last N members are hot spares (any redundant level): they hold no data
    /// until `nvraid rebuild` puts one into a missing role.
    #[arg(long, default_value_t = 0, value_name = "N")]
    spares: usize,
    /// md's write-intent bitmap: `internal` (the default for RAID 1/10:
    /// after a crash only the regions written just before it are resynced)
    /// or `none`.
    #[arg(long, short = 'b', value_name = "internal|none")]
    bitmap: Option<String>,
    /// How the array finds what to repair after a crash, md's names:
    /// `bitmap` (the write-intent bitmap, default for redundant levels),
    /// `resync` (no bitmap: everything is resynced), `ppl` (RAID 4/5:
    /// md's partial parity log, which also closes the write hole: a member
    /// lost after a crash never rebuilds wrong data), or `journal` (with
    /// --write-journal).
    #[arg(long, value_name = "bitmap|resync|ppl|journal")]
    consistency_policy: Option<String>,
    /// RAID 4/5/6: give the array md's write journal on this member (a
    /// fast device of its own; mdadm's --write-journal). The kernel's md
    /// replays it after a crash, and so does nvraid's assembly.
    #[arg(long, value_name = "MEMBER")]
    write_journal: Option<String>,
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

/// Parse `0`, `1`, `10`, `4`, `5`, `6` (also `raid0`…) into a level, with
/// its default layout.
pub fn parse_level(text: &str) -> Result<Level> {
    Level::parse(text).map_err(anyhow::Error::msg)
}

pub fn run(args: &CreateArgs, direct: bool) -> Result<u8> {
    let mut level = parse_level(&args.level)?;
    if let Some(layout) = &args.layout {
        level = level
            .with_layout(layout)
            .map_err(|e| anyhow::anyhow!("--layout: {e}"))?;
    }
    if !level.has_chunks() && args.chunk.is_some() {
        bail!(
            "--chunk does not apply to {} (mirrors have no chunks)",
            level.md_name()
        );
    }
    let options = CreateOptions {
        level,
        chunk_bytes: args.chunk.unwrap_or(CHUNK_BYTES_DEFAULT),
        name: args.name.clone(),
        size_bytes: args.size,
        force: args.force,
        direct,
        bitmap: bitmap_choice(args)?,
    };
    let mut members = args.members.clone();
    members.extend(args.write_journal.iter().cloned());
    let array = create_with_spares(&members, args.spares, &options)?;
    let detail = info::detail(&array);
    let needs_resync = array.resync_from().is_some();
    array.close()?;
    if needs_resync {
        eprintln!(
            "nvraid: the members held other bytes, so the parity does not match them yet: \
             `nvraid repair` computes it (`nvraid serve` does it in the background); until \
             then the array cannot lose a member"
        );
    }
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

/// What keeps the array consistent after a crash, from
/// `--consistency-policy`, `--bitmap`, `--bitmap-chunk` and
/// `--write-journal` (contradictions refused).
fn bitmap_choice(args: &CreateArgs) -> Result<nvraid_array::BitmapChoice> {
    let policy = match (args.consistency_policy.as_deref(), &args.write_journal) {
        (Some("journal"), None) => {
            bail!("--consistency-policy journal needs --write-journal MEMBER")
        }
        (Some("journal") | None, Some(_)) => {
            if let Some(bitmap) = &args.bitmap {
                bail!("--write-journal contradicts --bitmap {bitmap} (md allows a journal or a bitmap, not both)");
            }
            if args.bitmap_chunk.is_some() {
                bail!("--bitmap-chunk needs a bitmap; a write journal replaces it");
            }
            Some("journal")
        }
        (Some(other), Some(_)) => {
            bail!("--consistency-policy {other} contradicts --write-journal")
        }
        (policy, None) => policy,
    };
    let bitmap_arg = match (policy, args.bitmap.as_deref()) {
        (Some("journal"), _) => Some("journal"),
        (None, bitmap) => bitmap,
        (Some("bitmap"), None | Some("internal")) => Some("internal"),
        (Some("resync"), None | Some("none")) => Some("none"),
        (Some("ppl"), None) => {
            if args.bitmap_chunk.is_some() {
                bail!("--bitmap-chunk needs a bitmap; a partial parity log replaces it");
            }
            Some("ppl")
        }
        (Some(policy @ ("bitmap" | "resync" | "ppl")), Some(bitmap)) => {
            bail!("--consistency-policy {policy} contradicts --bitmap {bitmap}")
        }
        (Some(other), _) => {
            bail!("unknown --consistency-policy {other:?}: use bitmap, resync, ppl or journal")
        }
    };
    Ok(match (bitmap_arg, args.bitmap_chunk) {
        (Some("ppl"), _) => nvraid_array::BitmapChoice::Ppl,
        (Some("journal"), _) => nvraid_array::BitmapChoice::Journal,
        (None, None) => nvraid_array::BitmapChoice::Auto,
        (None | Some("internal"), chunk) => {
            nvraid_array::BitmapChoice::Internal { chunk_bytes: chunk }
        }
        (Some("none"), None) => nvraid_array::BitmapChoice::None,
        (Some("none"), Some(_)) => {
            bail!("--bitmap-chunk needs a bitmap; it cannot go with --bitmap none")
        }
        (Some(other), _) => bail!("unknown --bitmap {other:?}: use internal or none"),
    })
}
