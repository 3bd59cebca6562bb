//! `grow`: add members to a RAID 0 (as md's RAID 4, `takeover`), a RAID
//! 4/5/6 or a RAID 10 near, offline, in
//! md's format, the way md reshapes with v1.2 metadata and no backup file
//! (a RAID 1's new mirrors: `mirror`).
//!
//! 1. Every check comes first (a whole, clean array of a parity level
//!    or RAID 10 near, or with `force` a RAID 4/5/6 missing members its
//!    parity covers, read around as `degraded` reads around a failed one;
//!    without
//!    PPL or journal; new members large enough and blank; room
//!    before the data to move it, above a write-intent bitmap, or else,
//!    for RAID 4/5/6, new members with room for a backup of the critical
//!    section (`backup`: the grow runs in place); a refusal writes
//!    nothing.
//! 2. The reshape is recorded: each new member gets an empty bad-block log
//!    and the array's superblock with its role, then every member's
//!    superblock gets `RESHAPE_ACTIVE | NEW_OFFSET`, the new member count
//!    (`raid_disks`, `delta_disks`), the new shape (`new_level`,
//!    `new_layout`, `new_chunk`, the same as the old), `reshape_position`
//!    0 and `new_offset`: the data offset moves down by the room found
//!    (at most 4 MiB), so the new shape's rows are written below the old
//!    shape's live rows and no backup is needed.
//!
//! A write-intent bitmap is kept, as md keeps it: for RAID 4/5/6 its bits
//! count member rows, and adding members changes neither a member's rows
//! nor the bitmap's size. Each new member gets the bitmap (the union of
//! the members' bits) before its superblock, and every superblock write
//! is preceded by the bitmap header's with the same events count, so md
//! and nvraid believe the bits after any crash. The reshape's own writes
//! set no bits (md's do not either): a step is redone from the old shape
//! after a crash, and each new stripe's parity is computed whole.
//! A RAID 10's bits count array bytes instead: its bitmap is resized for
//! the larger array as md resizes it when its grow starts (`bitmap`: the
//! chunk doubled while the bits do not fit the sectors the bitmap had),
//! written whole to every member before any superblock records the
//! reshape; its header keeps the old size until the end, as md's does.
//! 3. Steps: each moves whole new stripes (`step::move_rows`), as large as
//!    `Reshape::step_is_safe` allows and md would continue from
//!    (`Reshape::md_can_continue`), at most `step_bytes`; the members are
//!    flushed, then the new position is written to every superblock
//!    (events + 1). A crash anywhere leaves a position whose bytes are all
//!    in place: `grow --continue` (or the kernel's md) resumes there.
//! 4. Past the old shape's end the new rows get zeros and their parity (md
//!    does the same); then the superblocks record the finished shape: the
//!    data offset is the new one, the data area that much larger, the
//!    reshape fields cleared.

use super::backup::{Backup, Saved};
use super::backup_file::BackupFile;
use super::degraded::{checkpoint, record_failure, Failed};
use super::md_backup::MdBackup;
use super::record::{is_reshaping, reshape_of};
use super::step::{move_rows, Unreadable};
use crate::assemble::{check_distinct_specs, member_data_bytes};
use crate::decision::{decide, SetAside};
use crate::error::{Error, Result};
use crate::intent::{bitmap_at, merge_bitmaps, read_member_bitmap, MemberBitmap};
use crate::slot::{read_superblock, write_superblock};
use nvraid_layout::{Direction, Geometry, Level, Reshape};
use nvraid_member::{Member, OpenOptions};
use nvraid_metadata::{features, Role, Superblock, Timestamp, RESYNC_CLEAN};
use serde::Serialize;

/// The most the data offset is moved: four chunks, at least 256 KiB (as
/// mdadm moves it), leaving the rest of the room for later reshapes. The
/// first step moves as many stripes as the offset moved by chunks; the
/// steps grow from there, as the new shape's rows fall behind the old's.
fn move_max_bytes(chunk_bytes: u64) -> u64 {
    (4 * chunk_bytes).max(256 << 10)
}

/// How to grow.
#[derive(Clone, Debug)]
pub struct GrowOptions {
    /// The member count after the grow (mdadm's `--raid-devices`).
    pub raid_devices: u32,
    /// The members to add, in the order their roles are given.
    pub add: Vec<String>,
    /// Open the members with O_DIRECT.
    pub direct: bool,
    /// Use new members that carry a filesystem or another array; grow a
    /// degraded RAID 4/5/6 (roles missing that its parity covers).
    pub force: bool,
    /// The most array bytes one step moves (default 16 MiB).
    pub step_bytes: u64,
}

/// Where a reshape stands, for progress reports.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct GrowProgress {
    /// The recorded position (array bytes in the new shape).
    pub position_bytes: u64,
    /// Where the reshape ends (the new shape's size).
    pub end_bytes: u64,
}

/// What [`grow`] or [`continue_grow`] did.
#[derive(Clone, Debug, Serialize)]
pub struct Grown {
    pub raid_disks_before: u32,
    pub raid_disks: u32,
    /// The array's size before and after.
    pub size_bytes_before: u64,
    pub size_bytes: u64,
    /// Where the data starts on each member now (bytes).
    pub data_offset_bytes: u64,
    /// Bytes of the array this run moved (from where it started).
    pub moved_bytes: u64,
    pub seconds: f64,
    pub events: u64,
    /// Members that failed (or were missing) during the reshape, recorded
    /// faulty in the others' superblocks: the array is degraded.
    pub failed: Vec<String>,
}

/// A member in the reshape, by role.
pub(super) struct Placed {
    pub(super) member: Member,
    pub(super) sb: Superblock,
}

/// Add `options.add` to the RAID 4/5/6 on `members` (every active member,
/// any order) and reshape it to `options.raid_devices` members.
pub fn grow(
    members: &[String],
    options: &GrowOptions,
    progress: &mut dyn FnMut(GrowProgress),
) -> Result<Grown> {
    grow_inner(members, options, None, progress)
}

/// [`grow`] with mdadm's `--backup-file`: a RAID 4/5/6 grown in place
/// keeps its critical section in the file `backup_file` too (made new,
/// `backup_file`), or only there when the new members have no room for
/// nvraid's backup area. A grow that can move its data offset needs no
/// backup and ignores the file, as mdadm does (it is not made).
pub fn grow_with_backup_file(
    members: &[String],
    options: &GrowOptions,
    backup_file: &std::path::Path,
    progress: &mut dyn FnMut(GrowProgress),
) -> Result<Grown> {
    grow_inner(members, options, Some(backup_file), progress)
}

