//! `grow --level`: the level changes md makes without moving a byte (its
//! "takeovers"), offline, in md's format. RAID 4 → RAID 5 with the
//! parity-last layout (md's `ALGORITHM_PARITY_N`: parity on the last
//! member, as RAID 4 keeps it), and back: both levels put every byte at
//! the same place, so only the superblocks change.
//!
//! Also a RAID 4 whose parity member is missing → RAID 0 of the others
//! (md's `raid0_takeover_raid45`), RAID 6 → 5 when Q is on the last
//! member (a `-6` layout or parity-last: that member leaves) and RAID 10
//! near=2 → RAID 0 (one copy of each pair kept, member 2i becoming i). RAID 5 → 6 and RAID 0 → 10
//! add members (`takeover`). RAID 1 of two ↔ RAID 5 of two: md's RAID 5
//! of two members holds one data chunk per stripe and its parity, a copy
//! of it, on the other member, so both hold the mirror's bytes; md picks
//! the chunk ([`raid1_takeover_chunk`]). [`raid1_to_raid5_grown`] is
//! mdadm's `--level 5 -n N --add`: that takeover, then the RAID 5's grow.
//! md's other takeovers are refused naming md's path.
//!
//! The checks of any change of shape come first (a whole, clean array
//! without PPL or journal); a change md makes only through a reshape or an
//! added member is refused naming md's path. Then every member's
//! superblock records the new level, layout and chunk (events + 1; a
//! write-intent bitmap's header first, with the same events: its bits mean
//! the same rows in both levels, a two-member RAID 5's member rows being
//! its array bytes).

use super::grow::{check_whole, kept_bitmap, write_superblocks, Placed};
use super::record::is_reshaping;
use crate::assemble::check_distinct_specs;
use crate::error::{Error, Result};
use nvraid_layout::parity::ParityLayout;
use nvraid_layout::Level;
use nvraid_metadata::{Role, Timestamp};
use serde::Serialize;

/// What [`change_level`] did.
#[derive(Clone, Debug, Serialize)]
pub struct LevelChanged {
    /// md's level number and nvraid's name of the level, before and after.
    pub md_level_before: i32,
    pub level_before: String,
    pub md_level: i32,
    pub level: String,
    pub chunk_bytes: u64,
    pub size_bytes: u64,
    pub events: u64,
    /// Members that left the array (a RAID 6's Q member when it became a
    /// RAID 5): blank them before using them elsewhere.
    pub released: Vec<String>,
}

/// The level as md names it: `raid4` for md's level 4 (which nvraid lays
/// out as RAID 5 parity-last), nvraid's name otherwise.
fn md_name(md_level: i32, level: Level) -> String {
    if md_level == 4 {
        "raid4".into()
    } else {
        level.to_string()
    }
}

/// The chunk md gives the RAID 5 it makes of a two-member RAID 1: 64 KiB,
/// halved until it divides the array's size (a RAID 5's members hold whole
/// chunks, so the size is kept); `None` below 4 KiB (md refuses too).
pub(super) fn raid1_takeover_chunk(array_bytes: u64) -> Option<u64> {
    let mut chunk = 64 * 1024;
    // nvraid's smallest chunk, md's stripe unit (a page).
    while chunk >= 4096 {
        if array_bytes.is_multiple_of(chunk) {
            return Some(chunk);
        }
        chunk /= 2;
    }
    None
}

/// A takeover to md level `to` that a crash cut short while the
/// superblocks were written, finished: the members already written
/// (events E, level `to`) are the record, and those one event behind with
/// the old level get its level, layout, chunk and size (no byte moved, and
/// nothing was written since: a write would have raised the events). Every
/// member kept (RAID 1 <-> 5 of two, 4 <-> 5): the role tables are the
/// same. The last role dropped (RAID 6 -> 5 without its Q member, a RAID 4
/// without its parity -> 0): the stale members record one member more and
/// that role where the record has a spare; they get the record's count and
/// table too, and a member holding the dropped role is left as it is (it
/// left the array, and is named). Anything else is handed back for the
/// ordinary checks.
fn finish_interrupted(
    found: Vec<(nvraid_member::Member, nvraid_metadata::Superblock)>,
    to: i32,
) -> Result<
    std::result::Result<LevelChanged, Vec<(nvraid_member::Member, nvraid_metadata::Superblock)>>,
