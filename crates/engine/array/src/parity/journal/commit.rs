//! The group commit of the running array (md's write-through mode).
//!
//! Both data paths hand each write round, once its parity is computed, to
//! [`MdJournal::enqueue`]: every data page under its array sector, then P
//! (and Q) under the stripe's member sector, in as many units as the meta
//! blocks need. The round's member writes start only when
//! [`MdJournal::ready`] says its units are durable; whoever finds the log
//! free writes every waiting round in one write and one flush (group
//! commit), and nobody blocks on another round. [`MdJournal::done`] marks a
//! round's stripes on the members. When the ring is half full the members
//! are flushed and the tail moves to the oldest round not done (or the
//! newest unit); the ring never passes the tail. A journaled array is never
//! recorded dirty: the log, not a resync, repairs a crash.
//!
//! Not here: the meta blocks' packing and encoding and the ring's I/O
//! (`log.rs`), a write cache's own groups and their release (`cache.rs`),
//! the trimming of a round against what a cache holds (`held.rs`), the
//! replay (`replay.rs`).

use super::held::{file_copies, trim_for_cache, Held};
use super::log::{encode_block, pack, packed_sectors};
use super::{MdJournal, Writer, FAILED};
use crate::error::Result;
use crate::members::Members;
use nvraid_io::AlignedBuf;
use nvraid_metadata::r5log::{MetaBlock, Payload, PAGE_BYTES, PAGE_SECTORS};

/// The largest batch buffer [`MdJournal`] keeps between batches.
const IMAGE_KEPT_BYTES: usize = 8 << 20;

/// One request round's pages, as units of the log.
#[derive(Debug)]
pub(super) struct Group {
    pub(super) id: u64,
    /// A write cache's pages (held until released).
    pub(super) cached: bool,
    pub(super) payloads: Vec<Payload>,
    /// The ring its payloads take packed on their own ([`packed_sectors`];
    /// a batch packs them with others' into no more).
    pub(super) sectors: u64,
    /// Every payload's pages, in order.
    pub(super) pages: Vec<u8>,
}

impl Group {
    pub(super) fn sectors(&self) -> u64 {
        self.sectors
    }
}

/// The units one write of the log carries: every payload of a batch of
/// groups, in order, packed afresh, so that groups share meta blocks (4 KiB
/// writes from many clients cost one meta block per batch, not one each).
/// Replays read payloads in log order whatever units hold them, so this
/// changes nothing they see.
struct Batch {
    units: Vec<MetaBlock>,
    /// Per unit, where each of its pages comes from: (group, byte offset in
    /// the group's pages).
    pages: Vec<Vec<(usize, usize)>>,
    /// Per group, the unit holding its first payload (for an empty group,
    /// that of the group before it): the tail may not pass it while the
    /// group is open.
    first_unit: Vec<usize>,
}

impl Batch {
    fn of(groups: &[Group]) -> Batch {
        // Each payload's group, and where its first page is in the group's.
        let mut sources = Vec::new();
        let mut payloads = Vec::new();
        for (index, group) in groups.iter().enumerate() {
            let mut from = 0usize;
            for payload in &group.payloads {
                sources.push((index, from));
                from += payload.pages() * PAGE_BYTES;
                payloads.push(payload.clone());
            }
        }
        let units = pack(payloads);
        let mut first: Vec<Option<usize>> = vec![None; groups.len()];
        let mut sources = sources.into_iter();
        let pages = units
            .iter()
            .enumerate()
            .map(|(at, unit)| {
                let mut pages = Vec::with_capacity(unit.pages());
                for payload in &unit.payloads {
                    let Some((group, from)) = sources.next() else {
                        panic!("invariant: a batch's units carry its groups' payloads, no more");
                    };
                    first[group].get_or_insert(at);
                    pages.extend((0..payload.pages()).map(|i| (group, from + i * PAGE_BYTES)));
                }
                pages
            })
            .collect();
        // A group with no payloads takes the unit of the group before it.
        let mut last = 0;
        let first_unit = first
            .into_iter()
            .map(|unit| {
                last = unit.unwrap_or(last);
                last
            })
            .collect();
        Batch {
            units,
            pages,
            first_unit,
        }
    }

    fn sectors(&self) -> u64 {
        self.units.iter().map(MetaBlock::unit_sectors).sum()
    }
}

/// Where a batch leaves the log: the next unit's position and sequence
/// number, and each group's id, whether a cache's, and its first unit.
struct BatchEnd {
    head: u64,
    seq: u64,
    firsts: Vec<(u64, bool, u64)>,
}

