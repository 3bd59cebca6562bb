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
    /// A write is acknowledged once durable in the journal (--journal) and
    /// written to the members later; replayed after a crash.
    Journal,
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
    let mut uuid = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut uuid))
        .context("/dev/urandom")?;
    Ok(uuid)
}

/// The warning `--cache writeback` prints at start.
pub const WRITEBACK_WARNING: &str = "nvraid: WARNING: --cache writeback acknowledges writes once they are in this process's memory. \
Writes acknowledged since the client's last FLUSH are LOST if nvraid is killed, crashes or the machine loses power; \
FLUSH and FUA still wait until the data is on the members. Use --cache journal for fast acknowledged writes that survive a crash.";
