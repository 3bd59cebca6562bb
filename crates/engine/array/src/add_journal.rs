//! `add_journal`: give an existing RAID 4/5/6 md's write journal on a member
//! of its own (mdadm's `--add-journal`), in md's on-disk format, so the
//! kernel's md driver assembles the array with it and replays its log.
//!
//! What changes on disk:
//! - the journal member gets an empty log (one empty meta block at the
//!   start of its data area) and a v1.2 superblock of the array with the
//!   journal's role (0xfffd) in a new device slot;
//! - every present member's superblock gets md's JOURNAL feature, the new
//!   role table and one more event. A write-intent bitmap is dropped (md
//!   keeps a journal or a bitmap, not both; the journal closes the write
//!   hole the bitmap's resync covered).
//!
//! An array that lost its journal (it failed and its slot records it
//! faulty, or it is given and stale, or with `force` it is not given) gets
//! a new one the same way: the old slot is recorded faulty and the old
//! journal's superblock is left alone.
//!
//! Every check comes before the first write, so a refused journal leaves
//! every byte of every member as it was. The journal is written first, then
//! the members one by one, each with events + 1: a crash in between leaves
//! members at most one event behind the journal, in sync for both md's and
//! nvraid's assembly (md's events margin), and running the command again
//! finishes the job.

use crate::assemble::level_of;
use crate::decision::{decide, SetAside};
use crate::error::{Error, Result};
use crate::slot::{read_superblock, write_superblock};
use nvraid_io::AlignedBuf;
use nvraid_member::{Member, OpenOptions};
use nvraid_metadata::{features, Role, Superblock, Timestamp, RESYNC_CLEAN, SUPER_OFFSET_BYTES};
use serde::Serialize;

/// How to add the journal.
#[derive(Clone, Copy, Debug, Default)]
pub struct AddJournalOptions {
    /// Open the members with O_DIRECT.
    pub direct: bool,
    /// Use a journal member that carries a filesystem or another array.
    pub force: bool,
}

/// What [`add_journal`] did.
#[derive(Clone, Debug, Serialize)]
pub struct JournalAdded {
    /// The journal member.
    pub journal: String,
    /// Its device slot in the role table.
    pub dev_number: u32,
    /// Bytes of log it holds.
    pub log_bytes: u64,
    /// Whether the array's write-intent bitmap was dropped.
    pub bitmap_removed: bool,
    /// The array's events counter after the change.
    pub events: u64,
}

/// The most device slots a 4 KiB v1.2 superblock can list.
const MAX_DEV: usize = (4096 - 256) / 2;

