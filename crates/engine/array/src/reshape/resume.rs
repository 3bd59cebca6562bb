//! `nvraid serve` of an array its members record part-way through a grow
//! of a RAID 4/5/6 or RAID 10 near (a server killed or stopped during
//! `grow --socket`, the offline grow killed, or the kernel's md stopped
//! mid-reshape).
//!
//! - **Clean** (every superblock says the array was stopped cleanly, every
//!   member of both shapes given, each recording the reshape): the array
//!   is assembled in its old shape from its old members (their superblocks
//!   read without the record, which every update puts back: `LiveGrow`'s
//!   `ReshapeRecord`), and a [`LiveGrow`] made from the record goes on
//!   from the recorded position, through the route and the steps of the
//!   online grow ([`LiveGrow::resume`]: the same core as `start`). The
//!   served size is the old shape's until the array is assembled again.
//! - **Dirty** (a server killed: the superblocks say active), or a record
//!   whose writing was cut short (some members one event behind without
//!   it): the grow is finished offline first (`continue_grow`, every
//!   moved stripe's parity computed from its data), and the array is then
//!   assembled as usual, in its new shape; being dirty, it is resynced in
//!   the background (the bits of a write-intent bitmap, or all of it),
//!   which puts right the parity of the new-shape rows clients wrote
//!   before the crash.
//! - **Restripes** (a RAID 4/5/6 or RAID 10 near keeping its members,
//!   chunk and/or layout changed: `grow --socket --chunk`, or the offline
//!   `grow --chunk` moving the data offset down) go on the same way, clean
//!   or dirty. A RAID 10's new region is marked in its bitmap again before
//!   the steps go on (`live_copy::mark_new_region`, as a new grow marks it).
//! - **Backwards** (a RAID 4/5/6 or RAID 10 near shrunk by members,
//!   nvraid's `grow -n N --array-size` (offline or served) or the
//!   kernel's, or a RAID 4/5/6 restriped with its data offset moved
//!   up, md's choice when there is more room after the data): the same,
//!   clean or dirty, with the position falling to 0 (`live_backwards`):
//!   the old shape assembled (every member, the leaving ones too) is
//!   served at the new, smaller size (`Members::cap_size`), `[P, end)`
//!   read and written in the new shape, `[0, P)` in the old; at the end a
//!   shrink's leaving members leave the running array and are recorded
//!   spares.
//! - **Finished before it is served** (as a dirty one is): a reshape
//!   nvraid honours but does not go on with while serving (a level change,
//!   a RAID 0 grown or restriped as md's RAID 4 with its parity missing, a
//!   RAID 10 restriped backwards, a reshape in place that kept its data
//!   offset, an array with a partial parity log or a write journal):
//!   `continue_grow` runs to the end, its progress logged (and, under
//!   systemd, the start timeout extended), then the array is assembled in
//!   its new shape and served. An array that was taken down mid-reshape
//!   comes back by itself, as md brings its own back. What
//!   `continue_grow` refuses (a backwards step that would need mdadm's
//!   backup file) is refused with nothing written.
//! - **Refused**, nothing written, with `nvraid grow --continue` named: a
//!   served read-only export, and a role without its member; a dirty one
//!   with a member missing names the risk (its bytes would come from
//!   parity the crash may have left stale; md refuses to start a dirty
//!   degraded array too).

use super::grow::{continue_grow, GrowProgress};
use super::live::{check_growable, Begin, LiveGrow, LiveGrowStatus, Parts};
use super::record::{is_reshaping, reshape_of};
use crate::array::Array;
use crate::assemble::{
    assemble, assemble_found, check_distinct_specs, read_superblocks, AssembleOptions,
};
use crate::decision::decide_reshaping;
use crate::error::{Error, Result};
use nvraid_layout::{Direction, Level, Reshape, Shape};
use nvraid_member::Member;
use nvraid_metadata::{features, Role, Superblock, RESYNC_CLEAN};
use std::sync::Arc;

/// How a resumed grow goes on (as `LiveGrowOptions` paces a new one).
#[derive(Clone, Copy, Debug)]
pub struct ResumeOptions {
    /// The most array bytes one step moves (and, finishing offline, one
    /// step of `continue_grow`).
    pub step_bytes: u64,
    /// While clients are busy, no faster than this (bytes per second).
    pub min_bytes_per_sec: Option<u64>,
    /// Never faster than this (bytes per second).
    pub max_bytes_per_sec: Option<u64>,
}

