//! `nvraid grow --consistency-policy bitmap|resync|ppl` (and mdadm's
//! `--bitmap internal|none`): how an existing array keeps its copies and
//! parity consistent after a crash, changed offline as `mdadm --grow`
//! changes it.
//!
//! md refuses to reshape an array with a partial parity log ("switch the
//! consistency policy to resync first"); this is how an nvraid user does
//! that, and goes back afterwards.
//!
//! - **Checks**, before any write: every role's member given, none set
//!   aside but spares (written too), no reshape recorded, no member being
//!   rebuilt, the array clean (a dirty one needs its resync or its log
//!   replayed first: `nvraid repair`, or assembling it), not a RAID 0
//!   (nothing to keep consistent) and not an array with md's write journal
//!   (its journal is its policy). PPL only on RAID 4/5, as md keeps it.
//! - **bitmap → resync**, **ppl → resync**: every superblock loses the
//!   feature (and the word that placed it); events + 1.
//! - **resync → bitmap**: an internal bitmap 4 KiB behind the superblock,
//!   as mdadm places one (or, where a grow moved the bad-block log there,
//!   in the longest stretch free before the data: md reads it where the
//!   superblock says), with every bit clear (the array is in sync) and the
//!   header's events the superblocks' new count, written and flushed on
//!   every member before any superblock names it; then the superblocks.
//!   The chunk is mdadm's default for the array (or `--bitmap-chunk`); it
//!   must fit below the bad-block log and the data.
//! - **resync → ppl**: the log's area behind the superblock (mdadm's
//!   offset where it is free, up to mdadm's 1 MiB, around the bad-block
//!   log and below the data), an empty
//!   header written and flushed on every member first; then the
//!   superblocks, checked as the kernel checks them (`PplArea::from_superblock`).
//! - **bitmap ↔ ppl** go through resync: two recorded changes, each whole,
//!   since both live at the same place behind the superblock.
//!
//! A crash between superblock writes leaves members one event apart: md
//! assembles them (the freshest superblock says the policy); nvraid refuses
//! members that disagree on a bitmap, naming this command, and running it
//! again rewrites every member with the new policy.

use super::grow::old_shape;
use super::record::{is_reshaping, open_members};
use crate::assemble::check_distinct_specs;
use crate::decision::{decide, SetAside};
use crate::error::{Error, Result};
use crate::slot::write_superblock;
use nvraid_layout::Level;
use nvraid_member::Member;
use nvraid_metadata::bitmap::{self, BitmapHeader};
use nvraid_metadata::ppl::PplArea;
use nvraid_metadata::{features, Superblock, Timestamp, RESYNC_CLEAN};
use serde::Serialize;

/// A consistency policy (mdadm's `--consistency-policy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Nothing kept: a dirty array is resynced whole.
    Resync,
    /// md's internal write-intent bitmap; the chunk, or mdadm's default.
    Bitmap { chunk_bytes: Option<u64> },
    /// md's partial parity log (RAID 4/5).
    Ppl,
}

impl Policy {
    fn name(self) -> &'static str {
        match self {
            Policy::Resync => "resync",
            Policy::Bitmap { .. } => "bitmap",
            Policy::Ppl => "ppl",
        }
    }
}

/// What [`change_policy`] did.
#[derive(Clone, Debug, Serialize)]
pub struct PolicyChanged {
    pub from: &'static str,
    pub to: &'static str,
    /// False when the array had that policy already (nothing written).
    pub changed: bool,
    /// The members' events count now.
    pub events: u64,
    /// The bitmap's chunk, with a bitmap.
    pub bitmap_chunk_bytes: Option<u64>,
    /// The log's area on each member, with PPL.
    pub ppl_area_bytes: Option<u64>,
}

