//! The assembly decision: given the superblocks of the members a user named,
//! which member holds which role, which are set aside and why, and when the
//! array must not be assembled at all. One pure function, used by
//! `assemble` and by `assemble --scan`, so both always agree.
//!
//! The rules follow md (the kernel's `super_1_validate` and mdadm's
//! assembly); docs/on-disk-format.md has them as a table:
//!
//! 1. All members carry the same array UUID, level, layout, chunk, member
//!    count (`raid_disks`) and member size (`size`), as mdadm requires of
//!    the devices it assembles; otherwise the array is refused, naming the
//!    member and the field (whatever order the members were given in). A
//!    member count larger than the role table is refused too.
//! 2. The freshest superblock (highest `events`) describes the array; when
//!    several are freshest, their role tables must agree, or the halves of
//!    the array ran apart (split brain) and the array is refused.
//! 3. Two members that each record the other as faulty both ran without
//!    the other (split brain): refused, whatever their events.
//! 4. Features nvraid cannot honour (a reshape in progress, md-cluster)
//!    refuse the array, naming the feature; so does a write journal on a
//!    level other than 4/5/6. (A reshape is let through by
//!    [`decide_reshaping`], for the readers of such an array and for
//!    `serve`, which goes on with a grow: `reshape::resume`.)
//! 5. Each member's role is the freshest role table's entry for its
//!    `dev_number`, not its own: a member the freshest table records as
//!    faulty or spare is set aside as such. The member it records as the
//!    write journal becomes the array's journal when it is fresh (a stale
//!    one is set aside as stale).
//! 6. A member whose events are more than one behind the freshest is stale
//!    and set aside. One behind is in sync, as for the kernel (its
//!    `super_1_validate` at assembly) and mdadm (its `event_margin`): a
//!    crash in the middle of a superblock update leaves some members one
//!    event behind, and they missed no write (anything that lets a member
//!    miss writes records it faulty in the others' role tables first).
//! 7. A member replacing another (`REPLACEMENT`) is set aside: nvraid does
//!    not continue a replacement.
//! 8. Two fresh members claiming one role refuse the array.
//!
//! A member whose superblock fails its checksum is set aside before this
//! decision (by `assemble`, as the kernel leaves out a device whose
//! superblock it cannot load): nothing it records can be trusted.

use crate::error::{Error, Result};

/// How far behind the freshest a member's events may be and it still be
/// in sync (rule 6; md's margin).
const EVENTS_MARGIN: u64 = 1;
use nvraid_metadata::{features, format_uuid, Role, Superblock};
use serde::Serialize;

/// Why a member given at assembly takes no part in the array.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum SetAside {
    /// Its events counter is behind the freshest member's.
    Stale { events: u64, freshest: u64 },
    /// The freshest role table records it as faulty.
    Faulty,
    /// The freshest role table records it as a spare (or has no role for it).
    Spare,
    /// A raid5/6 journal device.
    Journal,
    /// It was replacing another member; nvraid does not continue that.
    Replacement,
    /// Its superblock could not be read (an I/O error): a failed device.
    Unreadable { error: String },
    /// Its superblock is damaged (md's checksum does not match it): nothing
    /// it records can be trusted.
    Invalid { error: String },
}

impl SetAside {
    /// `stale`, `faulty`, `spare`, `journal`, `replacement`, `unreadable`
    /// or `invalid`.
    pub fn state(&self) -> &'static str {
        match self {
            SetAside::Stale { .. } => "stale",
            SetAside::Faulty => "faulty",
            SetAside::Spare => "spare",
            SetAside::Journal => "journal",
            SetAside::Replacement => "replacement",
            SetAside::Unreadable { .. } => "unreadable",
            SetAside::Invalid { .. } => "invalid",
        }
    }

    /// Why, in a sentence part.
    pub fn reason(&self) -> String {
        match self {
            SetAside::Stale { events, freshest } => format!(
                "stale: its events counter {events} is more than one behind the array's {freshest}; it missed writes"
            ),
            SetAside::Faulty => "the array records it as faulty".into(),
            SetAside::Spare => "a spare: the array gives it no active role".into(),
            SetAside::Journal => "a raid5/6 journal device".into(),
            SetAside::Replacement => {
                "it was replacing another member when the array stopped (nvraid does not continue a replacement)".into()
            }
            SetAside::Unreadable { error } => {
                format!("its superblock cannot be read ({error}); treated as a failed device")
            }
            SetAside::Invalid { error } => {
                format!("its superblock is damaged ({error}); treated as a failed device")
            }
        }
    }
}

