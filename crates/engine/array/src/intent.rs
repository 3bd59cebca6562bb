//! The write-intent bitmap at run time (md's internal bitmap, maintained).
//!
//! Per bitmap chunk the array keeps three things, all lock-free on the hot
//! path:
//! - `pending`: client writes in flight on the chunk;
//! - `durable`: the chunk's bit is set on every usable member (the write
//!   may go ahead without touching the bitmap);
//! - `touched`: the chunk was written since the last clearing pass.
//!
//! A write counts itself in `pending` and `touched`, then reads `durable`.
//! Only when the bit is not yet durable does it take the bitmap's lock, set
//! the bit in the in-memory image, write the image's page to every usable
//! member and flush it; writers that queued behind the lock find their bits
//! already durable (a group commit). So a chunk costs one bitmap write per
//! clearing period, and steady writes to hot chunks touch only atomics.
//!
//! Clearing is lazy, as md's daemon does it: every `daemon_sleep` seconds a
//! pass takes the chunks whose bit is set, that have no write in flight and
//! were not written since the previous pass; flushes every member (their
//! data is then durable on every copy); clears each bit in `durable` and
//! only then looks again at `pending` and `touched` — a write that started
//! meanwhile either saw the bit cleared (and sets it again itself, behind
//! the lock) or is seen here (and the bit stays). Then the image's pages go
//! to the members. Nothing is cleared while the array is degraded,
//! recovering or awaiting a resync: those bits are what a re-added member
//! and a resync need.
//!
//! Lock order: the array's events lock, then the bitmap's lock.

use crate::error::{Error, Result};
use crate::members::{Companion, Members};
use nvraid_io::AlignedBuf;
use nvraid_layout::Geometry;
use nvraid_metadata::bitmap::{self, BitmapHeader};
use nvraid_metadata::features;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The bitmap's page: md reads and writes it in 4 KiB pages.
const PAGE: usize = 4096;

/// The in-memory image of the bitmap (header and bits, as on the members)
/// and what writes it; behind the bitmap's lock.
pub(crate) struct Image {
    storage: AlignedBuf,
    header: BitmapHeader,
    last_pass: Instant,
}

impl std::fmt::Debug for WriteIntent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteIntent")
            .field("chunk_bytes", &(1u64 << self.chunk_shift))
            .field("chunks", &self.chunks())
            .field("at_bytes", &self.at_bytes)
            .finish_non_exhaustive()
    }
}

pub(crate) struct WriteIntent {
    chunk_shift: u32,
    /// The array's chunks (bits) now; the counters below have room for
    /// every bit the image holds, so a reshape of the running array that
    /// covers more bits (a RAID 10 grown) keeps them (see
    /// [`WriteIntent::adopt`]).
    chunks: AtomicU64,
    pending: Box<[AtomicU32]>,
    durable: Box<[AtomicU64]>,
    touched: Box<[AtomicU64]>,
    image: Mutex<Image>,
    /// Byte offset of the bitmap on each role's member (`super_offset +
    /// bitmap_offset`), the same on every member.
    at_bytes: u64,
    /// The array's shape: a write's array bytes are put in the bitmap's
    /// space through it (RAID 4/5/6: member rows, as md counts them).
    /// Replaced when a reshape's end is adopted ([`WriteIntent::adopt`]).
    geometry: std::sync::RwLock<Geometry>,
}

/// What the bitmap says, for `detail`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BitmapInfo {
    pub chunk_bytes: u64,
    pub chunks: u64,
    pub dirty_chunks: u64,
    pub events_cleared: u64,
}

fn word_bit(chunk: u64) -> (usize, u64) {
    ((chunk / 64) as usize, 1u64 << (chunk % 64))
}

