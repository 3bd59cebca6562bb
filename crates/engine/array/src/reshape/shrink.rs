//! `grow -n N` with fewer members than the array has: a RAID 4/5/6 or a
//! RAID 10 near shrunk by members, offline, in md's format (a backwards
//! reshape), and a RAID 5 of more than two members taken to RAID 1
//! through it.
//!
//! md shrinks this way: the array's size is cut first (mdadm's
//! `--grow --array-size`) so the data fits the smaller shape, then the
//! reshape runs from the end towards the start (`delta_disks` < 0, which
//! md reads as `RESHAPE_BACKWARDS`) with the data offset moved up
//! (`new_offset` > 0), so every step writes the new shape's rows above the
//! old shape's rows still live and no backup is needed; the members that
//! leave become spares.
//!
//! 1. **Checks**, before any write: a whole, clean RAID 4/5/6 or RAID 10
//!    near (the grow's checks: md refuses a degraded one too), no reshape
//!    recorded, a count the level allows (two members for RAID 4/5, four
//!    for RAID 6, one per copy for RAID 10), and
//!    `--array-size` given and no larger than what the smaller shape holds
//!    (without it the command names that size and the filesystem check to
//!    make). A filesystem the array starts with (ext2/3/4, XFS) that its own
//!    superblock says is larger than `--array-size` is refused unless
//!    `force`. Room after the data on every member for the offset's move:
//!    at least a chunk (four chunks, at least 256 KiB, when there is room).
//! 2. **The record**: every member's superblock gets `RESHAPE_ACTIVE |
//!    NEW_OFFSET | RESHAPE_BACKWARDS`, `raid_disks` the new count,
//!    `delta_disks` negative, `reshape_position` the new shape's size (md's
//!    start of a backwards reshape: the array is that size while it runs),
//!    `new_offset` the move up, `data_size` raised to what the device holds
//!    past the data offset; events + 1, a bitmap's header first (its bits
//!    count member rows, which a shrink does not change).
//! 3. **Steps and the end** are `shape::run_backwards`'s: each step reads
//!    its bytes from the old shape and writes the new shape's stripes at the
//!    new offset, every member flushed, then the position recorded. The
//!    finished record marks the roles that left as spares in every role
//!    table ([`release_leaving`]), as md leaves them.
//!
//! `grow --continue` finishes an interrupted shrink (`grow::continue_grow`).
//! The kernel's own shrink with the data offset kept (mdadm's backup file)
//! has steps near the start that are not crash-safe by themselves: those
//! keep the rows they overwrite on the members that leave first
//! (`backup`); any other backwards reshape whose steps are not all safe
//! is refused before anything is written ([`check_steps`]).

use super::grow::{
    check_whole, kept_bitmap, old_shape, publish_bitmap, reshape_at, write_superblocks,
    GrowProgress, Grown, Placed,
};
use super::record::{is_reshaping, open_members};
use super::step::read_through;
use crate::assemble::{check_distinct_specs, level_of, member_data_bytes};
use crate::error::{Error, Result};
use nvraid_layout::{Geometry, Level, Reshape};
use nvraid_member::Member;
use nvraid_metadata::{features, Role, Superblock, Timestamp};
use serde::Serialize;

/// How to shrink.
#[derive(Clone, Debug)]
pub struct ShrinkOptions {
    /// The member count after the shrink (mdadm's `--raid-devices`).
    pub raid_devices: u32,
    /// The size the array's data fits in (mdadm's `--array-size`), at most
    /// what the smaller shape holds; `None` refuses, naming that size.
    pub array_size: Option<u64>,
    /// Shrink though a filesystem at the array's start says it is larger
    /// than `array_size`.
    pub force: bool,
    /// Open the members with O_DIRECT.
    pub direct: bool,
    /// The most array bytes one step moves.
    pub step_bytes: u64,
}

/// What [`shrink`] did.
#[derive(Clone, Debug, Serialize)]
pub struct Shrunk {
    #[serde(flatten)]
    pub grown: Grown,
    /// The members that left the array, now spares in every role table.
    pub spares: Vec<String>,
}

/// Whether `reshape` removes members from a RAID 4/5/6 or RAID 10 near
/// (level, layout and chunk kept): what [`shrink`] records.
pub(super) fn is_shrink(reshape: &Reshape) -> bool {
    let (old, new) = (reshape.old(), reshape.new_shape());
    new.members() < old.members()
        && old.level() == new.level()
        && old.chunk_bytes() == new.chunk_bytes()
        && (old.level().parity_chunks() > 0 || matches!(old.level(), Level::Raid10 { .. }))
}

