//! `serve --cache`: the choice of write cache, and the journal member's
//! checks, replay and formatting.
//!
//! Every check runs before the array is assembled for writing, so a
//! refused journal leaves every byte of every member as it was.

use anyhow::{bail, Context, Result};
use nvraid_array::{detect_signature, read_superblock, Array};
use nvraid_cache::journal::{self, format::Superblock, Journal};
use nvraid_member::{Member, OpenOptions};

/// `--cache`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum CacheChoice {
    /// No cache: a write is acknowledged once it is on the members.
    #[default]
    None,
    /// RAM: a write is acknowledged once copied; FLUSH and FUA still wait
    /// for the members. Acknowledged writes not yet flushed are lost if
    /// the process dies or the machine loses power.
    Writeback,
    /// A write is acknowledged once durable in the journal (--journal, or
    /// md's write journal of an array created with --write-journal) and
    /// written to the members later; replayed after a crash.
    Journal,
}

/// Whether the array on `members` keeps md's write journal (read from
/// their superblocks, before anything is assembled).
pub fn has_md_journal(members: &[String], direct: bool) -> bool {
    superblocks(members, direct)
        .iter()
        .any(|(_, sb)| sb.feature_map & nvraid_metadata::features::JOURNAL != 0)
}

/// `--cache journal --journal SPEC` on the array on `members`: whether the
/// journal is md's (RAID 4/5/6), and then whether it must first be added to
/// the array (`Some(true)`) or already is its journal (`Some(false)`).
/// `None`: nvraid's own journal (RAID 0/1/10; or a RAID 4/5/6 whose
/// journal an earlier nvraid kept in its own format, replayed and kept so;
/// or an array whose md journal is another member, which the caller
/// refuses). A look that writes nothing; what it cannot read is left to the
/// checks that follow to name.
pub fn md_journal_plan(spec: &str, members: &[String], direct: bool) -> Option<bool> {
    let found = superblocks(members, direct);
    let (member_spec, first) = found.first()?;
    let level = nvraid_array::level_of(first, member_spec).ok()?;
    if level.parity_chunks() == 0 {
        return None;
    }
    let open = OpenOptions {
        direct: false,
        ..Default::default()
    };
    let journal = Member::open(spec, open).ok();
    if let Some(journal) = &journal {
        match journal::read_superblock(journal, &first.set_uuid) {
            Ok(Some(_)) => {
                eprintln!(
                    "nvraid: journal {spec} is in nvraid's own format (written before nvraid \
                     used md's for RAID 4/5/6); it is replayed and kept in that format"
                );
                return None;
            }
            // Another array's nvraid journal, or a damaged one: the checks
            // that follow refuse it by name.
            Err(
                journal::JournalError::OtherArray { .. } | journal::JournalError::Superblock { .. },
            ) => return None,
            // No nvraid journal (or too small for one: md's is checked next).
            Ok(None) | Err(_) => {}
        }
    }
    let is_md_journal = journal
        .as_ref()
        .and_then(|j| read_superblock(j).ok())
        .is_some_and(|sb| {
            sb.set_uuid == first.set_uuid && sb.role() == nvraid_metadata::Role::Journal
        });
    let every_member_has_one = found
        .iter()
        .all(|(_, sb)| sb.feature_map & nvraid_metadata::features::JOURNAL != 0);
    match (is_md_journal, every_member_has_one) {
        (true, true) => Some(false),
        (false, true) => None,
        (_, false) => Some(true),
    }
}

/// Whether the array on `members` would assemble with a role missing:
/// md's assembly decision on their superblocks alone (nothing replayed,
/// nothing written). Members that cannot be read count as missing.
pub fn would_be_degraded(members: &[String], direct: bool) -> Result<bool> {
    let found = superblocks(members, direct);
    let listed: Vec<(&str, &nvraid_metadata::Superblock)> =
        found.iter().map(|(spec, sb)| (*spec, sb)).collect();
    let decision = nvraid_array::decision::decide(&listed)?;
    Ok(decision.roles.iter().any(Option::is_none))
}