/// Change the consistency policy of the array on `members` (every member
/// of it, spares too; any order) to `to`.
pub fn change_policy(members: &[String], to: Policy, direct: bool) -> Result<PolicyChanged> {
    check_distinct_specs(members)?;
    let mut found = open_members(members, direct)?;
    let (reference, level) = check(&found)?;
    let from = current(&reference);
    if from == to.name() && found.iter().all(|(_, sb)| sb.events == reference.events) {
        return Ok(PolicyChanged {
            from,
            to: to.name(),
            changed: false,
            events: reference.events,
            bitmap_chunk_bytes: bitmap_chunk_of(&found[0].0, &reference),
            ppl_area_bytes: ppl_bytes(&reference),
        });
    }
    if to == Policy::Ppl && level.parity_chunks() != 1 {
        return Err(Error::BadOption {
            option: "--consistency-policy ppl".into(),
            why: format!(
                "a partial parity log on a {level} is not supported (md keeps one for RAID 4/5 only); nothing was written"
            ),
        });
    }
    let mut events = reference.events;
    for (_, sb) in found.iter_mut() {
        *sb = with_policy_of(sb, &reference);
    }
    if from == to.name() {
        // A change a crash cut short: every member gets the freshest
        // record, nothing else moves.
        events += 1;
        write_all(&found, events)?;
        return Ok(PolicyChanged {
            from,
            to: to.name(),
            changed: true,
            events,
            bitmap_chunk_bytes: bitmap_chunk_of(&found[0].0, &reference),
            ppl_area_bytes: ppl_bytes(&reference),
        });
    }
    // Out of the old policy, then into the new one.
    if from != "resync" {
        events += 1;
        for (_, sb) in found.iter_mut() {
            clear_policy(sb);
        }
        write_all(&found, events)?;
    }
    let mut bitmap_chunk_bytes = None;
    let mut ppl_area_bytes = None;
    match to {
        // Written above: out of the old policy is into this one.
        Policy::Resync => {}
        Policy::Bitmap { chunk_bytes } => {
            events += 1;
            let chunk = add_bitmap(&mut found, &reference, chunk_bytes, events)?;
            bitmap_chunk_bytes = Some(chunk);
            write_all(&found, events)?;
        }
        Policy::Ppl => {
            events += 1;
            let area = add_ppl(&mut found)?;
            ppl_area_bytes = Some(area.usable_sectors() * 512);
            write_all(&found, events)?;
        }
    }
    Ok(PolicyChanged {
        from,
        to: to.name(),
        changed: true,
        events,
        bitmap_chunk_bytes,
        ppl_area_bytes,
    })
}

/// The checks before any write: the reference superblock and the level.
fn check(found: &[(Member, Superblock)]) -> Result<(Superblock, Level)> {
    if let Some((member, _)) = found.iter().find(|(_, sb)| is_reshaping(sb)) {
        return Err(Error::NotStartable(format!(
            "{}: a reshape is in progress; finish it first (`nvraid grow --continue`); nothing was written",
            member.spec()
        )));
    }
    let listed: Vec<(&str, &Superblock)> = found.iter().map(|(m, sb)| (m.spec(), sb)).collect();
    let decision = decide(&listed)?;
    let (ref_member, reference) = &found[decision.reference];
    let spec = ref_member.spec();
    if let Some(role) = decision.roles.iter().position(Option::is_none) {
        return Err(Error::NotStartable(format!(
            "role {role} of the array is not given: a consistency policy is changed on every member at once (md writes it to each); give them all, or rebuild the missing one first (`nvraid add`); nothing was written"
        )));
    }
    if let Some((index, why)) = decision
        .set_aside
        .iter()
        .find(|(_, why)| !matches!(why, SetAside::Spare))
    {
        return Err(Error::NotStartable(format!(
            "{} takes no part in the array ({}); nothing was written",
            found[*index].0.spec(),
            why.reason()
        )));
    }
    if decision.journal.is_some() || reference.feature_map & features::JOURNAL != 0 {
        return Err(Error::Unsupported {
            spec: spec.into(),
            what: "changing the consistency policy of an array with md's write journal (the journal is its policy; md does not switch it either); nothing was written".into(),
        });
    }
    let level = crate::assemble::level_of(reference, spec)?;
    if level == Level::Raid0 {
        return Err(Error::Unsupported {
            spec: spec.into(),
            what: "a consistency policy for a raid0 (it has no copies or parity to keep consistent); nothing was written".into(),
        });
    }
    for (member, sb) in found {
        if sb.feature_map & (features::RECOVERY_OFFSET | features::RECOVERY_BITMAP) != 0 {
            return Err(Error::NotStartable(format!(
                "{} is being rebuilt; finish the rebuild first (`nvraid rebuild`); nothing was written",
                member.spec()
            )));
        }
    }
    if reference.resync_offset != RESYNC_CLEAN {
        return Err(Error::NotStartable(format!(
            "the array is not clean (a crash left it {}); run `nvraid repair` first (it resyncs, or replays the partial parity log), then change the policy; nothing was written",
            if reference.feature_map & features::PPL != 0 {
                "with its partial parity log to replay"
            } else {
                "needing its resync"
            }
        )));
    }
    Ok((reference.clone(), level))
}

