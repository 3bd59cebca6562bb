//! `grow --chunk` / `--layout`: a RAID 4/5/6 or RAID 10 near restriped
//! in place with the same members, offline, in md's format (md's
//! `new_chunk`/`new_layout` with a moved data offset, no backup file).
//! A RAID 0's chunk changes as md's RAID 4 of one more member with its
//! parity missing (`takeover`), restriped forwards without parity and
//! taken back to RAID 0 at the end. mdadm's `--layout normalise` takes a
//! RAID 6 out of a `-6` layout; `preserve` keeps the layout.
//!
//! With the member count kept, every member row holds the same array
//! bytes in both shapes, so the gap between the rows already written in
//! the new shape and those still to be read in the old one never widens:
//! each step moves at most as many member bytes as the data offset moved
//! (`Reshape::step_is_safe`), and the kernel continues such a reshape only
//! when the offset moved by at least the larger of the two chunks
//! (`Reshape::md_can_continue`). So the offset moves far, as mdadm moves
//! it: about half the room on the side with more of it.
//!
//! - **Direction.** As mdadm chooses (`set_new_data_offset` with no member
//!   added): down (forwards, from the array's start) when there is more
//!   room before the data than after it, otherwise up (backwards, from the
//!   end, md's `RESHAPE_BACKWARDS`); when the side with more room still
//!   has less than the larger chunk, the other side is tried (mdadm would
//!   take a backup file there instead). A RAID 10 near the same way.
//! - **Checks**, before any write: a whole, clean array (the grow's
//!   checks); a level md restripes (not RAID 1, RAID 10 far/offset; RAID
//!   0 through its RAID 4); a layout md accepts for the level (a RAID 10
//!   keeps its copies, md's raid4 its one layout, a RAID 0 none); a chunk
//!   md accepts, which keeps the array's size (md wants the array a
//!   multiple of the new chunk); room.
//! - **The record**: every member's superblock gets `RESHAPE_ACTIVE |
//!   NEW_OFFSET` (and `RESHAPE_BACKWARDS` moving up), `delta_disks` 0,
//!   `new_layout`, `new_chunk`, `new_offset`, and `reshape_position` 0
//!   (forwards) or the array's end (backwards); events + 1, a bitmap's
//!   header first. Moving up, a member's `data_size` is first raised to
//!   what the device holds past the data offset (mdadm raises it too).
//! - **Steps and the end** are the grow's (`grow::run`) forwards; moving
//!   up, [`run_backwards`] reads each step's bytes from the old shape and
//!   writes the new shape's stripes above them. The finished record takes
//!   the new chunk and layout as the array's (`grow::finish_record`).
//!   `grow --continue` finishes either direction.

use super::backup::Backup;
use super::grow::{
    check_whole, finish_record, floor_of, kept_bitmap, move_logs, old_shape, publish_bitmap,
    reshape_at, run, write_superblocks, GrowProgress, Grown, Placed,
};
use super::step::{read_through, write_copy_rows, write_stripes};
use crate::assemble::{check_distinct_specs, member_data_bytes};
use crate::error::{Error, Result};
use crate::intent::MemberBitmap;
use nvraid_layout::parity::ParityLayout;
use nvraid_layout::{Direction, Geometry, Level, Reshape};
use nvraid_member::Member;
use nvraid_metadata::{features, Superblock, Timestamp};

/// How to restripe.
#[derive(Clone, Debug)]
pub struct ShapeOptions {
    /// The new chunk size in bytes (`None`: keep it).
    pub chunk_bytes: Option<u64>,
    /// The new layout, in md's names (`None`: keep it).
    pub layout: Option<String>,
    /// Open the members with O_DIRECT.
    pub direct: bool,
    /// The most array bytes one step moves.
    pub step_bytes: u64,
}

/// Whether `reshape` keeps the member count and changes the chunk or the
/// layout (what [`change_shape`] records).
pub(super) fn is_in_place(reshape: &Reshape) -> bool {
    let (old, new) = (reshape.old(), reshape.new_shape());
    old.members() == new.members()
        && (old.level() != new.level() || old.chunk_bytes() != new.chunk_bytes())
}

