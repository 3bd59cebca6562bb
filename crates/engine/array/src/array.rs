//! An assembled array and its synchronous data path.
//!
//! The path of a write: [`Array::write_at`] checks range and alignment, marks
//! a redundant array dirty before its first write ([`Array::mark_dirty`]),
//! splits the request into pieces at chunk boundaries (nvraid-layout), and
//! writes every copy of every piece to its member at
//! `data_offset + member_offset`. With FUA, every member written is flushed
//! before the call returns.

use crate::error::{Error, Result};
use nvraid_layout::{Geometry, Level, Piece};
use nvraid_member::Member;
use nvraid_metadata::{Superblock, Timestamp, RESYNC_CLEAN, SUPER_OFFSET_BYTES};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

/// One role of the array: a member and its own superblock.
#[derive(Debug)]
pub struct Slot {
    pub member: Member,
    pub superblock: Superblock,
}

impl Slot {
    pub fn data_offset_bytes(&self) -> u64 {
        self.superblock.data_offset_sectors * 512
    }
}

/// Operations, bytes and errors of one member, counted by the fast path's
/// queues (each queue counts privately and adds its counts here in batches,
/// so workers do not share a cache line per I/O).
#[derive(Debug, Default)]
pub struct MemberCounters {
    pub ops: AtomicU64,
    pub bytes: AtomicU64,
    pub errors: AtomicU64,
}

impl MemberCounters {
    /// Add a batch of counts.
    pub fn add(&self, ops: u64, bytes: u64, errors: u64) {
        self.ops.fetch_add(ops, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.errors.fetch_add(errors, Ordering::Relaxed);
    }
}

/// An assembled array. All methods take `&self`; the array is `Sync`.
#[derive(Debug)]
pub struct Array {
    geometry: Geometry,
    /// Indexed by role; `None` is a missing (or stale) member.
    slots: Vec<Option<Slot>>,
    sector_bytes: u32,
    writable: bool,
    /// The array was dirty when assembled (unclean shutdown): it stays dirty
    /// on close, since nvraid has not resynced it.
    assembled_dirty: bool,
    dirty: AtomicBool,
    /// The events counter on the members; its lock serialises superblock
    /// updates.
    events: Mutex<u64>,
    read_rotor: AtomicU32,
    /// Members given at assembly but left out because their events counter
    /// is behind the others' (spec and superblock).
    stale: Vec<(String, Superblock)>,
    /// Per-role I/O counts of the fast path.
    counters: Vec<MemberCounters>,
}

impl Array {
    pub(crate) fn new(geometry: Geometry, slots: Vec<Option<Slot>>, writable: bool) -> Array {
        debug_assert_eq!(slots.len(), geometry.members() as usize);
        let present = slots.iter().flatten();
        let sector_bytes = present
            .clone()
            .map(|s| s.member.logical_block_bytes())
            .max()
            .unwrap_or(512)
            .max(512);
        let assembled_dirty = slots.iter().flatten().any(|s| !s.superblock.is_clean());
        let events = slots
            .iter()
            .flatten()
            .map(|s| s.superblock.events)
            .max()
            .unwrap_or(0);
        Array {
            geometry,
            slots,
            sector_bytes,
            writable,
            assembled_dirty,
            dirty: AtomicBool::new(assembled_dirty),
            events: Mutex::new(events),
            read_rotor: AtomicU32::new(0),
            stale: Vec::new(),
            counters: (0..geometry.members())
                .map(|_| MemberCounters::default())
                .collect(),
        }
    }

    /// Per-role I/O counts of the fast path (index = role).
    pub fn member_counters(&self) -> &[MemberCounters] {
        &self.counters
    }

    pub(crate) fn set_stale(&mut self, stale: Vec<(String, Superblock)>) {
        self.stale = stale;
    }