> {
    let Some(fresh) = found.iter().map(|(_, sb)| sb.events).max() else {
        return Ok(Err(found));
    };
    let reference = found
        .iter()
        .find(|(_, sb)| sb.events == fresh)
        .map(|(_, sb)| sb.clone())
        .expect("the freshest is there");
    // The role the takeover dropped, when the stale members record one
    // more than the record (its table entry a spare's there).
    let dropped = Role::Active(reference.raid_disks as u16).to_raw();
    let same_table = |sb: &nvraid_metadata::Superblock| {
        if sb.raid_disks == reference.raid_disks {
            return sb.roles_raw == reference.roles_raw;
        }
        // One entry differs: the dropped role's (recorded faulty, when
        // its member was missing or failed), a spare's in the record.
        let differ: Vec<(u16, u16)> = sb
            .roles_raw
            .iter()
            .zip(&reference.roles_raw)
            .filter(|(was, now)| was != now)
            .map(|(&was, &now)| (was, now))
            .collect();
        sb.raid_disks == reference.raid_disks + 1
            && sb.roles_raw.len() == reference.roles_raw.len()
            && differ.len() <= 1
            && differ.iter().all(|&(was, now)| {
                (was == dropped || was == Role::Faulty.to_raw()) && now == Role::Spare.to_raw()
            })
    };
    let leaves = |sb: &nvraid_metadata::Superblock| {
        sb.events + 1 == fresh && sb.roles_raw.get(sb.dev_number as usize) == Some(&dropped)
    };
    let stale: Vec<usize> = (0..found.len())
        .filter(|&i| found[i].1.events != fresh && !leaves(&found[i].1))
        .collect();
    let interrupted = !stale.is_empty()
        && reference.level == to
        && found.iter().all(|(_, sb)| {
            sb.set_uuid == reference.set_uuid
                && !is_reshaping(sb)
                && (sb.events == fresh
                    && sb.level == to
                    && sb.raid_disks == reference.raid_disks
                    && sb.roles_raw == reference.roles_raw
                    && sb.layout == reference.layout
                    && sb.chunk_sectors == reference.chunk_sectors
                    || sb.events + 1 == fresh && sb.level != to && same_table(sb))
        });
    if !interrupted {
        return Ok(Err(found));
    }
    let from = found[stale[0]].1.level;
    let spec = found[stale[0]].0.spec().to_string();
    let before = crate::assemble::geometry_of(&found[stale[0]].1, &spec)?;
    let after = crate::assemble::geometry_of(&reference, &spec)?;
    if before.array_bytes() != after.array_bytes()
        || !found
            .iter()
            .all(|(_, sb)| sb.level == from || sb.level == to)
    {
        return Ok(Err(found));
    }
    let released: Vec<String> = found
        .iter()
        .filter(|(_, sb)| leaves(sb))
        .map(|(m, _)| m.spec().to_string())
        .collect();
    let kept: Vec<(nvraid_member::Member, nvraid_metadata::Superblock)> =
        found.into_iter().filter(|(_, sb)| !leaves(sb)).collect();
    let stale: Vec<usize> = (0..kept.len())
        .filter(|&i| kept[i].1.events != fresh)
        .collect();
    // The bitmap as each member holds it (its header's events its own),
    // given the record's events on the members written now.
    let mut bitmap = kept_bitmap(kept.iter().map(|(m, sb)| (m, sb)), &after)?;
    let placed: Vec<Placed> = kept
        .into_iter()
        .map(|(member, mut sb)| {
            if sb.events != fresh {
                if reference.level == 0 && sb.level != 0 {
                    let n = sb.raid_disks;
                    record_raid0_of_raid4(&mut sb, n);
                } else {
                    sb.level = reference.level;
                    sb.layout = reference.layout;
                    sb.chunk_sectors = reference.chunk_sectors;
                    sb.size_sectors = reference.size_sectors;
                    sb.raid_disks = reference.raid_disks;
                }
                sb.roles_raw = reference.roles_raw.clone();
                sb.events = fresh;
                sb.utime = Timestamp::now();
            }
            Placed { member, sb }
        })
        .collect();
    write_superblocks(&placed, &stale, bitmap.as_mut())?;
    Ok(Ok(LevelChanged {
        md_level_before: from,
        level_before: md_name(from, before.level()),
        md_level: to,
        level: md_name(to, after.level()),
        chunk_bytes: u64::from(reference.chunk_sectors) * 512,
        size_bytes: after.array_bytes(),
        events: fresh,
        released,
    }))
}

