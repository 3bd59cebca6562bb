//! md's RAID 4/5/6 write journal (raid5-cache) at assembly: the journal
//! member joins the array, and a writable assembly replays its log as the
//! kernel does before anything else is written.
//!
//! The log format is [`nvraid_metadata::r5log`]. Replay, following md's
//! recovery (`r5c_recovery_flush_log` and what follows it):
//!
//! 1. Units are read from `journal_tail` while each is whole and carries the
//!    next sequence number.
//! 2. Their payloads gather into stripes by the stripe's sector on the
//!    members: data pages by member, parity pages (P, Q). A stripe with
//!    parity is *complete*: the log holds every page its last write put on
//!    the members. A data page for a complete stripe means a later write:
//!    the complete stripe is written out first, then a new one begins. A
//!    flush payload drops the stripes it lists (md wrote them already).
//! 3. Complete stripes are written page by page to the members, exactly as
//!    logged (data and parity; a stripe with parity and no data is left, as
//!    md leaves it: its data reached the members before the tail moved). Stripes with data only (md's write-back
//!    mode acknowledged them from the log) are written through the array's
//!    own write path, which reads what it needs and computes their parity.
//! 4. The members are flushed, an empty meta block goes where the log ends
//!    (its sequence number 10000 past the last one, as md does: units the
//!    crash left out of order beyond the end must not read as its
//!    continuation), and `journal_tail` moves to it in every superblock:
//!    the log is empty, and the kernel reads it as empty too.
//!
//! A block at `journal_tail` that does not decode means an empty log; a
//! writable assembly then starts one at the ring's start, with a random
//! sequence number, as md does.
//!
//! nvraid does not yet *write* this log while the array runs: its writes
//! to a journaled array go to the members directly and mark the array
//! dirty, as on an array without a journal, so a crash is followed by a
//! resync rather than a replay.

use crate::array::{Array, Slot};
use crate::error::{Error, Result};
use nvraid_io::AlignedBuf;
use nvraid_metadata::r5log::{self, MetaBlock, Payload, Ring, PAGE_BYTES, PAGE_SECTORS};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// How far the sequence jumps where a replayed log ends (md's 10000).
const SEQ_JUMP: u64 = 10_000;

/// The array's journal member.
#[derive(Debug)]
pub struct MdJournal {
    pub slot: Slot,
    ring: Ring,
    seed: u32,
    /// `journal_tail` as the member's superblock holds it now.
    tail: Mutex<u64>,
}

/// What a replay did, for the caller to report.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Replay {
    /// Units read from the log.
    pub units: usize,
    /// Stripes written back exactly as logged (data and parity).
    pub complete_stripes: usize,
    /// Stripes whose logged data was written through the array.
    pub data_only_stripes: usize,
    /// Pages written in all.
    pub pages: usize,
}

/// Stripes by their sector on the members.
type Stripes = Vec<(u64, Stripe)>;

/// One stripe gathered from the log.
#[derive(Default)]
struct Stripe {
    /// Data pages by member role.
    data: BTreeMap<u32, (u64, Vec<u8>)>,
    /// P, then Q.
    parity: Option<Vec<Vec<u8>>>,
}

impl MdJournal {
    pub(crate) fn new(slot: Slot) -> Result<MdJournal> {
        let sb = &slot.superblock;
        let ring = Ring::new(sb.data_size_sectors);
        let needed = (sb.data_offset_sectors + ring.sectors) * 512;
        if ring.sectors < 2 * PAGE_SECTORS || slot.member.size_bytes() < needed {
            return Err(Error::Unsupported {
                spec: slot.member.spec().into(),
                what: format!(
                    "a write journal of {} sectors from sector {} on a member of {} bytes",
                    ring.sectors,
                    sb.data_offset_sectors,
                    slot.member.size_bytes()
                ),
            });
        }
        Ok(MdJournal {
            seed: r5log::uuid_checksum(&sb.set_uuid),
            tail: Mutex::new(sb.recovery_offset),
            ring,
            slot,
        })
    }

    pub fn spec(&self) -> &str {
        self.slot.member.spec()
    }

