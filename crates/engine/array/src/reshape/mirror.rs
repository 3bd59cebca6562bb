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

use super::grow::{
    check_new_member, kept_bitmap, write_superblocks, GrowOptions, GrowProgress, Grown, Placed,
};
use crate::assemble::{assemble, AssembleOptions};
use crate::error::{Error, Result};
use crate::recovery::{self, Added};
use nvraid_layout::Geometry;
use nvraid_member::{Member, OpenOptions};
use nvraid_metadata::{Superblock, Timestamp};

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
    let events = crate::slot::read_superblock(&first)?.events;
    Ok(Grown {
        raid_disks_before: options.raid_devices - options.add.len() as u32,
        raid_disks: options.raid_devices,
        size_bytes_before: end,
        size_bytes: end,
        data_offset_bytes: reference.data_offset_sectors * 512,
        moved_bytes: rebuilt.iter().map(|r| r.bytes).sum(),
        seconds: started.elapsed().as_secs_f64(),
        events,
    })
}