/// A takeover that renumbers the roles (RAID 0 of N <-> RAID 10 near=2
/// of 2N, made on a served array: `live_level`) cut short by a crash
/// while the superblocks were written, finished: the members already
/// written (events E, level `to`, the renumbered table) are the record;
/// the others, one event behind with the old level and the old table
/// (which the record's renumbers: RAID 0 role k is RAID 10 role 2k; a
/// RAID 10's kept copy of pair i is RAID 0 role i, the other copy's entry
/// a spare's), get the record's level, layout, count, size and table. A
/// RAID 10 member whose entry the record makes a spare's left the array:
/// it is named and left as it is. No byte moved and nothing was written
/// since (a write would have raised the events). Anything else (a
/// write-intent bitmap too) is handed back for the ordinary checks.
fn finish_renumbered(
    found: Vec<(nvraid_member::Member, nvraid_metadata::Superblock)>,
    to: i32,
) -> Result<
    std::result::Result<LevelChanged, Vec<(nvraid_member::Member, nvraid_metadata::Superblock)>>,
> {
    use nvraid_metadata::features;
    let Some(fresh) = found.iter().map(|(_, sb)| sb.events).max() else {
        return Ok(Err(found));
    };
    let reference = found
        .iter()
        .find(|(_, sb)| sb.events == fresh)
        .map(|(_, sb)| sb.clone())
        .expect("the freshest is there");
    let Some(old) = found
        .iter()
        .find(|(_, sb)| sb.events + 1 == fresh)
        .map(|(_, sb)| sb.clone())
    else {
        return Ok(Err(found));
    };
    let from = old.level;
    let near2 = Level::Raid10 { near: 2 }.md_layout();
    let (raid0, raid10) = match (from, to) {
        (0, 10) => (&old, &reference),
        (10, 0) => (&reference, &old),
        _ => return Ok(Err(found)),
    };
    if reference.level != to
        || raid10.layout != near2
        || raid10.raid_disks != 2 * raid0.raid_disks
        || old.roles_raw.len() != reference.roles_raw.len()
    {
        return Ok(Err(found));
    }
    // The old table renumbered as the takeover renumbers it: each entry
    // must be the record's.
    let renumbered = old
        .roles_raw
        .iter()
        .zip(&reference.roles_raw)
        .all(
            |(&was, &now)| match (Role::from_raw(was), Role::from_raw(now)) {
                (Role::Active(k), Role::Active(j)) if from == 0 => j == 2 * k,
                (Role::Active(r), Role::Active(i)) if from == 10 => i == r / 2,
                (Role::Active(_) | Role::Faulty, Role::Spare) => from == 10,
                (a, b) => a == b,
            },
        );
    // A RAID 10 -> 0 keeps exactly one copy of each pair.
    let pairs_kept = from != 10
        || (0..reference.raid_disks as u16).all(|i| {
            reference
                .roles_raw
                .iter()
                .filter(|&&raw| Role::from_raw(raw) == Role::Active(i))
                .count()
                == 1
        });
    let same = |a: &nvraid_metadata::Superblock, b: &nvraid_metadata::Superblock| {
        a.level == b.level
            && a.layout == b.layout
            && a.raid_disks == b.raid_disks
            && a.chunk_sectors == b.chunk_sectors
            && a.roles_raw == b.roles_raw
    };
    let consistent = found.iter().all(|(_, sb)| {
        sb.set_uuid == reference.set_uuid
            && !is_reshaping(sb)
            && sb.feature_map & features::BITMAP_OFFSET == 0
            && (sb.events == fresh && same(sb, &reference)
                || sb.events + 1 == fresh && same(sb, &old))
    });
    if !renumbered || !pairs_kept || !consistent {
        return Ok(Err(found));
    }
    // A member whose own entry the record makes a spare's left the array.
    let leaves = |sb: &nvraid_metadata::Superblock| {
        reference.roles_raw.get(sb.dev_number as usize) == Some(&Role::Spare.to_raw())
    };
    let spec = found[0].0.spec().to_string();
    let before = crate::assemble::geometry_of(&old, &spec)?;
    let after = crate::assemble::geometry_of(&reference, &spec)?;
    if before.array_bytes() != after.array_bytes() {
        return Ok(Err(found));
    }
    let released: Vec<String> = found
        .iter()
        .filter(|(_, sb)| sb.events != fresh && leaves(sb))
        .map(|(m, _)| m.spec().to_string())
        .collect();
    let kept: Vec<(nvraid_member::Member, nvraid_metadata::Superblock)> =
        found.into_iter().filter(|(_, sb)| !leaves(sb)).collect();
    let stale: Vec<usize> = (0..kept.len())
        .filter(|&i| kept[i].1.events != fresh)
        .collect();
    let placed: Vec<Placed> = kept
        .into_iter()
        .map(|(member, mut sb)| {
            if sb.events != fresh {
                sb.level = reference.level;
                sb.layout = reference.layout;
                sb.chunk_sectors = reference.chunk_sectors;
                sb.raid_disks = reference.raid_disks;
                sb.size_sectors = reference.size_sectors;
                sb.data_size_sectors = reference.data_size_sectors;
                sb.roles_raw = reference.roles_raw.clone();
                sb.events = fresh;
                sb.utime = Timestamp::now();
            }
            Placed { member, sb }
        })
        .collect();
    write_superblocks(&placed, &stale, None)?;
    Ok(Ok(LevelChanged {
        md_level_before: from,
        level_before: md_name(from, before.level()),
        md_level: to,
        level: md_name(to, after.level()),
        chunk_bytes: u64::from(reference.chunk_sectors) * 512,
        size_bytes: after.array_bytes(),
        events: fresh,
        released,
    }))
}