fn grow_inner(
    members: &[String],
    options: &GrowOptions,
    backup_file: Option<&std::path::Path>,
    progress: &mut dyn FnMut(GrowProgress),
) -> Result<Grown> {
    let all: Vec<String> = members.iter().chain(&options.add).cloned().collect();
    check_distinct_specs(&all)?;
    let open = OpenOptions {
        write: true,
        create_bytes: None,
        direct: options.direct,
        ..Default::default()
    };
    let mut found = Vec::with_capacity(members.len());
    for spec in members {
        let member = Member::open(spec, open)?;
        let sb = read_superblock(&member)?;
        found.push((member, sb));
    }
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
    let found = match super::mirror::widened_before(found, options)? {
        Ok(widened) => return super::mirror::fill_mirrors(members, widened, options, progress),
        Err(found) => found,
    };
    let (reference, old_roles) = check_array(&found, options)?;
    let old_geometry = old_shape(&reference, found[0].0.spec())?;
    if old_geometry.level() == Level::Raid1 {
        return super::mirror::add_mirrors(
            members,
            found,
            &reference,
            &old_geometry,
            options,
            progress,
        );
    }
    // A RAID 0 grows as md grows one: taken over as a RAID 4 of one more
    // member, its parity missing, and back (`takeover`).
    let raid0_layout = (old_geometry.level() == Level::Raid0).then_some(reference.layout);
    let (old_count, old_geometry) = match raid0_layout {
        Some(_) => (
            old_geometry.members(),
            super::takeover::raid0_as_raid4(&found, &old_geometry)?,
        ),
        None => (old_geometry.members(), old_geometry),
    };
    let raid_disks = options.raid_devices + u32::from(raid0_layout.is_some());
    let member_rows = old_geometry.member_used_bytes();
    let mut bitmap = kept_bitmap(found.iter().map(|(m, sb)| (m, sb)), &old_geometry)?;
    let new_geometry = Geometry::new(
        old_geometry.level(),
        raid_disks,
        old_geometry
            .chunk_bytes()
            .expect("parity levels and RAID 10 have chunks"),
        match raid0_layout {
            Some(_) => member_rows,
            None => member_data_bytes(&reference),
        },
    )?;
    if let Some(b) = bitmap.as_mut() {
        raid10_bitmap_for(b, &old_geometry, &new_geometry);
        let held: Vec<(&Member, &Superblock)> = found.iter().map(|(m, sb)| (m, sb)).collect();
        super::bitmap::check_fits(b.at, b.storage.len() as u64, &held)?;
    }
    let bitmap_bytes = bitmap.as_ref().map(|b| b.storage.len() as u64);
    let mut adding = Vec::with_capacity(options.add.len());
    for spec in &options.add {
        let member = Member::open(spec, open)?;
        check_new_member(&member, &reference, &old_geometry, options.force)?;
        adding.push(member);
    }
    // No room to move the data offset: a RAID 4/5/6 grows in place, the
    // critical section kept in a backup area on the new members (`backup`).
    // With a backup file and new members too small for that area, the
    // file alone keeps the section (`backup_file`).
    let mut room_area = true;
    let moved_sectors = match room_to_move(&found, &reference, &old_geometry, bitmap_bytes) {
        Ok(moved) => Some(moved),
        Err(_) if raid0_layout.is_none() && old_geometry.level().parity_chunks() > 0 => {
            let room = super::backup::room_bytes(&old_geometry);
            let need =
                reference.data_offset_sectors * 512 + room + old_geometry.member_used_bytes();
            if backup_file.is_some() && adding.iter().any(|m| m.size_bytes() < need) {
                room_area = false;
            } else if let Some(small) = adding.iter().find(|m| m.size_bytes() < need) {
                return Err(Error::TooSmall {
                    spec: small.spec().into(),
                    size_bytes: small.size_bytes(),
                    min_bytes: need,
                    reason: format!(
                        "the members have less than one chunk ({} bytes) free before the data to move it, so the grow runs in place, and each new member keeps a backup of the critical section ({room} bytes) below its data",
                        old_geometry.chunk_bytes().unwrap_or(0)
                    ),
                });
            }
            None
        }
        Err(no_room) => return Err(no_room),
    };
    // Members by role: the old ones, then the new ones.
    let mut slots: Vec<Option<(Member, Superblock)>> = found.into_iter().map(Some).collect();
    // A role missing (`grow --force` of a degraded array) gets a stand-in,
    // never read or written, and md's faulty mark in the role table.
    let mut missing_roles = Vec::new();
    let mut placed: Vec<Placed> = Vec::with_capacity(old_roles.len() + adding.len());
    for (role, index) in old_roles.iter().enumerate() {
        let Some(i) = *index else {
            let mut sb = reference.clone();
            if let Some(dev) = reference
                .roles_raw
                .iter()
                .position(|&raw| Role::from_raw(raw) == Role::Active(role as u16))
            {
                sb.dev_number = dev as u32;
            }
            missing_roles.push((role, sb.dev_number));
            placed.push(Placed {
                member: super::degraded::stand_in()?,
                sb,
            });
            continue;
        };
        let (member, sb) = slots[i].take().expect("one member per role");
        placed.push(Placed { member, sb });
    }
    if moved_sectors.is_some() {
        move_logs(&mut placed, bitmap_bytes)?;
    }
    let mut reference = reference;
    reference.bblog_offset = placed[0].sb.bblog_offset;
    let events = reference.events + 1;
    let free_slots = free_dev_numbers(&reference, adding.len())?;
    let mut table = reference.roles_raw.clone();
    for (k, dev) in free_slots.iter().enumerate() {
        table[*dev as usize] = Role::Active((old_count as usize + k) as u16).to_raw();
    }
    for &(role, dev) in &missing_roles {
        if table.get(dev as usize).map(|&raw| Role::from_raw(raw))
            == Some(Role::Active(role as u16))
        {
            table[dev as usize] = Role::Faulty.to_raw();
        }
    }
    let record = |sb: &mut Superblock| {
        if raid0_layout.is_some() {
            super::takeover::record_as_raid4(sb, member_rows);
        }
        sb.feature_map |= features::RESHAPE_ACTIVE;
        if let Some(moved) = moved_sectors {
            sb.feature_map |= features::NEW_OFFSET;
            sb.new_offset = (-(moved as i64)) as i32 as u32;
        }
        sb.raid_disks = raid_disks;
        sb.delta_disks = (options.raid_devices - old_count) as i32 as u32;
        sb.new_level = sb.level as u32;
        sb.new_layout = sb.layout;
        sb.new_chunk = sb.chunk_sectors;
        sb.reshape_position = 0;
        sb.roles_raw = table.clone();
        sb.events = events;
        sb.utime = Timestamp::now();
    };
    for (member, dev) in adding.into_iter().zip(free_slots) {
        let mut sb = new_member_superblock(&member, &reference, dev)?;
        if moved_sectors.is_none() && room_area {
            // Its data starts above the backup area.
            sb.data_offset_sectors += super::backup::room_bytes(&old_geometry) / 512;
            sb.data_size_sectors =
                (member.size_bytes() / 512).saturating_sub(sb.data_offset_sectors);
        }
        record(&mut sb);
        if raid0_layout.is_some() && placed.len() == old_count as usize {
            // The old shape's parity role: this member holds none of it.
            super::takeover::record_recovering(&mut sb);
        }
        placed.push(Placed { member, sb });
    }
    for p in placed.iter_mut().take(old_count as usize) {
        record(&mut p.sb);
    }
    let mut failed = Failed::none(raid_disks as usize);
    for &(role, _) in &missing_roles {
        failed.missing(role);
    }
    if raid0_layout.is_some() {
        // The new shape's parity role has no member: a stand-in, never
        // read or written.
        failed.absent_from_old(old_count as usize);
        failed.missing(placed.len());
        let sb = placed[0].sb.clone();
        placed.push(Placed {
            member: super::degraded::stand_in()?,
            sb,
        });
    }
    let reshape = reshape_at(&placed, 0)?;
    debug_assert_eq!(reshape.new_shape(), &new_geometry);
    let backup = match moved_sectors {
        Some(_) => None,
        None => Backup::of(&placed, &failed, &reshape),
    };
    // mdadm's backup file, made and filled before any member is written.
    let file = match (moved_sectors, backup_file) {
        (None, Some(path)) => {
            let mut f = BackupFile::create(path, reference.set_uuid, &reshape)?;
            if let Err(e) = f.write(&placed, &failed, &reshape) {
                let _ = std::fs::remove_file(path);
                return Err(e);
            }
            Some(f)
        }
        _ => None,
    };
    // New members first: a crash before the old members are recorded
    // leaves them one event ahead, which `grow --continue` finishes.
    for p in placed[old_count as usize..].iter() {
        crate::badlog::write_empty(&p.member, &p.sb)?;
    }
    if let Some(b) = &backup {
        b.clear(&placed)?;
        super::md_backup::clear(&placed, &b.hosts())?;
    }
    let order: Vec<usize> = (old_count as usize..placed.len())
        .chain(0..old_count as usize)
        .filter(|&i| !failed.is_failed(i))
        .collect();
    if let Some(b) = bitmap.as_mut() {
        publish_bitmap(&placed, &order, b, events)?;
    }
    write_superblocks(&placed, &order, bitmap.as_mut())?;
    run_backed_with(
        placed,
        failed,
        reshape,
        options.step_bytes,
        bitmap,
        raid0_layout,
        backup,
        file,
        progress,
    )
}

/// Continue the reshape recorded on `members` (every member of both
/// shapes, any order): from the freshest recorded position, after putting
/// the freshest record on every member (a crash while the record was
/// written leaves some members one event behind it).
pub fn continue_grow(
    members: &[String],
    direct: bool,
    step_bytes: u64,
    progress: &mut dyn FnMut(GrowProgress),
) -> Result<Grown> {
    continue_inner(members, direct, step_bytes, None, progress)
}

