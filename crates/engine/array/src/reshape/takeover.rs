//! md's takeovers around a reshape: a RAID 0 grows as a RAID 4 whose
//! parity member is missing, the way md and mdadm grow one.
//!
//! md cannot reshape a RAID 0 itself. mdadm takes it over as RAID 4 (md
//! level 4, parity on the last member, `ALGORITHM_PARITY_N`) of one more
//! member, that member missing: a RAID 4 with parity last keeps each data
//! chunk where the RAID 0 of one zone keeps it. The reshape then runs on
//! that degraded RAID 4 and writes no parity (there is no parity member),
//! and at the end the array is taken back to RAID 0. While it runs, the
//! superblocks say what md's say (checked against the kernel's own RAID 0
//! grow in tools/mdvm):
//!
//! - `level` and `new_level` 4, `layout` and `new_layout` 5 (parity-last),
//!   `raid_disks` N + 1 + k (N the RAID 0's members, k added),
//!   `delta_disks` k;
//! - the old members keep roles 0..N; the first new member takes role N,
//!   the old shape's parity, which it does not hold: it is recorded
//!   recovering (`RECOVERY_OFFSET`), its `recovery_offset` following the
//!   reshape (the member rows of the new shape behind the position); the
//!   other new members take roles N+1..N+k; role N+k, the new shape's
//!   parity, has no member;
//! - `size` (md's per-member sectors) is the RAID 0's member rows.
//!
//! The end is one superblock write: level 0, `raid_disks` N + k, each
//! member's data area the RAID 4's rows (no more, so nothing stale shows
//! past them), recovery cleared.

use super::degraded::Failed;
use super::grow::Placed;
use crate::error::{Error, Result};
use nvraid_layout::parity::ParityLayout;
use nvraid_layout::{Geometry, Level};
use nvraid_member::Member;
use nvraid_metadata::{features, Superblock};

/// md's level and layout for a RAID 4: level 4, parity-last.
const RAID4_LEVEL: i32 = 4;
const PARITY_LAST: u32 = 5;

/// The RAID 4 a RAID 0 of one zone (`raid0`, over `found`'s members) is
/// taken over as: one more member (its parity, missing), the same chunk,
/// each member's rows the RAID 0's. Refused for a RAID 0 of several zones
/// (members of different sizes), as md refuses to take one over.
pub(super) fn raid0_as_raid4(found: &[(Member, Superblock)], raid0: &Geometry) -> Result<Geometry> {
    let chunk = raid0.chunk_bytes().expect("RAID 0 has chunks");
    let rows = |sb: &Superblock| sb.data_size_sectors * 512 / chunk * chunk;
    if let Some((member, sb)) = found
        .iter()
        .find(|(_, sb)| rows(sb) != raid0.member_used_bytes())
    {
        return Err(Error::Unsupported {
            spec: member.spec().into(),
            what: format!(
                "growing a RAID 0 of several zones (this member holds {} bytes of data, another {}): md takes only a RAID 0 of one zone over as RAID 4 to grow it",
                rows(sb),
                raid0.member_used_bytes()
            ),
        });
    }
    Geometry::new(
        Level::Raid5 {
            layout: ParityLayout::ParityLast,
        },
        raid0.members() + 1,
        chunk,
        raid0.member_used_bytes(),
    )
    .map_err(|e| Error::NotStartable(e.to_string()))
}

/// A member's superblock as md's RAID 4 of the takeover records it (the
/// reshape's own fields are the caller's): level and new level 4,
/// parity-last, `size` the RAID 0's member rows.
pub(super) fn record_as_raid4(sb: &mut Superblock, member_rows: u64) {
    sb.level = RAID4_LEVEL;
    sb.layout = PARITY_LAST;
    sb.new_level = RAID4_LEVEL as u32;
    sb.new_layout = PARITY_LAST;
    sb.size_sectors = member_rows / 512;
}

/// The member taking the old shape's parity role: recovering from the
/// start, as md records it.
pub(super) fn record_recovering(sb: &mut Superblock) {
    sb.feature_map |= features::RECOVERY_OFFSET;
    sb.recovery_offset = 0;
}

/// Where the recovering member is in sync: the new shape's member rows
/// behind `position` (array bytes; `data_members` the new shape's).
pub(super) fn follow_position(sb: &mut Superblock, position: u64, data_members: u32) {
    if sb.feature_map & features::RECOVERY_OFFSET != 0 {
        sb.recovery_offset = position / u64::from(data_members) / 512;
    }
}

/// Whether the reshape `reference` records is md's RAID 4 of a RAID 0
/// grow: md level 4 (or 5 parity-last), the new shape's parity role
/// without a member (`failed`: missing), and the old shape's parity role
/// held by a member recorded recovering (the first new member). Returns
/// the old parity role.
pub(super) fn raid0_takeover_of(
    reference: &Superblock,
    placed: &[Placed],
    failed: &Failed,
) -> Option<usize> {
    let parity_last =
        reference.level == RAID4_LEVEL || (reference.level == 5 && reference.layout == PARITY_LAST);
    let delta = reference.delta_disks as i32;
    let new_parity = reference.raid_disks as usize - 1;
    let old_parity = (reference.raid_disks as i64 - i64::from(delta) - 1) as usize;
    (parity_last
        && delta > 0
        && failed.is_failed(new_parity)
        && !failed.is_failed(old_parity)
        && placed[old_parity].sb.feature_map & features::RECOVERY_OFFSET != 0)
        .then_some(old_parity)
}

/// The finished grow taken back to RAID 0 (after the reshape's fields
/// were cleared and the data offset moved): level 0, one member fewer,
/// each member's data area the RAID 4's rows, no recovery.
pub(super) fn finish_as_raid0(sb: &mut Superblock, raid0_layout: u32) {
    sb.level = 0;
    sb.layout = raid0_layout;
    sb.raid_disks -= 1;
    sb.data_size_sectors = sb.size_sectors;
    sb.size_sectors = 0;
    sb.feature_map &= !features::RECOVERY_OFFSET;
    sb.recovery_offset = 0;
}
