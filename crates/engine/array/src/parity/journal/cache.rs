//! What a write cache over the array calls (md's write-back mode; the
//! cache's adapter is nvraid-cache's `journal::md`): its pages made ready
//! for the log without a lock, queued as data-only groups held open until
//! it releases them (the tail never passes a page the members lack), and
//! its share of the log, in sectors and in stripes, which keeps what a
//! kernel replay loads into md's stripe cache bounded.
//!
//! Not here: how the groups are written (`commit.rs`), the table of the
//! copies the cache holds, against which the array's rounds are trimmed
//! (`held.rs`).

use super::commit::Group;
use super::log::packed_sectors;
use super::MdJournal;
use crate::array::Array;
use nvraid_metadata::r5log::{self, Payload, PAGE_BYTES};

/// Page buffers of written cached groups kept for reuse, and the largest.
const SPARE_PAGES: usize = 256;
const SPARE_PAGE_BYTES: usize = 64 * 1024;

/// The most stripes (4 KiB rows of the members, md's unit) a write cache
/// keeps in md's log as data-only units (md's write-back mode). After a crash the kernel's md loads every data-only
/// stripe of the log into its stripe cache before it writes any of them
/// out, doubling the cache (256 stripes by default, 32,768 at most) as it
/// goes; where the doubled cache does not fit in memory, the assembly
/// waits for a stripe that never comes (reported on the linux-raid list
/// in April 2025 for 6.15-rc3, a RAID 6 hung after growing to 32,768; issue
/// 29 saw `mdadm --assemble` hang on a log nvraid left with 1,893 data-only
/// stripes, which runs here did not reproduce: up to 6,214 were recovered
/// in a 512 MiB guest on 6.1 and 6.12). md's own write-back cache never
/// holds more data-only stripes than its stripe cache. nvraid keeps the
/// stripes of its logged, unreleased cache pages at 4,096: the kernel's
/// cache then grows to 8,192 stripes at most (about 170 MB for a
/// five-member array), and a replay loads no more than that.
pub const CACHED_STRIPES_MAX: usize = 4096;

/// A write cache's write made ready for the log
/// ([`MdJournal::prepare_cached`]).
#[derive(Debug)]
pub struct CachedWrite {
    offset: u64,
    payloads: Vec<Payload>,
    sectors: u64,
    pages: Vec<u8>,
}

/// The stripe (md's unit: the 4 KiB row of the members) of array byte
/// `offset`, as its page number on a member.
fn stripe_key(array: &Array, offset: u64) -> u64 {
    match array.parity_shape() {
        Some(shape) => {
            let row = offset / shape.stripe_data_bytes();
            (row * shape.chunk + offset % shape.chunk) / PAGE_BYTES as u64
        }
        None => offset / PAGE_BYTES as u64,
    }
}

impl MdJournal {
    fn spare(&self) -> std::sync::MutexGuard<'_, Vec<Vec<u8>>> {
        self.spare_pages.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keep `pages` for a later cached write, unless enough are kept or it
    /// is large.
    pub(super) fn keep_spare(&self, pages: Vec<u8>) {
        let mut spare = self.spare();
        if spare.len() < SPARE_PAGES && pages.capacity() <= SPARE_PAGE_BYTES {
            spare.push(pages);
        }
    }

    /// A write cache's pages, `data` at array byte `offset` (whole 4 KiB
    /// pages), as data-only units (md's write-back mode): held open until
    /// [`MdJournal::release_through`], so the tail never passes them while
    /// the members lack them. Its ticket, or `None` when the cache holds
    /// its share of the log already (nothing queued). The caller orders
    /// these calls as it takes the writes in (a cache: under its lock).
    pub fn enqueue_cached(
        &self,
        array: &Array,
        offset: u64,
        data: &[u8],
    ) -> std::result::Result<Option<u64>, String> {
        let write = self.prepare_cached(offset, data)?;
        self.enqueue_prepared(array, write)
    }

