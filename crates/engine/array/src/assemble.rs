//! `assemble`: read every member's superblock, check that they form one
//! array, order them by their recorded roles and build the [`Array`].

use crate::array::Array;
use crate::decision::{decide, SetAside};
use crate::error::{Error, Result};
use crate::members::SetAsideMember;
use crate::slot::{read_superblock, Slot};
use nvraid_layout::{Geometry, Level, Raid0Layout};
use nvraid_member::{Member, OpenOptions};
use nvraid_metadata::{features, DecodeError, Superblock, SUPER_OFFSET_SECTORS};

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

/// Decode md's level and layout words into a supported [`Level`] (the
/// layout crate's `from_md`).
pub fn level_of(sb: &Superblock, spec: &str) -> Result<Level> {
    Level::from_md(sb.level, sb.layout).map_err(|e| Error::Unsupported {
        spec: spec.into(),
        what: e.to_string(),
    })
}

/// Bytes of each member the array uses, from md's fields: raid1/10 record
/// it in `size`; raid0 uses the whole data area. (A decoded superblock's
/// sector counts are byte counts too: `Superblock::validate` sees to it.)
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
    Geometry::new(
        level,
        sb.raid_disks,
        u64::from(sb.chunk_sectors) * 512,
        member_data_bytes(sb),
    )
    .map_err(|source| bad_geometry(sb, spec, source))
}

/// A geometry error, with the superblock fields it came from.
fn bad_geometry(sb: &Superblock, spec: &str, source: nvraid_layout::GeometryError) -> Error {
    Error::BadGeometry {
        spec: spec.into(),
        fields: format!(
            "level {}, raid_disks {}, chunk_size {} sectors, size {} sectors, data_size {} sectors",
            sb.level, sb.raid_disks, sb.chunk_sectors, sb.size_sectors, sb.data_size_sectors
        ),
        source,
    }
}

/// Assemble the array `specs` form. The order of `specs` does not matter:
/// members are placed by the roles the freshest superblock records (see
/// [`crate::decision`] for the rules); members that take no part are set
/// aside and named in [`Array::set_aside`].
pub fn assemble(specs: &[String], options: AssembleOptions) -> Result<Array> {
    if specs.is_empty() {
        return Err(Error::NoMembers);
    }
    // A member named twice is refused by name before any is opened (a
    // writable open claims it, and the second open would find this very
    // process holding the claim).
    check_distinct_specs(specs)?;
    let (found, unreadable) = read_superblocks(specs, options)?;
    assemble_found(found, unreadable, options)
}

/// [`assemble`] of members already opened, each with its superblock
/// (`found`), beside those whose superblock could not be used
/// (`unreadable`): `reshape::resume` assembles the old shape of an array
/// recorded mid-grow through it.
pub(crate) fn assemble_found(
    found: Found,
    unreadable: Vec<SetAsideMember>,
    options: AssembleOptions,
) -> Result<Array> {
    refuse_none_usable(&found, &unreadable)?;
    warn_damaged(&unreadable);
    check_distinct(&found)?;
    let listed: Vec<(&str, &Superblock)> = found.iter().map(|(m, sb)| (m.spec(), sb)).collect();
    let decision = decide(&listed)?;
    let (ref_member, ref_sb) = &found[decision.reference];
    let geometry = match raid0_sizes(&decision.roles, &found) {
        Some(sizes) => raid0_geometry(ref_sb, ref_member.spec(), &sizes)?,
        None => geometry_of(ref_sb, ref_member.spec())?,
    };
    if options.writable {
        check_writable_width(&geometry, ref_member.spec())?;
    }
    for (role, placed) in decision.roles.iter().enumerate() {
        if let Some(index) = placed {
            let (member, sb) = &found[*index];
            check_size(&geometry, role as u32, member, sb)?;
        }
    }
    let has_journal = ref_sb.feature_map & features::JOURNAL != 0;
    if has_journal && decision.journal.is_none() && options.writable {
        // Nothing has been written: the members were only opened.
        return Err(journal_not_given(ref_sb));
    }
    let (journal, slots, set_aside) = place_members(found, decision, has_journal)?;
    check_startable(&geometry, &slots, options.allow_degraded)?;
    let mut array = Array::new(geometry, slots, options.writable);
    array
        .members_mut()
        .set_aside_members(set_aside.into_iter().chain(unreadable).collect());
    if let Some(journal) = journal {
        array.attach_md_journal(journal);
    }
    array.load_bitmap()?;
    if has_journal && !options.writable {
        warn_journal_unreplayed(&array)?;
    }
    replay_journal(&array)?;
    if array.parity_shape().is_some() {
        load_ppl(&mut array, options.writable)?;
    }
    Ok(array)
}

