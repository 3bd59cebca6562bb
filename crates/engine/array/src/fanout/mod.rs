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

//!
//! | file | what it holds |
//! |---|---|
//! | `queue.rs` | the queue's state and the machinery every level shares |
//! | `mod.rs` (this file) | submit and reap: a request handed to its family's path, completions routed back, failover |
//!
//! The families' parts are `copies::fast` (split at chunk boundaries, copy
//! choice, reissue on another copy) and `parity::fast` (stripe rounds).

mod queue;

pub use queue::{FanoutQueue, FanoutTarget};
pub(crate) use queue::{
    Part, Shape, SlotState, SubOp, KIND_FLUSH, KIND_READ, KIND_WRITE, SCRATCH_SEG,
};

use crate::array::Admission;
use nvraid_io::queue::{Completion, OpKind, Queue};
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Looks that yield before a waiting queue starts to sleep between them.
const IDLE_LOOKS_BEFORE_SLEEP: u32 = 4096;

impl FanoutQueue {
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
    /// Reads that lost a member part-way, done again through the stripes
    /// (see `finish_sub`).
    #[cold]
    fn redo_reads(&mut self) {
        while let Some(slot) = self.redo.pop() {
            self.redo_read(slot);
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

    fn leak_buffers(&mut self) {
        self.zeroed.clear();
        std::mem::forget(std::mem::take(&mut self.buffers));
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
            if array.shape_epoch() != self.shape_epoch && self.busy_slots == 0 {
                self.reshape()?;
            }
        }
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
        // Published before the route is looked at (see
        // `Array::start_live_route`).
        self.published_busy
            .store(u64::from(self.busy_slots), Ordering::SeqCst);
        let routed = match &self.shape {
            Shape::Array(array) if array.is_reshaping_live() => Some(array.clone()),
            _ => None,
        };
        if let Some(array) = routed {
            let Some((_hold, route)) = array.enter_route() else {
                // The route ended (its reshape's shape swapped in) since
                // the look above: no request of this queue's own is in
                // flight (every one was routed), so it is made again for
                // the new shape and this request starts over there.
                self.slots[slot as usize] = SlotState::IDLE;
                self.busy_slots -= 1;
                self.published_busy
                    .store(u64::from(self.busy_slots), Ordering::SeqCst);
                if array.shape_epoch() != self.shape_epoch {
                    self.reshape()?;
                }
                return self.submit(slot, op, offset, len, fua);
            };
            {
                // This request is not the queue's own: what it has in
                // flight of its own is what was there before.
                self.published_busy
                    .store(u64::from(self.busy_slots - 1), Ordering::SeqCst);
                let moves = matches!(op, OpKind::Read | OpKind::Write);
                let buf = &mut self.buffers[slot as usize][..if moves { len as usize } else { 0 }];
                if let Err(errno) = route.io(&array, op, offset, buf, fua) {
                    self.slots[slot as usize].errno = errno;
                }
                self.zeroed[slot as usize] = false;
                self.finish_sub(slot, 0);
                self.published_busy
                    .store(u64::from(self.busy_slots), Ordering::SeqCst);
                return Ok(());
            }
        }
        if let Shape::Array(array) = &self.shape {
            if array.shape_epoch() != self.shape_epoch {
                // Swapped between the look at the top and the route's
                // (its route already cleared): start over in the new shape.
                self.slots[slot as usize] = SlotState::IDLE;
                self.busy_slots -= 1;
                self.published_busy
                    .store(u64::from(self.busy_slots), Ordering::SeqCst);
                self.reshape()?;
                return self.submit(slot, op, offset, len, fua);
            }
        }
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
            if !self.redo.is_empty() {
                self.redo_reads();
            }
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
                self.published_busy
                    .store(u64::from(self.busy_slots), Ordering::SeqCst);
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
        if !self.redo.is_empty() {
            self.redo_reads();
        }
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
        if let Shape::Array(array) = &self.shape {
            array.retire_shard(&self.counts);
        }
    }
}
