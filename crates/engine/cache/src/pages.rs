//! The cached blocks and everything that decides when one may go.
//!
//! A page is one 4 KiB block of the array. It is *dirty* while the array
//! holds an older version than the page (`written < seq`), *busy* while the
//! write-back thread is writing it, and *clean* once the array has it; a
//! clean page is dropped as soon as no read that might still need it is in
//! flight.
//!
//! Why a clean page cannot always be dropped at once: a read that found
//! cached pages in its range reads the array and then lays the cached pages
//! over what came back. If a page it relied on were written back and
//! dropped while the array read was in flight, the read could return the
//! array's older version. So such reads register the *epoch* (a counter
//! bumped whenever pages turn clean) they started in, and a page cleaned in
//! a later epoch stays until every read registered before it is done. A
//! read that found no page in its range needs nothing: any page created
//! after it started belongs to a write that raced with it.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use crate::journal::format::BLOCK_BYTES;

/// One cached block.
pub(crate) struct Page {
    pub data: Box<[u8]>,
    /// Sequence number of the last write to the block.
    pub seq: u64,
    /// The newest sequence number known to be on the array.
    pub written: u64,
    /// A write-back of this page is in flight.
    pub busy: bool,
    /// The lowest sequence number among writes not yet on the array (the
    /// write that dirtied it): a flush waits for pages dirty since before
    /// it was asked.
    pub dirty_from: u64,
}

impl Page {
    pub fn is_dirty(&self) -> bool {
        self.written < self.seq
    }
}

/// Hashes a page index with one multiplication (Fibonacci hashing): page
/// indexes are not chosen by an adversary, and the default SipHash cost a
/// fifth of the CPU of 1 MiB writes (256 lookups each).
#[derive(Default)]
pub(crate) struct IndexHasher(u64);

impl Hasher for IndexHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(byte)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0 ^ value).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// Everything behind the cache's lock.
#[derive(Default)]
pub(crate) struct Pages {
    pub map: HashMap<u64, Page, BuildHasherDefault<IndexHasher>>,
    /// Indexes of dirty pages, in order (write-back goes by address).
    pub dirty: BTreeSet<u64>,
    /// Sequence number of the last write taken in.
    pub seq: u64,
    /// Bumped every time pages turn clean.
    pub epoch: u64,
    /// Reads in flight that rely on cached pages: epoch → how many.
    reads: BTreeMap<u64, u32>,
    /// Pages that turned clean, with their epoch, oldest first.
    clean: VecDeque<(u64, u64)>,
    /// Spare page buffers.
    spare: Vec<Box<[u8]>>,
    /// How many pages are dirty, readable without the cache's lock (a
    /// writer asks on every write whether there is room).
    pub dirty_pages: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

/// Spare buffers kept for reuse.
const SPARE_MAX: usize = 1024;

impl Pages {
    /// Bytes of dirty data.
    pub fn dirty_bytes(&self) -> u64 {
        self.dirty.len() as u64 * BLOCK_BYTES as u64
    }