/// md's takeover of a RAID 4 (level 4, or 5 parity-last) whose parity
/// member (the last role) is missing as a RAID 0 of the others
/// (`raid0_takeover_raid45`): each data chunk is where the RAID 0 of one
/// zone keeps it, so no byte moves. What md's RAID 0 grow or restripe
/// leaves when the kernel finished it without mdadm taking it back. The
/// members handed back when the array is no such RAID 4 (the ordinary
/// checks then refuse).
fn raid4_without_parity_to_raid0(
    found: Vec<(nvraid_member::Member, nvraid_metadata::Superblock)>,
) -> Result<
    std::result::Result<LevelChanged, Vec<(nvraid_member::Member, nvraid_metadata::Superblock)>>,
> {
    use crate::decision::decide;
    use nvraid_metadata::features;
    let listed: Vec<(&str, &nvraid_metadata::Superblock)> =
        found.iter().map(|(m, sb)| (m.spec(), sb)).collect();
    let decision = decide(&listed)?;
    let reference = found[decision.reference].1.clone();
    let spec = found[decision.reference].0.spec().to_string();
    let parity_last = reference.level == 4
        || (reference.level == 5 && reference.layout == ParityLayout::ParityLast.to_md());
    let n = reference.raid_disks as usize;
    let missing: Vec<usize> = (0..decision.roles.len())
        .filter(|&r| decision.roles[r].is_none())
        .collect();
    if !parity_last || missing.is_empty() {
        return Ok(Err(found));
    }
    let refuse = |what: String| Error::Unsupported {
        spec: spec.clone(),
        what,
    };
    if missing != [n - 1] {
        return Err(refuse(format!(
            "a RAID 4 without role(s) {missing:?} as a RAID 0: md takes a RAID 4 over as RAID 0 only when its parity member (role {}) is the one missing",
            n - 1
        )));
    }
    if let Some((index, why)) = decision.set_aside.first() {
        return Err(Error::NotStartable(format!(
            "{} takes no part in the array ({}); give only the array's members",
            found[*index].0.spec(),
            why.reason()
        )));
    }
    if let Some((member, _)) = found.iter().find(|(_, sb)| {
        sb.feature_map & (features::RECOVERY_OFFSET | features::RECOVERY_BITMAP) != 0
    }) {
        return Err(Error::NotStartable(format!(
            "{} is being rebuilt; finish the rebuild first (`nvraid rebuild`)",
            member.spec()
        )));
    }
    if reference.feature_map
        & (features::PPL | features::MULTIPLE_PPLS | features::JOURNAL | features::BITMAP_OFFSET)
        != 0
    {
        return Err(refuse(
            "a RAID 4 with a write-intent bitmap, md's partial parity log or write journal as a RAID 0 (md's RAID 0 keeps none of them; md refuses too)".into(),
        ));
    }
    if reference.resync_offset != nvraid_metadata::RESYNC_CLEAN {
        return Err(Error::NotStartable(
            "the array is not clean (a resync is due); run `nvraid repair` first".into(),
        ));
    }
    let before = crate::assemble::geometry_of(&reference, &spec)?;
    let events = reference.events + 1;
    let last = Role::Active((n - 1) as u16).to_raw();
    let mut slots: Vec<Option<(nvraid_member::Member, nvraid_metadata::Superblock)>> =
        found.into_iter().map(Some).collect();
    let placed: Vec<Placed> = decision
        .roles
        .iter()
        .flatten()
        .map(|&i| {
            let (member, mut sb) = slots[i].take().expect("one member per role");
            record_raid0_of_raid4(&mut sb, n as u32);
            for raw in sb.roles_raw.iter_mut() {
                if *raw == last {
                    *raw = Role::Spare.to_raw();
                }
            }
            sb.events = events;
            sb.utime = Timestamp::now();
            Placed { member, sb }
        })
        .collect();
    let after = crate::assemble::geometry_of(&placed[0].sb, &spec)?;
    assert_eq!(
        after.array_bytes(),
        before.array_bytes(),
        "invariant: a takeover keeps the array's size"
    );
    write_superblocks(&placed, &(0..placed.len()).collect::<Vec<_>>(), None)?;
    Ok(Ok(LevelChanged {
        md_level_before: reference.level,
        level_before: md_name(reference.level, before.level()),
        md_level: 0,
        level: md_name(0, after.level()),
        chunk_bytes: u64::from(reference.chunk_sectors) * 512,
        size_bytes: after.array_bytes(),
        events,
        released: Vec::new(),
    }))
}