/// The outcome for a set of superblocks (indexes into the caller's list).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The superblock that describes the array (the first freshest).
    pub reference: usize,
    /// Index of the member in each role, `None` where the role is missing.
    pub roles: Vec<Option<usize>>,
    /// Members set aside, with the reason.
    pub set_aside: Vec<(usize, SetAside)>,
    /// The array's RAID 4/5/6 write journal, when it is given and fresh.
    pub journal: Option<usize>,
}

/// Feature bits that refuse the array, with what to do instead.
const REFUSED: [(u32, &str); 4] = [
    (
        features::RESHAPE_ACTIVE,
        "a reshape is in progress; nvraid reads such an array (`nvraid read`, `detail`), `nvraid serve` goes on with a RAID 4/5/6 grow while serving it, and `nvraid grow --continue` (or the kernel: mdadm --assemble) finishes a reshape before anything else writes it",
    ),
    (
        features::RESHAPE_BACKWARDS,
        "a reshape is in progress; `nvraid grow --continue` or the kernel finishes it",
    ),
    (
        features::NEW_OFFSET,
        "a reshape that moves the data offset is in progress; `nvraid grow --continue` or the kernel finishes it",
    ),
    (
        features::CLUSTERED,
        "an md-cluster array is shared by several hosts; a second writer would corrupt it",
    ),
];

