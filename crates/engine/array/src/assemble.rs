//! `assemble`: read every member's superblock, check that they form one
//! array, order them by their recorded roles and build the [`Array`].

use crate::array::{read_superblock, Array, Slot};
use crate::error::{Error, Result};
use nvraid_layout::{Geometry, Level};
use nvraid_member::{Member, OpenOptions};
use nvraid_metadata::{format_uuid, Role, Superblock};

/// How to assemble.
#[derive(Clone, Copy, Debug)]
pub struct AssembleOptions {
    pub writable: bool,
    pub direct: bool,
    /// Start a RAID 1/10 array with members missing (reads use the copies
    /// that are present; writes skip the missing ones).
    pub allow_degraded: bool,
}

impl Default for AssembleOptions {
    fn default() -> Self {
        AssembleOptions {
            writable: false,
            direct: true,
            allow_degraded: false,
        }
    }
}

/// Decode md's level and layout words into a supported [`Level`].
pub fn level_of(sb: &Superblock, spec: &str) -> Result<Level> {
    let unsupported = |what: String| Error::Unsupported {
        spec: spec.into(),
        what,
    };
    match sb.level {
        0 => Ok(Level::Raid0),
        1 => Ok(Level::Raid1),
        10 => {
            let near = sb.layout & 0xff;
            let far = (sb.layout >> 8) & 0xff;
            if far != 1 || sb.layout >> 16 != 0 {
                return Err(unsupported(format!(
                    "raid10 layout {:#x} (only the near layout is)",
                    sb.layout
                )));
            }
            Ok(Level::Raid10 { near })
        }
        other => Err(unsupported(format!("raid level {other}"))),
    }
}

/// Bytes of each member the array uses, from md's fields: raid1/10 record
/// it in `size`; raid0 uses the whole data area.
pub fn member_data_bytes(sb: &Superblock) -> u64 {
    match sb.level {
        0 => sb.data_size_sectors * 512,
        _ if sb.size_sectors > 0 => sb.size_sectors * 512,
        _ => sb.data_size_sectors * 512,
    }
}

/// Build the geometry a superblock describes.
pub fn geometry_of(sb: &Superblock, spec: &str) -> Result<Geometry> {
    let level = level_of(sb, spec)?;
    Ok(Geometry::new(
        level,
        sb.raid_disks,
        u64::from(sb.chunk_sectors) * 512,
        member_data_bytes(sb),
    )?)
}

/// Assemble the array `specs` form. The order of `specs` does not matter:
/// members are placed by the roles their superblocks record.
pub fn assemble(specs: &[String], options: AssembleOptions) -> Result<Array> {
    if specs.is_empty() {
        return Err(Error::NoMembers);
    }
    let open = OpenOptions {
        write: options.writable,
        create_bytes: None,
        direct: options.direct,
    };
    let mut found = Vec::with_capacity(specs.len());
    for spec in specs {
        let member = Member::open(spec, open)?;
        let sb = read_superblock(&member)?;
        found.push((member, sb));
    }
    check_same_array(&found)?;
    let freshest = found.iter().map(|(_, sb)| sb.events).max().unwrap_or(0);
    let (first_member, first_sb) = found
        .iter()
        .find(|(_, sb)| sb.events == freshest)
        .expect("non-empty");
    let geometry = geometry_of(first_sb, first_member.spec())?;
    let mut slots: Vec<Option<Slot>> = (0..geometry.members()).map(|_| None).collect();
    let mut stale = Vec::new();
    for (member, sb) in found {
        if let Some(left_out) = place(&mut slots, &geometry, member, sb, freshest)? {
            stale.push(left_out);
        }
    }
    check_startable(&geometry, &slots, options.allow_degraded)?;
    let mut array = Array::new(geometry, slots, options.writable);
    array.set_stale(stale);
    Ok(array)
}