impl WriteIntent {
    fn new(header: BitmapHeader, storage: AlignedBuf, geometry: &Geometry, at_bytes: u64) -> Self {
        let chunks = bitmap::bits_for(geometry.bitmap_space_bytes(), header.chunk_bytes);
        // Every bit the image holds (see `chunks`).
        let room = chunks.max((storage.len().saturating_sub(bitmap::HEADER_BYTES) * 8) as u64);
        let words = room.div_ceil(64) as usize;
        let mut durable: Box<[AtomicU64]> = (0..words).map(|_| AtomicU64::new(0)).collect();
        for chunk in 0..chunks {
            if bitmap::test_bit(&storage, chunk) {
                let (w, b) = word_bit(chunk);
                *durable[w].get_mut() |= b;
            }
        }
        WriteIntent {
            chunk_shift: header.chunk_bytes.trailing_zeros(),
            chunks: AtomicU64::new(chunks),
            pending: (0..room).map(|_| AtomicU32::new(0)).collect(),
            durable,
            touched: (0..words).map(|_| AtomicU64::new(0)).collect(),
            image: Mutex::new(Image {
                storage,
                header,
                last_pass: Instant::now(),
            }),
            at_bytes,
            geometry: std::sync::RwLock::new(geometry.clone()),
        }
    }

    /// The array's chunks (bits) now.
    fn chunks(&self) -> u64 {
        self.chunks.load(Ordering::Acquire)
    }

    /// A reshape of the running array ended (`Array::swap_shape`): writes
    /// from now on are put in the bitmap's space through `geometry`, and
    /// the bits cover its size (the header records it from the next
    /// superblock update on). Bits already set in the image for chunks
    /// the array gains (a RAID 10's new region, `mark_space`) count as
    /// durable. Refused when the image has no room for them. Called with
    /// no client write in flight.
    pub(crate) fn adopt(&self, geometry: &Geometry) -> Result<()> {
        let mut image = self.lock();
        let space = geometry.bitmap_space_bytes();
        let chunks = bitmap::bits_for(space, image.header.chunk_bytes);
        if chunks > self.pending.len() as u64 {
            return Err(Error::Unsupported {
                spec: "(the write-intent bitmap)".into(),
                what: format!(
                    "a reshaped array of {chunks} bitmap chunks in a bitmap with room for {}",
                    self.pending.len()
                ),
            });
        }
        for chunk in self.chunks()..chunks {
            if bitmap::test_bit(&image.storage, chunk) {
                let (w, b) = word_bit(chunk);
                self.durable[w].fetch_or(b, Ordering::SeqCst);
            }
        }
        image.header.sync_size_sectors = space / 512;
        let header = image.header.clone();
        header.encode(&mut image.storage);
        *self.geometry.write().unwrap_or_else(|p| p.into_inner()) = geometry.clone();
        self.chunks.store(chunks, Ordering::Release);
        Ok(())
    }

    /// The bits that array bytes `[offset, offset + len)` are under: for
    /// RAID 4/5/6 those of their stripes' member rows (md's bitmap counts
    /// member sectors there, the array's elsewhere).
    fn chunk_range(&self, offset: u64, len: u64) -> std::ops::Range<u64> {
        let space = self
            .geometry
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .bitmap_range(offset, len);
        let first = space.start >> self.chunk_shift;
        let end = if space.is_empty() {
            first
        } else {
            ((space.end - 1) >> self.chunk_shift) + 1
        };
        let chunks = self.chunks();
        first.min(chunks)..end.min(chunks)
    }

