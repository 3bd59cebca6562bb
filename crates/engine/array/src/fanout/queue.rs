//! A fast-path queue's state and the machinery every level shares: the
//! engine and its file table, the pool of member-operation records, the
//! slot buffers and their segments, issuing an operation and continuing a
//! short one, counting, and finishing a request's parts. What a request
//! becomes is the families' (`copies::fast`, `parity::fast`); submitting,
//! completing and failing over is the dispatch's (`fanout/mod.rs`). This
//! floor calls neither.

use crate::array::Array;
use crate::slot::CounterShard;
use nvraid_io::engine::{open_engine, Engine, EngineKind, MemberOp, MemberOpKind};
use nvraid_io::queue::{Completion, Queue, Target};
use nvraid_io::remote::{MixedEngine, RemoteFile};
use nvraid_io::AlignedBuf;
use nvraid_member::{Backend, Member};
use std::io;
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
                .map(|s| s.as_ref().map(|s| &*s.member))
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
    pub(crate) const IDLE: SlotState = SlotState {
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
    /// This queue's counts per member (its own cache lines; see
    /// [`CounterShard`]), which the array's snapshot reads.
    pub(crate) counts: Arc<CounterShard>,
    /// Slot buffers known to hold only zeros (a null member's read then
    /// needs no fill). Cleared when the caller may have written the buffer
    /// or a real member read into it.
    pub(crate) zeroed: Vec<bool>,
    /// Slots submitted and not yet completed.
    pub(crate) busy_slots: u32,
    /// `busy_slots` published for a reshape starting while the array is
    /// served (`Array::start_live_route` waits for it to reach 0).
    pub(crate) published_busy: Arc<std::sync::atomic::AtomicU64>,
    /// Engine completions being handled (capacity fixed at open).
    pub(crate) engine_done: Vec<(u64, i32)>,
    pub(crate) inflight: Vec<u32>,
    pub(crate) rotor: u32,
    pub(crate) max_io_bytes: u32,
    pub(crate) size_bytes: u64,
    /// The array's member generation this queue's file table and data
    /// offsets reflect (see [`Array::generation`]).
    pub(crate) generation: u64,
    /// The array's shape epoch this queue's geometry, parity shape, size
    /// and tables were made for (see [`Array::swap_shape`]): when it
    /// moves, the queue is made again over the same slot buffers
    /// ([`FanoutQueue::reshape`]).
    pub(crate) shape_epoch: u64,
    /// The engine the queue was opened with (for [`FanoutQueue::reshape`]).
    pub(crate) engine_kind: EngineKind,
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
    pub(crate) work: Vec<crate::parity::work::StripeWork>,
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
    /// Slots whose read lost a member part-way, to be read again through
    /// the stripes (capacity fixed at open).
    pub(crate) redo: Vec<u32>,
}

/// A segment start with this bit set is an offset in the slot's stripe
/// scratch rather than in its buffer.
pub(crate) const SCRATCH_SEG: u32 = 1 << 31;

pub(crate) const KIND_READ: u8 = 0;
pub(crate) const KIND_WRITE: u8 = 1;
pub(crate) const KIND_FLUSH: u8 = 2;

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
        let buffers: Vec<AlignedBuf> = (0..depth)
            .map(|_| AlignedBuf::zeroed(max_io_bytes as usize))
            .collect();
        Self::open_over(target, max_io_bytes, buffers, true)
    }

    /// The array's shape was swapped since this queue was made (see
    /// [`Array::swap_shape`]): make it again for the new shape (geometry,
    /// parity shape, size, member tables, records sized for the new
    /// member count), keeping its slot buffers where they are (a ublk
    /// queue's tags point into them). Only with no request of its own in
    /// flight: the swap ran with every request routed.
    pub(crate) fn reshape(&mut self) -> io::Result<()> {
        if self.busy_slots != 0 {
            return Err(io::Error::other(
                "invariant: a queue is made again for a new shape with nothing of its own in flight",
            ));
        }
        let target = FanoutTarget {
            shape: self.shape.clone(),
            engine: self.engine_kind,
        };
        let buffers = std::mem::take(&mut self.buffers);
        let mut fresh = Self::open_over(&target, self.max_io_bytes, buffers, false)?;
        // Requests done and not yet reaped (the routed ones) are reaped
        // from the new queue.
        fresh.ready.append(&mut self.ready);
        // The old queue goes (its counts folded into the array's); its
        // engine never holds an operation now.
        *self = fresh;
        Ok(())
    }

    /// A queue over `buffers` (one per slot); `zeroed`: they hold zeros.
    fn open_over(
        target: &FanoutTarget,
        max_io_bytes: u32,
        mut buffers: Vec<AlignedBuf>,
        zeroed: bool,
    ) -> io::Result<FanoutQueue> {
        let depth = buffers.len() as u32;
        // Read before the members: a member joining meanwhile moves the
        // generation past this value, and the first submit refreshes. The
        // shape epoch is read before the geometry likewise.
        let (generation, shape_epoch) = match &target.shape {
            Shape::Array(a) => (a.generation(), a.shape_epoch()),
            Shape::Raw(_) => (0, 0),
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
            published_busy: {
                let count = Arc::new(std::sync::atomic::AtomicU64::new(0));
                if let Shape::Array(array) = &target.shape {
                    array.register_queue(&count);
                }
                count
            },
            zeroed: vec![zeroed; depth as usize],
            counts: match &target.shape {
                Shape::Array(array) => array.counter_shard(),
                Shape::Raw(_) => Arc::new(CounterShard::new(members.len())),
            },
            engine_done: Vec::with_capacity(subs_max),
            inflight: vec![0; members.len()],
            rotor: 0,
            max_io_bytes,
            size_bytes: target.size_bytes(),
            generation,
            shape_epoch,
            engine_kind: target.engine,
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
                    .map(|_| crate::parity::work::StripeWork::new())
                    .collect(),
                None => Vec::new(),
            },
            parked: Vec::with_capacity(depth as usize),
            idle_looks: 0,
            logging: Vec::with_capacity(depth as usize),
            harvesting: false,
            scratch_cap: parity.map_or(0, |p| crate::parity::work::scratch_cap(&p, max_io_bytes)),
            redo: Vec::with_capacity(depth as usize),
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
        let members: Vec<Option<&Member>> = slots.iter().map(|s| s.map(|s| &*s.member)).collect();
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

    /// Count one finished member operation.
    #[inline]
    pub(crate) fn count(&mut self, member: u32, bytes: u64, error: bool) {
        self.counts.count(member as usize, bytes, error);
    }

    /// One member operation of `slot` finished with `errno` (0 = success).
    /// Once per member operation and per request: what only some requests
    /// need (a read redone through the stripes, a barrier released) is
    /// out of line.
    #[inline(always)]
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
            // Read again through the stripes: the dispatch does it (see
            // `FanoutQueue::redo_reads`), never this floor.
            self.redo.push(slot);
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

    /// The write on `slot` completed: it leaves the array's barrier.
    #[inline(never)]
    pub(crate) fn release_span(&mut self, slot: u32) {
        self.slots[slot as usize].span = false;
        if let Some((offset, len)) = self.spans[slot as usize].take() {
            if let Shape::Array(array) = &self.shape {
                array.end_write(offset, u64::from(len));
            }
        }
    }
}