/// [`continue_grow`] with mdadm's `--backup-file`: a grow in place
/// stopped inside its critical section gets the section back from the
/// file (`backup_file`; checked as mdadm checks it, refused by name with
/// nothing written) before it goes on. A file the position does not need
/// is ignored, as mdadm ignores it; a missing one too, then.
pub fn continue_grow_with_backup_file(
    members: &[String],
    direct: bool,
    step_bytes: u64,
    backup_file: &std::path::Path,
    progress: &mut dyn FnMut(GrowProgress),
) -> Result<Grown> {
    continue_inner(members, direct, step_bytes, Some(backup_file), progress)
}

fn continue_inner(
    members: &[String],
    direct: bool,
    step_bytes: u64,
    backup_file: Option<&std::path::Path>,
    progress: &mut dyn FnMut(GrowProgress),
) -> Result<Grown> {
    check_distinct_specs(members)?;
    let (found, blanks) = open_or_blank(members, direct)?;
    let Some(mut reference) = found
        .iter()
        .filter(|(_, sb)| is_reshaping(sb))
        .max_by_key(|(_, sb)| sb.events)
        .map(|(_, sb)| sb.clone())
    else {
        return Err(Error::BadOption {
            option: "--continue".into(),
            why: "no member records a reshape in progress".into(),
        });
    };
    let roles = {
        let old = i64::from(reference.raid_disks) - i64::from(reference.delta_disks as i32);
        reference.raid_disks.max(old.max(0) as u32) as usize
    };
    let mut by_role: Vec<Option<Placed>> = (0..roles).map(|_| None).collect();
    for (member, sb) in found {
        let role = reference
            .roles_raw
            .get(sb.dev_number as usize)
            .map(|&raw| Role::from_raw(raw));
        let fresh = sb.set_uuid == reference.set_uuid && sb.events + 1 >= reference.events;
        match role {
            Some(Role::Active(r)) if fresh && (r as usize) < roles => {
                if by_role[r as usize].is_some() {
                    return Err(Error::SameRole {
                        spec: member.spec().into(),
                        other: by_role[r as usize].as_ref().expect("placed").member.spec().into(),
                        role: r,
                    });
                }
                by_role[r as usize] = Some(Placed { member, sb });
            }
            _ => {
                return Err(Error::NotStartable(format!(
                    "{} takes no part in the reshape recorded on the others (not an active member of array {}, or more than one event behind)",
                    member.spec(),
                    nvraid_metadata::format_uuid(&reference.set_uuid)
                )))
            }
        }
    }
    let adopted = adopt_blanks(&mut by_role, blanks, &reference)?;
    // A role missing (its member failed, or not given) is read around,
    // as md continues a degraded reshape, when the others hold every byte.
    let parity_unnamed = super::takeover::last_role_unnamed(&reference);
    let (mut placed, mut failed) = super::degraded::fill_missing(by_role, &mut reference)?;
    // md's RAID 4 of a RAID 0 grow: the member in the old parity role
    // holds none of the old shape, and the array goes back to RAID 0 at
    // the end, as mdadm takes it back. So does a RAID 0's restripe.
    let raid0_layout = super::takeover::raid0_takeover_of(&reference, &placed, &failed)
        .map(|old_parity| failed.absent_from_old(old_parity))
        .or_else(|| {
            super::takeover::raid0_restripe_of(&reference, &failed, parity_unnamed).then_some(())
        })
        .map(|()| Level::Raid0.md_layout());
    let all = failed.surviving();
    // A member fresher than the record that records no reshape got the
    // finished shape: every byte had moved before that was written, so
    // the finish is written on the others (their record would otherwise
    // be put back over it, with its old data offset).
    if let Some(done) = placed
        .iter()
        .filter(|p| !is_reshaping(&p.sb) && p.sb.events > reference.events)
        .map(|p| p.sb.events)
        .max()
    {
        let reshape = reshape_of(&reference, placed[0].member.spec(), &[])?;
        let mut bitmap = kept_bitmap(
            all.iter().map(|&i| (&placed[i].member, &placed[i].sb)),
            reshape.new_shape(),
        )?;
        let raid0 = placed
            .iter()
            .find(|p| p.sb.events == done && p.sb.level == 0)
            .map(|p| p.sb.layout);
        for p in placed.iter_mut() {
            if is_reshaping(&p.sb) {
                finish_record(&mut p.sb);
                if let Some(layout) = raid0 {
                    super::takeover::finish_as_raid0(&mut p.sb, layout);
                }
            }
            if super::shrink::is_shrink(&reshape) {
                // The members that left are spares in every table.
                super::shrink::release_leaving(&mut p.sb, reshape.new_shape().members());
            }
            p.sb.events = done + 1;
            p.sb.utime = Timestamp::now();
        }
        if let Some(b) = bitmap.as_mut() {
            publish_bitmap(&placed, &all, b, done + 1)?;
        }
        write_superblocks(&placed, &all, bitmap.as_mut())?;
        progress(GrowProgress {
            position_bytes: reshape.new_shape().array_bytes(),
            end_bytes: reshape.new_shape().array_bytes(),
        });
        return Ok(Grown {
            raid_disks_before: reshape.old().members(),
            raid_disks: reshape.new_shape().members(),
            size_bytes_before: reshape.old().array_bytes(),
            size_bytes: reshape.new_shape().array_bytes(),
            data_offset_bytes: placed[all[0]].sb.data_offset_sectors * 512,
            moved_bytes: 0,
            seconds: 0.0,
            events: done + 1,
            failed: failed.specs(&placed),
        });
    }
    let events = reference.events + 1;
    // The bitmap as the members hold it, each read against its own
    // superblock (one a step behind holds its bitmap of then).
    let bitmap_geometry = reshape_of(&reference, placed[0].member.spec(), &[])?
        .old()
        .clone();
    let mut bitmap = kept_bitmap(
        all.iter().map(|&i| (&placed[i].member, &placed[i].sb)),
        &bitmap_geometry,
    )?;
    for p in placed.iter_mut() {
        let own = p.sb.clone();
        p.sb = reference.clone();
        // Each member keeps what is its own. One the crash left without
        // the record takes the record's new offset and bad-block log place
        // (`grow` copied every log there before writing any record).
        p.sb.dev_number = own.dev_number;
        p.sb.device_uuid = own.device_uuid;
        p.sb.data_offset_sectors = own.data_offset_sectors;
        p.sb.data_size_sectors = own.data_size_sectors;
        if is_reshaping(&own) {
            p.sb.new_offset = own.new_offset;
            p.sb.bblog_offset = own.bblog_offset;
            p.sb.bblog_size = own.bblog_size;
            p.sb.bblog_shift = own.bblog_shift;
        } else if (reference.new_offset as i32) > 0 {
            // Moving the offset up, the record raised each data area to
            // what the device holds (`shape`): so for this one.
            let held = (p.member.size_bytes() / 512).saturating_sub(own.data_offset_sectors);
            p.sb.data_size_sectors = own.data_size_sectors.max(held);
        }
        // Its bad blocks and its recovery (md's RAID 4 of a RAID 0 grow
        // records the member in the old parity role recovering) are its own.
        let own_bits = features::BAD_BLOCKS | features::RECOVERY_OFFSET;
        p.sb.feature_map = (reference.feature_map & !own_bits) | (own.feature_map & own_bits);
        p.sb.recovery_offset = own.recovery_offset;
        p.sb.events = events;
        p.sb.utime = Timestamp::now();
    }
    let mut reshape = reshape_at(&placed, reference.reshape_position * 512)?;
    // A RAID 10's bitmap counts array bytes: md resized it for the new
    // shape when its grow started (and so did `grow`); resizing it again
    // changes nothing, and gives the image the new shape's bits.
    // A chunk or layout change (`shape`) keeps the array's size, and so
    // a RAID 10's bitmap too; it may run either way.
    let in_place = super::shape::is_in_place(&reshape);
    if let Some(b) = bitmap.as_mut() {
        raid10_bitmap_for(b, reshape.old(), reshape.new_shape());
        let held: Vec<(&Member, &Superblock)> = placed.iter().map(|p| (&p.member, &p.sb)).collect();
        super::bitmap::check_fits(b.at, b.storage.len() as u64, &held)?;
    }
    let grows = |level: Level| level.parity_chunks() > 0 || matches!(level, Level::Raid10 { .. });
    let same_shape = reshape.old().level() == reshape.new_shape().level()
        && reshape.old().chunk_bytes() == reshape.new_shape().chunk_bytes();
    let shrinking = super::shrink::is_shrink(&reshape);
    if !(in_place || shrinking || reshape.direction() == Direction::Forwards && same_shape)
        || !grows(reshape.old().level())
    {
        return Err(Error::Unsupported {
            spec: placed[0].member.spec().into(),
            what: format!(
                "continuing this reshape ({} of {} members to {} of {}, {}): nvraid continues a RAID 4/5/6 or RAID 10 near that gains members, a RAID 4/5/6 shrinking by members, and a chunk or layout change of either; let the kernel finish it (mdadm --assemble)",
                reshape.old().level(),
                reshape.old().members(),
                reshape.new_shape().level(),
                reshape.new_shape().members(),
                match reshape.direction() {
                    Direction::Forwards => "forwards",
                    Direction::Backwards => "backwards",
                }
            ),
        });
    }
    if reshape.direction() == Direction::Backwards && (0..placed.len()).any(|r| failed.is_failed(r))
    {
        return Err(Error::Unsupported {
            spec: placed[0].member.spec().into(),
            what: "continuing a reshape that runs backwards with members missing (nvraid reads around a missing member only forwards); give every member, or let the kernel finish it (mdadm --assemble)".into(),
        });
    }
    // A grow in place stopped inside its critical section: the rows its
    // last step may have been writing are put back from the backup (before
    // anything else is written: a spoiled backup refuses with none).
    let mut backup = Backup::of(&placed, &failed, &reshape);
    // mdadm's backup file, when given: checked (refused by name, nothing
    // written), its section written back in the new shape and the
    // position taken past it. Without one, a grow in place inside its
    // section with no backup area of nvraid's is refused, naming it.
    let mut file_used = false;
    if let Some(path) = backup_file {
        if let Some(to) = super::backup_file::restore(
            path,
            &placed,
            &failed,
            &reshape,
            &reference.set_uuid,
            reference.utime,
        )? {
            file_used = true;
            if to != reshape.position() {
                for p in placed.iter_mut() {
                    p.sb.reshape_position = to / 512;
                }
                reshape = reshape_at(&placed, to)?;
                backup = Backup::of(&placed, &failed, &reshape);
            }
        }
    } else if super::backup_file::inside_section(&reshape)
        && !backup.as_ref().is_some_and(Backup::is_held)
    {
        return Err(Error::BadOption {
            option: "--backup-file".into(),
            why: format!(
                "the reshape stands at {} bytes, inside the critical section of a grow in place whose section no member keeps (mdadm's, or `nvraid grow --backup-file`'s): give the file with `--backup-file FILE` (mdadm's backup on the new members' tails, without a file, is restored by `mdadm --assemble`); nothing was written",
                reshape.position()
            ),
        });
    }
    // A backwards reshape goes on only where every step down to the start
    // is crash-safe, or a backup keeps the steps that are not (a shrink in
    // place; checked before anything is written).
    if reshape.direction() == Direction::Backwards && !backup.as_ref().is_some_and(Backup::is_held)
    {
        super::shrink::check_steps(&reshape, step_bytes, placed[0].member.spec())?;
    }
    if let Some(b) = &backup {
        b.restore(&placed, &failed, &reshape)?;
    }
    for &role in &adopted {
        crate::badlog::write_empty(&placed[role].member, &placed[role].sb)?;
    }
    if let Some(b) = bitmap.as_mut() {
        publish_bitmap(&placed, &all, b, events)?;
    }
    write_superblocks(&placed, &all, bitmap.as_mut())?;
    if reshape.direction() == Direction::Backwards {
        return super::shape::run_backwards_backed(
            placed, reshape, step_bytes, bitmap, backup, progress,
        );
    }
    let grown = run_backed(
        placed,
        failed,
        reshape,
        step_bytes,
        bitmap,
        raid0_layout,
        backup,
        progress,
    )?;
    // Done with it, as mdadm is once the reshape is finished.
    if let (true, Some(path)) = (file_used, backup_file) {
        let _ = std::fs::remove_file(path);
    }
    Ok(grown)
}