impl MdJournal {
    /// Waits, at most `timeout`, until `ticket` is durable, the journal
    /// failed, or a call of [`MdJournal::ready`] could write (no batch or
    /// tail move in flight, and groups waiting). A committer calls it where
    /// `ready` said "not yet": it sleeps until the batch in flight ends
    /// instead of polling.
    pub fn wait_ready(&self, ticket: u64, timeout: std::time::Duration) {
        let mut w = self.writer();
        w.sleepers += 1;
        let (mut w, _) = self
            .progress
            .wait_timeout_while(w, timeout, |w| {
                w.durable < ticket && w.failed.is_none() && (w.writing || w.waiting.is_empty())
            })
            .unwrap_or_else(|p| p.into_inner());
        w.sleepers -= 1;
    }

    /// Queue a round's pages (`payloads` in order, `pages` their bytes)
    /// for the log: its ticket.
    ///
    /// Under a write cache (md's write-back mode) the log holds the pages
    /// the cache acknowledged, and a round writing them back is trimmed:
    /// - a data page the log holds already (the newest copy the cache
    ///   logged for its place, same checksum) is not logged again;
    /// - a row's parity is logged only where it covers every copy the
    ///   cache holds in the row, as md logs the parity of a cached stripe
    ///   it writes out. A replay puts a row together from every data page
    ///   logged for it and the last parity after them, and writes that as
    ///   it stands; a row with no parity after its data it writes through
    ///   the array, parity computed from all of it, whatever a crash left
    ///   on the members. So a parity page that would not cover another
    ///   member's page the cache holds in its row (the round read that
    ///   page's old bytes) is never logged.
    ///
    /// On a degraded array a round that rebuilt a lost member's pages (to
    /// compute parity) logs them as they are (`rebuilt`), before its
    /// parity, unless the cache holds a newer version there (which the log
    /// has, after the row's last parity). A replay then never rebuilds a
    /// lost member's page from the members where the log's rows say
    /// otherwise: parity a crash tore mid-round, or the parity of an
    /// earlier complete stripe of the row, which the replay puts back
    /// although a later round (logging no parity) changed the row.
    ///
    /// A round that so logs nothing takes no place in the log: its ticket
    /// is the newest cache group whose copies it left out, and its writes
    /// wait until that group is durable.
    pub(crate) fn enqueue(
        &self,
        array: &Members,
        payloads: Vec<Payload>,
        pages: Vec<u8>,
        rebuilt: (Vec<Payload>, Vec<u8>),
    ) -> u64 {
        let mut w = self.writer();
        file_copies(array, &mut w);
        let held = Held {
            rows: &w.held_rows,
            released: w.released,
        };
        let (payloads, pages, waits) = trim_for_cache(array, held, payloads, pages, rebuilt);
        if payloads.is_empty() && waits > 0 {
            return waits;
        }
        let sectors = packed_sectors(&payloads);
        let id = w.next_group.max(1);
        w.next_group = id + 1;
        w.waiting.push_back(Group {
            id,
            cached: false,
            payloads,
            sectors,
            pages,
        });
        id
    }

    /// Whether `ticket`'s pages are durable in the log (then its stripes may
    /// be written). Never blocks on other requests: a caller that finds the
    /// log free writes every waiting group in one write and one flush; when
    /// the ring is half full it first moves the tail past the groups whose
    /// stripes are on the members (the members flushed, then every
    /// superblock). An error: the journal failed, and no write may go on.
    pub fn ready(&self, array: &Members, ticket: u64) -> Result<bool> {
        let ready = self.ready_inner(array, ticket);
        if ready.is_err() {
            // (Not under the log's lock: the members' superblocks are written.)
            let _ = self.record_failure(array);
        }
        ready
    }

    fn ready_inner(&self, array: &Members, ticket: u64) -> Result<bool> {
        if self.flags() & FAILED == 0
            && self.durable.load(std::sync::atomic::Ordering::Acquire) >= ticket
        {
            return Ok(true);
        }
        let mut w = self.writer();
        if let Some(why) = &w.failed {
            return Err(self.refused(why));
        }
        if w.durable >= ticket {
            return Ok(true);
        }
        if w.writing || w.waiting.is_empty() {
            return Ok(false);
        }
        let need: u64 = w.waiting.iter().map(Group::sectors).sum();
        let used = self.ring.distance(self.tail(), w.head);
        if used + need + PAGE_SECTORS > self.ring.sectors || used > self.ring.sectors / 2 {
            let (back, moved) = self.move_tail(array, w);
            w = back;
            moved?;
            if w.durable >= ticket {
                return Ok(true);
            }
            if w.writing || w.waiting.is_empty() {
                return Ok(false);
            }
        }
        let take = self.groups_with_room(&mut w)?;
        if take == 0 {
            return Ok(false);
        }
        let groups: Vec<Group> = w.waiting.drain(..take).collect();
        // The batch is built and written without the lock: `writing` keeps
        // every other writer off the head until it is moved below.
        let (start, seq) = (w.head, w.seq);
        w.writing = true;
        drop(w);
        let (written, end) = self.write_batch(&groups, start, seq);
        for group in groups {
            if group.cached {
                self.keep_spare(group.pages);
            }
        }
        let mut w = self.writer();
        w.writing = false;
        self.wake(&w);
        if let Err(e) = written {
            return Err(self.fail(&mut w, e.to_string()));
        }
        self.record_batch(&mut w, end);
        Ok(w.durable >= ticket)
    }