    /// Members left out at assembly because they are stale.
    pub fn stale(&self) -> &[(String, Superblock)] {
        &self.stale
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    pub fn size_bytes(&self) -> u64 {
        self.geometry.array_bytes()
    }

    /// Offsets and lengths must be multiples of this (512, or 4096 when a
    /// member has 4 KiB logical blocks).
    pub fn sector_bytes(&self) -> u32 {
        self.sector_bytes
    }

    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// Roles in order; `None` for a missing member.
    pub fn slots(&self) -> &[Option<Slot>] {
        &self.slots
    }

    /// The superblock of the first present member (array-wide fields).
    pub fn superblock(&self) -> &Superblock {
        &self
            .slots
            .iter()
            .flatten()
            .next()
            .expect("an array has a present member")
            .superblock
    }

    /// The events counter recorded on the members now.
    pub fn events(&self) -> u64 {
        *self.events.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a member is missing.
    pub fn is_degraded(&self) -> bool {
        self.slots.iter().any(Option::is_none)
    }

    /// Whether the array is marked dirty on its members right now.
    pub fn is_dirty(&self) -> bool {
        self.dirty.load(Ordering::Acquire)
    }

    fn has_redundancy(&self) -> bool {
        !matches!(self.geometry.level(), Level::Raid0)
    }

    fn check(&self, offset: u64, len: u64) -> Result<()> {
        let sector = u64::from(self.sector_bytes);
        if !offset.is_multiple_of(sector) || !len.is_multiple_of(sector) {
            return Err(Error::Unaligned {
                offset,
                len,
                sector_bytes: self.sector_bytes,
            });
        }
        if offset
            .checked_add(len)
            .is_none_or(|end| end > self.size_bytes())
        {
            return Err(Error::OutOfRange {
                offset,
                len,
                size_bytes: self.size_bytes(),
            });
        }
        Ok(())
    }

    /// Read `buf.len()` bytes at `offset`.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.check(offset, buf.len() as u64)?;
        let mut at = 0usize;
        for piece in self.geometry.pieces(offset, buf.len() as u64) {
            let len = piece.len as usize;
            self.read_piece(piece, &mut buf[at..at + len])?;
            at += len;
        }
        Ok(())
    }

    fn read_piece(&self, piece: Piece, buf: &mut [u8]) -> Result<()> {
        let copy = self.choose_copy(piece.logical_offset)?;
        let location = self.geometry.locate(piece.logical_offset, copy);
        let slot = self.slots[location.member as usize]
            .as_ref()
            .expect("chosen copy is present");
        let member_offset = slot.data_offset_bytes() + location.member_offset;
        slot.member
            .read_at(buf, member_offset)
            .map_err(|e| Error::io(slot.member.spec(), e))
    }

    /// The read policy: among present copies, the member with the fewest
    /// requests in flight; ties broken by a rotating start so that equal
    /// mirrors share the load.
    pub fn choose_copy(&self, logical_offset: u64) -> Result<u32> {
        // RAID 0 has one copy: no shared rotor to bump.
        let start = if self.geometry.copies() > 1 {
            self.read_rotor.fetch_add(1, Ordering::Relaxed)
        } else {
            0
        };
        let load = |member: usize| self.slots[member].as_ref().map(|s| s.member.inflight());
        least_loaded_copy(&self.geometry, logical_offset, start, load).ok_or_else(|| {
            Error::NotStartable(format!("no copy of offset {logical_offset} is present"))
        })
    }

    /// Write `buf` at `offset` to every copy; with `fua`, the data is durable
    /// when this returns.
    pub fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        self.check(offset, buf.len() as u64)?;
        if !self.writable {
            return Err(Error::ReadOnly);
        }
        self.mark_dirty()?;
        let mut touched = vec![false; self.slots.len()];
        let mut at = 0usize;
        for piece in self.geometry.pieces(offset, buf.len() as u64) {
            let len = piece.len as usize;
            self.write_piece(piece, &buf[at..at + len], &mut touched)?;
            at += len;
        }
        if fua {
            self.flush_slots(|role| touched[role])?;
        }
        Ok(())
    }

    fn write_piece(&self, piece: Piece, buf: &[u8], touched: &mut [bool]) -> Result<()> {
        for (role, slot, member_offset) in self.present_copies(piece.logical_offset) {
            slot.member
                .write_at(buf, member_offset)
                .map_err(|e| Error::io(slot.member.spec(), e))?;
            touched[role] = true;
        }
        Ok(())
    }

    /// Every present copy of the piece starting at `logical_offset`: its
    /// role, its slot and its byte offset on the member.
    fn present_copies(
        &self,
        logical_offset: u64,
    ) -> impl Iterator<Item = (usize, &Slot, u64)> + '_ {
        (0..self.geometry.copies()).filter_map(move |copy| {
            let location = self.geometry.locate(logical_offset, copy);
            let slot = self.slots[location.member as usize].as_ref()?;
            Some((
                location.member as usize,
                slot,
                slot.data_offset_bytes() + location.member_offset,
            ))
        })
    }