/// The array's policy by its superblock.
fn current(sb: &Superblock) -> &'static str {
    if sb.feature_map & features::BITMAP_OFFSET != 0 {
        "bitmap"
    } else if sb.feature_map & (features::PPL | features::MULTIPLE_PPLS) != 0 {
        "ppl"
    } else {
        "resync"
    }
}

/// `sb` with the policy fields of `reference` (members a crash left one
/// change behind get the freshest one's).
fn with_policy_of(sb: &Superblock, reference: &Superblock) -> Superblock {
    let bits = features::BITMAP_OFFSET | features::PPL | features::MULTIPLE_PPLS;
    let mut out = sb.clone();
    out.feature_map = (sb.feature_map & !bits) | (reference.feature_map & bits);
    out.bitmap_offset = reference.bitmap_offset;
    out
}

fn clear_policy(sb: &mut Superblock) {
    sb.feature_map &= !(features::BITMAP_OFFSET | features::PPL | features::MULTIPLE_PPLS);
    sb.bitmap_offset = 0;
}

/// md's (and mdadm's) place for an internal bitmap of a v1.2 array: 4 KiB
/// behind the superblock, in sectors from it.
const BITMAP_OFFSET_SECTORS: u32 = 8;

/// The free stretch of the metadata area every member has in common, in
/// sectors from the superblock: `[start, end)` between the superblock's
/// own 4 KiB and the data, around the bad-block log (which a grow may have
/// moved behind the superblock). The longest, the first of equals.
fn free_area(found: &[(Member, Superblock)]) -> (i64, i64) {
    let mut common: Option<Vec<(i64, i64)>> = None;
    for (_, sb) in found {
        let data = sb.data_offset_sectors as i64 - sb.super_offset_sectors as i64;
        let mut free = vec![(8, data)];
        if sb.bblog_size != 0 {
            let at = i64::from(sb.bblog_offset as i32);
            let end = at + i64::from(sb.bblog_size);
            free = free
                .into_iter()
                .flat_map(|(s, e)| [(s, e.min(at)), (s.max(end), e)])
                .filter(|(s, e)| s < e)
                .collect();
        }
        common = Some(match common {
            None => free,
            Some(c) => c
                .iter()
                .flat_map(|&(s1, e1)| free.iter().map(move |&(s2, e2)| (s1.max(s2), e1.min(e2))))
                .filter(|(s, e)| s < e)
                .collect(),
        });
    }
    common
        .unwrap_or_default()
        .into_iter()
        .fold((8, 8), |best, (s, e)| {
            if e - s > best.1 - best.0 {
                (s, e)
            } else {
                best
            }
        })
}

