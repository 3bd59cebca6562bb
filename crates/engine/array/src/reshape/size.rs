//! `grow --size`: how much of each member the array uses, changed offline
//! in md's format (mdadm's `--grow --size`, the kernel's `*_resize`).
//!
//! - `--size max` after every member grew: each member's `data_size` is
//!   raised to what its device holds past the data offset (mdadm asks the
//!   kernel for that first), and the array's per-member size (`size`) to
//!   the smallest, in whole chunks. Nothing moves. The new region holds
//!   whatever the larger devices held, so a redundant array records it as
//!   needing a resync, as md does: `resync_offset` at the old end (in the
//!   bitmap's space: member rows for RAID 4/5/6 and 1, array bytes for
//!   RAID 10), and a write-intent bitmap gets its header's size raised and
//!   the bits of the new region set; its chunk doubled until the bits fit
//!   the room md allows it, as md's resize does (`bitmap`).
//! - `--size SIZE` smaller than now: the array's end is cut off, so it is
//!   refused without `--force`, naming the filesystem check to do first;
//!   with it, only `size` (and the bitmap's header) shrink. Nothing moves.
//!
//! The checks are a reshape's (a whole, clean array without md's partial
//! parity log or write journal: md's raid5 refuses to resize those too);
//! a RAID 0 is refused (md's raid0 has no resize).

use super::grow::{check_whole, kept_bitmap, old_shape, publish_bitmap, write_superblocks, Placed};
use crate::assemble::check_distinct_specs;
use crate::error::{Error, Result};
use crate::intent::MemberBitmap;
use nvraid_layout::{Geometry, Level};
use nvraid_member::Member;
use nvraid_metadata::{bitmap, Superblock, Timestamp};
use serde::Serialize;

/// The size asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeTarget {
    /// As much as the smallest member holds.
    Max,
    /// This many bytes of each member (mdadm's `--size`).
    MemberBytes(u64),
}

/// How to resize.
#[derive(Clone, Debug)]
pub struct SizeOptions {
    pub target: SizeTarget,
    /// Shrink (cut the array's end off).
    pub force: bool,
    /// Open the members with O_DIRECT.
    pub direct: bool,
}

/// What [`resize`] did.
#[derive(Clone, Debug, Serialize)]
pub struct Resized {
    /// The array's size before and after.
    pub size_bytes_before: u64,
    pub size_bytes: u64,
    /// Bytes of each member the array uses, before and after.
    pub member_bytes_before: u64,
    pub member_bytes: u64,
    /// Where the resync of the new region starts (md's `resync_offset`,
    /// bytes in the bitmap's space); `None` when nothing is to resync.
    pub resync_from_bytes: Option<u64>,
    pub events: u64,
}

/// Change how much of each member the array on `members` (every member,
/// any order) uses.
pub fn resize(members: &[String], options: &SizeOptions) -> Result<Resized> {
    check_distinct_specs(members)?;
    let found = super::record::open_members(members, options.direct)?;
    if let Some((member, _)) = found.iter().find(|(_, sb)| super::record::is_reshaping(sb)) {
        return Err(Error::Unsupported {
            spec: member.spec().into(),
            what: "a size change while a reshape is in progress: finish it first with `nvraid grow --continue`".into(),
        });
    }
    let (reference, roles) = check_whole(&found, "resizes", "resizing")?;
    let spec = found[roles[0]].0.spec().to_string();
    let old = old_shape(&reference, &spec)?;
    if old.level() == Level::Raid0 {
        return Err(Error::Unsupported {
            spec,
            what: "changing a raid0's size with --size (md's raid0 cannot be resized; add members with --raid-devices instead)".into(),
        });
    }
    // What each member holds past its data offset.
    let held = |m: &Member, sb: &Superblock| {
        (m.size_bytes() / 512).saturating_sub(sb.data_offset_sectors) * 512
    };
    let (smallest, smallest_spec) = found
        .iter()
        .map(|(m, sb)| (held(m, sb), m.spec().to_string()))
        .min()
        .expect("members were given");
    let new = new_geometry(
        &old,
        smallest,
        &smallest_spec,
        options.target,
        options.force,
    )?;
    let (before, after) = (old.member_used_bytes(), new.member_used_bytes());
    let mut bitmap = kept_bitmap(found.iter().map(|(m, sb)| (m, sb)), &old)?;
    if let Some(b) = bitmap.as_mut() {
        *b = resized_bitmap(b, &old, &new, &found)?;
    }
    let events = reference.events + 1;
    // md resyncs what a grow added (from the old end), for every level
    // with redundancy.
    let resync_from = (after > before).then(|| old.bitmap_space_bytes());
    let mut slots: Vec<Option<(Member, Superblock)>> = found.into_iter().map(Some).collect();
    let mut placed: Vec<Placed> = roles
        .iter()
        .map(|&i| {
            let (member, sb) = slots[i].take().expect("one member per role");
            Placed { member, sb }
        })
        .collect();
    for p in placed.iter_mut() {
        let held = held(&p.member, &p.sb) / 512;
        let sb = &mut p.sb;
        sb.size_sectors = after / 512;
        if after > before {
            sb.data_size_sectors = sb.data_size_sectors.max(held);
        }
        if let Some(from) = resync_from {
            sb.resync_offset = from / 512;
        }
        sb.events = events;
        sb.utime = Timestamp::now();
    }
    let all: Vec<usize> = (0..placed.len()).collect();
    if let Some(b) = bitmap.as_mut() {
        publish_bitmap(&placed, &all, b, events)?;
    }
    write_superblocks(&placed, &all, bitmap.as_mut())?;
    Ok(Resized {
        size_bytes_before: old.array_bytes(),
        size_bytes: new.array_bytes(),
        member_bytes_before: before,
        member_bytes: after,
        resync_from_bytes: resync_from,
        events,
    })
}

