//! The fast path of RAID 4/5/6: writes, and reads that cannot go straight
//! to a data chunk (a member missing, failed, or being rebuilt).
//!
//! A request becomes columns ([`crate::stripe`]); the slot holds the
//! request's stripes, then works through its columns in **rounds**: as many
//! columns as the slot's scratch (and its share of member-operation
//! records) holds. A round issues every column's reads at once; when the
//! last completes, the parity is computed on the worker's thread and every
//! column's writes are issued at once; when they complete, the next round
//! starts. Nothing blocks the worker: a request whose stripes another
//! request holds is parked and tried again at each reap.
//!
//! A member that fails a read is marked faulty and the round is planned
//! again (the column is then rebuilt from the rest of its stripe); one that
//! fails a write is marked faulty and the round goes on (its block lives
//! on in the parity). When the array cannot lose the member, the request
//! fails with the error.

use crate::fanout::{FanoutQueue, Shape, SubOp, KIND_READ, KIND_WRITE, SCRATCH_SEG};
use crate::parity::plan::{Column, Mode, ParityShape, Place};
use crate::parity::work::StripeWork;
use nvraid_io::AlignedBuf;
use nvraid_parity::Kernel;
use std::io;

impl FanoutQueue {
    pub(crate) fn parity_array(&self) -> std::sync::Arc<crate::Array> {
        match &self.shape {
            Shape::Array(a) => std::sync::Arc::clone(a),
            Shape::Raw(_) => unreachable!("stripe work on a raw member"),
        }
    }

    /// Start `slot`'s request on the stripe path (the slot's submit guard is
    /// held by the caller; the work holds one of its own until it ends).
    pub(crate) fn stripe_start(
        &mut self,
        slot: u32,
        write: bool,
        offset: u64,
        len: u32,
        fua: bool,
    ) -> io::Result<()> {
        let shape = self.parity.expect("a parity array");
        let work = &mut self.work[slot as usize];
        work.active = true;
        work.write = write;
        work.offset = offset;
        work.len = len;
        work.fua = fua;
        work.columns.clear();
        shape.columns(offset, u64::from(len), &mut work.columns);
        work.next = 0;
        work.round_end = 0;
        work.writing = false;
        work.outstanding = 0;
        work.replan = false;
        work.errno = 0;
        work.stripes = None;
        self.slots[slot as usize].pending += 1;
        if !self.stripe_try_lock(slot) {
            self.parked.push(slot);
            return Ok(());
        }
        self.stripe_round(slot)
    }

    pub(crate) fn stripe_try_lock(&mut self, slot: u32) -> bool {
        let shape = self.parity.expect("a parity array");
        let array = self.parity_array();
        let work = &mut self.work[slot as usize];
        let (first, last) = shape.stripes(work.offset, u64::from(work.len));
        if array.parity_family().locks.try_lock_range(first, last) {
            work.stripes = Some((first, last));
            true
        } else {
            false
        }
    }