fn check_same_array(found: &[(Member, Superblock)]) -> Result<()> {
    let (first, first_sb) = &found[0];
    for (i, (member, sb)) in found.iter().enumerate() {
        if sb.set_uuid != first_sb.set_uuid {
            return Err(Error::MixedArrays {
                spec: member.spec().into(),
                uuid: format_uuid(&sb.set_uuid),
                other: first.spec().into(),
                other_uuid: format_uuid(&first_sb.set_uuid),
            });
        }
        for (other, _) in &found[..i] {
            if member.identity().is_some() && member.identity() == other.identity() {
                return Err(Error::Duplicate {
                    spec: member.spec().into(),
                    other: other.spec().into(),
                    what: "file or device",
                });
            }
        }
    }
    Ok(())
}

/// Put one member in its role's slot after checking it is usable: an active
/// role inside the array, not claimed twice, fresh, and not truncated.
/// A stale member is returned (spec and superblock) instead of placed.
fn place(
    slots: &mut [Option<Slot>],
    geometry: &Geometry,
    member: Member,
    sb: Superblock,
    freshest: u64,
) -> Result<Option<(String, Superblock)>> {
    let spec = member.spec().to_string();
    let Role::Active(role) = sb.role() else {
        return Err(Error::Unsupported {
            spec,
            what: format!("a member whose role is {:?}", sb.role()),
        });
    };
    if u32::from(role) >= geometry.members() {
        return Err(Error::Unsupported {
            spec,
            what: format!("role {role} in an array of {} members", geometry.members()),
        });
    }
    let needed_bytes = sb.data_offset_sectors * 512 + geometry.member_used_bytes();
    if member.size_bytes() < needed_bytes {
        return Err(Error::Truncated {
            spec,
            needed_bytes,
            size_bytes: member.size_bytes(),
        });
    }
    if member_data_bytes(&sb) < geometry.member_used_bytes() {
        return Err(Error::Unsupported {
            spec,
            what: "members of unequal size".into(),
        });
    }
    if sb.events < freshest {
        // Stale: its data is behind the others'. md leaves such a member out.
        return Ok(Some((spec, sb)));
    }
    if let Some(existing) = &slots[role as usize] {
        return Err(Error::SameRole {
            spec,
            other: existing.member.spec().into(),
            role,
        });
    }
    slots[role as usize] = Some(Slot {
        member,
        superblock: sb,
    });
    Ok(None)
}

/// Whether every byte of the array has at least one present copy.
pub fn has_every_byte(geometry: &Geometry, present: &[bool]) -> bool {
    match geometry.level() {
        Level::Raid0 => present.iter().all(|&p| p),
        Level::Raid1 => present.iter().any(|&p| p),
        // Near layout: chunk rows repeat with period lcm(n, near) slots; it
        // is enough to check the first n chunks' copy sets.
        Level::Raid10 { near } => (0..u64::from(geometry.members())).all(|chunk| {
            (0..near).any(|copy| {
                present[((chunk * u64::from(near) + u64::from(copy))
                    % u64::from(geometry.members())) as usize]
            })
        }),
    }
}

/// The roles not present, as text (`1, 3`); empty when none is missing.
pub(crate) fn missing_roles(present: &[bool]) -> Vec<String> {
    present
        .iter()
        .enumerate()
        .filter(|(_, &p)| !p)
        .map(|(role, _)| role.to_string())
        .collect()
}

fn check_startable(
    geometry: &Geometry,
    slots: &[Option<Slot>],
    allow_degraded: bool,
) -> Result<()> {
    let present: Vec<bool> = slots.iter().map(Option::is_some).collect();
    let missing = missing_roles(&present);
    if missing.is_empty() {
        return Ok(());
    }
    if !has_every_byte(geometry, &present) {
        return Err(Error::NotStartable(format!(
            "roles {} are missing or stale and some data has no copy left",
            missing.join(", ")
        )));
    }
    if !allow_degraded {
        return Err(Error::NotStartable(format!(
            "roles {} are missing or stale (the array would run degraded)",
            missing.join(", ")
        )));
    }
    Ok(())
}