/// Open every member of `specs` for writing and read its superblock; the
/// members with none (no md superblock's magic) and no other signature
/// apart, as blank (a new member whose superblock a crash kept `grow`
/// from writing).
#[allow(clippy::type_complexity)]
fn open_or_blank(
    specs: &[String],
    direct: bool,
) -> Result<(Vec<(Member, Superblock)>, Vec<Member>)> {
    let open = OpenOptions {
        write: true,
        create_bytes: None,
        direct,
        ..Default::default()
    };
    let (mut found, mut blanks) = (Vec::new(), Vec::new());
    for spec in specs {
        let member = Member::open(spec, open)?;
        match read_superblock(&member) {
            Ok(sb) => found.push((member, sb)),
            Err(Error::Superblock {
                source: nvraid_metadata::DecodeError::BadMagic { .. },
                ..
            }) if crate::detect_signature(&member)
                .map_err(|e| Error::io(member.spec(), e))?
                .is_none() =>
            {
                blanks.push(member)
            }
            Err(e) => return Err(e),
        }
    }
    Ok((found, blanks))
}

/// Give the blank members the roles of new members that have no member
/// (in role order, the blanks in the order given): a grow killed between
/// its new members' superblocks left them blank, with nothing written to
/// them yet (no step runs before every superblock records the reshape,
/// so the position is still 0). Each gets the superblock another new
/// member carries, with its own device slot, UUID and data size; nothing
/// is written here (`continue_grow` writes its empty bad-block log, the
/// bitmap and the superblock once every check is passed). Returns the
/// roles given. Refused, naming the blank member, past position 0 (its
/// role's bytes are then on a member not given) or with no role for it.
fn adopt_blanks(
    by_role: &mut [Option<Placed>],
    blanks: Vec<Member>,
    reference: &Superblock,
) -> Result<Vec<usize>> {
    if blanks.is_empty() {
        return Ok(Vec::new());
    }
    let old =
        (i64::from(reference.raid_disks) - i64::from(reference.delta_disks as i32)).max(0) as usize;
    let template = by_role
        .iter()
        .skip(old)
        .flatten()
        .map(|p| p.sb.clone())
        .next();
    let slot_of = |role: usize| {
        reference
            .roles_raw
            .iter()
            .position(|&raw| Role::from_raw(raw) == Role::Active(role as u16))
    };
    // (md's RAID 4 of a RAID 0 grow has a role no member ever holds.)
    let free: Vec<(usize, usize)> = (old..by_role.len())
        .filter(|&r| by_role[r].is_none())
        .filter_map(|r| slot_of(r).map(|dev| (r, dev)))
        .collect();
    let first = blanks[0].spec().to_string();
    let (Some(template), true, true) = (
        template,
        reference.reshape_position == 0,
        free.len() >= blanks.len(),
    ) else {
        return Err(Error::NotStartable(format!(
            "{first} has no md superblock; nvraid continues a reshape on a blank member only where the grow that added it stopped before its superblock was written (at position 0, another new member recorded; here the reshape is at {} bytes with {} new role(s) without a member): give the member that holds the role, or continue without it (degraded, where the level allows) and `nvraid add` it afterwards",
            reference.reshape_position * 512,
            free.len()
        )));
    };
    let mut adopted = Vec::new();
    for (member, (role, dev)) in blanks.into_iter().zip(free) {
        let mut sb = new_member_superblock(&member, &template, dev as u32)?;
        sb.events = reference.events;
        let needed = sb.data_offset_sectors * 512 + member_data_bytes(reference);
        if member.size_bytes() < needed {
            return Err(Error::TooSmall {
                spec: member.spec().into(),
                size_bytes: member.size_bytes(),
                min_bytes: needed,
                reason: format!("role {role} of the reshape recorded on the others"),
            });
        }
        by_role[role] = Some(Placed { member, sb });
        adopted.push(role);
    }
    Ok(adopted)
}

/// The reshape the members' superblocks record, at `position`.
pub(super) fn reshape_at(placed: &[Placed], position: u64) -> Result<Reshape> {
    let reference = &placed[0].sb;
    let mut sb = reference.clone();
    sb.reshape_position = position / 512;
    let by_role: Vec<Option<&Superblock>> = placed.iter().map(|p| Some(&p.sb)).collect();
    reshape_of(&sb, placed[0].member.spec(), &by_role)
}