/// A RAID 4 of `n` members taken over as the RAID 0 of its first `n - 1`
/// (md's `raid0_takeover_raid45`): the fields of one kept member's
/// superblock, its role table aside (the parity's entry becomes a spare's).
pub(super) fn record_raid0_of_raid4(sb: &mut nvraid_metadata::Superblock, n: u32) {
    sb.level = 0;
    sb.layout = Level::Raid0.md_layout();
    sb.raid_disks = n - 1;
    // A RAID 0's members hold their data area whole: the RAID 4's rows, no
    // more.
    if sb.size_sectors > 0 {
        sb.data_size_sectors = sb.size_sectors;
    }
    sb.size_sectors = 0;
}

/// md's takeover of md level `from` to `md_level` without moving a byte,
/// as [`plan_takeover`] chose it: what every kept member records.
#[derive(Clone, Copy, Debug)]
pub(super) struct Takeover {
    pub(super) from: i32,
    pub(super) md_level: i32,
    pub(super) layout: u32,
    pub(super) chunk_sectors: u32,
    /// The last member (a RAID 6's Q) leaves the array.
    pub(super) drop_last: bool,
    /// The second copy of each pair (the odd roles) leaves, the others
    /// renumbered (RAID 10 near=2 -> RAID 0).
    pub(super) halve: bool,
    /// The member count before.
    pub(super) members: u32,
    pub(super) array_bytes: u64,
}

impl Takeover {
    /// The takeover put into a kept member's superblock (level, layout,
    /// chunk, size, member count); its role table, events and time aside.
    pub(super) fn record(&self, sb: &mut nvraid_metadata::Superblock) {
        sb.level = self.md_level;
        sb.layout = self.layout;
        sb.chunk_sectors = self.chunk_sectors;
        if (self.from, self.md_level) == (1, 5) || (self.from, self.md_level) == (5, 1) {
            // md's size: a two-member RAID 5's member rows are its array
            // bytes, as a RAID 1's are.
            sb.size_sectors = self.array_bytes / 512;
        }
        if self.drop_last {
            sb.raid_disks = self.members - 1;
        }
        if self.halve {
            sb.raid_disks = self.members / 2;
            // A RAID 0's members hold their data area whole: the RAID 10's
            // rows, no more.
            if sb.size_sectors > 0 {
                sb.data_size_sectors = sb.size_sectors;
            }
            sb.size_sectors = 0;
        }
    }
}