/// The members whose superblock was read, each with it.
pub(crate) type Found = Vec<(Member, Superblock)>;

/// Open every member and read its superblock: the members whose
/// superblock can be used, and those left out (damaged or unreadable).
pub(crate) fn read_superblocks(
    specs: &[String],
    options: AssembleOptions,
) -> Result<(Found, Vec<SetAsideMember>)> {
    let open = OpenOptions {
        write: options.writable,
        create_bytes: None,
        direct: options.direct,
        ..Default::default()
    };
    let mut found = Vec::with_capacity(specs.len());
    let mut unreadable = Vec::new();
    for spec in specs {
        let member = Member::open(spec, open)?;
        match read_superblock(&member) {
            Ok(sb) => found.push((member, sb)),
            // A damaged superblock (its checksum does not match) is left
            // out as the kernel leaves out a device whose superblock it
            // cannot load: nothing it records can be trusted, not even
            // which array it belongs to. Any other refusal of a superblock
            // that does match its checksum stands.
            Err(Error::Superblock {
                source: source @ DecodeError::BadChecksum { .. },
                ..
            }) => {
                unreadable.push(SetAsideMember {
                    spec: spec.clone(),
                    superblock: None,
                    reason: SetAside::Invalid {
                        error: source.to_string(),
                    },
                });
            }
            // A device that fails to read is left out, as md leaves out a
            // device it cannot load; anything else about it is refused.
            Err(Error::Io { source, .. }) if crate::slot::is_member_failure(&source) => {
                unreadable.push(SetAsideMember {
                    spec: spec.clone(),
                    superblock: None,
                    reason: SetAside::Unreadable {
                        error: source.to_string(),
                    },
                });
            }
            Err(e) => return Err(e),
        }
    }
    Ok((found, unreadable))
}

/// Refuse to start when no member's superblock could be used, naming each
/// member and why it was left out.
fn refuse_none_usable(found: &[(Member, Superblock)], unreadable: &[SetAsideMember]) -> Result<()> {
    if !found.is_empty() {
        return Ok(());
    }
    let what = unreadable
        .iter()
        .map(|m| format!("{} ({})", m.spec, m.reason.reason()))
        .collect::<Vec<_>>()
        .join("; ");
    Err(Error::NotStartable(format!(
        "no member has a superblock that can be used ({what})"
    )))
}

/// Warn about each member set aside for a damaged superblock.
fn warn_damaged(unreadable: &[SetAsideMember]) {
    for m in unreadable {
        if let SetAside::Invalid { error } = &m.reason {
            eprintln!(
                "nvraid: warning: {}: {error}; set aside (its superblock is damaged)",
                m.spec
            );
        }
    }
}

/// A parity array nvraid can write: no more data chunks per stripe than it
/// computes parity over (nothing has been written: the members were only
/// opened).
fn check_writable_width(geometry: &Geometry, spec: &str) -> Result<()> {
    let parity = geometry.level().parity_chunks();
    if parity == 0 {
        return Ok(());
    }
    let data = geometry.members() - parity;
    if data > crate::parity::DATA_BLOCKS_MAX {
        return Err(Error::Unsupported {
            spec: spec.into(),
            what: format!(
                "writing to a {} array with {data} data chunks per stripe (nvraid writes at most {})",
                geometry.level(),
                crate::parity::DATA_BLOCKS_MAX
            ),
        });
    }
    Ok(())
}