/// The fewest members md runs a level with after a shrink (a RAID 10
/// near layout: one member per copy).
fn fewest(level: Level) -> u32 {
    match level {
        Level::Raid10 { near } => near.max(2),
        _ if level.parity_chunks() == 2 => 4,
        _ => 2,
    }
}

/// Shrink the RAID 4/5/6 or RAID 10 near on `members` (every member, any order) to
/// `options.raid_devices` members.
pub fn shrink(
    members: &[String],
    options: &ShrinkOptions,
    progress: &mut dyn FnMut(GrowProgress),
) -> Result<Shrunk> {
    check_distinct_specs(members)?;
    let found = open_members(members, options.direct)?;
    if let Some((member, sb)) = found.iter().find(|(_, sb)| is_reshaping(sb)) {
        return Err(Error::Unsupported {
            spec: member.spec().into(),
            what: format!(
                "a second reshape while one is in progress (at {} of {} members): finish it first with `nvraid grow --continue`",
                sb.reshape_position * 512,
                sb.raid_disks
            ),
        });
    }
    let (reference, roles) = check_whole(&found, "shrinks", "shrinking")?;
    let spec = found[roles[0]].0.spec().to_string();
    let level = level_of(&reference, &spec)?;
    refuse_level(level, &spec)?;
    let old = old_shape(&reference, &spec)?;
    let new = smaller_shape(
        level,
        &old,
        options.raid_devices,
        &reference,
        options.array_size,
    )?;
    let (n, new_size) = (new.members(), new.array_bytes());
    let array_size = options.array_size.expect("checked by smaller_shape");
    let chunk = old
        .chunk_bytes()
        .expect("RAID 4/5/6 and RAID 10 have chunks");
    let bitmap = kept_bitmap(found.iter().map(|(m, sb)| (m, sb)), &old)?;
    let held: Vec<(&Member, &Superblock)> = found.iter().map(|(m, sb)| (m, sb)).collect();
    let moved = room_after(&held, &old, chunk)?;
    let mut slots: Vec<Option<(Member, Superblock)>> = found.into_iter().map(Some).collect();
    let mut placed: Vec<Placed> = roles
        .iter()
        .map(|&i| {
            let (member, sb) = slots[i].take().expect("one member per role");
            Placed { member, sb }
        })
        .collect();
    let events = reference.events + 1;
    for p in placed.iter_mut() {
        let sb = &mut p.sb;
        sb.feature_map |=
            features::RESHAPE_ACTIVE | features::NEW_OFFSET | features::RESHAPE_BACKWARDS;
        sb.raid_disks = n;
        sb.delta_disks = (i64::from(n) - i64::from(old.members())) as i32 as u32;
        sb.new_level = sb.level as u32;
        sb.new_layout = sb.layout;
        sb.new_chunk = sb.chunk_sectors;
        sb.reshape_position = new_size / 512;
        sb.new_offset = moved as u32;
        let held = (p.member.size_bytes() / 512).saturating_sub(sb.data_offset_sectors);
        sb.data_size_sectors = sb.data_size_sectors.max(held);
        sb.events = events;
        sb.utime = Timestamp::now();
    }
    let reshape = reshape_at(&placed, new_size)?;
    debug_assert_eq!(reshape.new_shape(), &new);
    {
        let members: Vec<&Member> = placed.iter().map(|p| &p.member).collect();
        check_filesystem(&reshape, &members, array_size, options.force)?;
    }
    check_steps(&reshape, options.step_bytes, &spec)?;
    let spares: Vec<String> = placed[n as usize..]
        .iter()
        .map(|p| p.member.spec().to_string())
        .collect();
    let mut bitmap = bitmap;
    let all: Vec<usize> = (0..placed.len()).collect();
    if let Some(b) = bitmap.as_mut() {
        publish_bitmap(&placed, &all, b, events)?;
    }
    write_superblocks(&placed, &all, bitmap.as_mut())?;
    let grown = super::shape::run_backwards(placed, reshape, options.step_bytes, bitmap, progress)?;
    Ok(Shrunk { grown, spares })
}

/// A shrink of `level` refused by name (RAID 0, RAID 1, RAID 10 far or
/// offset), the offline and the served shrink alike; `spec` names the
/// array.
pub(super) fn refuse_level(level: Level, spec: &str) -> Result<()> {
    let refuse = |what: String| Error::Unsupported {
        spec: spec.to_string(),
        what,
    };
    match level {
        Level::Raid0 => Err(refuse(
            "shrinking a raid0 by members (md reshapes a RAID 0 only forwards, as a RAID 4 gaining members; nvraid shrinks RAID 4/5/6 and RAID 10 near): copy the data to a smaller array".into(),
        )),
        Level::Raid1 => Err(refuse(
            "fewer mirrors of a raid1 by --raid-devices (md lowers a RAID 1's count only once the extra mirrors were failed and removed; nvraid shrinks RAID 4/5/6 and RAID 10 near by members)".into(),
        )),
        Level::Raid10Far { offset, .. } => Err(refuse(format!(
            "shrinking a raid10 {} layout by members (md reshapes a RAID 10 only in its near layout; nvraid shrinks RAID 4/5/6 and RAID 10 near): copy the data to a smaller array",
            if offset { "offset" } else { "far" }
        ))),
        Level::Raid10 { .. } | Level::Raid5 { .. } | Level::Raid6 { .. } => Ok(()),
    }
}