    /// The part of [`MdJournal::enqueue_cached`] that needs no lock: the
    /// pages' checksums and their copy for the log.
    pub fn prepare_cached(
        &self,
        offset: u64,
        data: &[u8],
    ) -> std::result::Result<CachedWrite, String> {
        if !offset.is_multiple_of(PAGE_BYTES as u64) || !data.len().is_multiple_of(PAGE_BYTES) {
            return Err(format!(
                "{offset}+{}: the journal logs whole 4 KiB pages",
                data.len()
            ));
        }
        let payloads: Vec<Payload> = data
            .chunks(PAGE_BYTES)
            .enumerate()
            .map(|(i, page)| Payload::Data {
                flags: 0,
                location: (offset + (i * PAGE_BYTES) as u64) / 512,
                checksum: r5log::md_crc(self.seed, page),
            })
            .collect();
        let sectors = packed_sectors(&payloads);
        // A buffer of a batch already written, when one of the size is kept.
        let mut pages = {
            let mut spare = self.spare();
            match spare.iter().position(|b| b.capacity() >= data.len()) {
                Some(at) => spare.swap_remove(at),
                None => Vec::with_capacity(data.len()),
            }
        };
        pages.clear();
        pages.extend_from_slice(data);
        Ok(CachedWrite {
            offset,
            payloads,
            sectors,
            pages,
        })
    }

    /// Queues a write [`MdJournal::prepare_cached`] made ready (see
    /// [`MdJournal::enqueue_cached`]).
    pub fn enqueue_prepared(
        &self,
        array: &Array,
        write: CachedWrite,
    ) -> std::result::Result<Option<u64>, String> {
        let CachedWrite {
            offset,
            payloads,
            sectors,
            pages,
        } = write;
        let mut w = self.writer();
        if let Some(why) = &w.failed {
            return Err(why.clone());
        }
        let stripe_of = |i: usize| stripe_key(array, offset + (i * PAGE_BYTES) as u64);
        let new_stripes = (0..payloads.len())
            .filter(|&i| !w.held_stripes.contains_key(&stripe_of(i)))
            .count();
        let over_stripes = w.held_stripes.len() + new_stripes > self.cached_stripes_max();
        if w.held_sectors > 0
            && (w.held_sectors + sectors > self.cache_share(array) || over_stripes)
        {
            w.wants_room = true;
            drop(w);
            self.keep_spare(pages);
            return Ok(None);
        }
        let id = w.next_group.max(1);
        w.next_group = id + 1;
        let w = &mut *w;
        for (i, payload) in payloads.iter().enumerate() {
            let Payload::Data { checksum, .. } = *payload else {
                unreachable!("data payloads only")
            };
            w.unfiled
                .push((offset + (i * PAGE_BYTES) as u64, checksum, id));
        }
        for i in 0..payloads.len() {
            let stripe = stripe_of(i);
            *w.held_stripes.entry(stripe).or_insert(0) += 1;
            w.held_order.push_back((id, stripe));
        }
        w.held.push_back((id, sectors, payloads.len()));
        w.held_sectors += sectors;
        w.held_count += payloads.len();
        w.waiting.push_back(Group {
            id,
            cached: true,
            payloads,
            sectors,
            pages,
        });
        Ok(Some(id))
    }

    /// The most a write cache may hold in the log (sectors; and at most
    /// [`CACHED_STRIPES_MAX`] stripes). Writing its
    /// pages back logs each row's parity again (P, and Q on RAID 6; not the
    /// data, which the log holds: see [`MdJournal::enqueue`]), and the
    /// cache writes back in slices, each logged page released within two
    /// of them. For 4 KiB writes (the worst case: a meta block per page
    /// both ways) the ring then holds at most the share plus two slices'
    /// parity, 3 shares on RAID 4/5 and 4 on RAID 6. The share is a fifth
    /// of the ring on RAID 4/5 and a seventh on RAID 6 (or one write at a
    /// time), which leaves two fifths of the ring to spare.
    fn cache_share(&self, array: &Array) -> u64 {
        let parity = array
            .parity_shape()
            .map_or(2, |shape| u64::from(shape.parity));
        self.ring.sectors / (3 + 2 * parity)
    }

