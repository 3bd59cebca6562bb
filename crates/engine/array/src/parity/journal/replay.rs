//! The replay of md's write journal at a writable assembly, before anything
//! else is written, following md's recovery (`r5c_recovery_flush_log` and
//! what follows it):
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
//!    md leaves it: its data reached the members before the tail moved).
//!    Stripes with data only (md's write-back mode acknowledged them from
//!    the log) are written through the array's own write path, their
//!    parity computed from all of their data (never updated from parity a
//!    crash may have torn).
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
//! What the log holds is the disk's to say: a page past the array's end, or
//! parity of the wrong width, is an error naming the journal, never a
//! panic. Not here: reading the ring and starting the new log (`log.rs`).

use super::log::random_seq;
use super::MdJournal;
use crate::array::Array;
use crate::error::{Error, Result};
use nvraid_io::AlignedBuf;
use nvraid_metadata::r5log::{self, Payload, PAGE_BYTES, PAGE_SECTORS};
use std::collections::btree_map::Entry;
use std::collections::BTreeMap;

/// How far the sequence jumps where a replayed log ends (md's 10000).
const SEQ_JUMP: u64 = 10_000;

/// Why an array with md's journal has a parity shape.
const JOURNAL_HAS_PARITY: &str = "an array with md's journal has parity (assembly refuses others)";

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

/// The stripes of a log as its payloads are read in order
/// ([`Array::gather`]).
#[derive(Default)]
struct Gathering {
    /// Stripes open, by their sector on the members.
    stripes: BTreeMap<u64, Stripe>,
    /// Stripes to write exactly, in log order.
    complete: Stripes,
    /// The lost members, and the newest page logged for each (stripe,
    /// member) of one (see [`Gathering::finish`]).
    lost: Vec<u32>,
    newest: BTreeMap<(u64, u32), (u64, Vec<u8>)>,
}

impl Gathering {
    /// A flush payload: md wrote these stripes already.
    fn flush(&mut self, flushed: &[u64]) {
        for s in flushed {
            self.stripes.remove(s);
            self.newest.retain(|&(key, _), _| key != *s);
        }
    }

    /// The log read: the stripes to write exactly as logged (in log
    /// order), and those with data only.
    fn finish(self) -> (Stripes, Stripes) {
        let Gathering {
            stripes,
            mut complete,
            lost,
            newest,
        } = self;
        let (rest_complete, mut data_only): (Vec<_>, Vec<_>) =
            stripes.into_iter().partition(|(_, s)| s.parity.is_some());
        // A data-only stripe is written through the array, which rebuilds
        // a lost member's page from the parity on the members. Where the
        // log holds that page (in an earlier, complete stripe of the row,
        // say), its newest copy is what the member holds: every write of
        // that page after the tail is logged, data or rebuilt.
        for (key, stripe) in &mut data_only {
            for &role in &lost {
                if let Some(page) = newest.get(&(*key, role)) {
                    stripe.data.entry(role).or_insert_with(|| page.clone());
                }
            }
        }
        complete.extend(rest_complete);
        // Parity with no data: its data went to the members before the
        // tail moved past it; md writes nothing for it either.
        complete.retain(|(_, s)| !s.data.is_empty());
        (complete, data_only)
    }
}