/// A grow the members record, to go on while the array (assembled in its
/// old shape) is served: [`LiveGrow::resume`].
pub struct RecordedGrow {
    parts: Parts,
}

impl std::fmt::Debug for RecordedGrow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordedGrow")
            .field("position", &self.parts.reshape.position())
            .field("old_members", &self.parts.old_members)
            .finish()
    }
}

impl RecordedGrow {
    /// The recorded position (array bytes in the new shape).
    pub fn position_bytes(&self) -> u64 {
        self.parts.reshape.position()
    }
}

/// Assemble the array `specs` form for `serve` (see the module's text):
/// the array, and the grow to resume on it when its members record one
/// that goes on while served. A grow finished offline first reports its
/// progress through `log`.
pub fn assemble_serving(
    specs: &[String],
    options: AssembleOptions,
    resume: ResumeOptions,
    log: &dyn Fn(&str),
) -> Result<(Array, Option<RecordedGrow>)> {
    if specs.is_empty() {
        return Err(Error::NoMembers);
    }
    check_distinct_specs(specs)?;
    let (found, unreadable) = read_superblocks(specs, options)?;
    let Some((ref_at, reference)) = found
        .iter()
        .enumerate()
        .filter(|(_, (_, sb))| is_reshaping(sb))
        .max_by_key(|(_, (_, sb))| sb.events)
        .map(|(i, (_, sb))| (i, sb.clone()))
    else {
        return Ok((assemble_found(found, unreadable, options)?, None));
    };
    let ref_spec = found[ref_at].0.spec().to_string();
    // One array, before anything is decided (a grow finished offline
    // below must not run beside a stranger the assembly would refuse).
    if let Some((stranger, sb)) = found
        .iter()
        .find(|(_, sb)| sb.set_uuid != reference.set_uuid)
    {
        return Err(Error::MixedArrays {
            spec: stranger.spec().into(),
            uuid: nvraid_metadata::format_uuid(&sb.set_uuid),
            other: ref_spec,
            other_uuid: nvraid_metadata::format_uuid(&reference.set_uuid),
        });
    }
    let continue_hint = format!("`nvraid grow --continue {}`", specs.join(" "));
    if !options.writable {
        return Err(Error::NotStartable(format!(
            "the members record a reshape in progress, and a read-only export would leave it so: \
             serve the array writable (the grow then goes on while it is served), read it with \
             `nvraid read`, or finish the grow with {continue_hint}"
        )));
    }
    // The members by the role the record's table gives them (fresh: the
    // same array, at most one event behind the record).
    let fresh =
        |sb: &Superblock| sb.set_uuid == reference.set_uuid && sb.events + 1 >= reference.events;
    let old_count = (i64::from(reference.raid_disks) - i64::from(reference.delta_disks as i32))
        .clamp(0, i64::from(reference.max_dev)) as u32;
    let roles = reference.raid_disks.max(old_count) as usize;
    let role_of = |sb: &Superblock| match reference.roles_raw.get(sb.dev_number as usize) {
        Some(&raw) => match Role::from_raw(raw) {
            Role::Active(r) if (r as usize) < roles => Some(r as usize),
            _ => None,
        },
        None => None,
    };
    // A RAID 0 reshaped as md's RAID 4 never names its parity role: no
    // member of it is to be given.
    let named = if super::takeover::last_role_unnamed(&reference) {
        roles - 1
    } else {
        roles
    };
    let missing: Vec<usize> = (0..named)
        .filter(|&r| {
            !found
                .iter()
                .any(|(_, sb)| fresh(sb) && role_of(sb) == Some(r))
        })
        .collect();
    // Dirty when any member taking part says so (a clean close cut short
    // leaves some members dirty, one event behind the others).
    let dirty = found
        .iter()
        .any(|(_, sb)| fresh(sb) && role_of(sb).is_some() && sb.resync_offset != RESYNC_CLEAN);
    // A record nvraid cannot honour is refused here; one it honours but
    // does not go on with while serving is finished offline below.
    let recorded = reshape_of(&reference, &ref_spec, &[])?;
    let unservable = check_kind(&reference, &ref_spec, &continue_hint)
        .err()
        .map(|_| {
            if super::takeover::last_role_unnamed(&reference) {
                format!(
                    "a RAID 0 reshaped as md's RAID 4 with its parity missing ({})",
                    unservable_what(&recorded)
                )
            } else {
                unservable_what(&recorded)
            }
        });
    if !missing.is_empty() {
        let roles = missing
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        return Err(Error::NotStartable(if dirty {
            format!(
                "the members record a grow in progress and the array was not stopped cleanly \
                 (its superblocks say active), and role(s) {roles} have no member given: their \
                 bytes would be rebuilt from parity the crash may have left stale (md refuses \
                 to start a dirty degraded array too). Give every member, the added ones \
                 included; if one is lost for good, {continue_hint} finishes the grow reading \
                 around it, trusting that parity"
            )
        } else {
            format!(
                "the members record a grow in progress and role(s) {roles} have no member \
                 given: nvraid goes on with a grow while serving only with every member of \
                 both shapes. Give every member, the added ones included, or finish the grow \
                 offline with {continue_hint} (it reads around a missing member)"
            )
        }));
    }
    // A member fresh enough to take part but without the record: the
    // record's writing was cut short (or its finish): the offline
    // continue puts the record (or the finish) on every member.
    let cut_short = found
        .iter()
        .any(|(_, sb)| fresh(sb) && role_of(sb).is_some() && !is_reshaping(sb));
    if dirty || cut_short || unservable.is_some() {
        let placed: Vec<String> = found
            .iter()
            .filter(|(_, sb)| fresh(sb) && role_of(sb).is_some())
            .map(|(m, _)| m.spec().to_string())
            .collect();
        drop(found);
        drop(unreadable);
        log(&format!(
            "nvraid: event=reshape-finishing-offline position={} end={} reason={}",
            recorded.position(),
            recorded.new_shape().array_bytes(),
            if dirty {
                "\"the array was not stopped cleanly: the grow is finished before it is served, then resynced\"".to_string()
            } else if cut_short {
                "\"the reshape's record is not on every member\"".to_string()
            } else {
                format!(
                    "\"{}: serve does not go on with it while serving, so it is finished before the array is served\"",
                    unservable.as_deref().unwrap_or_default()
                )
            }
        ));
        let mut progress = |p: GrowProgress| {
            log(&format!(
                "nvraid: event=reshape-progress position={} end={}",
                p.position_bytes, p.end_bytes
            ))
        };
        let grown = continue_grow(&placed, options.direct, resume.step_bytes, &mut progress)?;
        log(&format!(
            "nvraid: event=reshape-finished raid_disks={}->{} size={}",
            grown.raid_disks_before, grown.raid_disks, grown.size_bytes
        ));
        return Ok((assemble(specs, options)?, None));
    }
    // Clean, whole, every member recording it: the old shape served, the
    // grow going on beside it.
    let listed: Vec<(&str, &Superblock)> = found.iter().map(|(m, sb)| (m.spec(), sb)).collect();
    let decision = decide_reshaping(&listed)?;
    let by_role: Vec<Option<&Superblock>> = decision
        .roles
        .iter()
        .map(|r| r.map(|i| &found[i].1))
        .collect();
    let reshape = reshape_of(&reference, &ref_spec, &by_role)?;
    let old_members = reshape.old().members();
    let new_members = reshape.new_shape().members();
    // By role of the larger shape (a shrink's leaving roles included).
    let mut bblog_offsets = vec![0u32; new_members.max(old_members) as usize];
    let mut added_at: Vec<Option<usize>> =
        vec![None; new_members.saturating_sub(old_members) as usize];
    for (role, index) in decision.roles.iter().enumerate() {
        let Some(index) = *index else {
            unreachable!("invariant: no role is missing (looked at above)")
        };
        bblog_offsets[role] = found[index].1.bblog_offset;
        if role >= old_members as usize {
            added_at[role - old_members as usize] = Some(index);
        }
    }
    let added_devs: Vec<u32> = added_at
        .iter()
        .map(|i| found[i.expect("every role placed")].1.dev_number)
        .collect();
    let mut added = Vec::with_capacity(added_at.len());
    let mut rest = Vec::with_capacity(found.len());
    let mut slots: Vec<Option<(Member, Superblock)>> = found.into_iter().map(Some).collect();
    for index in added_at.iter().map(|i| i.expect("every role placed")) {
        let (member, mut sb) = slots[index].take().expect("placed once");
        without_record(&mut sb, old_members, &added_devs);
        added.push((member, sb));
    }
    for (member, mut sb) in slots.into_iter().flatten() {
        without_record(&mut sb, old_members, &added_devs);
        rest.push((member, sb));
    }
    let table_entries = added_devs
        .iter()
        .enumerate()
        .map(|(k, &dev)| {
            (
                dev as usize,
                Role::Active((old_members as usize + k) as u16).to_raw(),
            )
        })
        .collect();
    let old_offset = reshape
        .data_offset(Shape::Old, 0)
        .expect("role 0 of the old shape");
    let new_offset = reshape
        .data_offset(Shape::New, 0)
        .expect("role 0 of the new shape");
    let one_offset = (0..old_members)
        .all(|r| reshape.data_offset(Shape::Old, r) == Some(old_offset))
        && (0..new_members).all(|r| reshape.data_offset(Shape::New, r) == Some(new_offset));
    if !one_offset {
        return Err(Error::NotStartable(format!(
            "the members record a grow whose members start their data at different offsets;              nvraid goes on with a grow while serving only when they share one: finish it              with {continue_hint}"
        )));
    }
    let array = assemble_found(rest, unreadable, options)?;
    // Nothing is written before every check has passed.
    check_growable(&array).map_err(|e| {
        Error::NotStartable(format!(
            "the members record a grow in progress, which cannot go on while the array is \
             served ({e}); finish it with {continue_hint}"
        ))
    })?;
    if array.roles() != old_members as usize {
        return Err(Error::NotStartable(format!(
            "the old shape assembled with {} roles, the record says {old_members}; finish the grow with {continue_hint}",
            array.roles()
        )));
    }
    // A shrink is served at its new, smaller size (md's size while it
    // reshapes, the bytes past it given up before it began).
    array.cap_size(reshape.array_bytes());
    Ok((
        array,
        Some(RecordedGrow {
            parts: Parts {
                reshape,
                old_members,
                added,
                moved_sectors: old_offset.abs_diff(new_offset) / 512,
                bblog_offsets,
                table_entries,
            },
        }),
    ))
}

