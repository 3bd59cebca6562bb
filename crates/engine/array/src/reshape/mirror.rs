//! `grow` of a RAID 1: another mirror, as md does it. A RAID 1 has no
//! stripes to move: md's `--raid-devices N` raises the member count in
//! every superblock (the new roles are then missing: the array is
//! degraded), and the members given with `--add` take those roles and
//! are rebuilt from the others.
//!
//! 1. The checks of any grow (`grow::check_array`: a whole, clean array,
//!    one `--add` per new member) and each new member's size and
//!    signature, before any write.
//! 2. Every member's superblock records the new `raid_disks` (events + 1;
//!    a write-intent bitmap's header first, with the same events). A crash
//!    here leaves a degraded RAID 1 of the new count, which assembles, and
//!    `nvraid add` puts the new member in (md's state after its own
//!    `--grow --raid-devices`).
//! 3. The array is assembled writable, each new member joins in a missing
//!    role (`recovery::add_member`: its superblock first, then the
//!    others' role tables), and the rebuild copies the array onto it,
//!    recording its progress as any rebuild does.
//!
//! The same command run again after a crash finishes it
//! ([`widened_before`]): a crash while the count was written leaves some
//! members with the new count one event ahead of the others (md's
//! assembly would take the fresher and re-add the others by bitmap); the
//! others then get the new count too, and the missing roles are filled as
//! in step 3. A crash after the count was written leaves a degraded RAID 1
//! of the new count, filled the same way (or by `nvraid add`).

use super::grow::{
    check_new_member, kept_bitmap, write_superblocks, GrowOptions, GrowProgress, Grown, Placed,
};
use crate::assemble::{assemble, AssembleOptions};
use crate::error::{Error, Result};
use crate::recovery::{self, Added};
use nvraid_layout::Geometry;
use nvraid_member::{Member, OpenOptions};
use nvraid_metadata::{Role, Superblock, Timestamp};

/// Add `options.add` as mirrors to the RAID 1 on `found` (every member,
/// checked whole and clean; `reference` the freshest superblock).
pub(super) fn add_mirrors(
    members: &[String],
    found: Vec<(Member, Superblock)>,
    reference: &Superblock,
    geometry: &Geometry,
    options: &GrowOptions,
    progress: &mut dyn FnMut(GrowProgress),
) -> Result<Grown> {
    let started = std::time::Instant::now();
    let open = OpenOptions {
        write: true,
        create_bytes: None,
        direct: options.direct,
        ..Default::default()
    };
    let mut adding = Vec::with_capacity(options.add.len());
    for spec in &options.add {
        let member = Member::open(spec, open)?;
        check_new_member(&member, reference, geometry, options.force)?;
        adding.push(member);
    }
    let mut bitmap = kept_bitmap(found.iter().map(|(m, sb)| (m, sb)), geometry)?;
    let events = reference.events + 1;
    let mut placed: Vec<Placed> = found
        .into_iter()
        .map(|(member, mut sb)| {
            sb.raid_disks = options.raid_devices;
            sb.events = events;
            sb.utime = Timestamp::now();
            Placed { member, sb }
        })
        .collect();
    write_superblocks(
        &placed,
        &(0..placed.len()).collect::<Vec<_>>(),
        bitmap.as_mut(),
    )?;
    placed.clear();
    fill(members, adding, geometry, options, started, progress)
}