    /// `journal_tail` now (sectors into the ring).
    pub fn tail(&self) -> u64 {
        *self.tail.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sectors of the ring.
    pub fn ring_sectors(&self) -> u64 {
        self.ring.sectors
    }

    fn io_error(&self, e: std::io::Error) -> Error {
        Error::io(self.spec(), e)
    }

    fn ring_offset(&self, position: u64) -> u64 {
        (self.slot.superblock.data_offset_sectors + position) * 512
    }

    /// Read the log from the tail (`Err` inside: no valid block there).
    fn scan(&self) -> Result<std::result::Result<r5log::Scan, r5log::LogError>> {
        let tail = self.tail();
        let tail = if tail >= self.ring.sectors || !tail.is_multiple_of(PAGE_SECTORS) {
            // md starts over at 0 from a tail outside the ring.
            0
        } else {
            tail
        };
        let mut page = AlignedBuf::zeroed(PAGE_BYTES);
        r5log::scan(self.ring, tail, self.seed, |pos, buf| {
            self.slot.member.read_at(&mut page, self.ring_offset(pos))?;
            buf.copy_from_slice(&page);
            Ok(())
        })
        .map_err(|e| self.io_error(e))
    }

    /// Start an empty log at `position` with sequence `seq`: the block,
    /// flushed; the caller then writes the superblocks with the new tail.
    fn start_log(&self, position: u64, seq: u64) -> Result<()> {
        let mut page = AlignedBuf::zeroed(PAGE_BYTES);
        MetaBlock::empty(seq, position)
            .encode(&mut page, self.seed)
            .expect("an empty block fits");
        let member = &self.slot.member;
        member
            .write_at(&page, self.ring_offset(position))
            .and_then(|()| member.flush())
            .map_err(|e| self.io_error(e))?;
        *self.tail.lock().unwrap_or_else(|p| p.into_inner()) = position;
        Ok(())
    }
}

/// A new journal's log: one empty meta block at its start, with a random
/// sequence number (what mdadm writes at create).
pub(crate) fn write_empty_log(
    member: &nvraid_member::Member,
    sb: &nvraid_metadata::Superblock,
) -> Result<()> {
    let seq = random_seq()?;
    let mut page = AlignedBuf::zeroed(PAGE_BYTES);
    MetaBlock::empty(seq, 0)
        .encode(&mut page, r5log::uuid_checksum(&sb.set_uuid))
        .expect("an empty block fits");
    member
        .write_at(&page, sb.data_offset_sectors * 512)
        .map_err(|e| Error::io(member.spec(), e))
}

/// A random 32-bit start for a log's sequence numbers, as md picks.
fn random_seq() -> Result<u64> {
    let bytes = crate::create::random_uuid()?;
    Ok(u64::from(u32::from_le_bytes(
        bytes[..4].try_into().expect("4 bytes"),
    )))
}

impl Array {
    /// The array's write journal, when it has one.
    pub fn md_journal(&self) -> Option<&MdJournal> {
        self.md_journal.as_ref()
    }

    /// Stripes the journal holds data for that the members may not have
    /// at all: data-only stripes (md's write-back mode acknowledges writes
    /// once they are logged). A look that writes nothing.
    pub fn journal_data_only_stripes(&self) -> Result<usize> {
        let Some(journal) = &self.md_journal else {
            return Ok(0);
        };
        match journal.scan()? {
            Ok(scan) => Ok(self.gather(journal, &scan)?.1.len()),
            Err(_) => Ok(0),
        }
    }

    /// Replay the journal (writable assembly). `None` when the array has no
    /// journal member or is read-only.
    pub(crate) fn replay_md_journal(&self) -> Result<Option<Replay>> {
        let Some(journal) = &self.md_journal else {
            return Ok(None);
        };
        if !self.is_writable() {
            return Ok(None);
        }
        let scan = match journal.scan()? {
            Ok(scan) => scan,
            Err(_) => {
                // No log: start one, as md does.
                journal.start_log(0, random_seq()?)?;
                self.write_journal_tail()?;
                return Ok(Some(Replay::default()));
            }
        };
        let mut replay = Replay {
            units: scan
                .units
                .iter()
                .filter(|u| !u.block.payloads.is_empty())
                .count(),
            ..Replay::default()
        };
        let (complete, data_only) = self.gather(journal, &scan)?;
        for (key, stripe) in &complete {
            replay.pages += self.write_logged_stripe(*key, stripe)?;
        }
        replay.complete_stripes = complete.len();
        self.flush()?;
        for (_, stripe) in &data_only {
            for (offset, page) in stripe.data.values() {
                let mut buf = AlignedBuf::zeroed(PAGE_BYTES);
                buf.copy_from_slice(page);
                self.write_at(&buf, *offset, false)?;
                replay.pages += 1;
            }
        }
        replay.data_only_stripes = data_only.len();
        self.flush()?;
        // md's jump: units written out of order may sit past the end with
        // the next few sequence numbers; the new log must not continue
        // into them.
        journal.start_log(scan.next_position, scan.next_seq + SEQ_JUMP)?;
        self.write_journal_tail()?;
        Ok(Some(replay))
    }