/// The fields that describe the array's geometry, each the same on every
/// member (mdadm's comparison of superblocks at assembly): name and value.
fn geometry_fields(sb: &Superblock, reshapes: bool) -> [(&'static str, String); 9] {
    // When a reshape is read, its new shape is geometry too (md keeps these
    // fields only while one is recorded).
    let reshaping = reshapes && sb.feature_map & features::RESHAPE_ACTIVE != 0;
    let new = |value: String| if reshaping { value } else { String::new() };
    [
        ("level", sb.level.to_string()),
        ("layout", format!("{:#x}", sb.layout)),
        ("chunk_size", format!("{} sectors", sb.chunk_sectors)),
        ("raid_disks", sb.raid_disks.to_string()),
        ("size", format!("{} sectors", sb.size_sectors)),
        ("new_level", new(sb.new_level.to_string())),
        ("new_layout", new(format!("{:#x}", sb.new_layout))),
        ("new_chunk", new(format!("{} sectors", sb.new_chunk))),
        ("delta_disks", new((sb.delta_disks as i32).to_string())),
    ]
}

/// Rule 1 for the geometry: the first field on which the members differ,
/// naming a member whose value most of the others do not share, and one
/// that holds the value most do (on a tie, the first given's value counts
/// as the most held; the message names both members and both values).
fn disagreement(found: &[(&str, &Superblock)], reshapes: bool) -> Result<()> {
    let fields: Vec<_> = found
        .iter()
        .map(|(_, sb)| geometry_fields(sb, reshapes))
        .collect();
    for (f, &(field, _)) in fields[0].iter().enumerate() {
        let value = |i: usize| &fields[i][f].1;
        let count = |v: &String| (0..found.len()).filter(|&i| value(i) == v).count();
        let Some(majority) =
            (0..found.len()).max_by_key(|&i| (count(value(i)), std::cmp::Reverse(i)))
        else {
            panic!("invariant: decide checks for members before its rules");
        };
        if let Some(odd) = (0..found.len()).find(|&i| value(i) != value(majority)) {
            return Err(Error::Disagree {
                spec: found[odd].0.into(),
                other: found[majority].0.into(),
                field,
                value: value(odd).clone(),
                other_value: value(majority).clone(),
            });
        }
    }
    Ok(())
}

/// The role `table` gives device slot `dev_number` (a spare when the slot
/// is past the table).
fn role_in(table: &Superblock, dev_number: u32) -> Role {
    Role::from_raw(
        table
            .roles_raw
            .get(dev_number as usize)
            .copied()
            .unwrap_or(0xffff),
    )
}

/// Whether the member's own superblock gives it an active role.
fn thinks_active(sb: &Superblock) -> bool {
    matches!(sb.role(), Role::Active(_))
}

/// Decide. `found` is the members' specs (for messages) and superblocks, in
/// the order the user gave them. The rules run in the order md applies
/// them; the first that refuses the array gives the error.
pub fn decide(found: &[(&str, &Superblock)]) -> Result<Decision> {
    decide_with(found, 0)
}

/// The reshape's bits (`RESHAPE_ACTIVE`, `RESHAPE_BACKWARDS`,
/// `NEW_OFFSET`): what [`decide_reshaping`] lets through.
pub const RESHAPE_BITS: u32 =
    features::RESHAPE_ACTIVE | features::RESHAPE_BACKWARDS | features::NEW_OFFSET;

/// [`decide`] for an array read part-way through a reshape (nvraid's
/// `reshape` module): the same rules, the reshape's bits allowed, the
/// reshape's record (new level, layout, chunk, member count change) the
/// same on every member as the geometry must be, and as many roles as the
/// larger of the two shapes has (a reshape removing members keeps them in
/// the old shape until it ends).
pub fn decide_reshaping(found: &[(&str, &Superblock)]) -> Result<Decision> {
    decide_with(found, RESHAPE_BITS)
}

fn decide_with(found: &[(&str, &Superblock)], allowed: u32) -> Result<Decision> {
    if found.is_empty() {
        return Err(Error::NoMembers);
    }
    one_array(found)?; // Rule 1: one array, a role table its count fits.
    let reshapes = allowed & features::RESHAPE_ACTIVE != 0;
    disagreement(found, reshapes)?; // Rule 1: one geometry.
    no_refused_feature(found, allowed)?; // Rule 4.
    let reference = freshest(found)?; // Rule 2.
    no_mutual_faults(found)?; // Rule 3.
    let decision = place(found, reference, reshapes)?; // Rules 5 to 8.
    check_placement(found, &decision, reshapes);
    Ok(decision)
}

/// Rule 1 for the identity: every member carries the first one's array
/// UUID, and a member count its role table holds.
fn one_array(found: &[(&str, &Superblock)]) -> Result<()> {
    let Some(&(first_spec, first)) = found.first() else {
        panic!("invariant: decide checks for members before its rules");
    };
    for &(spec, sb) in found {
        if sb.set_uuid != first.set_uuid {
            return Err(Error::MixedArrays {
                spec: spec.into(),
                uuid: format_uuid(&sb.set_uuid),
                other: first_spec.into(),
                other_uuid: format_uuid(&first.set_uuid),
            });
        }
        if sb.raid_disks > sb.max_dev {
            return Err(Error::BadField {
                spec: spec.into(),
                field: "raid_disks",
                value: sb.raid_disks.to_string(),
                why: format!(
                    "is more than its role table's {} entries (the superblock is damaged)",
                    sb.max_dev
                ),
            });
        }
    }
    Ok(())
}

/// Rule 4, on every member (array-wide bits are on all of them): no
/// feature nvraid cannot honour, and a write journal on RAID 4/5/6 only
/// (md keeps one there only).
fn no_refused_feature(found: &[(&str, &Superblock)], allowed: u32) -> Result<()> {
    for &(spec, sb) in found {
        for (bit, why) in REFUSED {
            if sb.feature_map & bit & !allowed != 0 {
                return Err(Error::Unsupported {
                    spec: spec.into(),
                    what: format!("{} ({why})", features::names(bit).join(", ")),
                });
            }
        }
    }
    for &(spec, sb) in found {
        if sb.feature_map & features::JOURNAL != 0 && !matches!(sb.level, 4..=6) {
            return Err(Error::Unsupported {
                spec: spec.into(),
                what: format!(
                    "a write journal (JOURNAL feature) on a raid{} array (md journals RAID 4/5/6 only)",
                    sb.level
                ),
            });
        }
    }
    Ok(())
}

/// Rule 2: the first freshest member, whose superblock describes the
/// array; every other freshest one must have its role table.
fn freshest(found: &[(&str, &Superblock)]) -> Result<usize> {
    let events = found.iter().map(|(_, sb)| sb.events).max().unwrap_or(0);
    let Some(reference) = found.iter().position(|(_, sb)| sb.events == events) else {
        panic!("invariant: decide checks for members before its rules");
    };
    let (ref_spec, ref_sb) = found[reference];
    for &(spec, sb) in found {
        if sb.events == events && sb.roles_raw != ref_sb.roles_raw {
            return Err(split_brain(
                ref_spec,
                ref_sb,
                spec,
                sb,
                "both have the same events counter but different role tables",
            ));
        }
    }
    Ok(reference)
}

/// Rule 3: no two members, each active by its own superblock, that record
/// each other as faulty.
fn no_mutual_faults(found: &[(&str, &Superblock)]) -> Result<()> {
    for (i, &(a_spec, a)) in found.iter().enumerate() {
        for &(b_spec, b) in &found[..i] {
            let a_fails_b = role_in(a, b.dev_number) == Role::Faulty;
            let b_fails_a = role_in(b, a.dev_number) == Role::Faulty;
            if a_fails_b && b_fails_a && thinks_active(a) && thinks_active(b) {
                return Err(split_brain(
                    b_spec,
                    b,
                    a_spec,
                    a,
                    "each records the other as faulty: both ran without the other",
                ));
            }
        }
    }
    Ok(())
}

/// How many roles the array has: the reference's `raid_disks`; while a
/// reshape that removes members (`delta_disks` < 0) is read, the old
/// shape's count, which still holds them in the roles past the new count.
fn role_count(ref_sb: &Superblock, reshapes: bool) -> usize {
    let raid_disks = ref_sb.raid_disks as usize;
    if reshapes && ref_sb.feature_map & features::RESHAPE_ACTIVE != 0 {
        let old = i64::from(ref_sb.raid_disks) - i64::from(ref_sb.delta_disks as i32);
        raid_disks.max(old.clamp(0, i64::from(ref_sb.max_dev)) as usize)
    } else {
        raid_disks
    }
}

/// Rules 5 to 8: each member's role from the reference's role table; the
/// members not placed set aside with the reason, the fresh journal kept.
fn place(found: &[(&str, &Superblock)], reference: usize, reshapes: bool) -> Result<Decision> {
    let ref_sb = found[reference].1;
    let freshest = ref_sb.events;
    let behind = |sb: &Superblock| sb.events + EVENTS_MARGIN < freshest;
    let raid_disks = role_count(ref_sb, reshapes);
    let mut roles: Vec<Option<usize>> = vec![None; raid_disks];
    let mut set_aside = Vec::new();
    let mut journal = None;
    for (index, &(spec, sb)) in found.iter().enumerate() {
        let role = role_in(ref_sb, sb.dev_number);
        let aside = match role {
            Role::Faulty => Some(SetAside::Faulty),
            // The journal must have seen every update the array did.
            Role::Journal if behind(sb) => Some(SetAside::Stale {
                events: sb.events,
                freshest,
            }),
            Role::Journal if journal.is_none() && ref_sb.feature_map & features::JOURNAL != 0 => {
                journal = Some(index);
                continue;
            }
            Role::Journal => Some(SetAside::Journal),
            Role::Spare => Some(SetAside::Spare),
            Role::Active(r) if usize::from(r) >= raid_disks => Some(SetAside::Spare),
            Role::Active(_) if behind(sb) => Some(SetAside::Stale {
                events: sb.events,
                freshest,
            }),
            Role::Active(_) if sb.feature_map & features::REPLACEMENT != 0 => {
                Some(SetAside::Replacement)
            }
            Role::Active(_) => None,
        };
        if let Some(reason) = aside {
            set_aside.push((index, reason));
            continue;
        }
        let Role::Active(r) = role else {
            unreachable!("set aside above")
        };
        if let Some(other) = roles[usize::from(r)] {
            return Err(Error::SameRole {
                spec: spec.into(),
                other: found[other].0.into(),
                role: r,
            });
        }
        roles[usize::from(r)] = Some(index);
    }
    Ok(Decision {
        reference,
        roles,
        set_aside,
        journal,
    })
}

/// Paired with the placement: the reference is a freshest member; each
/// placed member and the journal are fresh, each placed member holds the
/// role the reference table gives it, and every member given is placed,
/// set aside or the journal, exactly once.
fn check_placement(found: &[(&str, &Superblock)], decision: &Decision, reshapes: bool) {
    let ref_sb = found[decision.reference].1;
    assert!(
        found.iter().all(|(_, sb)| sb.events <= ref_sb.events),
        "invariant: the reference member is a freshest one"
    );
    let behind = |sb: &Superblock| sb.events + EVENTS_MARGIN < ref_sb.events;
    assert_eq!(
        decision.roles.len(),
        role_count(ref_sb, reshapes),
        "invariant: one role per member of the reference's count"
    );
    let mut seen = vec![0u32; found.len()];
    for (r, placed) in decision.roles.iter().enumerate() {
        if let Some(index) = *placed {
            let sb = found[index].1;
            assert!(!behind(sb), "invariant: a placed member is fresh");
            assert_eq!(
                role_in(ref_sb, sb.dev_number),
                Role::Active(r as u16),
                "invariant: a placed member holds the role the reference table gives it"
            );
            seen[index] += 1;
        }
    }
    if let Some(index) = decision.journal {
        assert!(
            !behind(found[index].1),
            "invariant: the array's journal is fresh"
        );
        seen[index] += 1;
    }
    for (index, _) in &decision.set_aside {
        seen[*index] += 1;
    }
    assert!(
        seen.iter().all(|&n| n == 1),
        "invariant: every member given is placed, set aside or the journal, exactly once"
    );
}

/// The error for two halves of the array that ran apart.
fn split_brain(a_spec: &str, a: &Superblock, b_spec: &str, b: &Superblock, how: &str) -> Error {
    Error::SplitBrain(format!(
        "{a_spec} (events {}, updated {}) and {b_spec} (events {}, updated {}) ran apart: {how}. \
         Choose the half whose data you want and give only its members (for example \
         `nvraid detail {a_spec}`); then bring the other half back as a new member",
        a.events, a.utime.seconds, b.events, b.utime.seconds
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvraid_metadata::{Timestamp, RESYNC_CLEAN, SUPER_OFFSET_SECTORS};

    /// A raid1 member `dev` of `disks`, with `table` as its role table.
    fn member(dev: u32, events: u64, table: &[u16]) -> Superblock {
        let mut roles_raw = vec![0xffffu16; 128];
        roles_raw[..table.len()].copy_from_slice(table);
        Superblock {
            feature_map: 0,
            set_uuid: [7; 16],
            set_name: [0; 32],
            ctime: Timestamp {
                seconds: 1,
                micros: 0,
            },
            level: 1,
            layout: 0,
            size_sectors: 2048,
            chunk_sectors: 0,
            raid_disks: 2,
            bitmap_offset: 0,
            new_level: 0,
            reshape_position: 0,
            delta_disks: 0,
            new_layout: 0,
            new_chunk: 0,
            new_offset: 0,
            data_offset_sectors: 2048,
            data_size_sectors: 2048,
            super_offset_sectors: SUPER_OFFSET_SECTORS,
            recovery_offset: 0,
            dev_number: dev,
            cnt_corrected_read: 0,
            device_uuid: [dev as u8; 16],
            devflags: 0,
            bblog_shift: 0,
            bblog_size: 0,
            bblog_offset: 0,
            utime: Timestamp {
                seconds: 1,
                micros: 0,
            },
            events,
            resync_offset: RESYNC_CLEAN,
            max_dev: 128,
            roles_raw,
        }
    }

    const FAULTY: u16 = 0xfffe;
    const SPARE: u16 = 0xffff;

    fn run(members: &[Superblock]) -> Result<Decision> {
        let names = ["a", "b", "c", "d"];
        let found: Vec<(&str, &Superblock)> = members
            .iter()
            .enumerate()
            .map(|(i, sb)| (names[i], sb))
            .collect();
        decide(&found)
    }

    #[test]
    fn healthy_members_take_their_roles_in_any_order() {
        let d = run(&[member(1, 5, &[0, 1]), member(0, 5, &[0, 1])]).unwrap();
        assert_eq!(d.roles, vec![Some(1), Some(0)]);
        assert!(d.set_aside.is_empty());
    }

    #[test]
    fn the_freshest_table_decides_roles() {
        // b failed: a (fresher) records it faulty; b's own table still says active.
        let d = run(&[member(0, 9, &[0, FAULTY]), member(1, 5, &[0, 1])]).unwrap();
        assert_eq!(d.roles, vec![Some(0), None]);
        assert_eq!(d.set_aside, vec![(1, SetAside::Faulty)]);
        // A spare given with the array is set aside, not refused.
        let d = run(&[
            member(0, 5, &[0, 1, SPARE]),
            member(1, 5, &[0, 1, SPARE]),
            member(2, 5, &[0, 1, SPARE]),
        ])
        .unwrap();
        assert_eq!(d.set_aside, vec![(2, SetAside::Spare)]);
        // A member whose own table records itself faulty, with the others.
        let d = run(&[
            member(0, 5, &[0, 1, FAULTY]),
            member(2, 5, &[0, 1, FAULTY]),
            member(1, 5, &[0, 1, FAULTY]),
        ])
        .unwrap();
        assert_eq!(d.roles, vec![Some(0), Some(2)]);
        assert_eq!(d.set_aside, vec![(1, SetAside::Faulty)]);
        // One behind (a crash between two members' superblock writes):
        // in sync, as md takes it.
        let d = run(&[member(0, 6, &[0, 1]), member(1, 5, &[0, 1])]).unwrap();
        assert_eq!(d.roles, vec![Some(0), Some(1)]);
        assert!(d.set_aside.is_empty());
        // Further behind, but not failed: stale.
        let d = run(&[member(0, 9, &[0, 1]), member(1, 5, &[0, 1])]).unwrap();
        assert_eq!(
            d.set_aside,
            vec![(
                1,
                SetAside::Stale {
                    events: 5,
                    freshest: 9
                }
            )]
        );
    }

    #[test]
    fn halves_that_ran_apart_are_refused() {
        let e = run(&[member(0, 9, &[0, FAULTY]), member(1, 7, &[FAULTY, 1])]).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("a (events 9") && text.contains("b (events 7"),
            "{text}"
        );
        assert!(text.contains("each records the other as faulty"), "{text}");
        // Same events, different tables.
        let e = run(&[member(0, 9, &[0, 1]), member(1, 9, &[FAULTY, 1])]).unwrap_err();
        assert!(e.to_string().contains("same events counter"), "{e}");
    }

    #[test]
    fn a_shrinking_reshape_keeps_the_leaving_member_in_its_role() {
        // Three members shrinking to two (delta_disks -1): the third is
        // still in the old shape. Read as a reshape it holds role 2; the
        // plain decision refuses the reshape, naming it.
        let shrinking = |dev: u32| {
            let mut sb = member(dev, 5, &[0, 1, 2]);
            sb.feature_map = features::RESHAPE_ACTIVE;
            sb.delta_disks = (-1i32) as u32;
            sb.new_level = 1;
            sb
        };
        let members = [shrinking(2), shrinking(0), shrinking(1)];
        let found: Vec<(&str, &Superblock)> =
            ["a", "b", "c"].into_iter().zip(members.iter()).collect();
        let d = decide_reshaping(&found).unwrap();
        assert_eq!(d.roles, vec![Some(1), Some(2), Some(0)]);
        assert!(d.set_aside.is_empty());
        let e = decide(&found).unwrap_err();
        assert!(e.to_string().contains("RESHAPE_ACTIVE"), "{e}");
        // Members that disagree on the reshape's record are refused, naming
        // the field.
        let mut odd = shrinking(1);
        odd.new_level = 5;
        let found = [("a", &members[0]), ("b", &members[1]), ("c", &odd)];
        let e = decide_reshaping(&found).unwrap_err();
        assert!(
            e.to_string().contains("new_level") && e.to_string().contains('c'),
            "{e}"
        );
    }

    #[test]
    fn refused_features_are_named() {
        let mut sb = member(0, 5, &[0, 1]);
        sb.feature_map = features::RESHAPE_ACTIVE;
        let e = run(&[sb, member(1, 5, &[0, 1])]).unwrap_err();
        assert!(e.to_string().contains("RESHAPE_ACTIVE"), "{e}");
        let mut sb = member(0, 5, &[0, 1]);
        sb.feature_map = features::CLUSTERED;
        assert!(run(&[sb]).unwrap_err().to_string().contains("CLUSTERED"));
    }

    #[test]
    fn members_that_disagree_on_the_geometry_are_refused_naming_the_odd_one() {
        let names = ["a", "b", "c"];
        let mut odd = member(2, 5, &[0, 1, 2]);
        odd.size_sectors = 3;
        let members = [member(0, 5, &[0, 1, 2]), member(1, 5, &[0, 1, 2]), odd];
        // Every order: the member the others outvote is named, with the field.
        for order in [
            [0, 1, 2],
            [0, 2, 1],
            [1, 0, 2],
            [1, 2, 0],
            [2, 0, 1],
            [2, 1, 0],
        ] {
            let found: Vec<(&str, &Superblock)> =
                order.iter().map(|&i| (names[i], &members[i])).collect();
            let e = decide(&found).unwrap_err();
            assert!(
                matches!(&e, Error::Disagree { spec, field: "size", value, .. }
                    if spec == "c" && value == "3 sectors"),
                "{order:?}: {e}"
            );
        }
        // Even when the odd one is fresher: mdadm compares them all.
        let mut fresher = member(1, 9, &[0, 1]);
        fresher.raid_disks = 3;
        let e = run(&[member(0, 5, &[0, 1]), fresher]).unwrap_err();
        assert!(e.to_string().contains("raid_disks is 3"), "{e}");
        // A member count past the role table is damage, named.
        let mut wide = member(0, 5, &[0, 1]);
        wide.raid_disks = u32::MAX;
        let e = run(&[member(1, 5, &[0, 1]), wide]).unwrap_err();
        assert!(
            matches!(&e, Error::BadField { spec, field: "raid_disks", .. } if spec == "b"),
            "{e}"
        );
    }

    #[test]
    fn two_fresh_members_in_one_role_are_refused() {
        let mut b = member(1, 5, &[0, 0]);
        b.dev_number = 1;
        let e = run(&[member(0, 5, &[0, 0]), b]).unwrap_err();
        assert!(matches!(e, Error::SameRole { role: 0, .. }), "{e}");
    }
}