/// The steps, the checkpoints and the end. Members in `failed` are read
/// around and not written; one failing on the way is recorded failed and
/// the step redone (`degraded`). With `raid0_layout`, the finished RAID 4
/// is taken back to RAID 0 of that layout (`takeover`).
pub(super) fn run(
    placed: Vec<Placed>,
    failed: Failed,
    reshape: Reshape,
    step_bytes: u64,
    bitmap: Option<MemberBitmap>,
    raid0_layout: Option<u32>,
    progress: &mut dyn FnMut(GrowProgress),
) -> Result<Grown> {
    run_backed(
        placed,
        failed,
        reshape,
        step_bytes,
        bitmap,
        raid0_layout,
        None,
        progress,
    )
}

/// The backup of the critical section's step of `reshape` to `to`
/// (`Backup::save`), going on around members that fail while it is
/// made: an old member whose rows cannot be read, or a new member whose
/// copy cannot be written, is recorded faulty (where the level can spare
/// it: md goes on degraded) and the copy is made again without it. Nothing
/// of the step has reached the old members yet, so nothing is put back.
/// Stops, the position recorded, when no new member is left to hold it.
fn save_backup(
    placed: &mut [Placed],
    failed: &mut Failed,
    reshape: &Reshape,
    backup: &mut Option<Backup>,
    mut bitmap: Option<&mut MemberBitmap>,
    to: u64,
) -> Result<Saved> {
    crate::failpoint::pause(
        "reshape-section",
        reshape.position(),
        to - reshape.position(),
    );
    loop {
        let Some(b) = backup.as_ref().filter(|b| b.is_held()) else {
            return Err(Error::NotStartable(format!(
                "every new member holding the backup of the critical section failed; the reshape stands at {} bytes, nothing past it written: bring one back and run `nvraid grow --continue`",
                reshape.position()
            )));
        };
        let (old, _) = failed.unreadable();
        match b.save(placed, &old, reshape, to) {
            Ok(saved) => return Ok(saved),
            Err(failure) => {
                record_failure(placed, failed, reshape, failure, bitmap.as_deref_mut())?;
                *backup = Backup::of(placed, failed, reshape);
            }
        }
    }
}

/// [`run`] of a grow in place: the steps no step is safe for (the
/// critical section) move one new stripe each, its overwritten rows kept
/// in `backup` first (`backup`).
#[allow(clippy::too_many_arguments)]
pub(super) fn run_backed(
    placed: Vec<Placed>,
    failed: Failed,
    reshape: Reshape,
    step_bytes: u64,
    bitmap: Option<MemberBitmap>,
    raid0_layout: Option<u32>,
    backup: Option<Backup>,
    progress: &mut dyn FnMut(GrowProgress),
) -> Result<Grown> {
    run_backed_with(
        placed,
        failed,
        reshape,
        step_bytes,
        bitmap,
        raid0_layout,
        backup,
        None,
        progress,
    )
}

/// [`run_backed`] with mdadm's backup file (`backup_file`), filled with
/// the whole section: no step crosses the section's end while it stands;
/// where nvraid keeps no backup area of its own, the steps inside the
/// section need no other (a crash there is undone from the file); it is
/// forgotten before the first step past the section and removed at the
/// end.
#[allow(clippy::too_many_arguments)]
pub(super) fn run_backed_with(
    mut placed: Vec<Placed>,
    mut failed: Failed,
    mut reshape: Reshape,
    step_bytes: u64,
    mut bitmap: Option<MemberBitmap>,
    raid0_layout: Option<u32>,
    mut backup: Option<Backup>,
    mut file: Option<BackupFile>,
    progress: &mut dyn FnMut(GrowProgress),
) -> Result<Grown> {
    let mut file_standing = file.is_some();
    let started = std::time::Instant::now();
    let start = reshape.position();
    let end = reshape.new_shape().array_bytes();
    let unit = reshape.position_unit();
    let step_bytes = step_bytes.max(unit);
    let kernel = nvraid_parity::Kernel::best();
    progress(GrowProgress {
        position_bytes: reshape.position(),
        end_bytes: end,
    });
    // mdadm's backup of the whole section beside nvraid's, when it fits
    // (`md_backup`): written before the section's first step, forgotten
    // before the first step past it; no step crosses its end meanwhile.
    let mut md = backup
        .as_ref()
        .and_then(|b| MdBackup::of(&placed, &failed, &reshape, &b.hosts()));
    if let Some(m) = &md {
        if let Err(failure) = m.write(&placed, &reshape) {
            md = None;
            record_failure(&mut placed, &mut failed, &reshape, failure, bitmap.as_mut())?;
            backup = Backup::of(&placed, &failed, &reshape);
        }
    }
    // The steps reuse their buffers (freed when the loop ends).
    let _kept = super::step::KeptBuffers::on_this_thread();
    while reshape.position() < end {
        let p = reshape.position();
        while let Some(m) = md.as_ref().filter(|m| p >= m.end()) {
            match m.forget(&placed, &failed) {
                Ok(()) => md = None,
                Err(failure) => {
                    record_failure(&mut placed, &mut failed, &reshape, failure, bitmap.as_mut())?;
                    backup = Backup::of(&placed, &failed, &reshape);
                }
            }
        }
        if let Some(f) = file.as_mut().filter(|f| file_standing && p >= f.end()) {
            f.forget()?;
            file_standing = false;
        }
        let mut to = (p + step_bytes).min(end);
        if to < end {
            to = to / unit * unit;
        }
        if let Some(m) = &md {
            to = to.min(m.end());
        }
        // Inside the section, the file alone keeping it: any step up to
        // its end (a crash is undone from the file).
        let by_file = match file.as_ref().filter(|_| file_standing) {
            Some(f) if !backup.as_ref().is_some_and(Backup::is_held) => {
                to = to.min(f.end());
                true
            }
            Some(f) => {
                to = to.min(f.end());
                false
            }
            None => false,
        };
        // In the critical section of a grow in place: one new stripe, its
        // rows kept first.
        let mut backed = None;
        loop {
            if by_file && to > p {
                break;
            }
            let kernel_ok = to == end || reshape.at(to).is_ok_and(|r| r.md_can_continue());
            if to > p && reshape.step_is_safe(to) && kernel_ok {
                break;
            }
            if to <= p + unit {
                match &backup {
                    Some(b) if b.is_held() => {
                        to = (p + unit).min(end);
                        backed = Some(save_backup(
                            &mut placed,
                            &mut failed,
                            &reshape,
                            &mut backup,
                            bitmap.as_mut(),
                            to,
                        )?);
                        break;
                    }
                    Some(_) => {
                        return Err(Error::NotStartable(format!(
                            "no step from {p} is safe without the backup of the critical section, and no new member holding it is left; nothing past it was written"
                        )))
                    }
                    None => {}
                }
                return Err(Error::NotStartable(format!(
                    "no step from {p} is safe (the data offset moved too little); nothing past it was written"
                )));
            }
            to = if to == end {
                (end - 1) / unit * unit
            } else {
                to - unit
            };
        }
        loop {
            let members: Vec<&Member> = placed.iter().map(|p| &p.member).collect();
            let (old, new) = failed.unreadable();
            let unreadable = Unreadable { old: &old, new };
            let moved = move_rows(&reshape, &members, unreadable, to, kernel, &|| {
                crate::failpoint::hit("reshape-write")
            });
            match moved {
                Ok(()) => break,
                // Recorded failed on the others, then the step redone
                // (from the kept rows, when the section's step was
                // part-way over them).
                Err(failure) => {
                    record_failure(&mut placed, &mut failed, &reshape, failure, bitmap.as_mut())?;
                    if by_file {
                        // Old rows of the step may be overwritten: the
                        // file puts the section back.
                        return Err(Error::NotStartable(format!(
                            "a member failed inside the critical section (recorded faulty); the reshape stands at {p} bytes: run `nvraid grow --continue --backup-file {}`",
                            file.as_ref().map(|f| f.path().display().to_string()).unwrap_or_default()
                        )));
                    }
                    if backup.is_some() {
                        backup = Backup::of(&placed, &failed, &reshape);
                    }
                    if let Some(saved) = &backed {
                        saved.put_back(&placed, &failed)?;
                        if !backup.as_ref().is_some_and(Backup::is_held) {
                            return Err(Error::NotStartable(format!(
                                "the member holding the backup of the critical section failed; the reshape stands at {p} bytes with its rows put back: bring it back and run `nvraid grow --continue`"
                            )));
                        }
                    }
                }
            }
        }
        if to < end {
            let data_members =
                reshape.new_shape().members() - reshape.new_shape().level().parity_chunks();
            for p in placed.iter_mut() {
                p.sb.reshape_position = to / 512;
                super::takeover::follow_position(&mut p.sb, to, data_members);
                p.sb.events += 1;
                p.sb.utime = Timestamp::now();
            }
            checkpoint(&mut placed, &mut failed, &reshape, bitmap.as_mut())?;
        }
        reshape = reshape
            .at(to)
            .map_err(|e| Error::NotStartable(e.to_string()))?;
        progress(GrowProgress {
            position_bytes: to,
            end_bytes: end,
        });
    }
    // The finished shape.
    let raid_disks_before = reshape.old().members();
    let size_bytes_before = reshape.old().array_bytes();
    if let Some(b) = bitmap.as_mut() {
        // md's header holds the array's resync size: the new shape's once
        // the reshape is done (a RAID 10's grows; the others' stay).
        if b.header.sync_size_sectors * 512 < reshape.new_shape().bitmap_space_bytes()
            && matches!(reshape.new_shape().level(), Level::Raid10 { .. })
        {
            b.header.sync_size_sectors = reshape.new_shape().bitmap_space_bytes() / 512;
        }
        if failed.surviving().len() == placed.len() {
            raid10_new_region_written(b, reshape.old(), reshape.new_shape());
        }
    }
    for p in placed.iter_mut() {
        finish_record(&mut p.sb);
        if let Some(layout) = raid0_layout {
            super::takeover::finish_as_raid0(&mut p.sb, layout);
        }
        p.sb.events += 1;
        p.sb.utime = Timestamp::now();
    }
    checkpoint(&mut placed, &mut failed, &reshape, bitmap.as_mut())?;
    if let Some(f) = &file {
        // Done with it, as mdadm is once the reshape is finished.
        let _ = std::fs::remove_file(f.path());
    }
    let survivor = failed.surviving().first().copied().unwrap_or(0);
    let raid0 = u32::from(raid0_layout.is_some());
    Ok(Grown {
        raid_disks_before: raid_disks_before - raid0,
        raid_disks: reshape.new_shape().members() - raid0,
        size_bytes_before,
        size_bytes: end,
        data_offset_bytes: placed[survivor].sb.data_offset_sectors * 512,
        moved_bytes: end - start,
        seconds: started.elapsed().as_secs_f64(),
        events: placed[survivor].sb.events,
        failed: match raid0_layout {
            // The RAID 4's parity role was never held.
            Some(_) => failed.specs(&placed[..placed.len() - 1]),
            None => failed.specs(&placed),
        },
    })
}