/// The bitmap for the new size, resized as md resizes it
/// (`super::bitmap::resized`: the chunk doubled until the bits fit the
/// room md allows, the bits of the kept region carried over, those past a
/// shrunk end dropped), the bits of a grown region set (the region is
/// resynced from `resync_offset` either way); refused when its image would
/// run into the data or a bad-block log on some member.
fn resized_bitmap(
    b: &MemberBitmap,
    old: &Geometry,
    new: &Geometry,
    found: &[(Member, Superblock)],
) -> Result<MemberBitmap> {
    let (from, to) = (old.bitmap_space_bytes(), new.bitmap_space_bytes());
    let mut resized = super::bitmap::resized(b, from, to);
    let held: Vec<(&Member, &Superblock)> = found.iter().map(|(m, sb)| (m, sb)).collect();
    super::bitmap::check_fits(resized.at, resized.storage.len() as u64, &held)?;
    if to > from {
        // Grown: the new region is set, from the bit holding the old end.
        let chunk = u64::from(resized.header.chunk_bytes);
        for bit in from / chunk..bitmap::bits_for(to, resized.header.chunk_bytes) {
            bitmap::put_bit(&mut resized.storage, bit, true);
        }
    }
    Ok(resized)
}

/// The array's geometry at the size `options` ask for (`old` resized; the
/// smallest member holding `smallest` bytes past its data offset, named
/// `smallest_spec`; `force`: a smaller size allowed), shared by the offline and the served `--size`.
/// Refused, by name: a size larger than that member holds, no change, and
/// a smaller size without `--force` (naming the filesystem check to do).
pub(super) fn new_geometry(
    old: &Geometry,
    smallest: u64,
    smallest_spec: &str,
    target: SizeTarget,
    force: bool,
) -> Result<Geometry> {
    let want = match target {
        SizeTarget::Max => smallest,
        SizeTarget::MemberBytes(bytes) => {
            if bytes > smallest {
                return Err(Error::BadOption {
                    option: "--size".into(),
                    why: format!(
                        "{bytes} bytes of each member, but {smallest_spec} holds only {smallest} past its data offset"
                    ),
                });
            }
            bytes
        }
    };
    let chunk = old.chunk_bytes().unwrap_or(0);
    let new =
        Geometry::new(old.level(), old.members(), chunk, want).map_err(|e| Error::BadOption {
            option: "--size".into(),
            why: e.to_string(),
        })?;
    let (before, after) = (old.member_used_bytes(), new.member_used_bytes());
    if after == before {
        return Err(Error::BadOption {
            option: "--size".into(),
            why: format!(
                "the array already uses {before} bytes of each member ({} bytes in all): nothing to change{}",
                old.array_bytes(),
                if target == SizeTarget::Max {
                    " (have the members grown? a file or device must be larger first)"
                } else {
                    ""
                }
            ),
        });
    }
    if after < before && !force {
        return Err(Error::NotStartable(format!(
            "shrinking the array from {} to {} bytes cuts off its last {} bytes. Shrink what is on it first: a filesystem must end below {} bytes (resize2fs DEVICE {}K for ext4; xfs cannot shrink; check with your filesystem's tool that it is no larger), then run again with --force. Nothing was written",
            old.array_bytes(),
            new.array_bytes(),
            old.array_bytes() - new.array_bytes(),
            new.array_bytes(),
            new.array_bytes() / 1024
        )));
    }
    Ok(new)
}