    /// How many of the waiting groups (at least one waits) the ring has
    /// room for now, a page left between the head and the tail. None: the
    /// round waits for the tail to move (`wants_room`), or, when the first
    /// group would not fit an empty ring, the journal fails.
    fn groups_with_room(&self, w: &mut Writer) -> Result<usize> {
        let used = self.ring.distance(self.tail(), w.head);
        let mut room = self.ring.sectors - used - PAGE_SECTORS.min(self.ring.sectors - used);
        let mut take = 0;
        for g in &w.waiting {
            let sectors = g.sectors();
            if sectors > room {
                break;
            }
            room -= sectors;
            take += 1;
        }
        if take > 0 {
            return Ok(take);
        }
        let Some(first) = w.waiting.front().map(Group::sectors) else {
            panic!("invariant: a batch is taken only when groups wait");
        };
        if first + PAGE_SECTORS > self.ring.sectors {
            let why = format!(
                "a write of {} sectors of log does not fit its ring of {}",
                first, self.ring.sectors
            );
            return Err(self.fail(w, why));
        }
        // Wait for stripes to reach the members, then the tail moves.
        w.wants_room = true;
        Ok(0)
    }

    /// Build the batch of `groups` (its first unit at `start`, with
    /// sequence number `seq`) and write it into the ring (without the
    /// log's lock: the caller holds `writing`). Where the log ends, and
    /// each group's first unit, whether or not the write succeeded.
    fn write_batch(
        &self,
        groups: &[Group],
        start: u64,
        seq: u64,
    ) -> (std::io::Result<()>, BatchEnd) {
        let batch = Batch::of(groups);
        let taken: u64 = groups.iter().map(Group::sectors).sum();
        assert!(
            batch.sectors() <= taken,
            "invariant: a batch packs its groups into no more ring ({}) than they take apart \
             ({taken})",
            batch.sectors()
        );
        assert!(
            self.ring.distance(self.tail(), start) + batch.sectors() + PAGE_SECTORS
                <= self.ring.sectors,
            "invariant: a batch leaves a page between the head and the tail"
        );
        let len = (batch.sectors() * 512) as usize;
        let mut kept = self.image.lock().unwrap_or_else(|p| p.into_inner());
        let mut own = None;
        let image: &mut [u8] = if len <= IMAGE_KEPT_BYTES {
            if kept.len() < len {
                *kept = AlignedBuf::zeroed(len.next_power_of_two().min(IMAGE_KEPT_BYTES));
            }
            &mut kept[..len]
        } else {
            &mut own.insert(AlignedBuf::zeroed(len))[..]
        };
        let end = self.encode_batch(&batch, groups, image, start, seq);
        (self.write_ring(start, image), end)
    }

    /// Encode `batch` (of `groups`) into `image`: each unit's meta block,
    /// placed and numbered from `start` and `seq` and checked as
    /// [`encode_block`] does, then its pages.
    fn encode_batch(
        &self,
        batch: &Batch,
        groups: &[Group],
        image: &mut [u8],
        start: u64,
        mut seq: u64,
    ) -> BatchEnd {
        let mut positions = Vec::with_capacity(batch.units.len());
        let mut pos = start;
        let mut at = 0usize;
        for (unit, pages) in batch.units.iter().zip(&batch.pages) {
            positions.push(pos);
            let mut block = unit.clone();
            block.seq = seq;
            block.position = pos;
            encode_block(&block, &mut image[at..at + PAGE_BYTES], self.seed);
            at += PAGE_BYTES;
            for &(group, from) in pages {
                image[at..at + PAGE_BYTES]
                    .copy_from_slice(&groups[group].pages[from..from + PAGE_BYTES]);
                at += PAGE_BYTES;
            }
            pos = self.ring.add(pos, unit.unit_sectors());
            seq += 1;
        }
        assert_eq!(at, image.len(), "invariant: a batch's image is its units");
        let firsts = groups
            .iter()
            .zip(&batch.first_unit)
            .map(|(g, &unit)| (g.id, g.cached, positions[unit]))
            .collect();
        BatchEnd {
            head: pos,
            seq,
            firsts,
        }
    }

