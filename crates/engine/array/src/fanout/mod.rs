//! The fast data path: an [`Array`] (or one raw member) as an
//! `nvraid_io::queue::Target`, with a per-worker [`FanoutQueue`] that splits
//! each request at chunk boundaries into member operations, runs them on the
//! worker's own engine (io_uring or psync), and joins them on completion.
//!
//! Per worker and fixed at open: the engine with its file table and
//! registered slot buffers, a pool of member-operation records sized for the
//! worst request, and per-member in-flight counts for the read policy. The
//! hot path takes no lock, makes no allocation and copies no data; workers
//! share nothing but the array's read-only geometry.

use crate::array::{Admission, Array};
use crate::copies::simple::least_loaded_copy;
use nvraid_io::engine::{open_engine, Engine, EngineKind, MemberOp, MemberOpKind};
use nvraid_io::queue::{Completion, OpKind, Queue, Target};
use nvraid_io::remote::{MixedEngine, RemoteFile};
use nvraid_io::AlignedBuf;
use nvraid_member::{Backend, Member};
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What the queue maps requests onto.
#[derive(Clone, Debug)]
pub(crate) enum Shape {
    /// An assembled array.
    Array(Arc<Array>),
    /// One member used whole, at offset 0, no metadata (the JBOD baseline).
    Raw(Arc<Member>),
}

/// A target that opens [`FanoutQueue`]s.
#[derive(Clone, Debug)]
pub struct FanoutTarget {
    shape: Shape,
    engine: EngineKind,
}

impl FanoutTarget {
    /// The array as a target, driven by `engine`.
    pub fn array(array: Arc<Array>, engine: EngineKind) -> FanoutTarget {
        FanoutTarget {
            shape: Shape::Array(array),
            engine,
        }
    }

    /// One member used whole as a plain target (no RAID, no metadata).
    pub fn raw(member: Arc<Member>, engine: EngineKind) -> FanoutTarget {
        FanoutTarget {
            shape: Shape::Raw(member),
            engine,
        }
    }

    pub fn engine(&self) -> EngineKind {
        self.engine
    }

    pub(crate) fn members(&self) -> Vec<Option<&Member>> {
        match &self.shape {
            Shape::Array(a) => a
                .slots()
                .iter()
                .map(|s| s.as_ref().map(|s| &s.member))
                .collect(),
            Shape::Raw(m) => vec![Some(m)],
        }
    }
}

impl Target for FanoutTarget {
    fn size_bytes(&self) -> u64 {
        match &self.shape {
            Shape::Array(a) => a.size_bytes(),
            Shape::Raw(m) => m.size_bytes(),
        }
    }

    fn sector_bytes(&self) -> u32 {
        match &self.shape {
            Shape::Array(a) => a.sector_bytes(),
            Shape::Raw(m) => m.logical_block_bytes().max(512),
        }
    }

    fn writable(&self) -> bool {
        match &self.shape {
            Shape::Array(a) => a.is_writable(),
            Shape::Raw(m) => m.is_writable(),
        }
    }

    fn describe(&self) -> String {
        match &self.shape {
            Shape::Array(a) => format!(
                "{} array of {} members ({})",
                a.geometry().level(),
                a.geometry().members(),
                self.engine.name()
            ),
            Shape::Raw(m) => format!("{} ({})", m.spec(), self.engine.name()),
        }
    }

    fn open_queue(&self, depth: u32, max_io_bytes: u32) -> io::Result<Box<dyn Queue>> {
        Ok(Box::new(FanoutQueue::open(self, depth, max_io_bytes)?))
    }
}

/// The engine's file table for `members` (-1 where none, or a null member).
fn file_table(members: &[Option<&Member>]) -> Vec<i32> {
    members
        .iter()
        .map(|m| match m.map(|m| m.backend()) {
            Some(Backend::Fd(fd)) => fd,
            _ => -1,
        })
        .collect()
}

/// The remote members' exports, by file-table index.
fn remote_table(members: &[Option<&Member>]) -> Vec<Option<Arc<dyn RemoteFile>>> {
    members.iter().map(|m| m.and_then(|m| m.remote())).collect()
}

/// A queue's engine over `files`, with its slot `buffers` registered, room
/// for `subs_max` operations. Remote members get a channel of this
/// worker's own under a mixed engine; without any, the queue drives its
/// plain engine, with no dispatch per operation (a remote member joining
/// later puts the engine under a mixed one then, see `refresh`). Whether
/// the engine is mixed.
fn queue_engine(
    target: &FanoutTarget,
    files: &[i32],
    remotes: &[Option<Arc<dyn RemoteFile>>],
    buffers: &mut [AlignedBuf],
    subs_max: usize,
) -> io::Result<(Box<dyn Engine>, bool)> {
    let regions: Vec<(*mut u8, usize)> = buffers
        .iter_mut()
        .map(|b| (b.as_mut_ptr(), b.len()))
        .collect();
    let engine = open_engine(target.engine, files, &regions, (subs_max as u32).min(4096))?;
    let mixed = remotes.iter().any(Option::is_some);
    let engine: Box<dyn Engine> = if mixed {
        Box::new(MixedEngine::new(engine, remotes)?)
    } else {
        engine
    };
    Ok((engine, mixed))
}

fn remote_id(remote: &Option<Arc<dyn RemoteFile>>) -> Option<usize> {
    remote
        .as_ref()
        .map(|r| Arc::as_ptr(r).cast::<()>() as usize)
}