/// Write an empty bitmap behind every member's superblock and name it in
/// their superblocks (not written yet). Its chunk.
fn add_bitmap(
    found: &mut [(Member, Superblock)],
    reference: &Superblock,
    chunk_bytes: Option<u64>,
    events: u64,
) -> Result<u64> {
    let spec = found[0].0.spec();
    let geometry = old_shape(reference, spec)?;
    let space = geometry.bitmap_space_bytes();
    // mdadm's place, 4 KiB behind the superblock, where it is free;
    // otherwise the longest stretch free (md reads the bitmap wherever
    // the superblock says).
    let (start, end) = free_area(found);
    let start = start.max(i64::from(BITMAP_OFFSET_SECTORS));
    let room_sectors = (end - start).max(0) as u64;
    let chunk = match chunk_bytes {
        Some(c) => crate::create::checked_bitmap_chunk(c)?,
        None => bitmap::default_chunk_bytes(
            space,
            bitmap::default_room_bytes(geometry.member_used_bytes() / 512).min(room_sectors * 512),
        ),
    };
    let bits = bitmap::bits_for(space, chunk as u32);
    let need = bitmap::storage_bytes(bits).next_multiple_of(4096);
    if need > room_sectors * 512 {
        return Err(Error::BadOption {
            option: "--bitmap-chunk".into(),
            why: format!(
                "a bitmap of {} chunks for {} needs {need} bytes behind the superblock and the members have {} free there (before the data, around the bad-block log); give a larger --bitmap-chunk; nothing was written",
                nvraid_member::format_size(chunk),
                nvraid_member::format_size(space),
                room_sectors * 512
            ),
        });
    }
    let header = BitmapHeader::new(reference.set_uuid, events, space / 512, chunk as u32);
    let mut image = nvraid_io::AlignedBuf::zeroed(need as usize);
    header.encode(&mut image);
    for (member, sb) in found.iter() {
        let at = (sb.super_offset_sectors as i64 + start) as u64 * 512;
        member
            .write_at(&image, at)
            .and_then(|()| member.flush())
            .map_err(|e| Error::io(member.spec(), e))?;
        crate::failpoint::hit("policy-write");
    }
    for (_, sb) in found.iter_mut() {
        sb.feature_map |= features::BITMAP_OFFSET;
        sb.bitmap_offset = start as i32 as u32;
    }
    Ok(chunk)
}

/// md's partial parity log behind every member's superblock: an empty
/// area written on each, then named in their superblocks (not written
/// yet). The area.
fn add_ppl(found: &mut [(Member, Superblock)]) -> Result<PplArea> {
    let (start, end) = free_area(found);
    let room = end - start;
    let size = room.clamp(0, i64::from(PplArea::MDADM_V12.size_sectors)) as u16;
    let area = PplArea {
        offset_sectors: start.clamp(0, i64::from(i16::MAX)) as i16,
        size_sectors: size,
    };
    for (member, sb) in found.iter_mut() {
        sb.feature_map |= features::PPL;
        sb.bitmap_offset = area.to_raw();
        PplArea::from_superblock(sb).map_err(|e| Error::Unsupported {
            spec: member.spec().into(),
            what: format!(
                "a partial parity log behind the superblock ({} sectors free there, around the bad-block log): {e}; nothing was written",
                room.max(0)
            ),
        })?;
    }
    for (member, sb) in found.iter() {
        crate::parity::ppl::reset_area(member, sb, &area)?;
        crate::failpoint::hit("policy-write");
    }
    Ok(area)
}

/// Every member's superblock with `events`, each flushed.
fn write_all(found: &[(Member, Superblock)], events: u64) -> Result<()> {
    for (member, sb) in found {
        let mut sb = sb.clone();
        sb.events = events;
        sb.utime = Timestamp::now();
        write_superblock(member, &sb)?;
        member.flush().map_err(|e| Error::io(member.spec(), e))?;
        crate::failpoint::hit("policy-superblock");
    }
    Ok(())
}

/// The bitmap chunk of an array that has one (by its header on `member`).
fn bitmap_chunk_of(member: &Member, sb: &Superblock) -> Option<u64> {
    if sb.feature_map & features::BITMAP_OFFSET == 0 {
        return None;
    }
    let mut head = nvraid_io::AlignedBuf::zeroed(4096);
    let at = (sb.super_offset_sectors as i64 + i64::from(sb.bitmap_offset as i32)) * 512;
    member.read_at(&mut head, at as u64).ok()?;
    BitmapHeader::decode(&head[..256], &sb.set_uuid)
        .ok()
        .map(|h| u64::from(h.chunk_bytes))
}

fn ppl_bytes(sb: &Superblock) -> Option<u64> {
    PplArea::from_superblock(sb)
        .ok()
        .flatten()
        .map(|a| a.usable_sectors() * 512)
}