/// The finished shape in a member's superblock: its data at the new
/// offset (the data area that much larger), the new level, layout and
/// chunk taken as the array's, the reshape's fields cleared.
pub(super) fn finish_record(sb: &mut Superblock) {
    let moved = i64::from(sb.new_offset as i32);
    sb.level = sb.new_level as i32;
    sb.layout = sb.new_layout;
    sb.chunk_sectors = sb.new_chunk;
    sb.data_offset_sectors = (sb.data_offset_sectors as i64 + moved) as u64;
    sb.data_size_sectors = (sb.data_size_sectors as i64 - moved) as u64;
    sb.feature_map &= !(features::RESHAPE_ACTIVE
        | features::NEW_OFFSET
        | features::RESHAPE_BACKWARDS
        | features::RECOVERY_OFFSET);
    // A member the reshape filled (md's RAID 4 of a RAID 0 grow) is in
    // sync once it ends, as md records it.
    sb.recovery_offset = 0;
    sb.new_offset = 0;
    sb.delta_disks = 0;
    sb.reshape_position = 0;
    sb.new_level = 0;
    sb.new_layout = 0;
    sb.new_chunk = 0;
}

/// Write and flush the superblocks of `placed` in `order`, a crash point
/// after each. With a bitmap, each member's bitmap header (its first page)
/// goes first, carrying the events count of the superblock that follows:
/// a bitmap older than its superblock would be taken as all dirty (md
/// forces a full resync then), one newer is believed.
pub(super) fn write_superblocks(
    placed: &[Placed],
    order: &[usize],
    mut bitmap: Option<&mut MemberBitmap>,
) -> Result<()> {
    for &i in order {
        let p = &placed[i];
        if let Some(b) = bitmap.as_deref_mut() {
            write_bitmap(p, b, p.sb.events, PAGE)?;
        }
        write_superblock(&p.member, &p.sb)?;
        p.member
            .flush()
            .map_err(|e| Error::io(p.member.spec(), e))?;
        crate::failpoint::hit("reshape-superblock");
    }
    Ok(())
}

/// The bitmap's page: md reads and writes it in 4 KiB pages.
const PAGE: usize = 4096;

/// The array's write-intent bitmap to keep through the reshape: the union
/// of the bits of every member (each read against its own superblock: one
/// older than it, or marked stale, counts as all set, as md counts it),
/// over the bitmap's space of `geometry` (member rows for RAID 4/5/6, the
/// same in the old and the new shape). `None` when the members have none;
/// refused when only some have one, or theirs differ in chunk or place.
pub(super) fn kept_bitmap<'a>(
    members: impl Iterator<Item = (&'a Member, &'a Superblock)>,
    geometry: &Geometry,
) -> Result<Option<MemberBitmap>> {
    let mut kept: Option<MemberBitmap> = None;
    let mut with = None;
    let mut without = None;
    for (member, sb) in members {
        let Some(at) = bitmap_at(sb) else {
            without = Some(member.spec().to_string());
            continue;
        };
        with = Some(member.spec().to_string());
        let read = read_member_bitmap(member, sb, at, geometry, sb.events)?;
        kept = Some(match kept.take() {
            None => read,
            Some(merged) => {
                merge_bitmaps(merged, read, member.spec(), geometry.bitmap_space_bytes())?
            }
        });
    }
    if let (Some(spec), Some(other)) = (without, with) {
        return Err(Error::Unsupported {
            spec,
            what: format!(
                "a member without the md bitmap its array's other members have ({other} has one)"
            ),
        });
    }
    Ok(kept.map(|mut b| {
        b.header.state &= !nvraid_metadata::bitmap::STATE_STALE;
        b.header.sync_size_sectors = geometry.bitmap_space_bytes() / 512;
        b
    }))
}

/// Write the first `len` bytes of the bitmap image, its header carrying
/// `events`, at the bitmap's place on `p`'s member (not flushed).
fn write_bitmap(p: &Placed, bitmap: &mut MemberBitmap, events: u64, len: usize) -> Result<()> {
    bitmap.header.events = events;
    bitmap.header.encode(&mut bitmap.storage);
    let at = bitmap_at(&p.sb).expect("invariant: every member of a bitmap array has one") as u64;
    let len = len.min(bitmap.storage.len());
    p.member
        .write_at(&bitmap.storage[..len], at)
        .map_err(|e| Error::io(p.member.spec(), e))
}

/// The whole bitmap image, its header carrying `events`, to the members
/// of `placed` in `order` (the new ones have none yet), flushed; before
/// any of them records `events`.
pub(super) fn publish_bitmap(
    placed: &[Placed],
    order: &[usize],
    bitmap: &mut MemberBitmap,
    events: u64,
) -> Result<()> {
    for &i in order {
        let p = &placed[i];
        write_bitmap(p, bitmap, events, usize::MAX)?;
        p.member
            .flush()
            .map_err(|e| Error::io(p.member.spec(), e))?;
    }
    Ok(())
}