    /// The stripes a scanned log holds, md's way: those to write exactly as
    /// logged (in log order), and those with data only.
    fn gather(&self, journal: &MdJournal, scan: &r5log::Scan) -> Result<(Stripes, Stripes)> {
        let shape = self.parity.expect("a journal array has parity");
        let mut stripes: BTreeMap<u64, Stripe> = BTreeMap::new();
        // Stripes to write exactly, in log order.
        let mut complete: Vec<(u64, Stripe)> = Vec::new();
        for unit in &scan.units {
            let mut pages = unit.pages.iter();
            for payload in &unit.block.payloads {
                match payload {
                    Payload::Data { location, .. } => {
                        let page = pages.next().expect("scan read one page per checksum");
                        let offset = location * 512;
                        if offset + PAGE_BYTES as u64 > self.size_bytes() {
                            return Err(self.bad_log(
                                journal,
                                format!(
                                    "a data page for array sector {location}, past the array's end"
                                ),
                            ));
                        }
                        let at = self.geometry().locate(offset, 0);
                        let key = at.member_offset / 512;
                        if stripes.get(&key).is_some_and(|s| s.parity.is_some()) {
                            complete.push((key, stripes.remove(&key).expect("present")));
                        }
                        stripes
                            .entry(key)
                            .or_default()
                            .data
                            .insert(at.member, (offset, page.clone()));
                    }
                    Payload::Parity {
                        location,
                        checksums,
                        ..
                    } => {
                        if checksums.len() != shape.parity as usize {
                            return Err(self.bad_log(
                                journal,
                                format!(
                                    "{} parity pages for stripe sector {location} of a {}",
                                    checksums.len(),
                                    self.geometry().level()
                                ),
                            ));
                        }
                        if (location + PAGE_SECTORS) * 512 > self.geometry().member_used_bytes() {
                            return Err(self.bad_log(
                                journal,
                                format!(
                                    "parity for stripe sector {location}, past the members' end"
                                ),
                            ));
                        }
                        let got: Vec<Vec<u8>> = checksums
                            .iter()
                            .map(|_| pages.next().expect("one page per checksum").clone())
                            .collect();
                        stripes.entry(*location).or_default().parity = Some(got);
                    }
                    Payload::Flush {
                        stripes: flushed, ..
                    } => {
                        for s in flushed {
                            stripes.remove(s);
                        }
                    }
                }
            }
        }
        let (rest_complete, data_only): (Vec<_>, Vec<_>) =
            stripes.into_iter().partition(|(_, s)| s.parity.is_some());
        complete.extend(rest_complete);
        // Parity with no data: its data went to the members before the
        // tail moved past it; md writes nothing for it either.
        complete.retain(|(_, s)| !s.data.is_empty());
        Ok((complete, data_only))
    }

    fn bad_log(&self, journal: &MdJournal, what: String) -> Error {
        Error::Unsupported {
            spec: journal.spec().into(),
            what: format!("its write journal: {what}"),
        }
    }

    /// Write a complete stripe's logged pages where they belong: each data
    /// page on its member, P and Q on theirs, at the stripe's sector.
    fn write_logged_stripe(&self, key: u64, stripe: &Stripe) -> Result<usize> {
        let shape = self.parity.expect("a parity array");
        let row = key * 512 / shape.chunk;
        let (p, q) = shape.map.parity_members(row);
        let mut writes: Vec<(u32, &[u8])> = stripe
            .data
            .iter()
            .map(|(member, (_, page))| (*member, &page[..]))
            .collect();
        if let Some(parity) = &stripe.parity {
            writes.push((p, &parity[0]));
            if let (Some(q), Some(page)) = (q, parity.get(1)) {
                writes.push((q, page));
            }
        }
        let mut buf = AlignedBuf::zeroed(PAGE_BYTES);
        let mut written = 0;
        for (member, page) in writes {
            let role = member as usize;
            if !self.is_usable(role) {
                continue;
            }
            let slot = self.slot(role).expect("usable");
            buf.copy_from_slice(page);
            slot.member
                .write_at(&buf, slot.data_offset_bytes() + key * 512)
                .map_err(|e| Error::io(slot.member.spec(), e))?;
            written += 1;
        }
        Ok(written)
    }
}
