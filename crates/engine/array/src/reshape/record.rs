//! md's record of a reshape (superblock fields, see nvraid-layout's
//! `reshape` module for what each means) read into a [`Reshape`].

use crate::assemble::member_data_bytes;
use crate::error::{Error, Result};
use nvraid_layout::{Direction, Geometry, Level, Reshape};
use nvraid_metadata::{features, Superblock};

/// Whether a superblock records a reshape in progress.
pub fn is_reshaping(sb: &Superblock) -> bool {
    sb.feature_map & features::RESHAPE_ACTIVE != 0
}

/// The reshape `reference` records (the freshest superblock; `spec` names
/// it in errors), with each role's old and new data offset taken from
/// that role's own superblock (`by_role`, the larger shape's member count
/// of them; a missing role takes the reference's offsets). Refused, naming
/// the field: a level or layout nvraid does not lay out, a member count or
/// chunk that makes no geometry, a new offset below the superblock, a
/// position md would refuse, a level change between families.
pub fn reshape_of(
    reference: &Superblock,
    spec: &str,
    by_role: &[Option<&Superblock>],
) -> Result<Reshape> {
    let bad = |field: &'static str, value: String, why: String| Error::BadField {
        spec: spec.into(),
        field,
        value,
        why,
    };
    let delta = reference.delta_disks as i32;
    let new_members = reference.raid_disks;
    let old_members = i64::from(new_members) - i64::from(delta);
    if old_members < 1 || old_members > i64::from(reference.max_dev) {
        return Err(bad(
            "delta_disks",
            delta.to_string(),
            format!("leaves {old_members} members before the reshape (the superblock is damaged)"),
        ));
    }
    let old_level = Level::from_md(reference.level, reference.layout).map_err(|e| {
        bad(
            "level",
            format!("{} layout {:#x}", reference.level, reference.layout),
            e.to_string(),
        )
    })?;
    let new_level =
        Level::from_md(reference.new_level as i32, reference.new_layout).map_err(|e| {
            bad(
                "new_level",
                format!(
                    "{} new_layout {:#x}",
                    reference.new_level as i32, reference.new_layout
                ),
                e.to_string(),
            )
        })?;
    if matches!(old_level, Level::Raid10Far { .. }) || matches!(new_level, Level::Raid10Far { .. })
    {
        return Err(Error::Unsupported {
            spec: spec.into(),
            what: "a reshape of a RAID 10 far or offset layout (md reshapes the near layout only)"
                .into(),
        });
    }
    let member_bytes = member_data_bytes(reference);
    let shape = |level: Level, members: u32, chunk_sectors: u32, field: &'static str| {
        Geometry::new(level, members, u64::from(chunk_sectors) * 512, member_bytes).map_err(|e| {
            bad(
                field,
                format!("{level} over {members} members, chunk {chunk_sectors} sectors"),
                format!("makes no geometry: {e}"),
            )
        })
    };
    let old = shape(
        old_level,
        old_members as u32,
        reference.chunk_sectors,
        "level",
    )?;
    let new = shape(new_level, new_members, reference.new_chunk, "new_level")?;
    let direction =
        if delta < 0 || (delta == 0 && reference.feature_map & features::RESHAPE_BACKWARDS != 0) {
            Direction::Backwards
        } else {
            Direction::Forwards
        };
    let offsets = |role: usize| -> Result<(u64, u64)> {
        let sb = by_role.get(role).copied().flatten().unwrap_or(reference);
        let old = sb.data_offset_sectors;
        let new = if sb.feature_map & features::NEW_OFFSET != 0 {
            let moved = i64::from(sb.new_offset as i32);
            let new = old as i64 + moved;
            // Below sector 8 + the superblock's 4 KiB, the new data would
            // overwrite the superblock.
            if new < 16 {
                return Err(bad(
                    "new_offset",
                    moved.to_string(),
                    format!("puts the new data at sector {new}, inside the superblock"),
                ));
            }
            new as u64
        } else {
            old
        };
        Ok((old * 512, new * 512))
    };
    let mut old_offsets = Vec::with_capacity(old.members() as usize);
    let mut new_offsets = Vec::with_capacity(new.members() as usize);
    for role in 0..old.members().max(new.members()) as usize {
        let (o, n) = offsets(role)?;
        if role < old.members() as usize {
            old_offsets.push(o);
        }
        if role < new.members() as usize {
            new_offsets.push(n);
        }
    }
    let position = reference.reshape_position.saturating_mul(512);
    Reshape::new(old, new, position, direction, old_offsets, new_offsets).map_err(|e| {
        bad(
            "reshape_position",
            format!("{} sectors", reference.reshape_position),
            e.to_string(),
        )
    })
}

/// Open every member of `specs` for writing (O_DIRECT with `direct`) and
/// read its superblock: what each reshape command starts from.
pub(super) fn open_members(
    specs: &[String],
    direct: bool,
) -> Result<Vec<(nvraid_member::Member, Superblock)>> {
    let open = nvraid_member::OpenOptions {
        write: true,
        create_bytes: None,
        direct,
        ..Default::default()
    };
    specs
        .iter()
        .map(|spec| {
            let member = nvraid_member::Member::open(spec, open)?;
            let sb = crate::slot::read_superblock(&member)?;
            Ok((member, sb))
        })
        .collect()
}