    /// A batch is durable: the head and sequence move past it, its request
    /// rounds' groups open until done (a cache's until released), and its
    /// newest group is the newest durable one.
    fn record_batch(&self, w: &mut Writer, end: BatchEnd) {
        self.assert_in_ring(end.head, "the head");
        assert!(
            end.seq > w.seq,
            "invariant: sequence numbers only move forward ({} to {})",
            w.seq,
            end.seq
        );
        w.head = end.head;
        w.seq = end.seq;
        for (id, cached, first) in end.firsts {
            assert!(
                id > w.durable,
                "invariant: groups become durable in order (group {id} after {})",
                w.durable
            );
            if !cached {
                w.open.insert(id, first);
            } else if id > w.released {
                // (A cache's group released before it was written stays
                // closed.)
                w.open_cached.push_back((id, first));
            }
            w.last_written = Some(first);
            w.durable = id;
        }
        self.durable
            .store(w.durable, std::sync::atomic::Ordering::Release);
    }

    /// The request holding `ticket` has written its stripes (a cache's
    /// group waits for [`MdJournal::release_through`] instead).
    pub(crate) fn done(&self, ticket: u64) {
        // (A cache's group is not in `open`: a round that logged nothing
        // has one's ticket.)
        self.writer().open.remove(&ticket);
    }

    /// Move the tail as far as the members allow: past every unit of a
    /// group that is done (the members flushed first, then every
    /// superblock). Waits while another thread writes the log.
    pub fn checkpoint(&self, array: &Members) -> Result<()> {
        let moved = self.checkpoint_inner(array);
        if moved.is_err() && self.failure().is_some() {
            let _ = self.record_failure(array);
        }
        moved
    }

    fn checkpoint_inner(&self, array: &Members) -> Result<()> {
        loop {
            let w = self.writer();
            if w.failed.is_some() {
                return Ok(());
            }
            if w.writing {
                drop(w);
                std::thread::sleep(std::time::Duration::from_micros(50));
                continue;
            }
            return self.move_tail(array, w).1;
        }
    }

    /// [`MdJournal::checkpoint`] with the lock held and nobody writing;
    /// gives the lock back.
    fn move_tail<'a>(
        &'a self,
        array: &Members,
        mut w: std::sync::MutexGuard<'a, Writer>,
    ) -> (std::sync::MutexGuard<'a, Writer>, Result<()>) {
        // The oldest group still writing its stripes (or held by a cache),
        // or else the newest written (all on the members; replaying it is
        // harmless).
        let oldest_round = w.open.first_key_value().map(|(&id, &at)| (id, at));
        let oldest = match (oldest_round, w.open_cached.front().copied()) {
            (Some(round), Some(cached)) => Some(round.min(cached)),
            (round, cached) => round.or(cached),
        };
        let new_tail = oldest.map(|(_, at)| at).or(w.last_written);
        let Some(new_tail) = new_tail.filter(|&t| t != self.tail()) else {
            return (w, Ok(()));
        };
        let old_tail = self.tail();
        assert!(
            self.ring.distance(old_tail, new_tail) < self.ring.distance(old_tail, w.head),
            "invariant: the tail moves toward the head, never past it (from {old_tail} to \
             {new_tail}, head {})",
            w.head
        );
        w.writing = true;
        drop(w);
        let moved = array.flush().and_then(|()| {
            self.set_tail(new_tail);
            array.rewrite_superblocks()
        });
        let mut w = self.writer();
        w.writing = false;
        w.wants_room = false;
        self.wake(&w);
        let result = match moved {
            Ok(()) => Ok(()),
            Err(e) if self.is_own_failure(&e) => {
                Err(self.fail(&mut w, format!("moving its tail: {e}")))
            }
            Err(e) => {
                // A member of the array, not the journal, failed its flush
                // or superblock (one the array could not lose, or it would
                // have been marked faulty and the update gone on): the log
                // is whole, the tail stays where it was (the ring does not
                // reuse what a replay may still need), and a later
                // checkpoint moves it.
                self.set_tail(old_tail);
                Err(e)
            }
        };
        (w, result)
    }

    /// At an orderly stop: the tail moves to the newest unit (every stripe
    /// is on the members, and they are flushed).
    pub(crate) fn close(&self, array: &Members) -> Result<()> {
        let w = self.writer();
        if !w.active || w.failed.is_some() {
            return Ok(());
        }
        let Some(last) = w.last_written.filter(|&t| t != self.tail()) else {
            return Ok(());
        };
        drop(w);
        self.set_tail(last);
        array.rewrite_superblocks()
    }
}