/// Which of md's takeovers turns the array `reference` describes (whole)
/// into md level `to` without moving a byte; the others refused, naming
/// md's path (`spec`: the member named in a refusal).
pub(super) fn plan_takeover(
    reference: &nvraid_metadata::Superblock,
    to: i32,
    spec: &str,
) -> Result<Takeover> {
    let level = crate::assemble::level_of(reference, spec)?;
    let geometry = crate::assemble::geometry_of(reference, spec)?;
    let n = reference.raid_disks;
    let refuse = |what: String| Error::Unsupported {
        spec: spec.to_string(),
        what,
    };
    let from = reference.level;
    // Whether the last member (a RAID 6's Q) leaves the array.
    let mut drop_last = false;
    // Whether the second copy of each pair (the odd roles) leaves, the
    // others renumbered (RAID 10 near=2 -> RAID 0).
    let mut halve = false;
    // (level, layout, chunk sectors) after the change.
    let (md_level, layout, chunk_sectors) = match (from, to) {
        (f, t) if f == t => {
            return Err(Error::BadOption {
                option: "--level".into(),
                why: format!("the array already is a {level}"),
            })
        }
        // md's takeover of a two-member RAID 1: a RAID 5 of two, left-
        // symmetric, whose stripes each hold one data chunk and its
        // parity, a copy of it, one on each member: the mirror's bytes.
        (1, 5) if n == 2 => (
            5,
            ParityLayout::LeftSymmetric.to_md(),
            raid1_takeover_chunk(geometry.array_bytes()).ok_or_else(|| {
                refuse(format!(
                    "a RAID 1 of {} bytes as a RAID 5: md takes a RAID 1 over with the largest chunk up to 64 KiB that divides the array, and no chunk of 4 KiB or more divides this one",
                    geometry.array_bytes()
                ))
            })? as u32
                / 512,
        ),
        (1, 5) => {
            return Err(refuse(format!(
                "a RAID 1 of {n} members as a RAID 5: md takes a RAID 1 over as RAID 5 only with exactly two members (make it two first: `mdadm --grow --raid-devices 2`), then grows the RAID 5"
            )))
        }
        // md's takeover of a two-member RAID 5 (any layout and chunk):
        // each member holds every array byte, in order.
        (5, 1) if n == 2 => (1, 0, 0),
        (5, 1) => {
            let two = geometry.member_used_bytes();
            return Err(refuse(format!(
                "a {level} of {n} members as a RAID 1: md takes a RAID 5 over as RAID 1 only with two members: shrink it to two first, which cuts the array to {} bytes; with the data below that, `nvraid grow --level 1 --raid-devices 2 --array-size {} MEMBERS` does both",
                two, two
            )))
        }
        (4, 5) => (5, ParityLayout::ParityLast.to_md(), reference.chunk_sectors),
        (5, 4) if level == (Level::Raid5 { layout: ParityLayout::ParityLast }) => {
            (4, 0, reference.chunk_sectors)
        }
        (5, 4) => {
            return Err(refuse(format!(
                "a {level} as a RAID 4: md takes a RAID 5 over as RAID 4 only with the parity-last layout (change the layout first, a reshape nvraid does not do yet)"
            )))
        }
        (5, 6) => {
            return Err(refuse(format!(
                "a {level} as a RAID 6 without a member for Q: md adds one with it; give it: `nvraid grow --level 6 --raid-devices {} --add NEW`",
                n + 1
            )))
        }
        (6, 5) => match level {
            // md drops the Q member of a `-6` layout (Q on the last
            // member): the RAID 5 of the others is the same bytes.
            Level::Raid6 {
                layout: ParityLayout::Raid5With6(rotation),
            } => {
                drop_last = true;
                (5, rotation as u32, reference.chunk_sectors)
            }
            Level::Raid6 {
                layout: ParityLayout::ParityLast,
            } => {
                drop_last = true;
                (5, ParityLayout::ParityLast.to_md(), reference.chunk_sectors)
            }
            _ => {
                return Err(refuse(format!(
                    "a {level} as a RAID 5: md drops Q only from a RAID 6 whose Q is on the last member (a `-6` layout or parity-last); change the layout first (`mdadm --grow --layout left-symmetric-6`), a reshape nvraid does not do yet"
                )))
            }
        },
        (0, 10) => {
            return Err(refuse(format!(
                "a {level} as a RAID 10 without its mirrors: md doubles the members with it, RAID 0 member i becoming RAID 10 near=2 member 2i; give them: `nvraid grow --level 10 --raid-devices {} --add NEW...`",
                2 * n
            )))
        }
        (10, 0) if level == (Level::Raid10 { near: 2 }) && n.is_multiple_of(2) => {
            // md takes a RAID 10 near=2 over as RAID 0 from one copy of
            // each pair (mdadm fails the others): member 2i becomes i.
            halve = true;
            (0, Level::Raid0.md_layout(), reference.chunk_sectors)
        }
        (10, 0) => {
            return Err(refuse(format!(
                "a {level} of {n} members as a RAID 0: md takes over as RAID 0 only a RAID 10 near=2 of an even member count (one copy of each pair kept)"
            )))
        }
        (4, 0) | (5, 0) if level == (Level::Raid5 { layout: ParityLayout::ParityLast }) => {
            return Err(refuse(format!(
                "a whole {} as a RAID 0: md takes a RAID 4 over as RAID 0 only with its parity member (role {}) missing; fail it first (`nvraid fail --member PARITY`)",
                md_name(from, level),
                n - 1
            )))
        }
        _ => {
            return Err(refuse(format!(
                "a {level} as a RAID {to}: md's level changes between these levels are 1 (two members) <-> 5, 4 <-> 5 (parity-last), 4 without its parity -> 0, 5 <-> 6 and 0 <-> 10 (near=2), which nvraid makes (5 -> 6 and 0 -> 10 with members added)"
            )))
        }
    };
    Ok(Takeover {
        from,
        md_level,
        layout,
        chunk_sectors,
        drop_last,
        halve,
        members: n,
        array_bytes: geometry.array_bytes(),
    })
}