    fn is_durable(&self, chunk: u64) -> bool {
        let (w, b) = word_bit(chunk);
        self.durable[w].load(Ordering::SeqCst) & b != 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Image> {
        self.image.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether any chunk of array bytes `[offset, offset + len)` has its bit
    /// set (in memory: durable, or about to be).
    pub(crate) fn any_set(&self, offset: u64, len: u64) -> bool {
        let image = self.lock();
        self.chunk_range(offset, len)
            .any(|c| bitmap::test_bit(&image.storage, c))
    }

    /// The bitmap's chunk (in its space: member rows for RAID 4/5/6).
    pub(crate) fn chunk_bytes(&self) -> u64 {
        1 << self.chunk_shift
    }

    /// Array bytes a walk through the array steps by to cover whole bits.
    pub(crate) fn array_step_bytes(&self) -> u64 {
        self.geometry
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .bitmap_step_bytes(self.chunk_bytes())
    }

    pub(crate) fn info(&self) -> BitmapInfo {
        let image = self.lock();
        BitmapInfo {
            chunk_bytes: 1 << self.chunk_shift,
            chunks: self.chunks(),
            dirty_chunks: (0..self.chunks())
                .filter(|&c| bitmap::test_bit(&image.storage, c))
                .count() as u64,
            events_cleared: image.header.events_cleared,
        }
    }

    /// The chunks a clearing pass may clear: durable, with no write in
    /// flight and (unless `all`) not written since the last pass. Resets
    /// what was written since the last pass.
    fn idle_chunks(&self, image: &Image, all: bool) -> Vec<u64> {
        let mut candidates = Vec::new();
        for (w, durable) in self.durable.iter().enumerate() {
            let touched = self.touched[w].swap(0, Ordering::SeqCst);
            let mut set = durable.load(Ordering::SeqCst);
            if !all {
                set &= !touched;
            }
            while set != 0 {
                let chunk = w as u64 * 64 + u64::from(set.trailing_zeros());
                set &= set - 1;
                assert!(
                    bitmap::test_bit(&image.storage, chunk),
                    "invariant: bitmap chunk {chunk}, durable in memory, has its bit set in \
                     the image the members hold"
                );
                if self.pending[chunk as usize].load(Ordering::SeqCst) == 0 {
                    candidates.push(chunk);
                }
            }
        }
        candidates
    }

    /// Clear the bits of `candidates` in memory and in the image, except
    /// where a write started meanwhile (that bit stays durable); returns
    /// the chunks cleared.
    fn clear_unless_raced(&self, image: &mut Image, candidates: Vec<u64>) -> Vec<u64> {
        let mut cleared = Vec::new();
        for chunk in candidates {
            let (w, b) = word_bit(chunk);
            self.durable[w].fetch_and(!b, Ordering::SeqCst);
            let raced = self.pending[chunk as usize].load(Ordering::SeqCst) != 0
                || self.touched[w].load(Ordering::SeqCst) & b != 0;
            if raced {
                self.durable[w].fetch_or(b, Ordering::SeqCst);
            } else {
                bitmap::put_bit(&mut image.storage, chunk, false);
                cleared.push(chunk);
            }
        }
        cleared
    }
}

/// Where `sb`'s bitmap lives on its member, in bytes, when it has one.
pub(crate) fn bitmap_at(sb: &nvraid_metadata::Superblock) -> Option<i64> {
    (sb.feature_map & features::BITMAP_OFFSET != 0)
        .then(|| (sb.super_offset_sectors as i64 + i64::from(sb.bitmap_offset as i32)) * 512)
}

/// One member's bitmap as read: its header, its bits (all set when the
/// bitmap is not to be trusted) and its byte offset on the member.
pub(crate) struct MemberBitmap {
    pub(crate) header: BitmapHeader,
    pub(crate) storage: AlignedBuf,
    pub(crate) at: u64,
}

/// Read the bitmap at byte `at` of `member` (whose superblock is `sb`),
/// checking that it lies between the superblock and the data, clear of the
/// bad-block log. A bitmap older than `events` or marked stale is taken as
/// all set.
pub(crate) fn read_member_bitmap(
    member: &nvraid_member::Member,
    sb: &nvraid_metadata::Superblock,
    at: i64,
    geometry: &Geometry,
    events: u64,
) -> Result<MemberBitmap> {
    let bad = |what: String| Error::Unsupported {
        spec: member.spec().into(),
        what,
    };
    let data_start = sb.data_offset_sectors * 512;
    if at < (sb.super_offset_sectors * 512 + 1024) as i64 || at as u64 >= data_start {
        return Err(bad(format!(
            "an md bitmap at byte {at}, outside the space between the superblock and the data"
        )));
    }
    let at = at as u64;
    let mut page = AlignedBuf::zeroed(PAGE);
    member
        .read_at(&mut page, at)
        .map_err(|e| Error::io(member.spec(), e))?;
    let header = BitmapHeader::decode(&page, &sb.set_uuid)
        .map_err(|e| bad(format!("an array whose {e}")))?;
    let bits = bitmap::bits_for(geometry.bitmap_space_bytes(), header.chunk_bytes);
    let len = bitmap::storage_bytes(bits);
    if at + len > data_start {
        return Err(bad(format!(
            "an md bitmap of {len} bytes at byte {at}, running into the data at byte {data_start}"
        )));
    }
    if sb.bblog_size > 0 {
        let bblog = sb.super_offset_sectors as i64 * 512 + i64::from(sb.bblog_offset as i32) * 512;
        if bblog >= at as i64 && bblog < (at + len) as i64 {
            return Err(bad(format!(
                "an md bitmap of {len} bytes at byte {at}, overlapping the bad-block log at byte {bblog}"
            )));
        }
    }
    let mut storage = AlignedBuf::zeroed(len as usize);
    member
        .read_at(&mut storage, at)
        .map_err(|e| Error::io(member.spec(), e))?;
    // nvraid before 2026-11-27 counted a RAID 4/5/6 bitmap's bits in array
    // bytes (its header's size is the array's, not a member's): those bits
    // name other stripes than md's, so none of them is believed.
    let array_space = geometry.bitmap_space_bytes() != geometry.array_bytes()
        && header.sync_size_sectors * 512 == geometry.array_bytes();
    let trusted = !header.is_stale() && header.events >= events && !array_space;
    if !trusted {
        for bit in 0..bits {
            bitmap::put_bit(&mut storage, bit, true);
        }
    }
    Ok(MemberBitmap {
        header,
        storage,
        at,
    })
}

/// The union of two members' bitmaps over `space_bytes` (`spec` names the
/// member `next` was read from): every bit set on either, the newer events
/// of each kind. Bitmaps of another chunk or place are refused.
pub(crate) fn merge_bitmaps(
    mut merged: MemberBitmap,
    next: MemberBitmap,
    spec: &str,
    space_bytes: u64,
) -> Result<MemberBitmap> {
    if merged.header.chunk_bytes != next.header.chunk_bytes || merged.at != next.at {
        return Err(Error::Unsupported {
            spec: spec.into(),
            what: "an md bitmap whose chunk or place differs from the other members'".into(),
        });
    }
    assert_eq!(
        merged.storage.len(),
        next.storage.len(),
        "invariant: bitmaps of one chunk over one array hold the same bits"
    );
    let bits = bitmap::bits_for(space_bytes, next.header.chunk_bytes);
    for bit in 0..bits {
        if bitmap::test_bit(&next.storage, bit) {
            bitmap::put_bit(&mut merged.storage, bit, true);
        }
    }
    merged.header.events = merged.header.events.max(next.header.events);
    merged.header.events_cleared = merged.header.events_cleared.max(next.header.events_cleared);
    Ok(merged)
}

impl WriteIntent {
    /// Load md's internal bitmap from the present members (the union of
    /// their bits: a bit set on any copy is honoured). A bitmap older than
    /// the superblocks or marked stale is taken as all set, as md takes it.
    /// `None` when the members have none; a bitmap nvraid cannot read is
    /// refused, naming the member and the reason. A writable array then
    /// maintains it ([`WriteIntent::publish`]).
    pub(crate) fn load(members: &Members) -> Result<Option<WriteIntent>> {
        let geometry = members.geometry();
        let space_bytes = geometry.bitmap_space_bytes();
        let events = members.events();
        let mut loaded: Option<MemberBitmap> = None;
        let mut any_without = None;
        for (role, slot) in members.slots().iter().enumerate() {
            let Some(slot) = slot else { continue };
            if members.in_sync_bytes(role).is_some() {
                // A member being recovered holds no trustworthy bits.
                continue;
            }
            let Some(at) = bitmap_at(&slot.superblock) else {
                any_without = Some(slot.member.spec().to_string());
                continue;
            };
            let read = read_member_bitmap(&slot.member, &slot.superblock, at, geometry, events)?;
            loaded = Some(match loaded.take() {
                None => read,
                Some(merged) => merge_bitmaps(merged, read, slot.member.spec(), space_bytes)?,
            });
        }
        let Some(loaded) = loaded else {
            return Ok(None);
        };
        if let Some(spec) = any_without {
            return Err(Error::Unsupported {
                spec,
                what: "a member without the md bitmap its array's other members have (a change of the consistency policy cut short? `nvraid grow --consistency-policy bitmap|resync` given every member finishes it)".into(),
            });
        }
        Ok(Some(Self::install(loaded, geometry, events)))
    }

    /// Bring the merged bitmap's header up to date, as md brings it, and
    /// make it the array's write intent. Bits past the array's end (mdadm
    /// fills them with ones) stay as they are.
    fn install(loaded: MemberBitmap, geometry: &Geometry, events: u64) -> WriteIntent {
        let MemberBitmap {
            mut header,
            mut storage,
            at,
        } = loaded;
        header.state &= !bitmap::STATE_STALE;
        header.sync_size_sectors = geometry.bitmap_space_bytes() / 512;
        header.events = header.events.max(events);
        header.encode(&mut storage);
        WriteIntent::new(header, storage, geometry, at)
    }

    /// nvraid now owns the bitmap: every member gets the merged image. A
    /// member that cannot take it has failed (md's rule), as on any later
    /// bitmap update.
    pub(crate) fn publish(&self, members: &Members) -> Result<()> {
        let image = self.lock();
        let mut failed = self.write_pages_collect(members, &image, 0..image.storage.len() / PAGE);
        drop(image);
        failed.extend(flush_usable(members));
        fail_all(members, failed)
    }

    /// Write pages `pages` of the image to every usable member (not
    /// flushed). A member that fails is reported back as `(role, error)`.
    fn write_pages_collect(
        &self,
        members: &Members,
        image: &Image,
        pages: std::ops::Range<usize>,
    ) -> Vec<(usize, std::io::Error)> {
        let mut failed = Vec::new();
        for (role, slot) in members.slots().iter().enumerate() {
            let Some(slot) = slot else { continue };
            if !members.is_usable(role) {
                continue;
            }
            let bytes = &image.storage[pages.start * PAGE..pages.end * PAGE];
            if let Err(e) = slot
                .member
                .write_at(bytes, self.at_bytes + (pages.start * PAGE) as u64)
            {
                failed.push((role, e));
            }
        }
        failed
    }

    /// A client write to array bytes `[offset, offset + len)` is about to
    /// be issued: when this returns Ok, the bit of every chunk it touches
    /// is durable on every usable member. The write is counted whatever
    /// the outcome; [`WriteIntent::end`] uncounts it.
    pub(crate) fn start(&self, members: &Members, offset: u64, len: u64) -> Result<()> {
        let intent = self;
        let range = intent.chunk_range(offset, len);
        let mut missing = false;
        for chunk in range.clone() {
            intent.pending[chunk as usize].fetch_add(1, Ordering::SeqCst);
            let (w, b) = word_bit(chunk);
            if intent.touched[w].load(Ordering::Relaxed) & b == 0 {
                intent.touched[w].fetch_or(b, Ordering::SeqCst);
            }
            missing |= !intent.is_durable(chunk);
        }
        if !missing {
            return Ok(());
        }
        let mut image = intent.lock();
        let needed: Vec<u64> = range.filter(|&c| !intent.is_durable(c)).collect();
        if needed.is_empty() {
            // Another writer made them durable while this one waited.
            return Ok(());
        }
        for &chunk in &needed {
            bitmap::put_bit(&mut image.storage, chunk, true);
        }
        let page_of = |chunk: u64| (bitmap::HEADER_BYTES + (chunk / 8) as usize) / PAGE;
        let (Some(&first), Some(&last)) = (needed.first(), needed.last()) else {
            panic!("invariant: a bitmap update has chunks to make durable");
        };
        let pages = page_of(first)..page_of(last) + 1;
        assert!(
            needed.iter().all(|&c| pages.contains(&page_of(c))),
            "invariant: the bitmap pages written hold every chunk made durable"
        );
        let mut failed = self.write_pages_collect(members, &image, pages);
        for (role, e) in flush_usable(members) {
            if failed.iter().all(|(f, _)| *f != role) {
                failed.push((role, e));
            }
        }
        drop(image);
        fail_all(members, failed)?;
        // Paired with the pass: a chunk is durable only once its bit is in
        // the image and on every usable member, and this write still counts
        // itself on it (so no pass clears it before the write lands).
        for &chunk in &needed {
            assert!(
                intent.pending[chunk as usize].load(Ordering::SeqCst) > 0,
                "invariant: bitmap chunk {chunk} made durable is counted by the write in flight"
            );
            let (w, b) = word_bit(chunk);
            intent.durable[w].fetch_or(b, Ordering::SeqCst);
        }
        Ok(())
    }

    /// Set, durably on every usable member, the bits of bitmap-space
    /// bytes `[from, to)`, chunks past the array's own included as long as
    /// the image holds them (a RAID 10 growing while served: md resyncs
    /// its new region after the reshape by these bits, and nothing clears
    /// them while the reshape runs). `false`, nothing written: the image
    /// is too small for them.
    pub(crate) fn mark_space(&self, members: &Members, from: u64, to: u64) -> Result<bool> {
        if to <= from {
            return Ok(true);
        }
        let (first, end) = (from >> self.chunk_shift, ((to - 1) >> self.chunk_shift) + 1);
        let mut image = self.lock();
        if bitmap::HEADER_BYTES as u64 + end.div_ceil(8) > image.storage.len() as u64 {
            return Ok(false);
        }
        for chunk in first..end {
            bitmap::put_bit(&mut image.storage, chunk, true);
        }
        let page_of = |chunk: u64| (bitmap::HEADER_BYTES + (chunk / 8) as usize) / PAGE;
        let mut failed =
            self.write_pages_collect(members, &image, page_of(first)..page_of(end - 1) + 1);
        for (role, e) in flush_usable(members) {
            if failed.iter().all(|(f, _)| *f != role) {
                failed.push((role, e));
            }
        }
        drop(image);
        fail_all(members, failed)?;
        for chunk in first..end.min(self.chunks()) {
            let (w, b) = word_bit(chunk);
            self.durable[w].fetch_or(b, Ordering::SeqCst);
        }
        Ok(true)
    }

    /// The write counted by [`WriteIntent::start`] has completed.
    pub(crate) fn end(&self, offset: u64, len: u64) {
        for chunk in self.chunk_range(offset, len) {
            let before = self.pending[chunk as usize].fetch_sub(1, Ordering::SeqCst);
            assert!(
                before > 0,
                "invariant: bitmap chunk {chunk}'s count of writes in flight never \
                 underflows (a write ended twice)"
            );
        }
    }

    /// One clearing pass (see the module notes), when `daemon_sleep` has
    /// passed since the last one, or now with `now`. With `all`, chunks
    /// written since the last pass are cleared too (nothing is in flight:
    /// an orderly close, or a finished resync).
    pub(crate) fn pass(&self, members: &Members, now: bool, all: bool) -> Result<()> {
        let intent = self;
        if !members.is_writable() || !may_clear_bits(members) {
            return Ok(());
        }
        // Read before the bitmap's lock (lock order: events first).
        let events = members.events();
        let mut image = intent.lock();
        let period = Duration::from_secs(u64::from(image.header.daemon_sleep.max(1)));
        if !now && image.last_pass.elapsed() < period {
            return Ok(());
        }
        image.last_pass = Instant::now();
        let candidates = intent.idle_chunks(&image, all);
        if candidates.is_empty() {
            return Ok(());
        }
        // Every write that completed is made durable on every copy before
        // any bit that covers it goes.
        let failed = flush_usable(members);
        if !failed.is_empty() {
            drop(image);
            return fail_all(members, failed);
        }
        if !may_clear_bits(members) {
            // A member failed meanwhile: its bits must stay.
            return Ok(());
        }
        let cleared = intent.clear_unless_raced(&mut image, candidates);
        if cleared.is_empty() {
            return Ok(());
        }
        image.header.events_cleared = image.header.events_cleared.max(events);
        let header = image.header.clone();
        header.encode(&mut image.storage);
        let page_of = |chunk: u64| (bitmap::HEADER_BYTES + (chunk / 8) as usize) / PAGE;
        let Some(last) = cleared.iter().map(|&c| page_of(c)).max() else {
            panic!("invariant: a clearing pass writes only when it cleared a bit");
        };
        let failed = self.write_pages_collect(members, &image, 0..last + 1);
        drop(image);
        fail_all(members, failed)
    }

    /// The bitmap's size on a member (header and bits, whole pages).
    pub(crate) fn storage_bytes(&self) -> u64 {
        self.lock().storage.len() as u64
    }

    /// Write the bitmap (header and bits as they stand) to `member`, which
    /// is joining the array at byte `at` of its own (not flushed).
    pub(crate) fn copy_to(&self, member: &nvraid_member::Member) -> Result<()> {
        let image = self.lock();
        member
            .write_at(&image.storage, self.at_bytes)
            .map_err(|e| Error::io(member.spec(), e))
    }
}

impl Companion for WriteIntent {
    /// Before the superblocks record `events`: the bitmap's header records
    /// it first, durably (md refuses to trust a bitmap older than the
    /// superblock), on every usable member.
    fn before_superblocks(&self, members: &Members, events: u64) -> Vec<(usize, std::io::Error)> {
        let mut image = self.lock();
        if image.header.events >= events {
            return Vec::new();
        }
        image.header.events = events;
        let header = image.header.clone();
        header.encode(&mut image.storage);
        let mut failed = self.write_pages_collect(members, &image, 0..1);
        failed.extend(flush_usable(members));
        failed
    }
}

fn flush_usable(members: &Members) -> Vec<(usize, std::io::Error)> {
    let mut failed = Vec::new();
    for (role, slot) in members.slots().iter().enumerate() {
        let Some(slot) = slot else { continue };
        if members.is_usable(role) {
            if let Err(e) = slot.member.flush() {
                failed.push((role, e));
            }
        }
    }
    failed
}

/// Fail the members that failed a bitmap update (md's rule for any member
/// I/O error); an error when one of them holds the last copy.
fn fail_all(members: &Members, failed: Vec<(usize, std::io::Error)>) -> Result<()> {
    for (role, e) in failed {
        members.fail_member(role, &e)?;
    }
    Ok(())
}

/// Whether bits may be cleared now: every role present, usable and in
/// sync, and no resync awaited.
fn may_clear_bits(members: &Members) -> bool {
    // A grow running on the array writes members this floor does not
    // flush (the added ones): their bits stay until it is assembled again.
    !members.is_degraded()
        && !members.is_reshaping()
        && (0..members.roles()).all(|r| members.in_sync_bytes(r).is_none())
        && members.resync_from().is_none()
}