    /// The most stripes a write cache keeps data-only in the log
    /// ([`CACHED_STRIPES_MAX`] unless set).
    pub fn cached_stripes_max(&self) -> usize {
        match self.stripes_max.load(std::sync::atomic::Ordering::Relaxed) {
            0 => CACHED_STRIPES_MAX,
            n => n,
        }
    }

    /// Set [`MdJournal::cached_stripes_max`] (at least 16).
    pub fn set_cached_stripes_max(&self, stripes: usize) {
        assert!(stripes >= 16, "a cache of {stripes} stripes");
        self.stripes_max
            .store(stripes, std::sync::atomic::Ordering::Relaxed);
    }

    /// How much of its share of the log a write cache holds now, as a
    /// pair `(held, share)` to compare: the fuller of its sectors against
    /// [`MdJournal::cache_share`] and its stripes against
    /// [`CACHED_STRIPES_MAX`] (`held / share` is the larger fraction).
    pub fn held_share(&self, array: &Array) -> (u64, u64) {
        let w = self.writer();
        let (sectors, share) = (w.held_sectors, self.cache_share(array).max(1));
        let (stripes, stripes_max) = (
            w.held_stripes.len() as u64,
            self.cached_stripes_max() as u64,
        );
        (
            (sectors * stripes_max).max(stripes * share),
            share * stripes_max,
        )
    }

    /// A write cache's pages up to group `ticket` are on the members and
    /// flushed: the tail may pass them.
    pub fn release_through(&self, ticket: u64) {
        let mut w = self.writer();
        let w = &mut *w;
        w.released = w.released.max(ticket);
        while let Some(&(_, sectors, count)) = w.held.front().filter(|g| g.0 <= ticket) {
            w.held.pop_front();
            assert!(
                w.held_sectors >= sectors && w.held_count >= count,
                "invariant: a held group's sectors and pages are counted in what is held"
            );
            w.held_sectors -= sectors;
            w.held_count -= count;
        }
        while let Some(&(_, stripe)) = w.held_order.front().filter(|p| p.0 <= ticket) {
            w.held_order.pop_front();
            if let std::collections::hash_map::Entry::Occupied(mut held) =
                w.held_stripes.entry(stripe)
            {
                *held.get_mut() -= 1;
                if *held.get() == 0 {
                    held.remove();
                }
            }
        }
        // Paired with the enqueue: every held page is counted in its stripe,
        // and every held group in the sectors and pages held.
        assert_eq!(
            w.held_order.len(),
            w.held_count,
            "invariant: held pages and their stripes"
        );
        assert!(
            !w.held.is_empty() || (w.held_sectors, w.held_count) == (0, 0),
            "invariant: no sectors or pages held without a group holding them"
        );
        // (Listed in group order: the released lead.)
        let released = w.unfiled.partition_point(|c| c.2 <= w.released);
        w.unfiled.drain(..released);
        while w.open_cached.front().is_some_and(|g| g.0 <= ticket) {
            w.open_cached.pop_front();
        }
        // Rows whose copies are all released are swept out once they are
        // a fifth of the table: one pass over the table, not a lookup per
        // page released. The table is probed at random (once per page
        // cached, once per page written back), so it is kept near the size
        // of what is held, and given back its room once it is three times
        // larger than that: the smaller it is, the fewer probes miss the
        // processor's caches.
        if w.held_rows.len() > w.held_count + w.held_count / 4 + 1024 {
            let released = w.released;
            w.held_rows.retain(|_, copies| !copies.purge(released));
            if w.held_rows.capacity() > 3 * w.held_rows.len().max(1024) {
                w.held_rows.shrink_to(2 * w.held_rows.len());
            }
        }
    }
}