impl Array {
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
                self.rewrite_superblocks()?;
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
        let (complete, mut data_only) = self.gather(journal, &scan)?;
        // A lost member's page of a data-only stripe the log lacks is
        // rebuilt now, from the members as the crash left them, before a
        // complete stripe of the same row puts back parity that a later
        // round (which logged none) made stale.
        self.read_lost_pages(&mut data_only)?;
        for (key, stripe) in &complete {
            replay.pages += self.write_logged_stripe(*key, stripe)?;
        }
        replay.complete_stripes = complete.len();
        self.flush()?;
        replay.pages += self.write_data_only(journal, &data_only)?;
        replay.data_only_stripes = data_only.len();
        self.flush()?;
        // md's jump: units written out of order may sit past the end with
        // the next few sequence numbers; the new log must not continue
        // into them.
        journal.start_log(scan.next_position, scan.next_seq + SEQ_JUMP)?;
        self.rewrite_superblocks()?;
        Ok(Some(replay))
    }

    /// Read the lost members' data pages of the data-only stripes where
    /// the log holds none (rebuilt from the members as they are).
    fn read_lost_pages(&self, data_only: &mut Stripes) -> Result<()> {
        for (key, stripe) in data_only {
            for (role, offset) in self.lost_data_pages(*key) {
                if stripe.data.contains_key(&role) {
                    continue;
                }
                let mut page = AlignedBuf::zeroed(PAGE_BYTES);
                self.read_at(&mut page, offset)?;
                stripe.data.insert(role, (offset, page.to_vec()));
            }
        }
        Ok(())
    }

    /// Data-only stripes go through the array, their parity computed
    /// from all of their data (a crash may have torn what the members
    /// hold, so it is not updated from it); the log is not written yet,
    /// and a crash now replays them again from the same log. The pages
    /// written.
    fn write_data_only(&self, journal: &MdJournal, data_only: &Stripes) -> Result<usize> {
        journal
            .replaying
            .store(true, std::sync::atomic::Ordering::Release);
        let written = (|| {
            let mut written = 0;
            for (_, stripe) in data_only {
                // The lost members' pages first: each later page's write
                // then rebuilds them from parity that agrees with them.
                let mut pages: Vec<(bool, &(u64, Vec<u8>))> = stripe
                    .data
                    .iter()
                    .map(|(&role, page)| (self.is_usable(role as usize), page))
                    .collect();
                pages.sort_by_key(|&(usable, _)| usable);
                for (_, (offset, page)) in pages {
                    let mut buf = AlignedBuf::zeroed(PAGE_BYTES);
                    buf.copy_from_slice(page);
                    self.write_at(&buf, *offset, false)?;
                    written += 1;
                }
            }
            Ok::<usize, Error>(written)
        })();
        journal
            .replaying
            .store(false, std::sync::atomic::Ordering::Release);
        written
    }

    /// The stripes a scanned log holds, md's way: those to write exactly as
    /// logged (in log order), and those with data only.
    fn gather(&self, journal: &MdJournal, scan: &r5log::Scan) -> Result<(Stripes, Stripes)> {
        let mut g = Gathering {
            lost: (0..self.roles() as u32)
                .filter(|&role| !self.is_usable(role as usize))
                .collect(),
            ..Gathering::default()
        };
        for unit in &scan.units {
            let mut pages = unit.pages.iter();
            let mut next_page = || {
                let Some(page) = pages.next() else {
                    panic!("invariant: a scanned unit has one page per checksum");
                };
                page
            };
            for payload in &unit.block.payloads {
                match payload {
                    Payload::Data { location, .. } => {
                        self.gather_data(journal, &mut g, *location, next_page())?;
                    }
                    Payload::Parity {
                        location,
                        checksums,
                        ..
                    } => {
                        self.check_parity(journal, *location, checksums.len())?;
                        let got: Vec<Vec<u8>> =
                            checksums.iter().map(|_| next_page().clone()).collect();
                        g.stripes.entry(*location).or_default().parity = Some(got);
                    }
                    Payload::Flush {
                        stripes: flushed, ..
                    } => g.flush(flushed),
                }
            }
        }
        Ok(g.finish())
    }

    /// A data page logged for array sector `location`: into its stripe (a
    /// complete one is closed first: the page is a later write), and the
    /// newest of its place when its member is lost.
    fn gather_data(
        &self,
        journal: &MdJournal,
        g: &mut Gathering,
        location: u64,
        page: &[u8],
    ) -> Result<()> {
        // A location from the disk: no arithmetic on it may wrap.
        let end = location
            .checked_mul(512)
            .and_then(|offset| offset.checked_add(PAGE_BYTES as u64));
        if end.is_none_or(|end| end > self.size_bytes()) {
            return Err(self.bad_log(
                journal,
                format!("a data page for array sector {location}, past the array's end"),
            ));
        }
        let offset = location * 512;
        let at = self.geometry().locate(offset, 0);
        let key = at.member_offset / 512;
        if g.lost.contains(&at.member) {
            g.newest.insert((key, at.member), (offset, page.to_vec()));
        }
        if let Entry::Occupied(stripe) = g.stripes.entry(key) {
            if stripe.get().parity.is_some() {
                g.complete.push((key, stripe.remove()));
            }
        }
        g.stripes
            .entry(key)
            .or_default()
            .data
            .insert(at.member, (offset, page.to_vec()));
        Ok(())
    }

    /// A parity payload of `pages` pages for stripe sector `location` is
    /// one this array could have logged (an error naming the journal when
    /// not: the log is the disk's to say).
    fn check_parity(&self, journal: &MdJournal, location: u64, pages: usize) -> Result<()> {
        let Some(shape) = self.parity_shape() else {
            panic!("invariant: {JOURNAL_HAS_PARITY}");
        };
        if pages != shape.parity as usize {
            return Err(self.bad_log(
                journal,
                format!(
                    "{pages} parity pages for stripe sector {location} of a {}",
                    self.geometry().level()
                ),
            ));
        }
        let end = location
            .checked_add(PAGE_SECTORS)
            .and_then(|sectors| sectors.checked_mul(512));
        if end.is_none_or(|end| end > self.geometry().member_used_bytes()) {
            return Err(self.bad_log(
                journal,
                format!("parity for stripe sector {location}, past the members' end"),
            ));
        }
        Ok(())
    }

    /// The lost members that hold data (not parity) at member sector
    /// `key`, each with the array offset of its page there.
    fn lost_data_pages(&self, key: u64) -> Vec<(u32, u64)> {
        let Some(shape) = self.parity_shape() else {
            panic!("invariant: {JOURNAL_HAS_PARITY}");
        };
        (0..self.roles() as u32)
            .filter(|&role| !self.is_usable(role as usize))
            .filter_map(|role| Some((role, shape.array_offset_of(key * 512, role)?)))
            .collect()
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
        let Some(shape) = self.parity_shape() else {
            panic!("invariant: {JOURNAL_HAS_PARITY}");
        };
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
            let Some(slot) = self.slot(role) else {
                panic!("invariant: a usable member has a slot");
            };
            buf.copy_from_slice(page);
            slot.member
                .write_at(&buf, slot.data_offset_bytes() + key * 512)
                .map_err(|e| Error::io(slot.member.spec(), e))?;
            written += 1;
        }
        Ok(written)
    }
}