/// The read policy's measure for one copy: this queue's operations in flight
/// on `member`, or `None` when the member is missing from the queue or may not
/// be read at `[at, at + len)` of its data area (failed, recovering there,
/// bad blocks).
fn read_load(
    array: &Array,
    data_offsets: &[Option<u64>],
    inflight: &[u32],
    member: usize,
    at: u64,
    len: u64,
) -> Option<u32> {
    data_offsets[member]?;
    array.readable(member, at, len).then(|| inflight[member])
}

/// One member operation in flight (or waiting to be resubmitted).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SubOp {
    pub(crate) slot: u32,
    pub(crate) member: u32,
    pub(crate) kind: u8,
    pub(crate) dsync: bool,
    /// Member byte offset where this operation starts.
    pub(crate) member_offset: u64,
    /// The buffer pieces, in member order: `segs[seg_first..][..seg_count]`
    /// (0 for a flush).
    pub(crate) seg_first: u32,
    pub(crate) seg_count: u32,
    /// Total bytes.
    pub(crate) len: u32,
    /// Bytes already moved (short transfers are continued).
    pub(crate) done: u32,
    /// Part of a RAID 4/5/6 request's stripe work (its completion goes
    /// there).
    pub(crate) stripe: bool,
    /// Some segment is in the slot's stripe scratch (marked `SCRATCH_SEG`),
    /// not its buffer.
    pub(crate) scratch: bool,
}

/// A piece of a request bound for one member, before merging.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Part {
    pub(crate) member: u32,
    pub(crate) member_offset: u64,
    pub(crate) buf_offset: u32,
    pub(crate) len: u32,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct SlotState {
    pub(crate) pending: u32,
    /// First error seen (positive errno), 0 if none.
    pub(crate) errno: i32,
    pub(crate) len: u32,
    /// The request holds the array's barrier (its span is in `spans`): a
    /// completion looks there only then.
    pub(crate) span: bool,
}

impl SlotState {
    /// A slot with no request.
    const IDLE: SlotState = SlotState {
        pending: 0,
        errno: 0,
        len: 0,
        span: false,
    };
}

/// An iovec pointing nowhere (filled in when a vectored operation is built).
const EMPTY_IOV: libc::iovec = libc::iovec {
    iov_base: std::ptr::null_mut(),
    iov_len: 0,
};

/// Per-worker queue over a [`FanoutTarget`].
pub struct FanoutQueue {
    pub(crate) shape: Shape,
    /// The array's geometry (a copy: the hot path reads it without touching
    /// the shared `Arc`). Boxed: a request moves it out while it is split
    /// (see `submit_rw`), and a pointer moves in one store where the
    /// geometry's several words stalled the load that followed.
    pub(crate) geometry: Option<Box<nvraid_layout::Geometry>>,
    /// Byte offset of each member's data area; `None` for missing members.
    pub(crate) data_offsets: Vec<Option<u64>>,
    pub(crate) null: Vec<bool>,
    pub(crate) engine: Box<dyn Engine>,
    pub(crate) buffers: Vec<AlignedBuf>,
    pub(crate) slots: Vec<SlotState>,
    /// Per slot, a write holding the array's barrier: `(offset, len)`,
    /// released when the slot completes.
    pub(crate) spans: Vec<Option<(u64, u32)>>,
    pub(crate) subs: Vec<SubOp>,
    pub(crate) free_subs: Vec<u32>,
    /// Buffer segments `(offset in the slot buffer, length)`; slot `s` owns
    /// `segs[s * segs_per_slot..][..segs_per_slot]`.
    pub(crate) segs: Vec<(u32, u32)>,
    /// iovecs built from `segs` for vectored operations (same indexing).
    pub(crate) iovs: Vec<libc::iovec>,
    pub(crate) segs_per_slot: u32,
    /// Scratch list of one request's parts (capacity fixed at open).
    pub(crate) parts: Vec<Part>,
    /// Completions that need no engine (null members, discards, errors).
    pub(crate) ready: Vec<Completion>,
    /// This queue's per-member counts (ops, bytes, errors) not yet added to
    /// the array's counters.
    pub(crate) counts: Vec<(u64, u64, u64)>,
    pub(crate) counted_since_publish: u32,
    /// Slot buffers known to hold only zeros (a null member's read then
    /// needs no fill). Cleared when the caller may have written the buffer
    /// or a real member read into it.
    pub(crate) zeroed: Vec<bool>,
    /// Slots submitted and not yet completed.
    pub(crate) busy_slots: u32,
    /// Engine completions being handled (capacity fixed at open).
    pub(crate) engine_done: Vec<(u64, i32)>,
    pub(crate) inflight: Vec<u32>,
    pub(crate) rotor: u32,
    pub(crate) max_io_bytes: u32,
    pub(crate) size_bytes: u64,
    /// The array's member generation this queue's file table and data
    /// offsets reflect (see [`Array::generation`]).
    pub(crate) generation: u64,
    /// The file table as registered with the engine.
    pub(crate) files: Vec<i32>,
    /// Which remote member each entry's channel reaches (by address).
    pub(crate) remotes: Vec<Option<usize>>,
    /// The engine is a `MixedEngine` (some member is, or was, remote).
    pub(crate) mixed: bool,
    /// Writes take the array's dirty mark, resync barrier and write-intent
    /// bits: a redundant level, or any with a bitmap. A RAID 0 has no
    /// resync, rebuild or scrub to hold a region against it, and no
    /// copies to mark dirty, so its writes skip all three.
    pub(crate) guarded_writes: bool,
    /// The engine completes operations inside `push` (asked of it at open
    /// and after each refresh, not per request: the runner asks per I/O).
    pub(crate) inline: bool,
    /// RAID 4/5/6: the stripe geometry, each slot's stripe work, the slots
    /// waiting for stripes another request holds, and the most scratch a
    /// slot may use.
    pub(crate) parity: Option<crate::parity::ParityShape>,
    pub(crate) work: Vec<crate::parity::fast::StripeWork>,
    pub(crate) parked: Vec<u32>,
    /// Looks in a row that found only requests waiting on other queues.
    pub(crate) idle_looks: u32,
    /// Slots whose round waits for its partial parity log to be durable.
    pub(crate) logging: Vec<u32>,
    /// Completions are being handled: a round that reaches its log waits
    /// in `logging` until all of them are, so that the rounds finishing
    /// together go to the log in one write and one flush.
    pub(crate) harvesting: bool,
    pub(crate) scratch_cap: usize,
}