/// The level `old` becomes with `layout` (md's names), or why md would not
/// make it. `md_level` is the superblock's level number (md's raid4 is 4).
pub(super) fn new_level(
    old: Level,
    md_level: i32,
    layout: Option<&str>,
    spec: &str,
) -> Result<Level> {
    let refuse = |what: String| Error::Unsupported {
        spec: spec.into(),
        what,
    };
    match old {
        // Its chunk only: taken over as md's RAID 4 (`change_shape`).
        Level::Raid0 if layout.is_some_and(|l| l != "preserve") => {
            return Err(refuse(
                "changing the layout of a raid0 (md's RAID 0 has no layout to restripe to; its chunk changes with --chunk)".into(),
            ))
        }
        Level::Raid0 => return Ok(old),
        Level::Raid1 => {
            return Err(refuse(
                "changing the chunk or layout of a raid1 (a mirror has neither; md refuses too)".into(),
            ))
        }
        Level::Raid10Far { .. } => {
            return Err(refuse(format!(
                "changing the chunk or layout of a {old} (md reshapes only the near layout of RAID 10, and nvraid too)"
            )))
        }
        _ => {}
    }
    let Some(text) = layout else {
        return Ok(old);
    };
    let bad = |why: String| Error::BadOption {
        option: "--layout".into(),
        why,
    };
    // mdadm's two words: `preserve` keeps the layout (a chunk change
    // only), `normalise` takes a RAID 6 from a `-6` layout (Q on the last
    // member, what md's RAID 5 -> 6 takeover leaves) to the ordinary one
    // of the same rotation (P and Q rotating).
    match text {
        "preserve" => return Ok(old),
        "normalise" | "normalize" => {
            return match old {
                Level::Raid6 {
                    layout: ParityLayout::Raid5With6(rotation),
                } => Ok(Level::Raid6 {
                    layout: ordinary_of(rotation),
                }),
                Level::Raid6 { .. } => Err(bad(format!(
                    "{text}: the {old} is in an ordinary layout already (normalise takes a RAID 6 out of a -6 layout)"
                ))),
                _ => Err(bad(format!(
                    "{text} applies to a RAID 6 in a -6 layout (md's layouts with Q on the last member), not to a {old}"
                ))),
            };
        }
        _ => {}
    }
    match old {
        Level::Raid10 { near } => match old.with_layout(text).map_err(bad)? {
            Level::Raid10 { near: n } if n == near => Ok(old),
            Level::Raid10 { near: n } => Err(refuse(format!(
                "changing a raid10 from {near} copies to {n} (md never changes the number of copies when it reshapes a RAID 10)"
            ))),
            Level::Raid10Far { offset: false, .. } => Err(refuse(
                "reshaping a raid10 to the far layout (md refuses: it reshapes to near or offset only)".into(),
            )),
            other => Err(refuse(format!(
                "reshaping a raid10 to {other} (md can switch near to offset; nvraid restripes the near layout only)"
            ))),
        },
        Level::Raid5 { .. } if md_level == 4 => Err(refuse(
            "changing the layout of md's raid4 (it has one: parity on the last member); make it a raid5 first (`nvraid grow --level 5`), then change the layout".into(),
        )),
        Level::Raid5 { .. } => Level::Raid5 {
            layout: ParityLayout::LeftSymmetric,
        }
        .with_layout(text)
        .map_err(bad),
        Level::Raid6 { .. } => old.with_layout(text).map_err(bad),
        _ => unreachable!("refused above"),
    }
}

/// The ordinary RAID 6 layout (P and Q rotating) of a `-6` layout's
/// rotation, as mdadm's `--layout normalise` picks it.
fn ordinary_of(rotation: nvraid_layout::parity::Raid5Rotation) -> ParityLayout {
    use nvraid_layout::parity::Raid5Rotation as R;
    match rotation {
        R::LeftAsymmetric => ParityLayout::LeftAsymmetric,
        R::RightAsymmetric => ParityLayout::RightAsymmetric,
        R::LeftSymmetric => ParityLayout::LeftSymmetric,
        R::RightSymmetric => ParityLayout::RightSymmetric,
        R::ParityFirst => ParityLayout::ParityFirst,
    }
}