/// A RAID 10's bitmap (its bits count array bytes) resized for the larger
/// array `new` becomes, as md resizes it when the grow starts: the chunk
/// doubled while the bits do not fit (`bitmap::resized`). Its header keeps
/// the old size until the reshape is done, as md's does (the kernel writes
/// its resync size there, which grows at the end). Other levels' bitmaps
/// count member rows, which a grow does not change: left as they are.
///
/// The bits of the new region (past the old size) are set, on disk: md
/// marks that region for resync when it resizes the bitmap, but only in
/// its memory, so md finishing a grow nvraid started (or nvraid finishing
/// one md started after a crash) would otherwise leave the copies of the
/// region's rows no step wrote differing. nvraid's own finish clears them
/// ([`raid10_new_region_written`]): its steps wrote every copy.
pub(super) fn raid10_bitmap_for(b: &mut MemberBitmap, old: &Geometry, new: &Geometry) {
    let (from, to) = (old.bitmap_space_bytes(), new.bitmap_space_bytes());
    if !matches!(old.level(), Level::Raid10 { .. }) || to <= from {
        return;
    }
    *b = super::bitmap::resized(b, from, to);
    b.header.sync_size_sectors = from / 512;
    put_region_bits(b, from, to, true);
}

/// A RAID 10 grow finished by nvraid with every member written: the new
/// region's bits (set by [`raid10_bitmap_for`]) cleared, each copy of its
/// rows written by the steps.
fn raid10_new_region_written(b: &mut MemberBitmap, old: &Geometry, new: &Geometry) {
    let (from, to) = (old.bitmap_space_bytes(), new.bitmap_space_bytes());
    if matches!(old.level(), Level::Raid10 { .. }) && to > from {
        put_region_bits(b, from, to, false);
    }
}

/// Set or clear the bits of bitmap-space bytes `[from, to)`: the chunks
/// that start at or past `from` (a chunk holding bytes below `from` keeps
/// its bit as it is).
fn put_region_bits(b: &mut MemberBitmap, from: u64, to: u64, set: bool) {
    let chunk = u64::from(b.header.chunk_bytes);
    let bits = nvraid_metadata::bitmap::bits_for(to, b.header.chunk_bytes);
    for bit in from.div_ceil(chunk).min(bits)..bits {
        nvraid_metadata::bitmap::put_bit(&mut b.storage, bit, set);
    }
    if set && !from.is_multiple_of(chunk) {
        // The chunk holding the old end: the region's first bytes are in it.
        nvraid_metadata::bitmap::put_bit(&mut b.storage, from / chunk, true);
    }
}

/// The old shape the reference records.
pub(super) fn old_shape(reference: &Superblock, spec: &str) -> Result<Geometry> {
    crate::assemble::geometry_of(reference, spec)
}

/// Check that the array can grow as asked. Returns the reference
/// superblock and the index of the member in each role.
fn check_array(
    found: &[(Member, Superblock)],
    options: &GrowOptions,
) -> Result<(Superblock, Vec<Option<usize>>)> {
    let degraded = match options.force {
        true => Degraded::Forced,
        false => Degraded::WithoutForce,
    };
    let (reference, roles) = check_members(found, "grows", "growing", degraded)?;
    let spec = found[roles.iter().flatten().next().copied().unwrap_or(0)]
        .0
        .spec();
    let refuse = |what: String| Error::Unsupported {
        spec: spec.into(),
        what,
    };
    let level = crate::assemble::level_of(&reference, spec)?;
    if let Level::Raid10Far { .. } = level {
        return Err(refuse(format!(
            "growing a {level} (md reshapes only the near layout of RAID 10)"
        )));
    }
    let missing: Vec<usize> = (0..roles.len()).filter(|&r| roles[r].is_none()).collect();
    if !missing.is_empty() {
        // md's rule for a grow of a degraded array (`--force`): a RAID 4/5/6
        // whose parity covers the missing; the reshape reads around them.
        let geometry = old_shape(&reference, spec)?;
        let present: Vec<bool> = roles.iter().map(Option::is_some).collect();
        if level.parity_chunks() == 0 {
            return Err(refuse(format!(
                "growing a degraded {level} (role(s) {missing:?} missing; nvraid grows degraded only a RAID 4/5/6 whose parity covers the missing members, as md does: rebuild it first with `nvraid add`)"
            )));
        }
        if !geometry.has_every_byte(&present) {
            return Err(Error::NotStartable(format!(
                "the {level} lacks role(s) {missing:?}, more than its parity covers: it cannot grow (nor run)"
            )));
        }
    }
    let old = reference.raid_disks;
    let want = old as usize + options.add.len();
    if options.add.is_empty() || options.raid_devices as usize != want {
        return Err(Error::BadOption {
            option: "--raid-devices".into(),
            why: format!(
                "{} with {} member(s) added to {old}: give one --add per new member, {} in all",
                options.raid_devices,
                options.add.len(),
                want
            ),
        });
    }
    Ok((reference, roles))
}

/// The checks every change of shape makes first (`verb`: "grows",
/// `doing`: "growing", for the messages): the members make a whole array
/// (no role missing, none set aside, none being rebuilt), clean, without
/// md's partial parity log or write journal. Returns the reference
/// superblock and the index of the member in each role.
pub(super) fn check_whole(
    found: &[(Member, Superblock)],
    verb: &str,
    doing: &str,
) -> Result<(Superblock, Vec<usize>)> {
    let (reference, roles) = check_members(found, verb, doing, Degraded::Refused)?;
    let roles = roles.iter().map(|i| i.expect("checked")).collect();
    Ok((reference, roles))
}

/// Whether [`check_members`] lets roles be missing.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Degraded {
    /// Refused (every change of shape but a grow).
    Refused,
    /// A grow without `--force`: refused, naming it.
    WithoutForce,
    /// `grow --force`: allowed (the caller checks the level covers them).
    Forced,
}

/// [`check_whole`], with roles missing allowed as `degraded` says:
/// returns the index of the member in each role (`None`: missing).
fn check_members(
    found: &[(Member, Superblock)],
    verb: &str,
    doing: &str,
    degraded: Degraded,
) -> Result<(Superblock, Vec<Option<usize>>)> {
    let listed: Vec<(&str, &Superblock)> = found.iter().map(|(m, sb)| (m.spec(), sb)).collect();
    let decision = decide(&listed)?;
    let (ref_member, reference) = &found[decision.reference];
    let spec = ref_member.spec();
    let refuse = |what: String| Error::Unsupported {
        spec: spec.into(),
        what,
    };
    if let Some(role) = decision.roles.iter().position(Option::is_none) {
        match degraded {
            Degraded::Refused => return Err(Error::NotStartable(format!(
                "the array is degraded (role {role} is missing); nvraid {verb} only a whole array: rebuild it first (`nvraid add`)"
            ))),
            Degraded::WithoutForce => return Err(Error::NotStartable(format!(
                "the array is degraded (role {role} is missing); md grows a degraded RAID 4/5/6 only when told to (mdadm --grow --force): give --force to grow it degraded, reading around the missing member, or rebuild it first (`nvraid add`)"
            ))),
            Degraded::Forced => {}
        }
    }
    if let Some((index, why)) = decision.set_aside.first() {
        let why = match why {
            SetAside::Spare => {
                "a spare: give only the active members, and the new ones with --add".into()
            }
            other => other.reason(),
        };
        return Err(Error::NotStartable(format!(
            "{} takes no part in the array ({why}); nvraid {verb} only a whole array",
            found[*index].0.spec()
        )));
    }
    for (member, sb) in found {
        if sb.feature_map & (features::RECOVERY_OFFSET | features::RECOVERY_BITMAP) != 0 {
            return Err(Error::NotStartable(format!(
                "{} is being rebuilt; finish the rebuild first (`nvraid rebuild`)",
                member.spec()
            )));
        }
    }
    if reference.feature_map & (features::PPL | features::MULTIPLE_PPLS) != 0 {
        return Err(refuse(format!(
            "{doing} an array with md's partial parity log (md refuses to reshape it too; switch it to resync first with `nvraid grow --consistency-policy resync MEMBERS`, and back with `--consistency-policy ppl` after)"
        )));
    }
    if reference.feature_map & features::JOURNAL != 0 {
        return Err(refuse(format!(
            "{doing} an array with md's write journal (md refuses to reshape it too)"
        )));
    }
    if reference.resync_offset != RESYNC_CLEAN {
        return Err(Error::NotStartable(
            "the array is not clean (a resync is due); run `nvraid repair` first".into(),
        ));
    }
    Ok((reference.clone(), decision.roles.clone()))
}