/// Change the array on `members` (every member, any order) to md level
/// `to`, where md does it without moving data (RAID 4 ↔ 5 parity-last).
pub fn change_level(members: &[String], to: i32, direct: bool) -> Result<LevelChanged> {
    check_distinct_specs(members)?;
    let found = super::record::open_members(members, direct)?;
    if let Some((member, _)) = found.iter().find(|(_, sb)| is_reshaping(sb)) {
        return Err(Error::Unsupported {
            spec: member.spec().into(),
            what: "a level change while a reshape is in progress: finish it first with `nvraid grow --continue`".into(),
        });
    }
    let found = match finish_interrupted(found, to)? {
        Ok(finished) => return Ok(finished),
        Err(found) => found,
    };
    let found = match finish_renumbered(found, to)? {
        Ok(finished) => return Ok(finished),
        Err(found) => found,
    };
    let found = match to {
        0 => match raid4_without_parity_to_raid0(found)? {
            Ok(changed) => return Ok(changed),
            Err(found) => found,
        },
        _ => found,
    };
    let (reference, _) = check_whole(&found, "changes the level of", "changing the level of")?;
    let spec = found[0].0.spec().to_string();
    let geometry = crate::assemble::geometry_of(&reference, &spec)?;
    let level = geometry.level();
    let n = reference.raid_disks;
    let plan = plan_takeover(&reference, to, &spec)?;
    let Takeover {
        from,
        md_level,
        chunk_sectors,
        drop_last,
        halve,
        ..
    } = plan;
    let mut bitmap = kept_bitmap(found.iter().map(|(m, sb)| (m, sb)), &geometry)?;
    let events = reference.events + 1;
    // The leaving member: its slot in the role table becomes unused (md's
    // spare mark) and its superblock is left as it was (one event behind,
    // naming a role the others do not give it: no assembly takes it in).
    let leaving = drop_last.then(|| {
        let last = Role::Active((n - 1) as u16).to_raw();
        let dev = reference
            .roles_raw
            .iter()
            .position(|&raw| raw == last)
            .expect("a whole array has its last role");
        (dev, n - 1)
    });
    let mut released = Vec::new();
    let placed: Vec<Placed> = found
        .into_iter()
        .filter(|(member, sb)| {
            let odd = halve
                && matches!(
                    reference.roles_raw.get(sb.dev_number as usize).map(|&r| Role::from_raw(r)),
                    Some(Role::Active(r)) if r % 2 == 1
                );
            let leaves = odd || leaving.is_some_and(|(dev, _)| sb.dev_number as usize == dev);
            if leaves {
                released.push(member.spec().to_string());
            }
            !leaves
        })
        .map(|(member, mut sb)| {
            plan.record(&mut sb);
            if let Some((dev, _)) = leaving {
                sb.roles_raw[dev] = Role::Spare.to_raw();
            }
            if halve {
                for raw in sb.roles_raw.iter_mut() {
                    if let Role::Active(r) = Role::from_raw(*raw) {
                        *raw = if r % 2 == 0 {
                            Role::Active(r / 2).to_raw()
                        } else {
                            Role::Spare.to_raw()
                        };
                    }
                }
            }
            sb.events = events;
            sb.utime = Timestamp::now();
            Placed { member, sb }
        })
        .collect();
    let after = crate::assemble::geometry_of(&placed[0].sb, &spec)?;
    assert_eq!(
        after.array_bytes(),
        geometry.array_bytes(),
        "invariant: a takeover keeps the array's size"
    );
    write_superblocks(
        &placed,
        &(0..placed.len()).collect::<Vec<_>>(),
        bitmap.as_mut(),
    )?;
    Ok(LevelChanged {
        md_level_before: from,
        level_before: md_name(from, level),
        md_level,
        level: md_name(md_level, after.level()),
        chunk_bytes: u64::from(chunk_sectors) * 512,
        size_bytes: after.array_bytes(),
        events,
        released,
    })
}