    /// Start the parked requests whose stripes are free now.
    pub(crate) fn retry_parked(&mut self) -> io::Result<()> {
        let mut i = 0;
        while i < self.parked.len() {
            let slot = self.parked[i];
            if self.stripe_try_lock(slot) {
                self.parked.swap_remove(i);
                self.stripe_round(slot)?;
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// Plan and start the next round of `slot`'s columns (or finish).
    pub(crate) fn stripe_round(&mut self, slot: u32) -> io::Result<()> {
        let shape = self.parity.expect("a parity array");
        let array = self.parity_array();
        let members = shape.data + shape.parity;
        let scratch_cap = self.scratch_cap;
        let ops_cap = self.segs_per_slot;
        let data_offsets = &self.data_offsets;
        let work = &mut self.work[slot as usize];
        if work.errno != 0 || work.next == work.columns.len() {
            return self.stripe_finish(slot);
        }
        work.bases.clear();
        let (mut used, mut ops, mut end) = (0usize, 0u32, work.next);
        while end < work.columns.len() {
            let col = &mut work.columns[end];
            let at = col.stripe * shape.chunk + u64::from(col.lo);
            let width = col.width() as u64;
            let readable = |m: u32| {
                data_offsets[m as usize].is_some() && array.readable(m as usize, at, width)
            };
            let planned = if work.write {
                let trusted = array.parity_trusted(&shape, col.stripe);
                shape.plan_write(col, readable, trusted)
            } else {
                shape.plan_read(col, readable)
            };
            if let Err(lost) = planned {
                if end == work.next {
                    // Said once per request, on the server's log.
                    eprintln!("nvraid: {}", array.too_many_lost(&shape, lost));
                    work.errno = libc::EIO;
                    return self.stripe_finish(slot);
                }
                break; // the next round reports it
            }
            let need = shape.scratch_len(col);
            if end > work.next && (used + need > scratch_cap || ops + 2 * members > ops_cap) {
                break;
            }
            if let (true, Some(ppl), true) = (work.write, &array.ppl, end > work.next) {
                // One log write per round: one parity member, and the
                // partial parity of every column in one log write.
                let first = &work.columns[work.next];
                let same = shape.map.parity_members(first.stripe).0
                    == shape.map.parity_members(work.columns[end].stripe).0;
                let pp: usize = work.columns[work.next..=end]
                    .iter()
                    .map(Column::width)
                    .sum();
                if !same
                    || pp as u64 > ppl.pp_max()
                    || end - work.next >= nvraid_metadata::ppl::MAX_ENTRIES
                {
                    break;
                }
            }
            work.bases.push(used);
            used += need;
            ops += 2 * members;
            end += 1;
        }
        work.round_end = end;
        if work.scratch.len() < used {
            work.scratch = AlignedBuf::zeroed(used.next_multiple_of(4096));
        }
        work.writing = false;
        work.ios.clear();
        for (i, col) in work.columns[work.next..end].iter().enumerate() {
            shape.reads(col, work.offset, work.bases[i], &mut work.ios);
        }
        self.stripe_issue(slot, KIND_READ, false)
    }

    /// Issue the slot's planned member operations (`work.ios`): blocks
    /// adjacent on one member (the same member's chunks of consecutive
    /// stripes) go as one vectored operation. When none is left waiting on
    /// the engine, go on at once.
    pub(crate) fn stripe_issue(&mut self, slot: u32, kind: u8, dsync: bool) -> io::Result<()> {
        let mut ios = std::mem::take(&mut self.work[slot as usize].ios);
        ios.sort_unstable_by_key(|io| (io.member, io.member_offset));
        let seg_base = slot * self.segs_per_slot;
        let mut waiting = 0;
        let mut issued = 0;
        let mut k = 0;
        while k < ios.len() {
            let first = ios[k];
            if self.null[first.member as usize] {
                // A null member keeps nothing: it reads as zeros.
                if kind == KIND_READ {
                    let range = |at: usize| at..at + first.len as usize;
                    match first.at {
                        Place::Scratch(at) => self.work[slot as usize].scratch[range(at)].fill(0),
                        Place::Request(at) => {
                            self.buffers[slot as usize][range(at)].fill(0);
                            self.zeroed[slot as usize] = false;
                        }
                    }
                }
                self.count(first.member, u64::from(first.len), false);
                k += 1;
                continue;
            }
            let mut sub = SubOp {
                slot,
                member: first.member,
                kind,
                dsync,
                member_offset: first.member_offset,
                seg_first: seg_base + k as u32,
                seg_count: 0,
                len: 0,
                done: 0,
                stripe: true,
                scratch: false,
            };
            while k < ios.len() {
                let io = ios[k];
                let adjacent = io.member == sub.member
                    && io.member_offset == sub.member_offset + u64::from(sub.len);
                if !adjacent || sub.seg_count as usize >= libc::UIO_MAXIOV as usize {
                    break;
                }
                let start = match io.at {
                    Place::Request(at) => at as u32,
                    Place::Scratch(at) => {
                        sub.scratch = true;
                        at as u32 | SCRATCH_SEG
                    }
                };
                self.segs[(seg_base + k as u32) as usize] = (start, io.len);
                sub.seg_count += 1;
                sub.len += io.len;
                k += 1;
            }
            if kind == KIND_WRITE && issued > 0 {
                crate::failpoint::hit("stripe-write");
            }
            issued += 1;
            waiting += 1;
            self.work[slot as usize].outstanding += 1;
            self.engine_sub(sub)?;
        }
        self.work[slot as usize].ios = ios;
        if waiting == 0 {
            return self.stripe_advance(slot);
        }
        Ok(())
    }

    /// A member operation of `slot`'s stripe work finished with `errno`.
    pub(crate) fn stripe_sub_done(&mut self, sub: &SubOp, errno: i32) -> io::Result<()> {
        let (slot, member, kind) = (sub.slot, sub.member, sub.kind);
        if errno != 0 {
            let error = io::Error::from_raw_os_error(errno);
            let array = self.parity_array();
            let work = &mut self.work[slot as usize];
            let role = member as usize;
            // An error that says nvraid asked for something wrong fails
            // the request and leaves the member alone.
            let taken_over = if !crate::slot::is_member_failure(&error) {
                false
            } else if kind == KIND_WRITE {
                // A member the array cannot lose keeps the range as bad
                // blocks (see `Array::write_failed`); the round's other
                // writes to the same rows are its companions.
                let (at, len) = (sub.member_offset, u64::from(sub.len));
                let mut companions: Vec<usize> = work
                    .ios
                    .iter()
                    .filter(|io| io.member != member)
                    .filter(|io| {
                        io.member_offset < at + len && at < io.member_offset + u64::from(io.len)
                    })
                    .map(|io| io.member as usize)
                    .collect();
                companions.sort_unstable();
                companions.dedup();
                array
                    .write_failed(role, at, len, &error, &companions)
                    .is_ok()
            } else {
                array.fail_member(role, &error).is_ok()
            };
            if taken_over {
                // A write's block lives on in the parity written beside it;
                // a read must be planned again without the member.
                if kind == KIND_READ {
                    work.replan = true;
                }
            } else if work.errno == 0 {
                work.errno = errno;
            }
        }
        let work = &mut self.work[slot as usize];
        work.outstanding -= 1;
        if work.outstanding == 0 {
            self.stripe_advance(slot)?;
        }
        Ok(())
    }

    /// The phase's operations have all completed: compute and write, or
    /// go on to the next round.
    pub(crate) fn stripe_advance(&mut self, slot: u32) -> io::Result<()> {
        let shape = self.parity.expect("a parity array");
        let array = self.parity_array();
        let work = &mut self.work[slot as usize];
        if work.errno != 0 {
            return self.stripe_finish(slot);
        }
        if work.writing {
            work.writing = false;
            work.next = work.round_end;
            if let (Some(ppl), Some(ticket)) = (&array.ppl, work.ticket.take()) {
                ppl.done(ticket);
            }
            if let (Some(journal), Some(ticket)) = (&array.md_journal, work.jticket.take()) {
                journal.done(ticket);
            }
            return self.stripe_round(slot);
        }
        if work.replan {
            work.replan = false;
            return self.stripe_round(slot);
        }
        let request = &mut self.buffers[slot as usize][..work.len as usize];
        // A PPL array logs the round on its parity member (when it has one).
        let round = &work.columns[work.next..work.round_end];
        let log_on = array.ppl.as_ref().filter(|_| work.write).and_then(|_| {
            let (p, _) = shape.map.parity_members(round[0].stripe);
            array.is_usable(p as usize).then_some(p)
        });
        if log_on.is_some() {
            let total: usize = round
                .iter()
                .filter(|c| c.mode != Mode::Full)
                .map(Column::width)
                .sum();
            work.pp.clear();
            work.pp.resize(total, 0);
        }
        compute_round(&shape, work, request, log_on.is_some());
        if !work.write {
            work.next = work.round_end;
            return self.stripe_round(slot);
        }
        // A journaled array logs the round's data and parity pages first.
        if let Some(journal) = array.md_journal.as_ref().filter(|j| j.logging()) {
            if !journal_round(&shape, work, request, journal, &array) {
                work.errno = libc::EINVAL;
                return self.stripe_finish(slot);
            }
        }
        if let (Some(p), Some(ppl)) = (log_on, &array.ppl) {
            work.ticket = Some(ppl.enqueue(p, &work.entries, &work.pp));
        }
        if work.ticket.is_some() || work.jticket.is_some() {
            self.logging.push(slot);
            if self.harvesting {
                // The harvest tries the log once every completion is in.
                return Ok(());
            }
            return self.retry_logging();
        }
        self.stripe_write(slot)
    }

    /// Issue the round's writes (its log, if any, is durable).
    pub(crate) fn stripe_write(&mut self, slot: u32) -> io::Result<()> {
        let shape = self.parity.expect("a parity array");
        let array = self.parity_array();
        let work = &mut self.work[slot as usize];
        let data_offsets = &self.data_offsets;
        let writable = |m: u32| data_offsets[m as usize].is_some() && array.is_usable(m as usize);
        work.ios.clear();
        for (i, col) in work.columns[work.next..work.round_end].iter().enumerate() {
            shape.writes(col, work.offset, work.bases[i], writable, &mut work.ios);
        }
        work.writing = true;
        let dsync = work.fua;
        self.stripe_issue(slot, KIND_WRITE, dsync)
    }

    /// Issue the writes of the rounds whose logs are durable now; a round
    /// whose journal failed completes with EIO.
    pub(crate) fn retry_logging(&mut self) -> io::Result<()> {
        let array = self.parity_array();
        let mut i = 0;
        while i < self.logging.len() {
            let slot = self.logging[i];
            let work = &mut self.work[slot as usize];
            let ppl_ready = match (&array.ppl, work.ticket) {
                (Some(ppl), Some(ticket)) => ppl.ready(&array, ticket),
                _ => true,
            };
            let journal_ready = match (&array.md_journal, work.jticket) {
                (Some(journal), Some(ticket)) => journal.ready(&array, ticket),
                _ => Ok(true),
            };
            match journal_ready {
                Err(_) => {
                    self.logging.swap_remove(i);
                    work.errno = libc::EIO;
                    self.stripe_finish(slot)?;
                }
                Ok(true) if ppl_ready => {
                    self.logging.swap_remove(i);
                    self.stripe_write(slot)?;
                }
                Ok(_) => i += 1,
            }
        }
        Ok(())
    }

    /// Let go of the stripes and complete the request.
    pub(crate) fn stripe_finish(&mut self, slot: u32) -> io::Result<()> {
        let array = self.parity_array();
        let work = &mut self.work[slot as usize];
        if let (Some(ppl), Some(ticket)) = (&array.ppl, work.ticket.take()) {
            ppl.done(ticket);
        }
        if let (Some(journal), Some(ticket)) = (&array.md_journal, work.jticket.take()) {
            journal.done(ticket);
        }
        if let Some((first, last)) = work.stripes.take() {
            array.parity_family().locks.unlock_range(first, last);
        }
        work.active = false;
        let errno = work.errno;
        self.finish_sub(slot, errno);
        Ok(())
    }
}

/// Finish the round's columns on the worker's thread: a read's lost blocks
/// recovered into the request, a write's parity computed into the scratch
/// (with `log`, each column's partial parity and log entry too).
fn compute_round(shape: &ParityShape, work: &mut StripeWork, request: &mut [u8], log: bool) {
    let kernel = Kernel::best();
    let round = &work.columns[work.next..work.round_end];
    let mut pp_at = 0;
    work.entries.clear();
    for (i, col) in round.iter().enumerate() {
        let base = work.bases[i];
        let scratch = &mut work.scratch[base..base + shape.scratch_len(col)];
        if !work.write {
            shape.finish_read(kernel, col, request, work.offset, scratch);
            continue;
        }
        let pp_len = if log && col.mode != Mode::Full {
            col.width()
        } else {
            0
        };
        let pp = &mut work.pp[pp_at..pp_at + pp_len];
        let wanted = (pp_len > 0).then_some(&mut *pp);
        shape.compute(kernel, col, request, work.offset, scratch, wanted);
        if log {
            work.entries.push(shape.ppl_entry(col, pp));
        }
        pp_at += pp_len;
    }
}

/// Queue the round's data and parity pages on md's journal (its ticket in
/// `work.jticket`). False when a column cannot be logged whole.
fn journal_round(
    shape: &ParityShape,
    work: &mut StripeWork,
    request: &[u8],
    journal: &crate::parity::journal::MdJournal,
    array: &crate::Array,
) -> bool {
    let round = &work.columns[work.next..work.round_end];
    let (mut payloads, mut pages) = (Vec::new(), Vec::new());
    let mut rebuilt = (Vec::new(), Vec::new());
    let whole = round.iter().enumerate().all(|(i, col)| {
        let base = work.bases[i];
        let scratch = &work.scratch[base..base + shape.scratch_len(col)];
        shape.rebuilt_pages(col, scratch, journal.seed(), &mut rebuilt.0, &mut rebuilt.1);
        shape.journal_pages(
            col,
            request,
            work.offset,
            scratch,
            journal.seed(),
            &mut payloads,
            &mut pages,
        )
    });
    if !whole {
        return false;
    }
    work.jticket = Some(journal.enqueue(array, payloads, pages, rebuilt));
    true
}