/// Why a RAID 0's restripe must move its data offset down (see
/// [`choose_move`]).
pub(super) const RAID0_FORWARDS_ONLY: &str = "a RAID 0's restripe (md's RAID 4 with its parity missing) moves the data offset down by at least that, and cannot here";

/// The new shape of a restripe of `old` to `level` in chunks of `chunk`
/// bytes (`None`: the old chunk) over members holding `member_bytes` of
/// data each, and that chunk; refused, with the option named, when nothing
/// changes (`layout_given`: the layout was asked for), when the chunk is
/// one md does not take, or when the array would change size (md wants
/// the array a multiple of the new chunk). The offline restripe's checks,
/// which the served one (`live_shape`) makes too.
pub(super) fn new_geometry(
    old: &Geometry,
    level: Level,
    chunk: Option<u64>,
    layout_given: bool,
    member_bytes: u64,
    spec: &str,
) -> Result<(Geometry, u64)> {
    let old_chunk = old.chunk_bytes().expect("the levels restriped have chunks");
    let chunk = chunk.unwrap_or(old_chunk);
    if level == old.level() && chunk == old_chunk {
        return Err(Error::BadOption {
            option: if layout_given { "--layout" } else { "--chunk" }.into(),
            why: format!(
                "the array is already a {level} in chunks of {chunk} bytes: nothing to change"
            ),
        });
    }
    let new =
        Geometry::new(level, old.members(), chunk, member_bytes).map_err(|e| Error::BadOption {
            option: "--chunk".into(),
            why: e.to_string(),
        })?;
    if new.array_bytes() != old.array_bytes() {
        return Err(Error::Unsupported {
            spec: spec.into(),
            what: format!(
                "chunks of {chunk} bytes on this array: each member holds {} bytes of data, not a whole number of the new chunks, so the array would shrink from {} to {} bytes (md wants the array a multiple of the new chunk); shrink it first (`nvraid grow --size`) or pick a smaller chunk",
                old.member_used_bytes(),
                old.array_bytes(),
                new.array_bytes()
            ),
        });
    }
    Ok((new, chunk))
}