    fn mirror_dirty(&self) {
        self.dirty_pages.store(
            self.dirty.len() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// A page buffer, from the spares when there is one.
    pub fn buffer(&mut self) -> Box<[u8]> {
        self.spare
            .pop()
            .unwrap_or_else(|| vec![0u8; BLOCK_BYTES].into_boxed_slice())
    }

    /// Takes in a write: `data` (whole blocks) at block `first`. Returns
    /// its sequence number.
    pub fn insert(&mut self, first: u64, data: &[u8]) -> u64 {
        assert!(
            data.len().is_multiple_of(BLOCK_BYTES),
            "invariant: the cache takes whole pages ({} bytes given)",
            data.len()
        );
        self.seq += 1;
        let seq = self.seq;
        for (i, block) in data.chunks(BLOCK_BYTES).enumerate() {
            let index = first + i as u64;
            match self.map.get_mut(&index) {
                Some(page) => {
                    page.data.copy_from_slice(block);
                    if !page.is_dirty() {
                        page.dirty_from = seq;
                    }
                    page.seq = seq;
                }
                None => {
                    let mut buffer = self.buffer();
                    buffer.copy_from_slice(block);
                    self.map.insert(
                        index,
                        Page {
                            data: buffer,
                            seq,
                            written: 0,
                            busy: false,
                            dirty_from: seq,
                        },
                    );
                }
            }
            self.dirty.insert(index);
        }
        self.mirror_dirty();
        seq
    }

    /// Which of the blocks `first..first + count` are cached: `All`,
    /// `Some`, or `None`.
    pub fn coverage(&self, first: u64, count: u64) -> Coverage {
        if self.map.is_empty() {
            return Coverage::None;
        }
        let present = (first..first + count)
            .filter(|i| self.map.contains_key(i))
            .count() as u64;
        match present {
            0 => Coverage::None,
            n if n == count => Coverage::All,
            _ => Coverage::Some,
        }
    }

    /// Copies the cached blocks of `first..` into `buffer` (whole blocks),
    /// leaving the others as they are.
    pub fn overlay(&self, first: u64, buffer: &mut [u8]) {
        for (i, block) in buffer.chunks_mut(BLOCK_BYTES).enumerate() {
            if let Some(page) = self.map.get(&(first + i as u64)) {
                block.copy_from_slice(&page.data);
            }
        }
    }

    /// Registers a read that will overlay cached pages; returns its epoch.
    pub fn start_read(&mut self) -> u64 {
        *self.reads.entry(self.epoch).or_default() += 1;
        self.epoch
    }

    /// The read registered at `epoch` is done.
    pub fn end_read(&mut self, epoch: u64) {
        let Some(count) = self.reads.get_mut(&epoch) else {
            panic!("invariant: a read ends once, in the epoch it started in ({epoch})");
        };
        *count -= 1;
        if *count == 0 {
            self.reads.remove(&epoch);
        }
        self.evict();
    }

    /// Marks `snapshot` (the sequence number written) of page `index` as on
    /// the array; the page turns clean unless it was written again since.
    pub fn written_back(&mut self, index: u64, snapshot: u64) {
        let page = self.busy_page(index);
        assert!(
            snapshot <= page.seq,
            "invariant: page {index} was written back from a version it had"
        );
        page.busy = false;
        page.written = page.written.max(snapshot);
        if page.is_dirty() {
            // Written again while the write-back was in flight: what came
            // after the snapshot is still to be written.
            page.dirty_from = snapshot + 1;
        } else {
            self.dirty.remove(&index);
            self.clean.push_back((self.epoch + 1, index));
        }
    }

    /// Ends a round of [`Pages::written_back`]: a new epoch, and the clean
    /// pages no read needs are dropped.
    pub fn end_round(&mut self) {
        self.mirror_dirty();
        self.epoch += 1;
        self.evict();
    }

    /// A write-back of page `index` failed: it stays dirty.
    pub fn write_failed(&mut self, index: u64) {
        self.busy_page(index).busy = false;
    }

    /// A page the write-back thread is writing: it stays cached (eviction
    /// passes busy pages by) and only its write-back ends its busy state.
    fn busy_page(&mut self, index: u64) -> &mut Page {
        let Some(page) = self.map.get_mut(&index) else {
            panic!("invariant: page {index}, being written back, is cached");
        };
        assert!(
            page.busy,
            "invariant: only a page being written back (busy) ends a write-back (page {index})"
        );
        page
    }

    /// Drops clean pages cleaned in an epoch no registered read predates.
    fn evict(&mut self) {
        let oldest_read = self.reads.keys().next().copied();
        while let Some(&(epoch, index)) = self.clean.front() {
            if oldest_read.is_some_and(|oldest| epoch > oldest) {
                break;
            }
            self.clean.pop_front();
            let removable = self
                .map
                .get(&index)
                .is_some_and(|page| !page.is_dirty() && !page.busy);
            if removable {
                if let Some(page) = self.map.remove(&index) {
                    if self.spare.len() < SPARE_MAX {
                        self.spare.push(page.data);
                    }
                }
            }
        }
    }
}

/// How much of a range the cache holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Coverage {
    None,
    Some,
    All,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(byte: u8) -> Vec<u8> {
        vec![byte; BLOCK_BYTES]
    }

    #[test]
    fn a_page_cleaned_after_a_read_started_stays_until_the_read_ends() {
        let mut pages = Pages::default();
        let seq = pages.insert(3, &block(1));
        let epoch = pages.start_read();
        pages.map.get_mut(&3).unwrap().busy = true;
        pages.written_back(3, seq);
        pages.end_round();
        assert!(pages.map.contains_key(&3), "the read may still need it");
        pages.end_read(epoch);
        assert!(!pages.map.contains_key(&3));
        assert_eq!(pages.dirty_bytes(), 0);
    }

    #[test]
    fn a_page_written_again_during_write_back_stays_dirty() {
        let mut pages = Pages::default();
        let first = pages.insert(0, &block(1));
        pages.map.get_mut(&0).unwrap().busy = true;
        let second = pages.insert(0, &block(2));
        pages.written_back(0, first);
        pages.end_round();
        let page = &pages.map[&0];
        assert!(page.is_dirty() && page.dirty_from == first + 1);
        assert_eq!(page.data[0], 2);
        pages.map.get_mut(&0).unwrap().busy = true;
        pages.written_back(0, second);
        pages.end_round();
        assert!(pages.map.is_empty());
    }

    /// Page states move clean/dirty -> busy -> written back only: a
    /// write-back that ends on a page nobody was writing is a bookkeeping
    /// fault, stopped before it marks data clean that the array lacks.
    #[test]
    #[should_panic(expected = "invariant: only a page being written back (busy)")]
    fn a_write_back_cannot_end_on_a_page_not_being_written_back() {
        let mut pages = Pages::default();
        let seq = pages.insert(0, &block(1));
        pages.written_back(0, seq);
    }

    #[test]
    #[should_panic(expected = "invariant: a read ends once")]
    fn a_read_ends_once() {
        let mut pages = Pages::default();
        pages.insert(0, &block(1));
        let epoch = pages.start_read();
        pages.end_read(epoch);
        pages.end_read(epoch);
    }

    #[test]
    fn coverage_and_overlay() {
        let mut pages = Pages::default();
        pages.insert(1, &block(9));
        assert_eq!(pages.coverage(0, 1), Coverage::None);
        assert_eq!(pages.coverage(0, 2), Coverage::Some);
        assert_eq!(pages.coverage(1, 1), Coverage::All);
        let mut buffer = vec![0u8; 2 * BLOCK_BYTES];
        pages.overlay(0, &mut buffer);
        assert!(buffer[..BLOCK_BYTES].iter().all(|&b| b == 0));
        assert!(buffer[BLOCK_BYTES..].iter().all(|&b| b == 9));
    }
}