/// Why a writable assembly of a journalled array without its journal is
/// refused: the journal failed at run time, or it was not given.
fn journal_not_given(ref_sb: &Superblock) -> Error {
    if !ref_sb
        .roles_raw
        .iter()
        .any(|&r| nvraid_metadata::Role::from_raw(r) == nvraid_metadata::Role::Journal)
    {
        // Its slot records it faulty: it failed at run time.
        return Error::NotStartable(
            "the array's write journal failed (its members record it faulty), and writes \
             need a journal; give the array a new one \
             with `nvraid add-journal --journal NEW MEMBER...` (mdadm's --add-journal), \
             or assemble it read-only"
                .into(),
        );
    }
    Error::NotStartable(format!(
        "the array has a write journal (md's JOURNAL feature) and its journal member \
         was not given (or is stale): writes it holds would be lost and new ones \
         would not be logged; name the journal member with the others (`{}` shows \
         which device it is)",
        "nvraid examine"
    ))
}

/// What [`place_members`] makes of the members read: the journal, the
/// slot of each role (`None` where missing), and the members set aside.
type Placed = (
    Option<crate::parity::journal::MdJournal>,
    Vec<Option<Slot>>,
    Vec<SetAsideMember>,
);

/// Put each member where `decision` places it: the journal, a role's
/// slot, or set aside with its reason.
fn place_members(
    found: Found,
    decision: crate::decision::Decision,
    has_journal: bool,
) -> Result<Placed> {
    let mut taken: Vec<Option<(Member, Superblock)>> = found.into_iter().map(Some).collect();
    // `decide` names each member at most once, as the journal, in a role
    // or set aside; every `take` below finds its member still there.
    let mut take = |index: usize| {
        let Some(member) = taken[index].take() else {
            panic!("invariant: decide() places member {index} once (journal, role or set aside)")
        };
        member
    };
    let journal = match decision.journal {
        Some(index) => {
            let (member, sb) = take(index);
            Some(crate::parity::journal::MdJournal::new(Slot::new(
                member, sb,
            )?)?)
        }
        None => None,
    };
    let mut slots: Vec<Option<Slot>> = Vec::with_capacity(decision.roles.len());
    for placed in &decision.roles {
        slots.push(match placed {
            Some(index) => {
                let (member, mut sb) = take(*index);
                if has_journal {
                    // Array-wide features are the freshest superblock's (as
                    // md takes them): a member that `add_journal`, cut short,
                    // left without the journal feature and with its old
                    // bitmap takes the journal's from here on, no bitmap.
                    sb.feature_map |= features::JOURNAL;
                    sb.feature_map &= !features::BITMAP_OFFSET;
                }
                Some(Slot::new(member, sb)?)
            }
            None => None,
        });
    }
    let set_aside = decision
        .set_aside
        .into_iter()
        .map(|(index, reason)| {
            let (member, superblock) = take(index);
            SetAsideMember {
                spec: member.spec().to_string(),
                superblock: Some(superblock),
                reason,
            }
        })
        .collect();
    Ok((journal, slots, set_aside))
}

/// A read-only assembly of a journalled array: warn when reads may miss
/// writes only the journal holds (journal not given, or not replayed).
fn warn_journal_unreplayed(array: &Array) -> Result<()> {
    match &array.md_journal {
        None => eprintln!(
            "nvraid: warning: the array's write journal was not given: reads return what \
             the members hold and miss writes only the journal has"
        ),
        Some(journal) => {
            let pending = array.journal_data_only_stripes()?;
            if pending > 0 {
                eprintln!(
                    "nvraid: warning: the write journal {} holds data for {pending} stripes \
                     not replayed yet (md's write-back mode): reads return what the members \
                     hold until a writable assembly replays them",
                    journal.spec()
                );
            }
        }
    }
    Ok(())
}

/// Replay md's write journal into the members (a writable assembly), and
/// say what it wrote.
fn replay_journal(array: &Array) -> Result<()> {
    if let Some(replay) = array.replay_md_journal()? {
        if replay.units > 0 {
            eprintln!(
                "nvraid: replayed the write journal: {} log units, {} stripes written as \
                 logged, {} data-only stripes written through the array ({} pages)",
                replay.units, replay.complete_stripes, replay.data_only_stripes, replay.pages
            );
        }
    }
    Ok(())
}