/// A new member must hold the data area the others use, at the same data
/// offset, and carry nothing (unless forced).
pub(super) fn check_new_member(
    member: &Member,
    reference: &Superblock,
    old: &Geometry,
    force: bool,
) -> Result<()> {
    let min_bytes = reference.data_offset_sectors * 512 + old.member_used_bytes();
    if member.size_bytes() < min_bytes {
        return Err(Error::TooSmall {
            spec: member.spec().into(),
            size_bytes: member.size_bytes(),
            min_bytes,
            reason: format!(
                "the array's members use {} bytes from a data offset of {} bytes",
                old.member_used_bytes(),
                reference.data_offset_sectors * 512
            ),
        });
    }
    if !force && member.is_persistent() {
        if let Some(what) =
            crate::detect_signature(member).map_err(|e| Error::io(member.spec(), e))?
        {
            return Err(Error::InUse {
                spec: member.spec().into(),
                what,
            });
        }
    }
    Ok(())
}

/// Where md lets a moved data offset start at the lowest: 36 KiB past
/// the superblock's start (its `super_1_allow_new_offset`), in sectors
/// from the superblock.
const FLOOR_SECTORS: u64 = 72;

/// Where a bad-block log in the way of the move goes (sectors from the
/// superblock): right after the superblock's 4 KiB, where mdadm puts it,
/// or right after a write-intent bitmap there (`bitmap_bytes`, its
/// whole pages).
fn log_moved_to(sb: &Superblock, bitmap_bytes: Option<u64>) -> u64 {
    match (bitmap_bytes, bitmap_at(sb)) {
        (Some(len), Some(at)) => {
            let end = (at as u64 + len) / 512 - sb.super_offset_sectors;
            end.max(8)
        }
        _ => 8,
    }
}

/// Where the moved data may start on `sb`'s member at the lowest (device
/// sectors), md's `super_1_allow_new_offset`: 36 KiB past the
/// superblock's start, past the write-intent bitmap's pages, past the
/// bad-block log, which stays where it is when it lies below that, and
/// otherwise moves to just past the superblock or the bitmap
/// ([`log_moved_to`]; `Some(to)`).
pub(super) fn floor_of(sb: &Superblock, bitmap_bytes: Option<u64>) -> (u64, Option<u64>) {
    let sb_start = sb.super_offset_sectors;
    let mut floor = sb_start + FLOOR_SECTORS;
    if let (Some(len), Some(at)) = (bitmap_bytes, bitmap_at(sb)) {
        floor = floor.max((at as u64 + len).div_ceil(512));
    }
    let Some((start, len)) = log_sectors(sb) else {
        return (floor, None);
    };
    let to = sb_start + log_moved_to(sb, bitmap_bytes);
    if start < floor || (to < start + len && start < to + len) {
        // Below the floor, or where moving it would overwrite it: it stays.
        (floor.max(start + len), None)
    } else {
        (floor.max(to + len), Some(to))
    }
}

/// How far (sectors) the data offset can move down on every member: from
/// the data down to md's floor ([`floor_of`]), at most
/// [`move_max_bytes`], in whole 4 KiB; refused below one chunk (a step
/// could then not write one row).
fn room_to_move(
    found: &[(Member, Superblock)],
    reference: &Superblock,
    old: &Geometry,
    bitmap_bytes: Option<u64>,
) -> Result<u64> {
    let sbs: Vec<&Superblock> = found.iter().map(|(_, sb)| sb).collect();
    room_of(&sbs, reference, old, bitmap_bytes)
}

/// [`room_to_move`] for a served array's superblocks (by role), with each
/// member's bad-block log to move first: `(first sector, sectors, new
/// first sector)`, device sectors (see [`floor_of`]).
#[allow(clippy::type_complexity)]
pub(super) fn room_for(
    sbs: &[Superblock],
    reference: &Superblock,
    old: &Geometry,
    bitmap_bytes: Option<u64>,
) -> Result<(u64, Vec<Option<(u64, u64, u64)>>)> {
    let refs: Vec<&Superblock> = sbs.iter().collect();
    let room = room_of(&refs, reference, old, bitmap_bytes)?;
    let moves = sbs
        .iter()
        .map(|sb| match (log_sectors(sb), floor_of(sb, bitmap_bytes)) {
            (Some((start, len)), (_, Some(to))) if to != start => Some((start, len, to)),
            _ => None,
        })
        .collect();
    Ok((room, moves))
}

fn room_of(
    sbs: &[&Superblock],
    reference: &Superblock,
    old: &Geometry,
    bitmap_bytes: Option<u64>,
) -> Result<u64> {
    let chunk_bytes = old
        .chunk_bytes()
        .expect("the levels grown by moving rows have chunks");
    let mut room = move_max_bytes(chunk_bytes) / 512;
    for sb in sbs {
        let (floor, _) = floor_of(sb, bitmap_bytes);
        room = room.min(sb.data_offset_sectors.saturating_sub(floor));
    }
    let room = room / 8 * 8;
    let chunk_sectors = old
        .chunk_bytes()
        .expect("the levels grown by moving rows have chunks")
        / 512;
    if room < chunk_sectors {
        return Err(Error::NotStartable(format!(
            "the members have {} bytes free before the data (from a data offset of {} bytes{}), less than one chunk of {} bytes: nvraid moves the data offset instead of keeping a backup file, and cannot here",
            room * 512,
            reference.data_offset_sectors * 512,
            match bitmap_bytes {
                Some(len) => format!(", above a write-intent bitmap of {len} bytes"),
                None => String::new(),
            },
            chunk_sectors * 512
        )));
    }
    Ok(room)
}

/// A member's bad-block log: first sector and length (device sectors).
fn log_sectors(sb: &Superblock) -> Option<(u64, u64)> {
    if sb.bblog_size == 0 || sb.bblog_offset == 0 {
        return None;
    }
    let start = sb.super_offset_sectors as i64 + i64::from(sb.bblog_offset as i32);
    Some((start.max(0) as u64, u64::from(sb.bblog_size)))
}

/// Move each bad-block log that sits above md's floor (where the data
/// will move) to just after the superblock or the bitmap: its contents
/// copied and flushed there, its superblock's `bblog_offset` changed in
/// `placed` (for the record written next; until then the old place is the
/// one used).
pub(super) fn move_logs(placed: &mut [Placed], bitmap_bytes: Option<u64>) -> Result<()> {
    for p in placed.iter_mut() {
        let (Some((start, len)), (_, Some(to))) =
            (log_sectors(&p.sb), floor_of(&p.sb, bitmap_bytes))
        else {
            continue;
        };
        if to == start {
            continue;
        }
        let mut log = nvraid_io::AlignedBuf::zeroed((len * 512).next_multiple_of(4096) as usize);
        let log = &mut log[..(len * 512) as usize];
        p.member
            .read_at(log, start * 512)
            .map_err(|e| Error::io(p.member.spec(), e))?;
        p.member
            .write_at(log, to * 512)
            .map_err(|e| Error::io(p.member.spec(), e))?;
        p.member
            .flush()
            .map_err(|e| Error::io(p.member.spec(), e))?;
        p.sb.bblog_offset = (to - p.sb.super_offset_sectors) as u32;
    }
    Ok(())
}

/// `count` unused device slots of the role table (after the highest used).
pub(super) fn free_dev_numbers(reference: &Superblock, count: usize) -> Result<Vec<u32>> {
    let table = &reference.roles_raw;
    let free: Vec<u32> = (0..table.len() as u32)
        .filter(|&d| Role::from_raw(table[d as usize]) == Role::Spare)
        .filter(|&d| d >= reference.raid_disks)
        .take(count)
        .collect();
    if free.len() < count {
        return Err(Error::NotStartable(format!(
            "the role table has room for {} more members, not {count}",
            free.len()
        )));
    }
    Ok(free)
}

/// A new member's superblock: the reference's, with its own device slot,
/// UUID and data area, no bad blocks and no recovery.
pub(super) fn new_member_superblock(
    member: &Member,
    reference: &Superblock,
    dev: u32,
) -> Result<Superblock> {
    let mut sb = reference.clone();
    sb.dev_number = dev;
    sb.device_uuid = crate::create::random_uuid()?;
    sb.feature_map &= !(features::BAD_BLOCKS
        | features::RECOVERY_OFFSET
        | features::RECOVERY_BITMAP
        | features::REPLACEMENT);
    sb.recovery_offset = 0;
    sb.cnt_corrected_read = 0;
    sb.devflags = 0;
    sb.data_size_sectors = (member.size_bytes() / 512).saturating_sub(sb.data_offset_sectors);
    Ok(sb)
}