/// Restripe the RAID 4/5/6 or RAID 10 near on `members` (every member, any
/// order) to `options`' chunk and layout, in place.
pub fn change_shape(
    members: &[String],
    options: &ShapeOptions,
    progress: &mut dyn FnMut(GrowProgress),
) -> Result<Grown> {
    check_distinct_specs(members)?;
    let found = super::record::open_members(members, options.direct)?;
    if let Some((member, sb)) = found.iter().find(|(_, sb)| super::record::is_reshaping(sb)) {
        return Err(Error::Unsupported {
            spec: member.spec().into(),
            what: format!(
                "a second reshape while one is in progress (at {} of {} members): finish it first with `nvraid grow --continue`",
                sb.reshape_position * 512,
                sb.raid_disks
            ),
        });
    }
    let (reference, roles) = check_whole(&found, "reshapes", "reshaping")?;
    let spec = found[roles[0]].0.spec().to_string();
    let old = old_shape(&reference, &spec)?;
    let level = new_level(
        old.level(),
        reference.level,
        options.layout.as_deref(),
        &spec,
    )?;
    // A RAID 0 is restriped as md does it: taken over as a RAID 4 of one
    // more member (parity-last, the parity member missing: each data
    // chunk where the RAID 0 keeps it), that restriped without parity,
    // and taken back to RAID 0 at the end (`takeover`).
    let raid0_layout = (old.level() == Level::Raid0).then_some(reference.layout);
    let (old, level) = match raid0_layout {
        Some(_) => {
            let raid4 = super::takeover::raid0_as_raid4(&found, &old)?;
            let level = raid4.level();
            (raid4, level)
        }
        None => (old, level),
    };
    let member_bytes = match raid0_layout {
        Some(_) => old.member_used_bytes(),
        None => member_data_bytes(&reference),
    };
    let (new, chunk) = new_geometry(
        &old,
        level,
        options.chunk_bytes,
        options.layout.is_some(),
        member_bytes,
        &spec,
    )?;
    let bitmap = kept_bitmap(found.iter().map(|(m, sb)| (m, sb)), &old)?;
    let bitmap_bytes = bitmap.as_ref().map(|b| b.storage.len() as u64);
    // A RAID 0's restripe runs forwards only: nvraid reads around a
    // missing member (its RAID 4's parity) only forwards.
    let held: Vec<(&Member, &Superblock)> = found.iter().map(|(m, sb)| (m, sb)).collect();
    let forwards_only = raid0_layout.map(|_| RAID0_FORWARDS_ONLY);
    let (direction, moved_sectors) = choose_move(&held, &old, &new, bitmap_bytes, forwards_only)?;
    drop(held);
    let mut slots: Vec<Option<(Member, Superblock)>> = found.into_iter().map(Some).collect();
    let mut placed: Vec<Placed> = roles
        .iter()
        .map(|&i| {
            let (member, sb) = slots[i].take().expect("one member per role");
            Placed { member, sb }
        })
        .collect();
    if direction == Direction::Forwards {
        move_logs(&mut placed, bitmap_bytes)?;
    }
    let events = reference.events + 1;
    // The layout word kept as it is when the layout is (md's raid4 keeps
    // its own).
    let new_layout = if raid0_layout.is_some() || level != old.level() {
        level.md_layout()
    } else {
        reference.layout
    };
    let position = match direction {
        Direction::Forwards => 0,
        Direction::Backwards => old.array_bytes(),
    };
    for p in placed.iter_mut() {
        let sb = &mut p.sb;
        if raid0_layout.is_some() {
            super::takeover::record_as_raid4(sb, old.member_used_bytes());
            sb.raid_disks = old.members();
        }
        sb.feature_map |= features::RESHAPE_ACTIVE | features::NEW_OFFSET;
        sb.delta_disks = 0;
        sb.new_level = sb.level as u32;
        sb.new_layout = new_layout;
        sb.new_chunk = (chunk / 512) as u32;
        sb.reshape_position = position / 512;
        match direction {
            Direction::Forwards => {
                sb.feature_map &= !features::RESHAPE_BACKWARDS;
                sb.new_offset = (-(moved_sectors as i64)) as i32 as u32;
            }
            Direction::Backwards => {
                sb.feature_map |= features::RESHAPE_BACKWARDS;
                sb.new_offset = moved_sectors as u32;
                let held = (p.member.size_bytes() / 512).saturating_sub(sb.data_offset_sectors);
                sb.data_size_sectors = sb.data_size_sectors.max(held);
            }
        }
        sb.events = events;
        sb.utime = Timestamp::now();
    }
    let mut bitmap = bitmap;
    let all: Vec<usize> = (0..placed.len()).collect();
    if let Some(b) = bitmap.as_mut() {
        publish_bitmap(&placed, &all, b, events)?;
    }
    write_superblocks(&placed, &all, bitmap.as_mut())?;
    let mut failed = super::degraded::Failed::none(old.members() as usize);
    if raid0_layout.is_some() {
        // The RAID 4's parity role has no member: a stand-in, never read
        // or written.
        failed.missing(placed.len());
        let sb = placed[0].sb.clone();
        placed.push(Placed {
            member: super::degraded::stand_in()?,
            sb,
        });
    }
    let reshape = reshape_at(&placed, position)?;
    debug_assert_eq!(reshape.new_shape(), &new);
    match direction {
        Direction::Forwards => run(
            placed,
            failed,
            reshape,
            options.step_bytes,
            bitmap,
            raid0_layout,
            progress,
        ),
        Direction::Backwards => {
            run_backwards(placed, reshape, options.step_bytes, bitmap, progress)
        }
    }
}