/// The shape `old` (of `level`, its superblock `reference`) takes with
/// `n` members, checked: fewer members than now and no fewer than the
/// level runs with, and `array_size` given and no larger than the smaller
/// shape holds (refused naming that size and the filesystem to shrink).
pub(super) fn smaller_shape(
    level: Level,
    old: &Geometry,
    n: u32,
    reference: &Superblock,
    array_size: Option<u64>,
) -> Result<Geometry> {
    if n >= old.members() || n < fewest(level) {
        return Err(Error::BadOption {
            option: "--raid-devices".into(),
            why: format!(
                "{n} for the {level} of {} members: a shrink goes to fewer members, at least {} for this level (to add members give one --add per new member)",
                old.members(),
                fewest(level)
            ),
        });
    }
    let chunk = old
        .chunk_bytes()
        .expect("RAID 4/5/6 and RAID 10 have chunks");
    let new = Geometry::new(level, n, chunk, member_data_bytes(reference))?;
    let new_size = new.array_bytes();
    let Some(array_size) = array_size else {
        return Err(Error::BadOption {
            option: "--array-size".into(),
            why: format!(
                "shrinking the {level} from {} to {n} members cuts the array from {} to {new_size} bytes, and every byte past that is lost: first make the data fit in the first {new_size} bytes (a filesystem shrunk below it, e.g. `e2fsck -f` then `resize2fs DEVICE {}K` for ext4; XFS cannot shrink), then say so with --array-size {new_size} (mdadm's --grow --array-size); nothing was written",
                old.members(),
                old.array_bytes(),
                new_size / 1024
            ),
        });
    };
    if array_size > new_size {
        return Err(Error::BadOption {
            option: "--array-size".into(),
            why: format!(
                "{array_size} bytes do not fit the {level} of {n} members, which holds {new_size} bytes: shrink the data below {new_size} bytes first, or keep more members; nothing was written"
            ),
        });
    }
    Ok(new)
}

/// Take the RAID 5 of more than two members on `members` to two
/// (`options.raid_devices` must be 2), the shrink md makes before it takes
/// a RAID 5 over as RAID 1. `None` when there is nothing to shrink (not a
/// RAID 5, or two members already): the takeover alone then decides.
pub fn shrink_to_two(
    members: &[String],
    options: &ShrinkOptions,
    progress: &mut dyn FnMut(GrowProgress),
) -> Result<Option<Shrunk>> {
    let found = open_members(members, options.direct)?;
    let Some((_, sb)) = found.iter().max_by_key(|(_, sb)| sb.events) else {
        return Ok(None);
    };
    if is_reshaping(sb) || sb.level != 5 || sb.raid_disks <= 2 {
        return Ok(None);
    }
    if options.raid_devices != 2 {
        return Err(Error::BadOption {
            option: "--raid-devices".into(),
            why: format!(
                "{} with --level 1: md takes a RAID 5 over as RAID 1 with two members, so it is shrunk to 2 first",
                options.raid_devices
            ),
        });
    }
    drop(found);
    shrink(members, options, progress).map(Some)
}

/// How far (sectors) the data offset moves up: the room after the data
/// on every member (to the device's end, past the rows the array uses),
/// at most four chunks (at least 256 KiB, as a grow moves it down), in
/// whole 4 KiB; refused below one chunk.
pub(super) fn room_after(
    found: &[(&Member, &Superblock)],
    old: &Geometry,
    chunk: u64,
) -> Result<u64> {
    let used = old.member_used_bytes() / 512;
    let mut room = (4 * chunk).max(256 << 10) / 512;
    for (member, sb) in found {
        let end = member.size_bytes() / 512;
        room = room.min(end.saturating_sub(sb.data_offset_sectors + used));
    }
    let room = room / 8 * 8;
    if room < chunk / 512 {
        return Err(Error::NotStartable(format!(
            "the members have {} bytes free after the data (each uses {} bytes from its data offset), less than one chunk of {chunk} bytes: a shrink moves the data offset up by at least that so that it needs no backup, and cannot here; free the room first by using less of each member (`nvraid grow --size SIZE --force`, which also cuts the array's end; the data must fit below it)",
            room * 512,
            old.member_used_bytes()
        )));
    }
    Ok(room)
}

