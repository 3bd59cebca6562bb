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
/// each member's rows the RAID 0's (for a grow, or a chunk change in
/// `shape`). Refused for a RAID 0 of several zones (members of different
/// sizes), as md refuses to take one over.
pub(super) fn raid0_as_raid4(found: &[(Member, Superblock)], raid0: &Geometry) -> Result<Geometry> {
    let held: Vec<(&str, &Superblock)> = found.iter().map(|(m, sb)| (m.spec(), sb)).collect();
    raid4_of_raid0(&held, raid0)
}

/// [`raid0_as_raid4`] of members named by spec (a served array's slots).
pub(super) fn raid4_of_raid0(found: &[(&str, &Superblock)], raid0: &Geometry) -> Result<Geometry> {
    let chunk = raid0.chunk_bytes().expect("RAID 0 has chunks");
    let rows = |sb: &Superblock| sb.data_size_sectors * 512 / chunk * chunk;
    if let Some((spec, sb)) = found
        .iter()
        .find(|(_, sb)| rows(sb) != raid0.member_used_bytes())
    {
        return Err(Error::Unsupported {
            spec: (*spec).into(),
            what: format!(
                "growing or restriping a RAID 0 of several zones (this member holds {} bytes of data, another {}): md takes only a RAID 0 of one zone over as RAID 4 to reshape it",
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

/// Whether no member's role table names the last role of `reference`'s
/// array (not even faulty): the parity role of md's RAID 4 of a RAID 0,
/// which no member ever held.
pub(crate) fn last_role_unnamed(reference: &Superblock) -> bool {
    let last = nvraid_metadata::Role::Active(reference.raid_disks.saturating_sub(1) as u16);
    !reference
        .roles_raw
        .iter()
        .any(|&raw| nvraid_metadata::Role::from_raw(raw) == last)
}

/// Whether the reshape `reference` records is a RAID 0's restripe (a
/// chunk change, `shape`) as md's RAID 4: md level 4 (or 5 parity-last)
/// in both shapes, no member added, and the parity role (the last) without
/// a member and never named in the role table (`parity_unnamed`, read
/// before a missing role was marked faulty). md's superblocks say no more
/// than that; a RAID 4 whose parity member was removed (not failed) and
/// that is restriped looks the same, and is taken back to RAID 0 too (the
/// same bytes, no redundancy lost that it had).
pub(super) fn raid0_restripe_of(
    reference: &Superblock,
    failed: &Failed,
    parity_unnamed: bool,
) -> bool {
    let parity_last =
        |level: i32, layout: u32| level == RAID4_LEVEL || (level == 5 && layout == PARITY_LAST);
    parity_last(reference.level, reference.layout)
        && parity_last(reference.new_level as i32, reference.new_layout)
        && reference.delta_disks == 0
        && parity_unnamed
        && failed.is_failed(reference.raid_disks as usize - 1)
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

/// The RAID 6 layout md takes a RAID 5 of `layout` over as: the same
/// rotation over the first members and Q on the added last one (the `-6`
/// layouts), or parity-last (P then Q on the last two). Either keeps
/// every data chunk and P where the RAID 5 has them.
pub(super) fn raid6_layout_for(layout: ParityLayout) -> Option<ParityLayout> {
    use nvraid_layout::parity::Raid5Rotation as R;
    Some(match layout {
        ParityLayout::LeftAsymmetric => ParityLayout::Raid5With6(R::LeftAsymmetric),
        ParityLayout::RightAsymmetric => ParityLayout::Raid5With6(R::RightAsymmetric),
        ParityLayout::LeftSymmetric => ParityLayout::Raid5With6(R::LeftSymmetric),
        ParityLayout::RightSymmetric => ParityLayout::Raid5With6(R::RightSymmetric),
        ParityLayout::ParityFirst => ParityLayout::Raid5With6(R::ParityFirst),
        ParityLayout::ParityLast => ParityLayout::ParityLast,
        ParityLayout::Raid5With6(_) => return None,
    })
}

/// `grow --level 6 -n N+1 --add NEW`: a RAID 5 of N becomes md's RAID 6 of
/// N+1 with Q on the new last member, as md takes one over (no data
/// moves: the `-6` layouts put the data and P where the RAID 5 has them),
/// then the new member takes the Q role and is rebuilt (Q computed for
/// every stripe). The checks of any grow come first; then every member's
/// superblock records level 6, the `-6` layout and N+1 members (events +
/// 1, a bitmap's header first: its bits count member rows in both), which
/// leaves a RAID 6 with its Q role missing (md's state after its own
/// takeover), and the rebuild fills it. A crash after the record leaves
/// that degraded RAID 6, which `nvraid add` (or md's `--add`) fills.
/// md's further reshape to the ordinary RAID 6 layout (Q rotating) is not
/// done: the array stays in the `-6` layout, which md runs as it is.
pub fn add_q(
    members: &[String],
    options: &super::GrowOptions,
    progress: &mut dyn FnMut(super::GrowProgress),
) -> Result<super::Grown> {
    use super::grow::{check_new_member, check_whole, kept_bitmap, write_superblocks};
    use nvraid_member::OpenOptions;
    use nvraid_metadata::Timestamp;
    let started = std::time::Instant::now();
    crate::assemble::check_distinct_specs(members)?;
    let open = OpenOptions {
        write: true,
        create_bytes: None,
        direct: options.direct,
        ..Default::default()
    };
    let mut found = Vec::with_capacity(members.len());
    for spec in members {
        let member = Member::open(spec, open)?;
        let sb = crate::slot::read_superblock(&member)?;
        found.push((member, sb));
    }
    if let Some((member, _)) = found.iter().find(|(_, sb)| super::is_reshaping(sb)) {
        return Err(Error::Unsupported {
            spec: member.spec().into(),
            what: "a level change while a reshape is in progress: finish it first with `nvraid grow --continue`".into(),
        });
    }
    let (reference, _) = check_whole(&found, "changes the level of", "changing the level of")?;
    let spec = found[0].0.spec().to_string();
    let geometry = crate::assemble::geometry_of(&reference, &spec)?;
    let n = geometry.members();
    let Level::Raid5 { layout } = geometry.level() else {
        return Err(Error::Unsupported {
            spec,
            what: format!(
                "a {} as a RAID 6 with a member added: md adds Q this way to a RAID 5 only",
                geometry.level()
            ),
        });
    };
    if reference.level == RAID4_LEVEL {
        return Err(Error::Unsupported {
            spec,
            what: "a RAID 4 (md level 4) as a RAID 6: md takes a RAID 4 over as RAID 5 first (`nvraid grow --level 5`)".into(),
        });
    }
    let new_layout = raid6_layout_for(layout).expect("RAID 5 layouts all have one");
    if options.add.len() != 1 || options.raid_devices != n + 1 {
        return Err(Error::BadOption {
            option: "--raid-devices".into(),
            why: format!(
                "{} with {} member(s) added: a RAID 5 of {n} becomes a RAID 6 of {} with exactly one --add (its Q)",
                options.raid_devices,
                options.add.len(),
                n + 1
            ),
        });
    }
    let new = Member::open(&options.add[0], open)?;
    check_new_member(&new, &reference, &geometry, options.force)?;
    let after = Geometry::new(
        Level::Raid6 { layout: new_layout },
        n + 1,
        geometry.chunk_bytes().expect("RAID 5 has chunks"),
        crate::assemble::member_data_bytes(&reference),
    )
    .map_err(|e| Error::NotStartable(e.to_string()))?;
    assert_eq!(
        after.array_bytes(),
        geometry.array_bytes(),
        "invariant: a takeover keeps the array's size"
    );
    let mut bitmap = kept_bitmap(found.iter().map(|(m, sb)| (m, sb)), &geometry)?;
    let events = reference.events + 1;
    let placed: Vec<Placed> = found
        .into_iter()
        .map(|(member, mut sb)| {
            sb.level = 6;
            sb.layout = new_layout.to_md();
            sb.raid_disks = n + 1;
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
    drop(placed);
    super::mirror::fill(members, vec![new], &after, options, started, progress)
}

/// `grow --level 10 -n 2N --add NEW...`: a RAID 0 of N becomes md's RAID
/// 10 near=2 of 2N, as md takes one over: RAID 0 member `i` becomes RAID
/// 10 member `2i` (chunk `c`'s first copy lies on member `2(c mod N)`, row
/// `c div N`, where the RAID 0 keeps it), the odd roles (the second
/// copies) missing; then the new members take those roles and are
/// rebuilt. One `--add` per new mirror (N), or none: md's own takeover
/// leaves the mirrors missing, which `nvraid add` fills later.
pub fn raid0_to_raid10(
    members: &[String],
    options: &super::GrowOptions,
    progress: &mut dyn FnMut(super::GrowProgress),
) -> Result<super::Grown> {
    use super::grow::{check_new_member, check_whole, write_superblocks};
    use nvraid_member::OpenOptions;
    use nvraid_metadata::{Role, Timestamp};
    let started = std::time::Instant::now();
    crate::assemble::check_distinct_specs(members)?;
    let open = OpenOptions {
        write: true,
        create_bytes: None,
        direct: options.direct,
        ..Default::default()
    };
    let mut found = Vec::with_capacity(members.len());
    for spec in members {
        let member = Member::open(spec, open)?;
        let sb = crate::slot::read_superblock(&member)?;
        found.push((member, sb));
    }
    if let Some((member, _)) = found.iter().find(|(_, sb)| super::is_reshaping(sb)) {
        return Err(Error::Unsupported {
            spec: member.spec().into(),
            what: "a level change while a reshape is in progress: finish it first with `nvraid grow --continue`".into(),
        });
    }
    let (reference, _) = check_whole(&found, "changes the level of", "changing the level of")?;
    let spec = found[0].0.spec().to_string();
    let geometry = crate::assemble::geometry_of(&reference, &spec)?;
    let n = geometry.members();
    if geometry.level() != Level::Raid0 {
        return Err(Error::Unsupported {
            spec,
            what: format!(
                "a {} as a RAID 10 with members added: md doubles the members this way of a RAID 0 only",
                geometry.level()
            ),
        });
    }
    // One zone only: the RAID 10's members all hold the same rows.
    raid0_as_raid4(&found, &geometry)?;
    if options.raid_devices != 2 * n || !(options.add.is_empty() || options.add.len() == n as usize)
    {
        return Err(Error::BadOption {
            option: "--raid-devices".into(),
            why: format!(
                "{} with {} member(s) added: a RAID 0 of {n} becomes a RAID 10 near=2 of {} (md doubles the members), with one --add per new mirror ({n}) or none",
                options.raid_devices,
                options.add.len(),
                2 * n
            ),
        });
    }
    let mut adding = Vec::with_capacity(options.add.len());
    for spec in &options.add {
        let member = Member::open(spec, open)?;
        check_new_member(&member, &reference, &geometry, options.force)?;
        adding.push(member);
    }
    let rows = geometry.member_used_bytes();
    let after = Geometry::new(
        Level::Raid10 { near: 2 },
        2 * n,
        geometry.chunk_bytes().expect("RAID 0 has chunks"),
        rows,
    )
    .map_err(|e| Error::NotStartable(e.to_string()))?;
    assert_eq!(
        after.array_bytes(),
        geometry.array_bytes(),
        "invariant: a takeover keeps the array's size"
    );
    let events = reference.events + 1;
    let mut table = reference.roles_raw.clone();
    for raw in table.iter_mut() {
        if let Role::Active(r) = Role::from_raw(*raw) {
            *raw = Role::Active(2 * r).to_raw();
        }
    }
    let placed: Vec<Placed> = found
        .into_iter()
        .map(|(member, mut sb)| {
            sb.level = 10;
            sb.layout = Level::Raid10 { near: 2 }.md_layout();
            sb.raid_disks = 2 * n;
            sb.size_sectors = rows / 512;
            sb.data_size_sectors = rows / 512;
            sb.roles_raw = table.clone();
            sb.events = events;
            sb.utime = Timestamp::now();
            Placed { member, sb }
        })
        .collect();
    write_superblocks(&placed, &(0..placed.len()).collect::<Vec<_>>(), None)?;
    drop(placed);
    if adding.is_empty() {
        return Ok(super::Grown {
            raid_disks_before: n,
            raid_disks: 2 * n,
            size_bytes_before: geometry.array_bytes(),
            size_bytes: after.array_bytes(),
            data_offset_bytes: reference.data_offset_sectors * 512,
            moved_bytes: 0,
            seconds: started.elapsed().as_secs_f64(),
            events,
            failed: Vec::new(),
        });
    }
    super::mirror::fill(members, adding, &after, options, started, progress)
}