/// Which way the data offset moves and by how many sectors, as mdadm
/// chooses with no member added: towards the side with more room (before
/// the data, above md's floor: the superblock, the bitmap, a bad-block log
/// that stays; after it, up to the device's end), by about half that room
/// (at least the larger chunk, in 4 KiB); the other side when that one has
/// less than the larger chunk.
pub(super) fn choose_move(
    found: &[(&Member, &Superblock)],
    old: &Geometry,
    new: &Geometry,
    bitmap_bytes: Option<u64>,
    forwards_only: Option<&str>,
) -> Result<(Direction, u64)> {
    let min = old
        .chunk_bytes()
        .unwrap_or(0)
        .max(new.chunk_bytes().unwrap_or(0))
        / 512;
    let used = old.member_used_bytes() / 512;
    let mut before = u64::MAX;
    let mut after = u64::MAX;
    for (member, sb) in found {
        let (floor, _) = floor_of(sb, bitmap_bytes);
        before = before.min(sb.data_offset_sectors.saturating_sub(floor));
        let end = member.size_bytes() / 512;
        after = after.min(end.saturating_sub(sb.data_offset_sectors + used));
    }
    let first = if before > after {
        Direction::Forwards
    } else {
        Direction::Backwards
    };
    let room = |d: Direction| match d {
        Direction::Forwards => before,
        Direction::Backwards => after,
    };
    let other = match first {
        Direction::Forwards => Direction::Backwards,
        Direction::Backwards => Direction::Forwards,
    };
    let Some(direction) = [first, other]
        .into_iter()
        .filter(|&d| forwards_only.is_none() || d == Direction::Forwards)
        .find(|&d| room(d) >= min)
    else {
        if let Some(why) = forwards_only {
            return Err(Error::NotStartable(format!(
                "the members have {} bytes free before the data{}, less than the larger chunk ({} bytes): {why}",
                before * 512,
                match bitmap_bytes {
                    Some(len) => format!(" (above a write-intent bitmap of {len} bytes)"),
                    None => String::new(),
                },
                min * 512
            )));
        }
        return Err(Error::NotStartable(format!(
            "the members have {} bytes free before the data{} and {} after it, less than the larger chunk ({} bytes) on both sides: nvraid moves the data offset by at least that instead of keeping a backup file, and cannot here",
            before * 512,
            match bitmap_bytes {
                Some(len) => format!(" (above a write-intent bitmap of {len} bytes)"),
                None => String::new(),
            },
            after * 512,
            min * 512
        )));
    };
    let moved = (room(direction) / 2).max(min) / 8 * 8;
    Ok((direction, moved.max(min)))
}

/// A backwards step of a RAID 10 near restripe, from the recorded
/// position down to `to`: the new shape's whole rows that hold the chunks
/// `[to, position)`, each chunk read from where the record says it is
/// (below the position in the old shape; a row's chunks from the position
/// on are already in the new one and are written back as they are; zeros
/// past the array's end), written at the new data offset; every member
/// flushed. The rows lie above every old row still live (the caller
/// checked `Reshape::step_is_safe(to)`), so a crash inside the step loses
/// nothing.
fn copy_rows_down(reshape: &Reshape, members: &[&Member], to: u64, hit: &dyn Fn()) -> Result<()> {
    let new = reshape.new_shape();
    let chunk = new.chunk_bytes().expect("RAID 10 has chunks");
    let n = u64::from(new.members());
    let near = u64::from(new.copies());
    let first_row = (to / chunk) * near / n;
    let end_row = (reshape.position().div_ceil(chunk) * near).div_ceil(n);
    let first_chunk = first_row * n / near;
    let end_chunk = (end_row * n).div_ceil(near);
    let start = first_chunk * chunk;
    let mut data = nvraid_io::AlignedBuf::zeroed(((end_chunk - first_chunk) * chunk) as usize);
    let readable = reshape
        .array_bytes()
        .min(end_chunk * chunk)
        .saturating_sub(start);
    if readable > 0 {
        read_through(reshape, members, &mut data[..readable as usize], start)?;
    }
    // Every member is there (a restripe refuses a degraded array).
    write_copy_rows(reshape, members, first_row..end_row, &data, &[], hit)
        .map_err(|failure| failure.error)
}

/// The steps of a reshape running backwards (from the recorded position
/// down to the array's start) with the member count kept, each as large
/// as `Reshape::step_is_safe` allows and md would continue from, at most
/// `step_bytes`: the bytes read from the old shape, the new shape's
/// stripes written at the new data offset, every member flushed, then the
/// position recorded; then the finished shape.
pub(super) fn run_backwards(
    placed: Vec<Placed>,
    reshape: Reshape,
    step_bytes: u64,
    bitmap: Option<MemberBitmap>,
    progress: &mut dyn FnMut(GrowProgress),
) -> Result<Grown> {
    run_backwards_backed(placed, reshape, step_bytes, bitmap, None, progress)
}