/// A filesystem at the array's start larger than `array_size`, by its own
/// superblock (ext2/3/4, XFS): refused unless `force`, naming it and the
/// check to make.
pub(super) fn check_filesystem(
    reshape: &Reshape,
    members: &[&Member],
    array_size: u64,
    force: bool,
) -> Result<()> {
    let len = 4096.min(reshape.array_bytes());
    let mut head = nvraid_io::AlignedBuf::zeroed(4096);
    read_through(reshape, members, &mut head[..len as usize], 0)?;
    let Some((what, bytes)) = filesystem_bytes(&head) else {
        return Ok(());
    };
    if bytes > array_size && !force {
        return Err(Error::BadOption {
            option: "--array-size".into(),
            why: format!(
                "the array holds {what} of {bytes} bytes (by its superblock), larger than --array-size {array_size}: shrinking would cut it off; shrink the filesystem first (ext4: `e2fsck -f`, then `resize2fs DEVICE {}K`; XFS cannot shrink), or give --force if it is not in use; nothing was written",
                array_size / 1024
            ),
        });
    }
    Ok(())
}

/// The size a filesystem's superblock at the start of `head` gives it.
fn filesystem_bytes(head: &[u8]) -> Option<(&'static str, u64)> {
    let le32 = |at: usize| u32::from_le_bytes(head[at..at + 4].try_into().unwrap());
    if head.len() >= 4096 && head[1080..1082] == [0x53, 0xef] {
        let sb = 1024;
        let lo = u64::from(le32(sb + 4));
        let log = le32(sb + 24).min(16);
        // INCOMPAT_64BIT: the block count's high half.
        let hi = if le32(sb + 0x60) & 0x80 != 0 {
            u64::from(le32(sb + 0x150))
        } else {
            0
        };
        return Some((
            "an ext2/3/4 filesystem",
            ((hi << 32) | lo).saturating_mul(1024 << log),
        ));
    }
    if head.len() >= 16 && &head[..4] == b"XFSB" {
        let block = u64::from(u32::from_be_bytes(head[4..8].try_into().unwrap()));
        let blocks = u64::from_be_bytes(head[8..16].try_into().unwrap());
        return Some(("an XFS filesystem", blocks.saturating_mul(block)));
    }
    None
}

/// The position a backwards step from `reshape`'s position goes down to:
/// the lowest at most `step_bytes` below it (in the position's unit) whose
/// step is crash-safe (`Reshape::step_is_safe`) and from where md would
/// continue (`Reshape::md_can_continue`); `None` when no step down is safe.
pub(super) fn backwards_step(reshape: &Reshape, step_bytes: u64) -> Option<u64> {
    let p = reshape.position();
    let unit = reshape.position_unit();
    let mut to = p.saturating_sub(step_bytes.max(unit)) / unit * unit;
    loop {
        let kernel_ok = to == 0 || reshape.at(to).is_ok_and(|r| r.md_can_continue());
        if to < p && reshape.step_is_safe(to) && kernel_ok {
            return Some(to);
        }
        if to + unit >= p {
            return None;
        }
        to += unit;
    }
}

/// Check, before anything is written, that a backwards reshape can step
/// from its position down to the start, each step crash-safe: the
/// kernel's shrink with the data offset kept cannot (its last stripes
/// need mdadm's backup file).
pub(super) fn check_steps(reshape: &Reshape, step_bytes: u64, spec: &str) -> Result<()> {
    let mut at = reshape.clone();
    while at.position() > 0 {
        let Some(to) = backwards_step(&at, step_bytes) else {
            return Err(Error::Unsupported {
                spec: spec.into(),
                what: format!(
                    "continuing this backwards reshape ({} to {} members, at {} bytes): below {} bytes no step is crash-safe without a backup of the stripes it overwrites (the data offset did not move far enough; md kept them in mdadm's backup file), which nvraid does not keep; let the kernel finish it (`mdadm --assemble --backup-file FILE`); nothing was written",
                    reshape.old().members(),
                    reshape.new_shape().members(),
                    reshape.position(),
                    at.position()
                ),
            });
        };
        at = at.at(to).map_err(|e| Error::NotStartable(e.to_string()))?;
    }
    Ok(())
}

/// The finished record of a shrink: the roles past the new member count
/// are spares in `sb`'s role table (md's mark for the members that left).
pub(super) fn release_leaving(sb: &mut Superblock, new_members: u32) {
    for raw in sb.roles_raw.iter_mut() {
        if matches!(Role::from_raw(*raw), Role::Active(r) if u32::from(r) >= new_members) {
            *raw = Role::Spare.to_raw();
        }
    }
}