/// Looks that yield before a waiting queue starts to sleep between them.
const IDLE_LOOKS_BEFORE_SLEEP: u32 = 4096;

/// A segment start with this bit set is an offset in the slot's stripe
/// scratch rather than in its buffer.
pub(crate) const SCRATCH_SEG: u32 = 1 << 31;

pub(crate) const KIND_READ: u8 = 0;
pub(crate) const KIND_WRITE: u8 = 1;
const KIND_FLUSH: u8 = 2;

impl FanoutQueue {
    pub(crate) fn open(
        target: &FanoutTarget,
        depth: u32,
        max_io_bytes: u32,
    ) -> io::Result<FanoutQueue> {
        if depth == 0 || max_io_bytes == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "queue depth and I/O size must be positive",
            ));
        }
        // Read before the members: a member joining meanwhile moves the
        // generation past this value, and the first submit refreshes.
        let generation = match &target.shape {
            Shape::Array(a) => a.generation(),
            Shape::Raw(_) => 0,
        };
        let members = target.members();
        let files = file_table(&members);
        let null = members
            .iter()
            .map(|m| m.is_some_and(|m| m.backend() == Backend::Null))
            .collect();
        let data_offsets = match &target.shape {
            Shape::Array(a) => a
                .slots()
                .iter()
                .map(|s| s.as_ref().map(|s| s.data_offset_bytes()))
                .collect(),
            Shape::Raw(_) => vec![Some(0)],
        };
        let mut buffers: Vec<AlignedBuf> = (0..depth)
            .map(|_| AlignedBuf::zeroed(max_io_bytes as usize))
            .collect();
        let per_request = Self::subs_per_request(&target.shape, max_io_bytes, members.len());
        let subs_max = depth as usize * per_request;
        let remotes = remote_table(&members);
        let (engine, mixed) = queue_engine(target, &files, &remotes, &mut buffers, subs_max)?;
        let inline = engine.completes_inline();
        let (geometry, parity) = match &target.shape {
            Shape::Array(a) => (Some(Box::new(a.geometry().clone())), a.parity_shape()),
            Shape::Raw(_) => (None, None),
        };
        Ok(FanoutQueue {
            shape: target.shape.clone(),
            geometry,
            data_offsets,
            null,
            engine,
            buffers,
            slots: vec![SlotState::IDLE; depth as usize],
            spans: vec![None; depth as usize],
            subs: vec![SubOp::default(); subs_max],
            free_subs: (0..subs_max as u32).rev().collect(),
            segs: vec![(0, 0); subs_max],
            iovs: vec![EMPTY_IOV; subs_max],
            segs_per_slot: per_request as u32,
            parts: Vec::with_capacity(per_request),
            ready: Vec::with_capacity(depth as usize),
            busy_slots: 0,
            zeroed: vec![true; depth as usize],
            counts: vec![(0, 0, 0); members.len()],
            counted_since_publish: 0,
            engine_done: Vec::with_capacity(subs_max),
            inflight: vec![0; members.len()],
            rotor: 0,
            max_io_bytes,
            size_bytes: target.size_bytes(),
            generation,
            files,
            remotes: remotes.iter().map(remote_id).collect(),
            mixed,
            inline,
            guarded_writes: match &target.shape {
                Shape::Array(a) => a.guards_writes(),
                Shape::Raw(_) => false,
            },
            parity,
            work: match parity {
                Some(_) => (0..depth)
                    .map(|_| crate::parity::fast::StripeWork::new())
                    .collect(),
                None => Vec::new(),
            },
            parked: Vec::with_capacity(depth as usize),
            idle_looks: 0,
            logging: Vec::with_capacity(depth as usize),
            harvesting: false,
            scratch_cap: parity.map_or(0, |p| Self::scratch_cap(&p, max_io_bytes)),
        })
    }

    /// A member joined the array since this queue last looked: take the
    /// new members' files and data offsets. Operations in flight on a
    /// member that left finish on its file (the array keeps it open).
    pub(crate) fn refresh(&mut self) -> io::Result<()> {
        let Shape::Array(array) = &self.shape else {
            return Ok(());
        };
        let array = Arc::clone(array);
        let generation = array.generation();
        let slots = array.slots();
        let members: Vec<Option<&Member>> = slots.iter().map(|s| s.map(|s| &s.member)).collect();
        let files = file_table(&members);
        for (index, (&new, old)) in files.iter().zip(self.files.iter_mut()).enumerate() {
            if new != *old {
                self.engine.update_file(index as u32, new)?;
                *old = new;
            }
        }
        let remotes = remote_table(&members);
        if !self.mixed && remotes.iter().any(Option::is_some) {
            // The first remote member: from now on the engine dispatches.
            // What is in flight on the plain engine completes through it.
            let outstanding = self.inflight.iter().sum();
            MixedEngine::wrap_in_place(&mut self.engine, outstanding);
            self.mixed = true;
        }
        for (index, remote) in remotes.iter().enumerate() {
            if remote_id(remote) != self.remotes[index] {
                self.engine.update_remote(index as u32, remote.as_ref())?;
                self.remotes[index] = remote_id(remote);
            }
        }
        for (role, slot) in slots.iter().enumerate() {
            self.data_offsets[role] = slot.map(|s| s.data_offset_bytes());
            self.null[role] = slot.is_some_and(|s| s.member.backend() == Backend::Null);
        }
        self.generation = generation;
        self.inline = self.engine.completes_inline();
        Ok(())
    }

    /// The most member operations one request can need.
    pub(crate) fn subs_per_request(shape: &Shape, max_io_bytes: u32, members: usize) -> usize {
        let pieces_copies = match shape {
            Shape::Raw(_) => 1,
            Shape::Array(a) => {
                let g = a.geometry();
                let pieces = g
                    .chunk_bytes()
                    .map_or(1, |c| u64::from(max_io_bytes) / c + 2)
                    as usize;
                // Reads around bad blocks or a recovery point take a few
                // more operations per request.
                let around_limits = if a.read_limited() { 64 } else { 0 };
                // RAID 4/5/6: a round of stripe work reads and writes up to
                // every member per column.
                let stripe_work = if a.parity_shape().is_some() {
                    4 * members
                } else {
                    0
                };
                (pieces * g.copies() as usize + around_limits).max(stripe_work)
            }
        };
        pieces_copies.max(members)
    }

    /// Choose the copy to read: among readable copies, fewest of this
    /// worker's operations in flight on its member, ties broken by rotation
    /// (or the first readable copy while the array reads first copies).
    pub(crate) fn choose_copy(
        &mut self,
        geometry: &nvraid_layout::Geometry,
        logical_offset: u64,
        len: u64,
    ) -> Option<u32> {
        let Shape::Array(array) = &self.shape else {
            return Some(0);
        };
        if geometry.copies() == 1 && !array.read_limited() {
            return Some(0);
        }
        let first = array.first_copy_reads();
        if !first {
            self.rotor = self.rotor.wrapping_add(1);
        }
        let (data_offsets, inflight) = (&self.data_offsets, &self.inflight);
        let load = |member, at| read_load(array, data_offsets, inflight, member, at, len);
        least_loaded_copy(geometry, logical_offset, self.rotor, first, load)
    }

    pub(crate) fn push_sub(&mut self, sub: SubOp) -> io::Result<()> {
        let slot = sub.slot as usize;
        self.slots[slot].pending += 1;
        if self.null[sub.member as usize] {
            if sub.kind == KIND_READ && !self.zeroed[slot] {
                // Zero the whole buffer once; it stays zero until written.
                self.buffers[slot].fill(0);
                self.zeroed[slot] = true;
            }
            self.count(sub.member, u64::from(sub.len), false);
            self.finish_sub(sub.slot, 0);
            return Ok(());
        }
        self.engine_sub(sub)
    }

    /// Take a record for `sub` and hand it to the engine.
    pub(crate) fn engine_sub(&mut self, sub: SubOp) -> io::Result<()> {
        if sub.kind == KIND_READ {
            // A member read may land in the slot buffer: no longer known
            // to be all zeros.
            self.zeroed[sub.slot as usize] = false;
        }
        let index = self
            .free_subs
            .pop()
            .ok_or_else(|| io::Error::other("member operation pool exhausted"))?;
        self.subs[index as usize] = sub;
        self.inflight[sub.member as usize] += 1;
        self.issue(index)
    }

    /// Hand sub-operation `index` (its remaining part) to the engine.
    pub(crate) fn issue(&mut self, index: u32) -> io::Result<()> {
        let sub = self.subs[index as usize];
        let data_offset = self.data_offsets[sub.member as usize].unwrap_or(0);
        let kind = match sub.kind {
            KIND_READ => MemberOpKind::Read,
            KIND_WRITE => MemberOpKind::Write,
            _ => MemberOpKind::Flush,
        };
        let base = self.buffers[sub.slot as usize].as_mut_ptr();
        let mut op = MemberOp {
            kind,
            file: sub.member,
            offset: data_offset + sub.member_offset + u64::from(sub.done),
            buf: base,
            len: sub.len - sub.done,
            iov: std::ptr::null(),
            iov_count: 0,
            buf_index: sub.slot as u16,
            dsync: sub.dsync,
            user_data: u64::from(index),
        };
        if sub.scratch {
            // Not (only) the registered buffer: iovecs, not a fixed
            // operation.
            op.iov_count = self.build_iovecs(&sub);
            op.iov = &self.iovs[sub.seg_first as usize];
        } else if sub.seg_count == 1 {
            let (start, _) = self.segs[sub.seg_first as usize];
            // SAFETY (pointer arithmetic): every segment lies inside the slot
            // buffer (submit checks len <= max_io_bytes, its length).
            op.buf = unsafe { base.add((start + sub.done) as usize) };
        } else if sub.seg_count > 1 {
            op.iov_count = self.build_iovecs(&sub);
            op.iov = &self.iovs[sub.seg_first as usize];
        }
        // SAFETY: the slot buffer and the iovecs live in self, which outlives
        // the engine's use of them (Drop drains in-flight operations first),
        // and neither is reused before this operation's completion is reaped.
        unsafe { self.engine.push(&op) }
    }

    /// Fill `iovs[seg_first..]` with the part of `sub`'s segments not yet
    /// moved; returns how many iovecs.
    pub(crate) fn build_iovecs(&mut self, sub: &SubOp) -> u32 {
        let buffer = self.buffers[sub.slot as usize].as_mut_ptr();
        let scratch = if sub.scratch {
            self.work[sub.slot as usize].scratch_ptr()
        } else {
            std::ptr::null_mut()
        };
        let mut skip = sub.done;
        let mut count = 0u32;
        for k in 0..sub.seg_count {
            let (start, len) = self.segs[(sub.seg_first + k) as usize];
            if skip >= len {
                skip -= len;
                continue;
            }
            let (base, start) = if start & SCRATCH_SEG != 0 {
                (scratch, start & !SCRATCH_SEG)
            } else {
                (buffer, start)
            };
            self.iovs[(sub.seg_first + count) as usize] = libc::iovec {
                // SAFETY (pointer arithmetic): the segment lies inside the
                // slot buffer, or inside the slot's stripe scratch when it
                // is marked so (`scratch` is then that scratch's address).
                iov_base: unsafe { base.add((start + skip) as usize) }.cast(),
                iov_len: (len - skip) as usize,
            };
            skip = 0;
            count += 1;
        }
        count
    }

    /// Count one finished member operation; every 256, add this queue's
    /// counts to the array's.
    pub(crate) fn count(&mut self, member: u32, bytes: u64, error: bool) {
        let entry = &mut self.counts[member as usize];
        entry.0 += 1;
        entry.1 += bytes;
        entry.2 += u64::from(error);
        self.counted_since_publish += 1;
        if self.counted_since_publish >= 256 {
            self.publish_counts();
        }
    }

    pub(crate) fn publish_counts(&mut self) {
        self.counted_since_publish = 0;
        let Shape::Array(array) = &self.shape else {
            return;
        };
        // Each add is a locked instruction on a line every worker shares:
        // only the counts that moved (errors rarely do).
        for (counters, entry) in array.member_counters().iter().zip(self.counts.iter_mut()) {
            let (ops, bytes, errors) = std::mem::take(entry);
            if ops > 0 {
                counters.ops.fetch_add(ops, Ordering::Relaxed);
            }
            if bytes > 0 {
                counters.bytes.fetch_add(bytes, Ordering::Relaxed);
            }
            if errors > 0 {
                counters.errors.fetch_add(errors, Ordering::Relaxed);
            }
        }
    }

    /// One member operation of `slot` finished with `errno` (0 = success).
    /// Once per member operation and per request: what only some requests
    /// need (a read redone through the stripes, a barrier released) is
    /// out of line.
    #[inline]
    pub(crate) fn finish_sub(&mut self, slot: u32, errno: i32) {
        let state = &mut self.slots[slot as usize];
        if errno != 0 && state.errno == 0 {
            state.errno = errno;
        }
        state.pending -= 1;
        if state.pending != 0 {
            return;
        }
        if self.parity.is_some() && self.work[slot as usize].redo {
            self.redo_read(slot);
            return;
        }
        let state = *state;
        if state.span {
            self.release_span(slot);
        }
        self.busy_slots -= 1;
        let result = if state.errno == 0 {
            Ok(state.len)
        } else {
            Err(state.errno)
        };
        self.ready.push(Completion { slot, result });
    }

    /// A RAID 4/5/6 read lost a member part-way: read it again through
    /// the stripe path (the lost chunk comes back from the rest of its
    /// stripe).
    #[cold]
    fn redo_read(&mut self, slot: u32) {
        let work = &mut self.work[slot as usize];
        work.redo = false;
        let offset = work.offset;
        let state = &mut self.slots[slot as usize];
        state.errno = 0;
        state.pending = 1;
        let len = state.len;
        if self.stripe_start(slot, false, offset, len, false).is_err() {
            self.slots[slot as usize].errno = libc::EIO;
        }
        self.finish_sub(slot, 0);
    }

    /// The write on `slot` completed: it leaves the array's barrier.
    #[inline(never)]
    fn release_span(&mut self, slot: u32) {
        self.slots[slot as usize].span = false;
        if let Some((offset, len)) = self.spans[slot as usize].take() {
            if let Shape::Array(array) = &self.shape {
                array.end_write(offset, u64::from(len));
            }
        }
    }

    /// Handle one engine completion: continue short transfers, retry
    /// EAGAIN/EINTR, record errors.
    pub(crate) fn on_engine_completion(&mut self, user_data: u64, result: i32) -> io::Result<()> {
        let index = user_data as u32;
        let sub = &mut self.subs[index as usize];
        let retry = result == -libc::EAGAIN || result == -libc::EINTR;
        let errno = match result {
            _ if retry => return self.issue(index),
            r if r < 0 => -r,
            0 if sub.kind != KIND_FLUSH => libc::EIO, // no progress: end of file
            r => {
                sub.done += if sub.kind == KIND_FLUSH { 0 } else { r as u32 };
                if sub.done < sub.len {
                    return self.issue(index);
                }
                0
            }
        };
        let record = *sub;
        let (slot, member, stripe) = (record.slot, record.member, record.stripe);
        let moved = if errno == 0 { u64::from(sub.len) } else { 0 };
        self.count(member, moved, errno != 0);
        self.inflight[member as usize] -= 1;
        // The record is free again (fail_over works on a copy of it).
        self.free_subs.push(index);
        if stripe {
            return self.stripe_sub_done(&record, errno);
        }
        let errno = if errno == 0 {
            0
        } else {
            self.fail_over(index, errno)?
        };
        self.finish_sub(slot, errno);
        Ok(())
    }

    /// A member operation failed with `errno`. On a redundant array the
    /// member is marked faulty (durably, in the other members' superblocks)
    /// and the operation's work goes elsewhere: a read is reissued, part by
    /// part, on another copy; a write or flush has nothing left to do (the
    /// other copies were written by their own operations). Returns the errno
    /// the request must still see: 0 when another copy took over, `errno`
    /// when none could (RAID 0, or the member holds the last copy).
    pub(crate) fn fail_over(&mut self, index: u32, errno: i32) -> io::Result<i32> {
        let sub = self.subs[index as usize];
        let error = io::Error::from_raw_os_error(errno);
        let Shape::Array(array) = &self.shape else {
            return Ok(errno);
        };
        if !crate::slot::is_member_failure(&error) {
            return Ok(errno);
        }
        let array = Arc::clone(array);
        if array.fail_member(sub.member as usize, &error).is_err() {
            return Ok(errno);
        }
        if sub.kind != KIND_READ {
            return Ok(0);
        }
        if self.parity.is_some() {
            // Read it again through the stripe path once the request's
            // other parts have finished: the lost chunk comes back from
            // the rest of its stripe.
            self.work[sub.slot as usize].redo = true;
            return Ok(0);
        }
        let Some(geometry) = self.geometry.take() else {
            return Ok(errno);
        };
        let reissued = self.reissue_read(&geometry, &array, sub);
        self.geometry = Some(geometry);
        Ok(if reissued? { 0 } else { errno })
    }

    /// Read each segment of the failed read `sub` from another readable
    /// copy (each segment is one piece, or part of one, so each is
    /// contiguous on any copy). False when a segment has no copy left.
    pub(crate) fn reissue_read(
        &mut self,
        geometry: &nvraid_layout::Geometry,
        array: &Array,
        sub: SubOp,
    ) -> io::Result<bool> {
        let mut member_offset = sub.member_offset;
        let mut moves = Vec::with_capacity(sub.seg_count as usize);
        for k in 0..sub.seg_count {
            let seg = sub.seg_first + k;
            let (_, len) = self.segs[seg as usize];
            let Some((logical, _)) = geometry.logical_of(sub.member, member_offset) else {
                return Ok(false);
            };
            let load = |member, at| {
                read_load(
                    array,
                    &self.data_offsets,
                    &self.inflight,
                    member,
                    at,
                    u64::from(len),
                )
            };
            let Some(copy) =
                least_loaded_copy(geometry, logical, 0, array.first_copy_reads(), load)
            else {
                return Ok(false);
            };
            moves.push((geometry.locate(logical, copy), seg, len));
            member_offset += u64::from(len);
        }
        for (at, seg, len) in moves {
            self.push_sub(SubOp {
                slot: sub.slot,
                member: at.member,
                kind: KIND_READ,
                dsync: false,
                member_offset: at.member_offset,
                seg_first: seg,
                seg_count: 1,
                len,
                done: 0,
                stripe: false,
                scratch: false,
            })?;
        }
        Ok(true)
    }

    pub(crate) fn submit_rw(
        &mut self,
        slot: u32,
        write: bool,
        offset: u64,
        len: u32,
        fua: bool,
    ) -> io::Result<()> {
        self.parts.clear();
        if let Some(work) = self.work.get_mut(slot as usize) {
            work.offset = offset;
            if !write {
                let Shape::Array(array) = &self.shape else {
                    unreachable!("parity arrays are arrays")
                };
                let direct = !(array.is_degraded() || array.read_limited())
                    || self.geometry.as_ref().is_some_and(|g| {
                        // Every chunk it touches can be read where it is.
                        g.pieces(offset, u64::from(len)).all(|piece| {
                            let at = g.locate(piece.logical_offset, 0);
                            self.data_offsets[at.member as usize].is_some()
                                && array.readable(at.member as usize, at.member_offset, piece.len)
                        })
                    });
                if !direct {
                    return self.stripe_start(slot, false, offset, len, false);
                }
            }
        }
        let stripe_write = write && self.parity.is_some();
        // The geometry is moved out while the request is split (split needs
        // `&mut self`) and put back: a move of a few words, no reference
        // count touched.
        match self.geometry.take() {
            None => self.parts.push(Part {
                member: 0,
                member_offset: offset,
                buf_offset: 0,
                len,
            }),
            Some(geometry) => {
                let marked = match (write, &self.shape) {
                    (true, Shape::Array(_)) if self.guarded_writes => self.admit(slot, offset, len),
                    _ => Ok(true),
                };
                let split = matches!(marked, Ok(true))
                    && (stripe_write || self.split(&geometry, write, offset, len));
                self.geometry = Some(geometry);
                marked?;
                if !split {
                    self.slots[slot as usize].errno = libc::EIO;
                    return Ok(());
                }
                if stripe_write {
                    return self.stripe_start(slot, true, offset, len, fua);
                }
            }
        }
        let kind = if write { KIND_WRITE } else { KIND_READ };
        self.merge_and_push(slot, kind, write && fua)
    }

    /// Let `slot`'s write of `[offset, offset + len)` in
    /// ([`Array::admit_write`]); while a resync holds its region, this
    /// queue's own requests go on meanwhile (the resync waits for them;
    /// blocking here would deadlock). False when the request must fail
    /// with EIO (its write-intent bits could not be written on any copy;
    /// those member failures are already recorded and logged). What the
    /// admission holds is released when the slot completes (`finish_sub`).
    fn admit(&mut self, slot: u32, offset: u64, len: u32) -> io::Result<bool> {
        loop {
            let Shape::Array(array) = &self.shape else {
                unreachable!("invariant: only an array's queue admits writes")
            };
            let admission = array
                .admit_write(offset, u64::from(len), false)
                .map_err(io::Error::other)?;
            let held = match admission {
                Admission::Unguarded => return Ok(true),
                Admission::Held => true,
                Admission::HeldIntentFailed(_) => false,
                Admission::Busy => {
                    self.harvest(0)?;
                    // Requests of this queue waiting for stripes or a log
                    // may be inside the region: they must go on.
                    self.retry_parked()?;
                    if !self.logging.is_empty() {
                        self.retry_logging()?;
                    }
                    std::thread::sleep(std::time::Duration::from_micros(20));
                    continue;
                }
            };
            self.spans[slot as usize] = Some((offset, len));
            self.slots[slot as usize].span = true;
            return Ok(held);
        }
    }

    /// Split a request into parts, one per piece and copy written (or the
    /// copy chosen for a read). False when a piece has no copy present.
    pub(crate) fn split(
        &mut self,
        geometry: &nvraid_layout::Geometry,
        write: bool,
        offset: u64,
        len: u32,
    ) -> bool {
        let mut buf_offset = 0u32;
        for piece in geometry.pieces(offset, u64::from(len)) {
            let copies = if write {
                0..geometry.copies()
            } else {
                let Some(copy) = self.choose_copy(geometry, piece.logical_offset, piece.len) else {
                    if !self.split_around_limits(geometry, piece, buf_offset) {
                        return false;
                    }
                    buf_offset += piece.len as u32;
                    continue;
                };
                copy..copy + 1
            };
            for copy in copies {
                let at = geometry.locate(piece.logical_offset, copy);
                let failed = match &self.shape {
                    Shape::Array(array) => array.is_faulty(at.member as usize),
                    Shape::Raw(_) => false,
                };
                if self.data_offsets[at.member as usize].is_some() && !failed {
                    let part = Part {
                        member: at.member,
                        member_offset: at.member_offset,
                        buf_offset,
                        len: piece.len as u32,
                    };
                    self.parts.push(part);
                }
            }
            buf_offset += piece.len as u32;
        }
        true
    }

    /// Read a piece that no single copy may serve whole (bad blocks, a
    /// member being recovered) from several copies, split as
    /// [`Array::cover`] does. The rare path: it may allocate. False when some
    /// sector has no readable copy, or the request would need more member
    /// operations than a slot holds.
    pub(crate) fn split_around_limits(
        &mut self,
        geometry: &nvraid_layout::Geometry,
        piece: nvraid_layout::Piece,
        buf_offset: u32,
    ) -> bool {
        let Shape::Array(array) = &self.shape else {
            return false;
        };
        let array = Arc::clone(array);
        let (data_offsets, inflight) = (&self.data_offsets, &self.inflight);
        let mut found = Vec::new();
        let mut choose = |part: nvraid_layout::Piece| {
            let load = |member, at| read_load(&array, data_offsets, inflight, member, at, part.len);
            least_loaded_copy(
                geometry,
                part.logical_offset,
                0,
                array.first_copy_reads(),
                load,
            )
        };
        let sector = u64::from(array.sector_bytes());
        let covered = array.cover(
            piece,
            sector,
            &mut |part, copy| found.push((part, copy)),
            &mut choose,
        );
        if !covered || self.parts.len() + found.len() > self.segs_per_slot as usize {
            return false;
        }
        for (part, copy) in found {
            let at = geometry.locate(part.logical_offset, copy);
            self.parts.push(Part {
                member: at.member,
                member_offset: at.member_offset,
                buf_offset: buf_offset + (part.logical_offset - piece.logical_offset) as u32,
                len: part.len as u32,
            });
        }
        true
    }

    /// Turn the request's parts into member operations: parts that are
    /// adjacent on the same member become one vectored operation (a 1 MiB
    /// read of a 4-member RAID 0 with 64 KiB chunks is 4 operations, not 16).
    pub(crate) fn merge_and_push(&mut self, slot: u32, kind: u8, dsync: bool) -> io::Result<()> {
        self.parts
            .sort_unstable_by_key(|p| (p.member, p.member_offset));
        let seg_base = slot * self.segs_per_slot;
        let mut next_seg = seg_base;
        let mut i = 0;
        while i < self.parts.len() {
            let first = self.parts[i];
            let mut sub = SubOp {
                slot,
                member: first.member,
                kind,
                dsync,
                member_offset: first.member_offset,
                seg_first: next_seg,
                seg_count: 0,
                len: 0,
                done: 0,
                stripe: false,
                scratch: false,
            };
            while i < self.parts.len() {
                let part = self.parts[i];
                let adjacent = part.member == sub.member
                    && part.member_offset == sub.member_offset + u64::from(sub.len);
                if !adjacent || sub.seg_count as usize >= libc::UIO_MAXIOV as usize {
                    break;
                }
                self.segs[next_seg as usize] = (part.buf_offset, part.len);
                next_seg += 1;
                sub.seg_count += 1;
                sub.len += part.len;
                i += 1;
            }
            debug_assert!(next_seg <= seg_base + self.segs_per_slot);
            self.push_sub(sub)?;
        }
        Ok(())
    }

    pub(crate) fn submit_flush(&mut self, slot: u32) -> io::Result<()> {
        for member in 0..self.data_offsets.len() as u32 {
            let failed = match &self.shape {
                Shape::Array(array) => array.is_faulty(member as usize),
                Shape::Raw(_) => false,
            };
            if self.data_offsets[member as usize].is_some() && !failed {
                let sub = SubOp {
                    slot,
                    member,
                    kind: KIND_FLUSH,
                    dsync: false,
                    member_offset: 0,
                    seg_first: 0,
                    seg_count: 0,
                    len: 0,
                    done: 0,
                    stripe: false,
                    scratch: false,
                };
                self.push_sub(sub)?;
            }
        }
        Ok(())
    }

    pub(crate) fn discard(&self, offset: u64, len: u32) -> Result<(), i32> {
        let errno = |e: crate::Error| match e {
            crate::Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            _ => libc::EIO,
        };
        match &self.shape {
            Shape::Array(a) => a.discard(offset, u64::from(len)).map_err(errno),
            Shape::Raw(m) => m
                .discard(offset, u64::from(len))
                .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO)),
        }
    }
}