/// Load (and, writable, replay) a RAID 4/5/6's partial parity log; warn
/// when an unclean, degraded array has none to close the write hole.
fn load_ppl(array: &mut Array, writable: bool) -> Result<()> {
    let replayed = array.load_ppl(writable)?;
    if replayed > 0 {
        eprintln!(
            "nvraid: replayed {replayed} partial parity log entries (the array was not shut down cleanly)"
        );
    }
    if writable && array.ppl.is_none() && array.resync_from().is_some() && array.is_degraded() {
        // md refuses to start such an array unless forced; nvraid
        // starts it (the missing member may be added back) and says so.
        eprintln!(
            "nvraid: warning: this {} was not shut down cleanly and runs degraded with no \
             partial parity log: a stripe being written at the crash may rebuild wrong bytes \
             for the missing member (the write hole; create RAID 5 with \
             --consistency-policy ppl to close it)",
            array.geometry().level()
        );
    }
    Ok(())
}

/// No spec names a member another spec named (same text, or the same
/// file or device under two names), checked before anything is opened.
pub(crate) fn check_distinct_specs(specs: &[String]) -> Result<()> {
    for (i, spec) in specs.iter().enumerate() {
        if let Some(other) = specs[..i]
            .iter()
            .find(|other| nvraid_member::same_object(spec, other))
        {
            return Err(Error::Duplicate {
                spec: spec.clone(),
                other: other.clone(),
                what: "file or device",
            });
        }
    }
    Ok(())
}