    /// Discard `[offset, offset + len)` on every copy.
    pub fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.check(offset, len)?;
        if !self.writable {
            return Err(Error::ReadOnly);
        }
        self.mark_dirty()?;
        for piece in self.geometry.pieces(offset, len) {
            for (_, slot, member_offset) in self.present_copies(piece.logical_offset) {
                slot.member
                    .discard(member_offset, piece.len)
                    .map_err(|e| Error::io(slot.member.spec(), e))?;
            }
        }
        Ok(())
    }

    /// Make every completed write durable on every member.
    pub fn flush(&self) -> Result<()> {
        self.flush_slots(|_| true)
    }

    fn flush_slots(&self, wanted: impl Fn(usize) -> bool) -> Result<()> {
        for (role, slot) in self.slots.iter().enumerate() {
            if let (Some(slot), true) = (slot, wanted(role)) {
                slot.member
                    .flush()
                    .map_err(|e| Error::io(slot.member.spec(), e))?;
            }
        }
        Ok(())
    }

    /// md's rule: before the first write to a redundant array, record on
    /// every member that it is dirty (resync_offset 0, events + 1), so that
    /// a crash before the next clean close is detected. RAID 0 has no copies
    /// to get out of step and, as in md, is never marked dirty.
    pub fn mark_dirty(&self) -> Result<()> {
        if !self.has_redundancy() || self.dirty.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if self.dirty.load(Ordering::Acquire) {
            return Ok(());
        }
        self.update_superblocks(&mut events, 0)?;
        self.dirty.store(true, Ordering::Release);
        Ok(())
    }

    /// Orderly close: flush, then mark a dirty array clean (unless it was
    /// already dirty when assembled: nvraid has not resynced it).
    pub fn close(self) -> Result<()> {
        if self.writable {
            self.flush()?;
        }
        if self.writable && self.dirty.load(Ordering::Acquire) && !self.assembled_dirty {
            let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
            self.update_superblocks(&mut events, RESYNC_CLEAN)?;
        }
        Ok(())
    }

    /// Write every present member's superblock with `resync_offset`, one more
    /// event and the current time, then flush them. `events` is the locked
    /// counter; it advances once the superblocks are written.
    fn update_superblocks(&self, events: &mut u64, resync_offset: u64) -> Result<()> {
        let next = *events + 1;
        let now = Timestamp::now();
        for slot in self.slots.iter().flatten() {
            let mut sb = slot.superblock.clone();
            sb.events = next;
            sb.resync_offset = resync_offset;
            sb.utime = now;
            write_superblock(&slot.member, &sb)?;
        }
        for slot in self.slots.iter().flatten() {
            slot.member
                .flush()
                .map_err(|e| Error::io(slot.member.spec(), e))?;
        }
        *events = next;
        Ok(())
    }
}

/// The read policy of both data paths: among the copies of the byte at
/// `logical_offset` whose member is present (`load` gives its requests in
/// flight, `None` for a missing member), the least loaded one; the scan
/// starts at copy `start % copies`, so ties rotate as `start` advances.
pub(crate) fn least_loaded_copy(
    geometry: &Geometry,
    logical_offset: u64,
    start: u32,
    load: impl Fn(usize) -> Option<u32>,
) -> Option<u32> {
    let copies = geometry.copies();
    let mut best: Option<(u32, u32)> = None;
    for step in 0..copies {
        let copy = (start % copies + step) % copies;
        let member = geometry.locate(logical_offset, copy).member as usize;
        let Some(member_load) = load(member) else {
            continue;
        };
        if best.is_none_or(|(_, best_load)| member_load < best_load) {
            best = Some((copy, member_load));
        }
    }
    best.map(|(copy, _)| copy)
}

/// Encode `sb` and write it at 4 KiB on `member` (not flushed).
pub(crate) fn write_superblock(member: &Member, sb: &Superblock) -> Result<()> {
    let mut block = nvraid_io::AlignedBuf::zeroed(4096);
    sb.encode(&mut block).map_err(|source| Error::Superblock {
        spec: member.spec().into(),
        source,
    })?;
    member
        .write_at(&block, SUPER_OFFSET_BYTES)
        .map_err(|e| Error::io(member.spec(), e))
}

/// Read and decode the superblock at 4 KiB on `member`.
pub fn read_superblock(member: &Member) -> Result<Superblock> {
    let needed_bytes = SUPER_OFFSET_BYTES + 4096;
    if member.size_bytes() < needed_bytes {
        return Err(Error::Truncated {
            spec: member.spec().into(),
            needed_bytes,
            size_bytes: member.size_bytes(),
        });
    }
    let mut block = nvraid_io::AlignedBuf::zeroed(4096);
    member
        .read_at(&mut block, SUPER_OFFSET_BYTES)
        .map_err(|e| Error::io(member.spec(), e))?;
    Superblock::decode(&block).map_err(|source| Error::Superblock {
        spec: member.spec().into(),
        source,
    })
}