/// Whether `serve` can start the array whose members record the reshape
/// `reference` records (`scan`'s judgement of an array for the boot
/// path): a record nvraid honours is gone on with while served, or
/// finished before the array is served; one it cannot honour is refused,
/// naming why.
pub(crate) fn check_servable(reference: &Superblock, spec: &str) -> Result<()> {
    reshape_of(reference, spec, &[]).map(|_| ())
}

/// A recorded reshape in a few words: its two shapes and its direction.
fn unservable_what(reshape: &Reshape) -> String {
    let (old, new) = (reshape.old(), reshape.new_shape());
    format!(
        "{} of {} members to {} of {} members, chunk {} to {}, {}",
        old.level(),
        old.members(),
        new.level(),
        new.members(),
        old.chunk_bytes().unwrap_or(0),
        new.chunk_bytes().unwrap_or(0),
        match reshape.direction() {
            Direction::Forwards => "forwards",
            Direction::Backwards => "backwards",
        }
    )
}

/// The reshape `reference` records is one `serve` goes on with: a RAID
/// 4/5/6 or RAID 10 near gaining members (level, layout and chunk kept) or restriped
/// with its members kept (chunk and/or layout changed), forwards, every
/// member's data offset moving down by the same amount from one offset;
/// or a RAID 4/5/6 shrunk by members or restriped backwards, or a RAID
/// 10 near shrunk, the offsets moving up;
/// without a partial parity log or a write journal. Refused otherwise,
/// naming the offline continue.
fn check_kind(reference: &Superblock, spec: &str, continue_hint: &str) -> Result<Reshape> {
    let reshape = reshape_of(reference, spec, &[])?;
    let (old, new) = (reshape.old(), reshape.new_shape());
    let refuse = |what: String| {
        Error::NotStartable(format!(
            "the members record a reshape in progress ({what}); `nvraid serve` goes on only \
             with a RAID 4/5/6 or RAID 10 near gaining members or restriped (chunk, layout) \
             while served (forwards, the data offset moved down), and with a RAID 4/5/6 \
             shrunk or restriped backwards or a RAID 10 near shrunk (the data offset moved up): finish this one first with {continue_hint}, or let the kernel's md finish \
             it (mdadm --assemble)"
        ))
    };
    let describe = unservable_what(&reshape);
    let parity = matches!(old.level(), Level::Raid5 { .. } | Level::Raid6 { .. });
    // A RAID 10 near keeping its copies (the route's `copy_read` and
    // `copy_write`, `step`'s RAID 10 rows).
    let near = matches!(old.level(), Level::Raid10 { .. }) && old.level() == new.level();
    let grow = old.level() == new.level()
        && old.chunk_bytes() == new.chunk_bytes()
        && new.members() > old.members();
    // A chunk or layout change within the level (`live_shape`).
    let restripe = super::shape::is_in_place(&reshape)
        && std::mem::discriminant(&old.level()) == std::mem::discriminant(&new.level());
    // A RAID 0 grown or restriped as md's RAID 4 (its parity role never
    // named, so no member of it is "missing" to give).
    if parity && super::takeover::last_role_unnamed(reference) {
        return Err(refuse(format!(
            "{describe}: a RAID 0's reshape as md's RAID 4 with its parity missing"
        )));
    }
    // Backwards (`live_backwards`): a RAID 4/5/6 shrunk by members or
    // restriped with its data offset moved up.
    let backwards = reshape.direction() == Direction::Backwards;
    let shrink = super::shrink::is_shrink(&reshape);
    let forwards_ok = !backwards && (parity || near) && (grow || restripe);
    // A RAID 10 near runs backwards only shrunk (its rows moved down by
    // `live_backwards` as the offline shrink moves them).
    let backwards_ok = backwards && ((parity && (shrink || restripe)) || (near && shrink));
    if !(forwards_ok || backwards_ok) {
        return Err(refuse(describe));
    }
    let moved = i64::from(reference.new_offset as i32);
    let moved_right = if backwards { moved > 0 } else { moved < 0 };
    if reference.feature_map & features::NEW_OFFSET == 0 || !moved_right {
        return Err(refuse(format!(
            "{describe}, the data offset {}",
            if moved == 0 {
                "kept (md's backup file)"
            } else if moved > 0 {
                "moving up"
            } else {
                "moving down"
            }
        )));
    }
    if reference.feature_map & (features::PPL | features::JOURNAL) != 0 {
        return Err(refuse(format!(
            "{describe}, with md's partial parity log or write journal"
        )));
    }
    Ok(reshape)
}