/// No member given twice (same file or device under two names).
fn check_distinct(found: &[(Member, Superblock)]) -> Result<()> {
    for (i, (member, _)) in found.iter().enumerate() {
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

/// The data sizes of a RAID 0's members by role, when every role is present
/// (a RAID 0 with a role missing cannot start anyway).
fn raid0_sizes(roles: &[Option<usize>], found: &[(Member, Superblock)]) -> Option<Vec<u64>> {
    roles
        .iter()
        .map(|placed| placed.map(|i| found[i].1.clone()))
        .map(|sb| {
            sb.filter(|sb| sb.level == 0)
                .map(|sb| member_data_bytes(&sb))
        })
        .collect()
}

/// md's RAID 0 geometry over members of these data sizes: one zone when they
/// are equal (in whole chunks); otherwise md's zones, mapped by the layout
/// the superblock records (RAID0_LAYOUT: 1 original, 2 alternate). Without
/// a recorded layout the mapping of a multi-zone array is ambiguous (the
/// kernel refuses it too, unless told which with raid0.default_layout).
fn raid0_geometry(sb: &Superblock, spec: &str, sizes: &[u64]) -> Result<Geometry> {
    let chunk = u64::from(sb.chunk_sectors) * 512;
    let layout = if sb.feature_map & features::RAID0_LAYOUT == 0 {
        None
    } else {
        match sb.layout {
            1 => Some(Raid0Layout::Original),
            2 => Some(Raid0Layout::Alternate),
            other => {
                return Err(Error::Unsupported {
                    spec: spec.into(),
                    what: format!("raid0 layout {other} (md knows 1, original, and 2, alternate)"),
                })
            }
        }
    };
    let geometry = Geometry::raid0_zones(sizes, chunk, layout.unwrap_or(Raid0Layout::Original))
        .map_err(|source| bad_geometry(sb, spec, source))?;
    if geometry.zone_count() > 1 && layout.is_none() {
        return Err(Error::Unsupported {
            spec: spec.into(),
            what: "a raid0 over members of unequal size with no recorded zone layout \
                   (md's RAID0_LAYOUT feature): the mapping is ambiguous, and the kernel \
                   refuses such an array too unless raid0.default_layout is set"
                .into(),
        });
    }
    Ok(geometry)
}

/// A placed member holds the data area its superblock describes: its data
/// starts after its superblock (md refuses metadata that overlaps data),
/// its data area (`data_size`) holds the member's share of the array, and
/// the member is long enough for both.
fn check_size(geometry: &Geometry, role: u32, member: &Member, sb: &Superblock) -> Result<()> {
    let spec = member.spec().to_string();
    let used = geometry.member_used_bytes_of(role);
    let super_end = SUPER_OFFSET_SECTORS + (sb.encoded_len() as u64).div_ceil(512);
    if sb.data_offset_sectors < super_end {
        return Err(Error::BadField {
            spec,
            field: "data_offset",
            value: format!("{} sectors", sb.data_offset_sectors),
            why: format!(
                "puts the data inside the superblock, which ends at sector {super_end} (md refuses metadata that overlaps data)"
            ),
        });
    }
    if member_data_bytes(sb) < used {
        return Err(Error::Unsupported {
            spec,
            what: "members of unequal size".into(),
        });
    }
    if sb.data_size_sectors * 512 < used {
        return Err(Error::BadField {
            spec,
            field: "data_size",
            value: format!("{} sectors", sb.data_size_sectors),
            why: format!(
                "is smaller than the member's share of the array ({} sectors)",
                used / 512
            ),
        });
    }
    // No overflow: validate() bounds data_offset, and `used` is a share of
    // an array no larger than 2^64 bytes; saturating all the same.
    let needed_bytes = (sb.data_offset_sectors * 512).saturating_add(used);
    if member.size_bytes() < needed_bytes {
        return Err(Error::Truncated {
            spec,
            needed_bytes,
            size_bytes: member.size_bytes(),
        });
    }
    Ok(())
}

/// Whether every byte of the array has at least one present copy (the
/// layout crate's [`Geometry::has_every_byte`]).
pub fn has_every_byte(geometry: &Geometry, present: &[bool]) -> bool {
    geometry.has_every_byte(present)
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
        let parity = geometry.level().parity_chunks();
        return Err(Error::NotStartable(if parity > 0 {
            format!(
                "roles {} are missing or set aside: a {} stripe can rebuild at most {parity} lost block(s)",
                missing.join(", "),
                geometry.level()
            )
        } else {
            format!(
                "roles {} are missing or set aside and some data has no copy left",
                missing.join(", ")
            )
        }));
    }
    if !allow_degraded {
        return Err(Error::NotStartable(format!(
            "roles {} are missing or set aside (the array would run degraded)",
            missing.join(", ")
        )));
    }
    Ok(())
}
impl Array {
    /// A RAID 5 whose superblocks carry md's PPL: take its logs, and when it
    /// is assembled writable after a crash, replay them (then the array is
    /// in sync: md's recovery, which needs no resync) and empty them.
    /// Returns the entries replayed.
    pub(crate) fn load_ppl(&mut self, writable: bool) -> Result<usize> {
        let sb = self.superblock().clone();
        let Some(ppl) = crate::parity::ppl::Ppl::of(&sb, self.roles())? else {
            return Ok(0);
        };
        if self.geometry().level().parity_chunks() != 1 {
            return Err(Error::Unsupported {
                spec: sb.name(),
                what: format!(
                    "a partial parity log on a {} (md logs RAID 5 only)",
                    self.geometry().level()
                ),
            });
        }
        if let crate::personality::Personality::Parity(parity) = self.personality_mut() {
            // A column's partial parity is as wide as the column: one log
            // write must hold it (whole 4 KiB pages, as md logs them).
            let fits = ppl.pp_max() / 4096 * 4096;
            parity.shape.max_width = crate::parity::ppl::COLUMN_BYTES_MAX.min(fits as u32);
        }
        if !writable {
            // Read as it is: replaying writes.
            self.ppl = Some(ppl);
            return Ok(0);
        }
        let (replayed, logged) = if self.resync_from().is_some() {
            ppl.replay(self, self.parity_family().shape)?
        } else {
            (0, false)
        };
        ppl.reset(self)?;
        if logged {
            // Every stripe that was being written has its parity back, and
            // the logs are empty again: recorded clean now (md does no
            // resync after its PPL recovery), so that a crash before the
            // next write does not find a dirty array with empty logs,
            // which reads as one never written through its logs (created
            // over used members) and would need a full resync.
            self.resync_checkpoint(None)?;
        }
        self.ppl = Some(ppl);
        Ok(replayed)
    }
}