/// The superblocks of the members that can be opened and read (a look
/// that writes nothing).
fn superblocks(members: &[String], direct: bool) -> Vec<(&str, nvraid_metadata::Superblock)> {
    let open = OpenOptions {
        direct,
        ..Default::default()
    };
    members
        .iter()
        .filter_map(|spec| {
            let sb = read_superblock(&Member::open(spec, open).ok()?).ok()?;
            Some((spec.as_str(), sb))
        })
        .collect()
}

/// A journal member that passed its checks, and what it holds.
pub struct JournalMember {
    member: Member,
    /// Its superblock when it already is this array's journal.
    existing: Option<Superblock>,
    array_uuid: [u8; 16],
}

/// Opens and checks `spec` as the journal of the array on `members`:
/// at least 16 MiB, not one of the members, and either this array's
/// journal already, or blank (anything else only with `force`).
pub fn check_journal(
    spec: &str,
    members: &[String],
    force: bool,
    direct: bool,
) -> Result<JournalMember> {
    let mut array_uuid = None;
    let mut identities = Vec::new();
    for member_spec in members {
        let member = Member::open(
            member_spec,
            OpenOptions {
                direct: false,
                ..Default::default()
            },
        )?;
        identities.push((member_spec.as_str(), member.identity()));
        if array_uuid.is_none() {
            array_uuid = read_superblock(&member).ok().map(|sb| sb.set_uuid);
        }
    }
    let Some(array_uuid) = array_uuid else {
        bail!("no member carries an md superblock: {}", members.join(", "));
    };
    let member = Member::open(
        spec,
        OpenOptions {
            write: true,
            direct,
            ..Default::default()
        },
    )
    .with_context(|| format!("journal {spec}"))?;
    for (member_spec, identity) in &identities {
        let same = *member_spec == spec || (identity.is_some() && *identity == member.identity());
        if same {
            bail!("journal {spec} is {member_spec}, a member of the array; the journal must be a separate member");
        }
    }
    let existing = journal::read_superblock(&member, &array_uuid)
        .with_context(|| "the journal member cannot be used".to_string())?;
    if existing.is_none() && !force {
        if let Some(what) =
            detect_signature(&member).with_context(|| format!("{spec}: cannot read"))?
        {
            bail!("journal {spec} carries {what}; --cache journal would overwrite it (add --force to go ahead)");
        }
    }
    Ok(JournalMember {
        member,
        existing,
        array_uuid,
    })
}

/// Replays what the journal holds onto `array` (flushing it before the
/// journal's tail moves), or formats a new journal; returns it ready.
pub fn start_journal(checked: JournalMember, array: &Array) -> Result<Journal> {
    let JournalMember {
        member,
        existing,
        array_uuid,
    } = checked;
    let name = member.spec().to_string();
    let superblock = match existing {
        Some(superblock) => {
            let (replayed, after) = journal::replay(&member, &superblock, &mut |offset, data| {
                array
                    .write_at(data, offset, false)
                    .map_err(|e| std::io::Error::other(e.to_string()))
            })?;
            array.flush().context("flushing the replayed writes")?;
            journal::write_superblock(&member, &after)?;
            if replayed.records > 0 {
                eprintln!(
                    "nvraid: journal {name}: replayed {} records ({} bytes) onto the array",
                    replayed.records, replayed.bytes
                );
            }
            after
        }
        None => {
            let superblock =
                journal::new_superblock(member.size_bytes(), array_uuid, random_uuid()?);
            journal::write_superblock(&member, &superblock)?;
            eprintln!(
                "nvraid: journal {name}: formatted, {} MiB of ring",
                superblock.ring_bytes >> 20
            );
            superblock
        }
    };
    Ok(Journal::new(Box::new(member), superblock))
}

fn random_uuid() -> Result<[u8; 16]> {
    nvraid_io::random::uuid().context("/dev/urandom")
}

/// The warning `--cache writeback` prints at start.
pub const WRITEBACK_WARNING: &str = "nvraid: WARNING: --cache writeback acknowledges writes once they are in this process's memory. \
Writes acknowledged since the client's last FLUSH are LOST if nvraid is killed, crashes or the machine loses power; \
FLUSH and FUA still wait until the data is on the members. Use --cache journal for fast acknowledged writes that survive a crash.";