/// A RAID 1 this grow already widened (all or part): `Ok` with the new
/// members opened and checked once every member records the new count (the
/// ones a crash left one event behind brought up to it); `Err` with the
/// members untouched when the array is not such a RAID 1 (the grow's
/// ordinary checks then judge it).
pub(super) fn widened_before(
    found: Vec<(Member, Superblock)>,
    options: &GrowOptions,
) -> Result<std::result::Result<Widened, Vec<(Member, Superblock)>>> {
    let n = options.raid_devices;
    let Some(top) = found
        .iter()
        .map(|(_, sb)| sb)
        .max_by_key(|sb| sb.events)
        .cloned()
    else {
        return Ok(Err(found));
    };
    let part_of = |sb: &Superblock| {
        sb.level == 1
            && sb.set_uuid == top.set_uuid
            && sb.roles_raw == top.roles_raw
            && ((sb.raid_disks == n && sb.events == top.events)
                || (sb.raid_disks < n && sb.events + 1 == top.events))
    };
    // Roles the table gives a member, below the new count: the others are
    // what the new members fill, one each.
    let held = (0..n)
        .filter(|&r| {
            top.roles_raw
                .iter()
                .any(|&raw| Role::from_raw(raw) == Role::Active(r as u16))
        })
        .count();
    if top.level != 1
        || top.raid_disks != n
        || n as usize - held != options.add.len()
        || !found.iter().all(|(_, sb)| part_of(sb))
    {
        return Ok(Err(found));
    }
    let geometry = crate::assemble::geometry_of(&top, found[0].0.spec())?;
    let open = OpenOptions {
        write: true,
        create_bytes: None,
        direct: options.direct,
        ..Default::default()
    };
    let mut adding = Vec::with_capacity(options.add.len());
    for spec in &options.add {
        let member = Member::open(spec, open)?;
        check_new_member(&member, &top, &geometry, options.force)?;
        adding.push(member);
    }
    let mut bitmap = kept_bitmap(found.iter().map(|(m, sb)| (m, sb)), &geometry)?;
    let lagging: Vec<Placed> = found
        .into_iter()
        .filter(|(_, sb)| sb.raid_disks != n)
        .map(|(member, mut sb)| {
            sb.raid_disks = n;
            sb.events = top.events;
            sb.utime = Timestamp::now();
            Placed { member, sb }
        })
        .collect();
    write_superblocks(
        &lagging,
        &(0..lagging.len()).collect::<Vec<_>>(),
        bitmap.as_mut(),
    )?;
    Ok(Ok(Widened { adding, geometry }))
}

/// A RAID 1 every member of which records the new count, and the members
/// that fill its missing roles.
pub(super) struct Widened {
    adding: Vec<Member>,
    geometry: Geometry,
}

/// Fill the missing roles of a RAID 1 [`widened_before`] found.
pub(super) fn fill_mirrors(
    members: &[String],
    widened: Widened,
    options: &GrowOptions,
    progress: &mut dyn FnMut(GrowProgress),
) -> Result<Grown> {
    let Widened { adding, geometry } = widened;
    fill(
        members,
        adding,
        &geometry,
        options,
        std::time::Instant::now(),
        progress,
    )
}

/// Assemble the widened RAID 1, put each of `adding` in a missing role
/// and rebuild them.
pub(super) fn fill(
    members: &[String],
    adding: Vec<Member>,
    geometry: &Geometry,
    options: &GrowOptions,
    started: std::time::Instant,
    progress: &mut dyn FnMut(GrowProgress),
) -> Result<Grown> {
    let array = assemble(
        members,
        AssembleOptions {
            writable: true,
            direct: options.direct,
            allow_degraded: true,
        },
    )?;
    for member in adding {
        let spec = member.spec().to_string();
        match recovery::add_member_to(&array, member)? {
            Added::Recovering { .. } => {}
            Added::Spare => {
                return Err(Error::NotStartable(format!(
                    "{spec} found no missing role to take after the member count was raised to {}",
                    options.raid_devices
                )))
            }
        }
    }
    let end = geometry.array_bytes();
    let roles = options.add.len() as u64;
    progress(GrowProgress {
        position_bytes: 0,
        end_bytes: end * roles,
    });
    let mut finished = 0u64;
    let mut last_role = None;
    let rebuilt = recovery::rebuild(&array, None, &mut |p: recovery::Progress| {
        if last_role.is_some_and(|r| r != p.role) {
            finished += end;
        }
        last_role = Some(p.role);
        progress(GrowProgress {
            position_bytes: finished + p.done_bytes,
            end_bytes: end * roles,
        });
    })?;
    array.close()?;
    // The events count the closed array left (each rebuild checkpoint and
    // the close itself counted one).
    let first = Member::open(
        &members[0],
        OpenOptions {
            write: false,
            create_bytes: None,
            direct: options.direct,
            ..Default::default()
        },
    )?;
    let sb = crate::slot::read_superblock(&first)?;
    let (events, data_offset_sectors) = (sb.events, sb.data_offset_sectors);
    Ok(Grown {
        raid_disks_before: options.raid_devices - options.add.len() as u32,
        raid_disks: options.raid_devices,
        size_bytes_before: end,
        size_bytes: end,
        data_offset_bytes: data_offset_sectors * 512,
        moved_bytes: rebuilt.iter().map(|r| r.bytes).sum(),
        seconds: started.elapsed().as_secs_f64(),
        events,
        failed: Vec::new(),
    })
}