/// `grow --level 5 -n N --add NEW...` on a RAID 1 of two, as mdadm does
/// it: md's takeover to a two-member RAID 5 ([`change_level`]), then the
/// RAID 5's grow to N members (`grow`). What the grow would refuse about
/// the count and the new members is checked before the takeover, so bad
/// input changes nothing; a crash during the grow leaves a two-member
/// RAID 5 growing, which `grow --continue` finishes.
pub fn raid1_to_raid5_grown(
    members: &[String],
    options: &super::GrowOptions,
    progress: &mut dyn FnMut(super::GrowProgress),
) -> Result<super::Grown> {
    let all: Vec<String> = members.iter().chain(&options.add).cloned().collect();
    check_distinct_specs(&all)?;
    let taken_over = {
        let found = super::record::open_members(members, options.direct)?;
        if let Some((member, _)) = found.iter().find(|(_, sb)| is_reshaping(sb)) {
            return Err(Error::Unsupported {
                spec: member.spec().into(),
                what: "a level change while a reshape is in progress: finish it first with `nvraid grow --continue`".into(),
            });
        }
        // The same command run again after a crash in the takeover: it is
        // finished first (the new members were checked before it began).
        let found = match finish_interrupted(found, 5)? {
            Ok(_) => return super::grow::grow(members, options, progress),
            Err(found) => found,
        };
        let (reference, _) = check_whole(&found, "changes the level of", "changing the level of")?;
        let spec = found[0].0.spec().to_string();
        let geometry = crate::assemble::geometry_of(&reference, &spec)?;
        let n = reference.raid_disks;
        // A RAID 5 of two (the takeover done, the grow not begun) grows.
        let taken_over = reference.level == 5 && n == 2;
        if !(reference.level == 1 || taken_over) || n != 2 {
            return Err(Error::Unsupported {
                spec,
                what: format!(
                    "a {} of {n} members as a RAID 5 with members added: md takes only a RAID 1 of exactly two members over as RAID 5 (then grows it)",
                    geometry.level()
                ),
            });
        }
        if options.add.is_empty() || options.raid_devices != 2 + options.add.len() as u32 {
            return Err(Error::BadOption {
                option: "--raid-devices".into(),
                why: format!(
                    "{} with {} member(s) added: a RAID 1 of two becomes a RAID 5 of two, grown by one member per --add (so --raid-devices is 2 + the --add count)",
                    options.raid_devices,
                    options.add.len()
                ),
            });
        }
        let raid5 = if taken_over {
            geometry.clone()
        } else {
            let chunk = raid1_takeover_chunk(geometry.array_bytes()).ok_or_else(|| Error::Unsupported {
                spec: spec.clone(),
                what: format!(
                    "a RAID 1 of {} bytes as a RAID 5: md takes a RAID 1 over with the largest chunk up to 64 KiB that divides the array, and no chunk of 4 KiB or more divides this one",
                    geometry.array_bytes()
                ),
            })?;
            nvraid_layout::Geometry::new(
                Level::Raid5 {
                    layout: ParityLayout::LeftSymmetric,
                },
                2,
                chunk,
                geometry.array_bytes(),
            )
            .map_err(|e| Error::NotStartable(e.to_string()))?
        };
        let open = nvraid_member::OpenOptions {
            write: true,
            create_bytes: None,
            direct: options.direct,
            ..Default::default()
        };
        for spec in &options.add {
            let member = nvraid_member::Member::open(spec, open)?;
            super::grow::check_new_member(&member, &reference, &raid5, options.force)?;
        }
        taken_over
    };
    if !taken_over {
        change_level(members, 5, options.direct)?;
    }
    super::grow::grow(members, options, progress)
}