impl Queue for FanoutQueue {
    fn depth(&self) -> u32 {
        self.slots.len() as u32
    }

    fn completes_inline(&self) -> bool {
        self.inline
    }

    fn buffer_mut(&mut self, slot: u32) -> &mut [u8] {
        self.zeroed[slot as usize] = false;
        &mut self.buffers[slot as usize]
    }

    fn buffer(&self, slot: u32) -> &[u8] {
        &self.buffers[slot as usize]
    }

    fn submit(
        &mut self,
        slot: u32,
        op: OpKind,
        offset: u64,
        len: u32,
        fua: bool,
    ) -> io::Result<()> {
        let invalid = |what: String| Err(io::Error::new(io::ErrorKind::InvalidInput, what));
        if let Shape::Array(array) = &self.shape {
            if array.generation() != self.generation {
                self.refresh()?;
            }
        }
        if slot as usize >= self.slots.len() || self.slots[slot as usize].pending != 0 {
            return invalid(format!("slot {slot} is out of range or busy"));
        }
        let moves_data = matches!(op, OpKind::Read | OpKind::Write | OpKind::Discard);
        if moves_data
            && (len > self.max_io_bytes && op != OpKind::Discard
                || offset
                    .checked_add(u64::from(len))
                    .is_none_or(|e| e > self.size_bytes))
        {
            return invalid(format!(
                "request {offset}+{len} is past the end or larger than the queue's buffers"
            ));
        }
        self.slots[slot as usize] = SlotState {
            pending: 1,
            errno: 0,
            len,
            span: false,
        };
        self.busy_slots += 1;
        let outcome = match op {
            OpKind::Read => self.submit_rw(slot, false, offset, len, false),
            OpKind::Write => self.submit_rw(slot, true, offset, len, fua),
            OpKind::Flush => self.submit_flush(slot),
            OpKind::Discard => {
                if let Err(errno) = self.discard(offset, len) {
                    self.slots[slot as usize].errno = errno;
                }
                Ok(())
            }
        };
        // A request that failed once accepted (the array could not be
        // marked dirty, an engine refused a member operation) completes
        // with the error through `reap`, like any other failure: it has
        // exactly one outcome. Returning the error here as well would
        // leave that completion to be taken for whatever request the
        // caller puts in the slot next.
        if let Err(error) = outcome {
            let state = &mut self.slots[slot as usize];
            if state.errno == 0 {
                state.errno = error.raw_os_error().unwrap_or(libc::EIO);
            }
        }
        // The guard count of 1 keeps the slot from completing while its
        // operations are being queued; drop it now.
        self.finish_sub(slot, 0);
        Ok(())
    }