/// A superblock as the array's old shape holds it: the reshape's record
/// taken out (each superblock update puts it back while the grow runs),
/// the added members' role table entries free (their record puts them
/// back too). The bad-block log keeps the place the record gave it.
fn without_record(sb: &mut Superblock, old_members: u32, added_devs: &[u32]) {
    sb.raid_disks = old_members;
    sb.delta_disks = 0;
    sb.feature_map &=
        !(features::RESHAPE_ACTIVE | features::NEW_OFFSET | features::RESHAPE_BACKWARDS);
    sb.reshape_position = 0;
    sb.new_offset = 0;
    sb.new_level = sb.level as u32;
    sb.new_layout = sb.layout;
    sb.new_chunk = sb.chunk_sectors;
    for &dev in added_devs {
        if let Some(entry) = sb.roles_raw.get_mut(dev as usize) {
            *entry = Role::Spare.to_raw();
        }
    }
}

impl LiveGrow {
    /// Go on with the grow `recorded` on the served `array` (assembled by
    /// [`assemble_serving`] in its old shape), from the recorded position:
    /// the record is in every superblock update from the first on, client
    /// requests go through the route, the steps run on a thread of their
    /// own, which is returned. The added members get the array's bitmap
    /// first, as `start` gives it to them.
    pub fn resume(
        array: &Arc<Array>,
        recorded: RecordedGrow,
        options: ResumeOptions,
    ) -> Result<(Arc<LiveGrow>, std::thread::JoinHandle<()>)> {
        check_growable(array)?;
        // A RAID 10's new region marked again (a crash while it goes on
        // leaves md to resync that region by these bits, as `start`'s
        // mark does for a new grow).
        super::live_copy::mark_new_region(
            array,
            recorded.parts.reshape.old(),
            recorded.parts.reshape.new_shape(),
        )?;
        for (member, _) in &recorded.parts.added {
            array.bitmap_copy_to(member)?;
            member.flush().map_err(|e| Error::io(member.spec(), e))?;
        }
        LiveGrow::launch(
            array,
            recorded.parts,
            (
                options.step_bytes,
                options.min_bytes_per_sec,
                options.max_bytes_per_sec,
            ),
            Begin::Recorded,
        )
    }
}

/// What `serve` logs when a grow goes on: `event=reshape-resumed`.
pub fn resumed_line(status: &LiveGrowStatus) -> String {
    format!(
        "nvraid: event=reshape-resumed position={} raid_disks={}->{} end={}",
        status.position_bytes, status.raid_disks_before, status.raid_disks, status.end_bytes
    )
}