/// Add `journal` as md's write journal of the RAID 4/5/6 on `members`
/// (every active member, and any spares, in any order).
pub fn add_journal(
    members: &[String],
    journal: &str,
    options: AddJournalOptions,
) -> Result<JournalAdded> {
    if members.is_empty() {
        return Err(Error::NoMembers);
    }
    if let Some(same) = members
        .iter()
        .find(|m| nvraid_member::same_object(m, journal))
    {
        return Err(not_separate(journal, same));
    }
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
        let sb = read_superblock(&member)?;
        found.push((member, sb));
    }
    let listed: Vec<(&str, &Superblock)> = found.iter().map(|(m, sb)| (m.spec(), sb)).collect();
    let decision = decide(&listed)?;
    let reference = found[decision.reference].1.clone();
    let refuse = |why: String| Error::NoJournal {
        spec: journal.into(),
        why,
    };
    let level = level_of(&reference, found[decision.reference].0.spec())?;
    if level.parity_chunks() == 0 {
        return Err(refuse(format!(
            "the array is a {level}: md journals RAID 4/5/6 only (`serve --cache journal \
             --journal MEMBER` keeps nvraid's own journal for RAID 0/1/10)"
        )));
    }
    if reference.feature_map & features::PPL != 0 {
        return Err(refuse(
            "the array keeps md's partial parity log (consistency policy ppl), and md keeps \
             one or the other"
                .into(),
        ));
    }
    if let Some(missing) = decision.roles.iter().position(Option::is_none) {
        return Err(refuse(format!(
            "the array is degraded (role {missing} is missing); rebuild it first"
        )));
    }
    if let Some((member, _)) = found
        .iter()
        .find(|(_, sb)| sb.feature_map & features::RECOVERY_OFFSET != 0)
    {
        // (A rebuild by bitmap would lose its list of what to copy with the
        // bitmap.)
        return Err(refuse(format!(
            "{} is being rebuilt; finish the rebuild first (`nvraid rebuild`)",
            member.spec()
        )));
    }
    // The array's old journal, when given: set aside (a working one is
    // refused below), and left as it is.
    let is_old_journal = |sb: &Superblock| sb.role() == Role::Journal;
    if let Some(index) = decision.journal {
        return Err(refuse(format!(
            "the array already has a write journal, {}, and it works",
            found[index].0.spec()
        )));
    }
    if let Some((index, why)) = decision
        .set_aside
        .iter()
        .find(|(index, why)| *why != SetAside::Spare && !is_old_journal(&found[*index].1))
    {
        return Err(refuse(format!(
            "{} is set aside ({}); give the array's working members and spares only",
            found[*index].0.spec(),
            why.reason()
        )));
    }
    // The journal member: separate, big enough, and blank unless forced.
    let member = Member::open(journal, open)?;
    if let Some((other, _)) = found
        .iter()
        .find(|(m, _)| m.identity().is_some() && m.identity() == member.identity())
    {
        return Err(not_separate(journal, other.spec()));
    }
    let data_offset = reference.data_offset_sectors * 512;
    let min_bytes = data_offset + crate::create::JOURNAL_LOG_MIN_BYTES;
    if member.size_bytes() < min_bytes {
        return Err(Error::TooSmall {
            spec: journal.into(),
            size_bytes: member.size_bytes(),
            min_bytes,
            reason: format!(
                "a journal holds {} of log after the array's {} metadata area",
                nvraid_member::format_size(crate::create::JOURNAL_LOG_MIN_BYTES),
                nvraid_member::format_size(data_offset)
            ),
        });
    }
    // A journal this command wrote before a crash cut it short (its
    // superblock went first, so some members may still lack the journal):
    // the job is finished, keeping its log, which an assembly in between
    // may have used.
    let earlier = read_superblock(&member)
        .ok()
        .filter(|sb| sb.set_uuid == reference.set_uuid && sb.role() == Role::Journal);
    let every_member_has_it = found
        .iter()
        .all(|(_, sb)| sb.feature_map & features::JOURNAL != 0);
    // An array that has lost its journal (mdadm's --add-journal "recreates
    // a journal for an array that lost one"): its journal failed (its slot
    // records it faulty), or is given and stale, or is not given at all
    // (then only with --force: its log may hold writes the members lack).
    // The old journal's slot is recorded faulty; the new one takes a slot
    // of its own.
    let replacing = earlier.is_none() && every_member_has_it;
    let mut old_slots = Vec::new();
    if replacing {
        for (dev, &raw) in reference.roles_raw.iter().enumerate() {
            if Role::from_raw(raw) != Role::Journal {
                continue;
            }
            let given = found
                .iter()
                .any(|(_, sb)| is_old_journal(sb) && sb.dev_number as usize == dev);
            if !given && !options.force {
                return Err(refuse(format!(
                    "the array's write journal (device slot {dev}) was not given and is not \
                     recorded faulty: its log may hold writes the members lack. Name it with \
                     the members (a working journal is kept; a stale one is replaced), or add \
                     --force to replace it, losing what it holds"
                )));
            }
            old_slots.push(dev);
        }
    } else if every_member_has_it
        || (earlier.is_none() && reference.feature_map & features::JOURNAL != 0)
    {
        return Err(refuse(
            "the array already has a write journal (name its journal member with the others)"
                .into(),
        ));
    }
    // (Also when finishing: an array served without its half-added journal
    // and then cut short needs its resync all the same. A journal replaced
    // keeps the resync a failed journal's last writes left: the array could
    // not be written without one, so nothing else could run it.)
    if reference.resync_offset != RESYNC_CLEAN && !replacing {
        return Err(refuse(
            "the array needs its resync, which a journal would make md skip (run `nvraid \
             repair`, or serve the array until its resync ends)"
                .into(),
        ));
    }
    if earlier.is_none() && !options.force {
        if let Some(what) = crate::detect_signature(&member).map_err(|e| Error::io(journal, e))? {
            return Err(Error::InUse {
                spec: journal.into(),
                what,
            });
        }
    }
    let freshest = found
        .iter()
        .map(|(_, sb)| sb)
        .chain(earlier.as_ref())
        .max_by_key(|sb| sb.events)
        .expect("members were given");
    let events = freshest.events + 1;
    let (dev_number, table) = match &earlier {
        Some(sb) => (sb.dev_number as usize, freshest.roles_raw.clone()),
        None => {
            // The new device slot: past every slot in the table and every
            // given member's (a spare that was not given may hold a slot the
            // table leaves blank, so no blank entry is reused).
            let dev_number = found
                .iter()
                .map(|(_, sb)| sb.roles_raw.len().max(sb.dev_number as usize + 1))
                .max()
                .unwrap_or(0);
            (dev_number, reference.roles_raw.clone())
        }
    };
    if dev_number >= MAX_DEV {
        return Err(refuse(format!(
            "the role table has no room for device slot {dev_number}"
        )));
    }
    let mut table = table;
    for &dev in &old_slots {
        table[dev] = Role::Faulty.to_raw();
    }
    if table.len() <= dev_number {
        table.resize(dev_number + 1, Role::Spare.to_raw());
    }
    table[dev_number] = Role::Journal.to_raw();
    let now = Timestamp::now();
    let bitmap_removed = found
        .iter()
        .any(|(_, sb)| sb.feature_map & features::BITMAP_OFFSET != 0);
    let update = |sb: &mut Superblock| {
        sb.feature_map |= features::JOURNAL;
        sb.feature_map &= !features::BITMAP_OFFSET;
        if bitmap_removed {
            sb.bitmap_offset = 0;
        }
        sb.roles_raw = table.clone();
        sb.max_dev = table.len() as u32;
        sb.events = events;
        sb.utime = now;
    };
    let mut journal_sb = earlier.clone().unwrap_or_else(|| reference.clone());
    update(&mut journal_sb);
    if earlier.is_none() {
        journal_sb.dev_number = dev_number as u32;
        journal_sb.device_uuid = crate::create::random_uuid()?;
        journal_sb.feature_map &= !(features::BAD_BLOCKS
            | features::RECOVERY_OFFSET
            | features::RECOVERY_BITMAP
            | features::REPLACEMENT);
        journal_sb.bblog_shift = 0;
        journal_sb.bblog_size = 0;
        journal_sb.bblog_offset = 0;
        journal_sb.cnt_corrected_read = 0;
        journal_sb.devflags = 0;
        // md's journal_tail (the field recovery_offset shares): the log
        // starts at its first sector.
        journal_sb.recovery_offset = 0;
        journal_sb.data_size_sectors = (member.size_bytes() - data_offset) / 4096 * 4096 / 512;
    }
    let log_bytes = journal_sb.data_size_sectors * 512;
    // (An old journal given is left as it is: its slot says what it is.)
    found.retain(|(_, sb)| !is_old_journal(sb));
    let planned: Vec<Superblock> = found
        .iter()
        .map(|(_, sb)| {
            let mut sb = sb.clone();
            update(&mut sb);
            sb
        })
        .collect();
    // Checked: write. What each superblock write covers is kept, to put
    // back if a later write fails.
    let mut kept: Vec<(&Member, AlignedBuf)> = Vec::new();
    let written = (|| -> Result<()> {
        keep(&member, &mut kept)?;
        if earlier.is_none() {
            crate::parity::journal::write_empty_log(&member, &journal_sb)?;
        }
        write_superblock(&member, &journal_sb)?;
        member.flush().map_err(|e| Error::io(journal, e))?;
        crate::failpoint::hit("add-journal-superblock");
        for ((member, _), sb) in found.iter().zip(&planned) {
            keep(member, &mut kept)?;
            write_superblock(member, sb)?;
            member.flush().map_err(|e| Error::io(member.spec(), e))?;
            crate::failpoint::hit("add-journal-superblock");
        }
        Ok(())
    })();
    if let Err(e) = written {
        // Best effort: the error that led here is what the user sees.
        for (member, old) in kept.iter().rev() {
            let _ = member.write_at(old, SUPER_OFFSET_BYTES);
            let _ = member.flush();
        }
        return Err(e);
    }
    Ok(JournalAdded {
        journal: journal.into(),
        dev_number: dev_number as u32,
        log_bytes,
        bitmap_removed,
        events,
    })
}

fn not_separate(journal: &str, member: &str) -> Error {
    Error::NoJournal {
        spec: journal.into(),
        why: format!(
            "it is {member}, a member of the array; the journal must be a separate member"
        ),
    }
}

/// Read the 4 KiB superblock block of `member` into `kept`.
fn keep<'a>(member: &'a Member, kept: &mut Vec<(&'a Member, AlignedBuf)>) -> Result<()> {
    if member.is_persistent() {
        let mut old = AlignedBuf::zeroed(4096);
        member
            .read_at(&mut old, SUPER_OFFSET_BYTES)
            .map_err(|e| Error::io(member.spec(), e))?;
        kept.push((member, old));
    }
    Ok(())
}