    fn reap(
        &mut self,
        min_complete: u32,
        on_complete: &mut dyn FnMut(Completion),
    ) -> io::Result<u32> {
        let mut passed = 0u32;
        loop {
            if !self.parked.is_empty() {
                self.retry_parked()?;
            }
            if !self.logging.is_empty() {
                self.retry_logging()?;
            }
            for completion in self.ready.drain(..) {
                on_complete(completion);
                passed += 1;
            }
            let mut wait = if passed >= min_complete || self.busy_slots == 0 {
                0
            } else {
                1
            };
            let waiting = !self.parked.is_empty() || !self.logging.is_empty();
            if wait > 0 && waiting && self.inflight.iter().all(|&n| n == 0) {
                // Only requests waiting for stripes or logs other queues
                // hold: nothing of ours will complete. Let the others run
                // and look again; after a while, sleep between looks (a
                // sleep's wake-up costs tens of microseconds here, most of
                // a PPL write's time when every wait slept).
                self.idle_looks += 1;
                if self.idle_looks < IDLE_LOOKS_BEFORE_SLEEP {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(std::time::Duration::from_micros(20));
                }
                wait = 0;
            } else {
                self.idle_looks = 0;
            }
            self.harvest(wait)?;
            if self.ready.is_empty() && (passed >= min_complete || self.busy_slots == 0) {
                if self.busy_slots == 0 && self.counted_since_publish > 0 {
                    self.publish_counts();
                }
                return Ok(passed);
            }
        }
    }
}

impl FanoutQueue {
    /// Take the engine's completions (waiting for at least `wait`) and
    /// handle them; finished requests go to `ready`.
    #[inline]
    pub(crate) fn harvest(&mut self, wait: u32) -> io::Result<()> {
        let mut engine_done = std::mem::take(&mut self.engine_done);
        self.engine.complete(wait, &mut |user_data, result| {
            engine_done.push((user_data, result))
        })?;
        self.harvesting = true;
        let handled = engine_done
            .iter()
            .try_for_each(|&(user_data, result)| self.on_engine_completion(user_data, result));
        self.harvesting = false;
        engine_done.clear();
        self.engine_done = engine_done;
        handled?;
        if !self.logging.is_empty() {
            self.retry_logging()?;
        }
        Ok(())
    }
}

impl Drop for FanoutQueue {
    fn drop(&mut self) {
        // Let in-flight operations finish before their buffers are freed.
        while self.busy_slots > 0 {
            if self.reap(1, &mut |_| {}).is_err() {
                break;
            }
        }
        self.publish_counts();
    }
}