/// [`run_backwards`] of a shrink in place (the kernel's, its data offset
/// kept): a step no step is safe for (its critical section, near the
/// start) moves one new stripe, the rows it overwrites kept in `backup`
/// first (`backup`, on the members that leave).
pub(super) fn run_backwards_backed(
    mut placed: Vec<Placed>,
    mut reshape: Reshape,
    step_bytes: u64,
    mut bitmap: Option<MemberBitmap>,
    backup: Option<Backup>,
    progress: &mut dyn FnMut(GrowProgress),
) -> Result<Grown> {
    let level = reshape.new_shape().level();
    let shrinking = super::shrink::is_shrink(&reshape);
    if !(is_in_place(&reshape) || shrinking)
        || !(level.parity_chunks() > 0 || matches!(level, Level::Raid10 { .. }))
    {
        return Err(Error::Unsupported {
            spec: placed[0].member.spec().into(),
            what: "a reshape running backwards other than a chunk or layout change of a RAID 4/5/6 or RAID 10 near (a shrink); let the kernel finish it (mdadm --assemble)".into(),
        });
    }
    let started = std::time::Instant::now();
    let start = reshape.position();
    let end = reshape.array_bytes();
    let unit = reshape.position_unit();
    let step_bytes = step_bytes.max(unit);
    let kernel = nvraid_parity::Kernel::best();
    let done = |p: u64| GrowProgress {
        position_bytes: end - p,
        end_bytes: end,
    };
    progress(done(start));
    while reshape.position() > 0 {
        let p = reshape.position();
        let to = match super::shrink::backwards_step(&reshape, step_bytes) {
            Some(to) => to,
            None => match &backup {
                Some(b) if b.is_held() => {
                    let to = p.saturating_sub(unit);
                    b.save(&placed, &[], &reshape, to)
                        .map_err(|failure| failure.error)?;
                    to
                }
                _ => {
                    return Err(Error::NotStartable(format!(
                        "no step down from {p} is safe (the data offset moved too little); nothing below it was written"
                    )))
                }
            },
        };
        let members: Vec<&Member> = placed.iter().map(|p| &p.member).collect();
        let hit = || crate::failpoint::hit("reshape-write");
        if reshape.new_shape().level().parity_chunks() == 0 {
            copy_rows_down(&reshape, &members, to, &hit)?;
        } else {
            // Every byte below the position is still in the old shape.
            let mut data = nvraid_io::AlignedBuf::zeroed((p - to) as usize);
            read_through(&reshape, &members, &mut data, to)?;
            let new = reshape.new_shape();
            let new_unit = new.chunk_bytes().expect("parity levels have chunks")
                * u64::from(new.members() - new.level().parity_chunks());
            // A restripe runs with every member (its checks refuse a
            // degraded array): a member failing stops it at the position
            // recorded.
            write_stripes(&reshape, &members, to / new_unit, &data, &[], kernel, &hit)
                .map_err(|failure| failure.error)?;
        }
        if to > 0 {
            for p in placed.iter_mut() {
                p.sb.reshape_position = to / 512;
                p.sb.events += 1;
                p.sb.utime = Timestamp::now();
            }
            write_superblocks(
                &placed,
                &(0..placed.len()).collect::<Vec<_>>(),
                bitmap.as_mut(),
            )?;
        }
        reshape = reshape
            .at(to)
            .map_err(|e| Error::NotStartable(e.to_string()))?;
        progress(done(to));
    }
    let new_members = reshape.new_shape().members();
    for p in placed.iter_mut() {
        finish_record(&mut p.sb);
        if shrinking {
            super::shrink::release_leaving(&mut p.sb, new_members);
        }
        p.sb.events += 1;
        p.sb.utime = Timestamp::now();
    }
    write_superblocks(
        &placed,
        &(0..placed.len()).collect::<Vec<_>>(),
        bitmap.as_mut(),
    )?;
    Ok(Grown {
        raid_disks_before: reshape.old().members(),
        raid_disks: reshape.new_shape().members(),
        size_bytes_before: reshape.old().array_bytes(),
        size_bytes: end,
        data_offset_bytes: placed[0].sb.data_offset_sectors * 512,
        moved_bytes: start,
        seconds: started.elapsed().as_secs_f64(),
        events: placed[0].sb.events,
        failed: Vec::new(),
    })
}
