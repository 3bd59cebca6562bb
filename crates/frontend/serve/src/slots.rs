//! A worker's queue and its slots: what each slot is doing (a piece of a
//! job, an owned connection's request, a payload arriving, read data
//! waiting to be sent), the jobs being executed, and the reaping of
//! completions. A job's pieces finish here; a connection's request is
//! handed back to whoever reaps (the worker, which knows its connections).

use std::sync::Arc;
use std::time::Instant;

use nvraid_io::queue::{Completion, OpKind, Queue};
use nvraid_nbd::ErrorCode;

use crate::job::{Job, Work};
use crate::stats::{Export, LatencyOp, LatencyShard};

/// A job being executed.
struct Active {
    job: Job,
    /// Offset within the job of the next piece to submit.
    next_piece: u32,
    pieces_left: u32,
    outstanding: u32,
    error: Option<ErrorCode>,
    /// The round it started in.
    started: Instant,
}

/// One piece of a job in flight: which job, where in it, how long.
#[derive(Clone, Copy)]
pub(crate) struct Piece {
    active: usize,
    at: u32,
    len: u32,
}

/// A request of an owned connection in one slot.
#[derive(Clone, Copy)]
pub(crate) struct SlotRequest {
    /// Index of the connection in the worker's owned connections.
    pub conn: usize,
    pub request: nvraid_nbd::RequestHeader,
    pub permit_bytes: u64,
}

/// What a slot is doing.
#[derive(Clone, Copy)]
pub(crate) enum SlotUse {
    Free,
    /// A piece of a job, submitted.
    Piece(Piece),
    /// Filling with a write's payload from the socket (not submitted).
    Receiving,
    /// An owned connection's request, submitted.
    Request(SlotRequest),
    /// Holding a read's data until its reply has been sent.
    Sending,
    /// Reserved for a ublk tag (its buffer is the tag's), idle.
    UblkIdle,
    /// A ublk request, submitted in its tag's slot.
    Ublk(UblkRequest),
}

/// A ublk request in its tag's slot.
#[derive(Clone, Copy)]
pub(crate) struct UblkRequest {
    pub tag: u16,
    pub command: nvraid_nbd::Command,
    pub len: u32,
}

/// One worker's queue, its slots and its jobs.
pub(crate) struct Slots {
    pub(crate) queue: Box<dyn Queue>,
    pub(crate) slot_bytes: u32,
    free_slots: Vec<u32>,
    pub(crate) uses: Vec<SlotUse>,
    /// Slots submitted to the queue and not yet reaped.
    pub(crate) io_in_flight: u32,
    actives: Vec<Option<Active>>,
    pub(crate) active_count: usize,
    completions: Vec<Completion>,
    /// Bytes of owned connections' requests submitted, ever (a running
    /// count that a connection's `pump` budgets against).
    pub(crate) started_bytes: u64,
    /// Completed ublk requests to answer: tag, command, length, and the
    /// result for the kernel (bytes done, or a negative errno).
    pub(crate) ublk_answers: Vec<(u16, nvraid_nbd::Command, u32, i32)>,
    /// The worker's clock, read once per round of its loop and once per
    /// reap that brought completions: what a request's latency is
    /// measured with (two clock reads per request would cost more than a
    /// percent at the rates a worker serves; the error is at most one
    /// round, microseconds when busy).
    now: Instant,
    /// When each slot's request was submitted (`Request` and `Ublk`).
    submitted_at: Vec<Instant>,
    latency: Arc<LatencyShard>,
}

impl Slots {
    pub(crate) fn new(queue: Box<dyn Queue>, slot_bytes: u32, latency: Arc<LatencyShard>) -> Slots {
        let depth = queue.depth();
        let now = Instant::now();
        Slots {
            now,
            submitted_at: vec![now; depth as usize],
            latency,
            queue,
            slot_bytes,
            free_slots: (0..depth).rev().collect(),
            uses: vec![SlotUse::Free; depth as usize],
            io_in_flight: 0,
            actives: (0..depth).map(|_| None).collect(),
            active_count: 0,
            completions: Vec::with_capacity(depth as usize),
            started_bytes: 0,
            ublk_answers: Vec::new(),
        }
    }

    /// Read the clock (a new round of the worker's loop).
    pub(crate) fn tick(&mut self) {
        self.now = Instant::now();
    }

    /// A request of `op` through `export`, started at `at`, is done now.
    fn record_latency(&self, export: Export, op: LatencyOp, at: Instant) {
        let nanos = self.now.saturating_duration_since(at).as_nanos();
        self.latency
            .record(export, op, u64::try_from(nanos).unwrap_or(u64::MAX));
    }

    /// Take the last `count` slots out of use for good: a ublk queue's
    /// tags, tag t in slot `first + t`. Returns `first`.
    pub(crate) fn reserve_for_ublk(&mut self, count: u32) -> u32 {
        let depth = self.uses.len() as u32;
        assert!(
            count < depth,
            "invariant: the queue was opened with slots beyond the ublk tags"
        );
        let first = depth - count;
        self.free_slots.retain(|s| *s < first);
        for slot in first..depth {
            assert!(
                matches!(self.uses[slot as usize], SlotUse::Free),
                "invariant: ublk slots are reserved before any is used"
            );
            self.uses[slot as usize] = SlotUse::UblkIdle;
        }
        self.ublk_answers.reserve(count as usize);
        first
    }

    /// Make `slot`'s buffer what `work` writes (zeroes for a zeroing), and
    /// give the target operation.
    pub(crate) fn prepare(&mut self, slot: u32, work: Work, len: u32) -> OpKind {
        if work == Work::Zero {
            self.queue.buffer_mut(slot)[..len as usize].fill(0);
        }
        work.op()
    }

    /// Submit a ublk request sitting in its tag's reserved `slot` (a
    /// write's data already there); its answer comes back through
    /// `ublk_answers`. An error is the errno to answer at once.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn submit_ublk(
        &mut self,
        slot: u32,
        work: Work,
        offset: u64,
        len: u32,
        fua: bool,
        tag: u16,
        command: nvraid_nbd::Command,
    ) -> Result<(), i32> {
        assert!(
            matches!(self.uses[slot as usize], SlotUse::UblkIdle),
            "invariant: a ublk tag's slot is idle when its request comes"
        );
        let op = self.prepare(slot, work, len);
        let len = if op == OpKind::Flush { 0 } else { len };
        match self.queue.submit(slot, op, offset, len, fua) {
            Ok(()) => {
                self.uses[slot as usize] = SlotUse::Ublk(UblkRequest { tag, command, len });
                self.submitted_at[slot as usize] = self.now;
                self.io_in_flight += 1;
                Ok(())
            }
            Err(error) => Err(error.raw_os_error().unwrap_or(libc::EIO)),
        }
    }

    /// A free slot, taken for `use_`.
    pub(crate) fn take_slot(&mut self, use_: SlotUse) -> Option<u32> {
        let slot = self.free_slots.pop()?;
        assert!(
            matches!(self.uses[slot as usize], SlotUse::Free),
            "invariant: slot {slot} on the free list is free"
        );
        self.uses[slot as usize] = use_;
        Some(slot)
    }

    pub(crate) fn free_slot(&mut self, slot: u32) {
        assert!(
            !matches!(self.uses[slot as usize], SlotUse::Free),
            "invariant: slot {slot} is freed once"
        );
        self.uses[slot as usize] = SlotUse::Free;
        self.free_slots.push(slot);
    }

    pub(crate) fn has_free_slot(&self) -> bool {
        !self.free_slots.is_empty()
    }

    /// Whether one more job fits.
    pub(crate) fn has_free_active(&self) -> bool {
        self.active_count < self.queue.depth() as usize
    }

    /// How many slots one connection's unsent replies may hold; further
    /// read data is copied out of the slot (`complete_request`).
    pub(crate) fn hold_limit(&self) -> u32 {
        (self.queue.depth() / 4).max(2)
    }

    /// Submit an owned connection's request that sits in `slot`.
    pub(crate) fn submit_request(
        &mut self,
        slot: u32,
        op: OpKind,
        request: SlotRequest,
    ) -> Result<(), ErrorCode> {
        let header = request.request;
        let len = if op == OpKind::Flush {
            0
        } else {
            header.length
        };
        match self
            .queue
            .submit(slot, op, header.offset, len, header.fua())
        {
            Ok(()) => {
                self.uses[slot as usize] = SlotUse::Request(request);
                self.submitted_at[slot as usize] = self.now;
                self.io_in_flight += 1;
                self.started_bytes += u64::from(len.max(1));
                Ok(())
            }
            Err(error) => {
                self.free_slot(slot);
                Err(ErrorCode::from_io_error(&error))
            }
        }
    }

    pub(crate) fn start(&mut self, job: Job) {
        let pieces_left = match job.work {
            Work::Flush => 1,
            _ => job.length.div_ceil(self.slot_bytes),
        };
        let active = Some(Active {
            job,
            next_piece: 0,
            pieces_left,
            outstanding: 0,
            error: None,
            started: self.now,
        });
        // An owned connection's long write, received after the inbox
        // filled the entries, gets one more.
        match self.actives.iter().position(Option::is_none) {
            Some(index) => self.actives[index] = active,
            None => self.actives.push(active),
        }
        self.active_count += 1;
    }

    pub(crate) fn submit_ready(&mut self) {
        for index in 0..self.actives.len() {
            while !self.free_slots.is_empty() && self.has_pieces(index) {
                self.submit_piece(index);
            }
        }
    }

    fn has_pieces(&self, index: usize) -> bool {
        self.actives[index]
            .as_ref()
            .is_some_and(|a| a.pieces_left > 0)
    }

    fn submit_piece(&mut self, index: usize) {
        let Some(slot) = self.free_slots.pop() else {
            panic!("invariant: submit_piece is called with a free slot");
        };
        assert!(
            matches!(self.uses[slot as usize], SlotUse::Free),
            "invariant: slot {slot} on the free list is free"
        );
        let Some(active) = self.actives[index].as_mut() else {
            panic!("invariant: job {index} with pieces left is active");
        };
        let at = active.next_piece;
        let len = (active.job.length - at).min(self.slot_bytes);
        active.next_piece += len;
        active.pieces_left -= 1;
        let job = &active.job;
        let buffer = self.queue.buffer_mut(slot);
        let op = match job.work {
            Work::Read => OpKind::Read,
            Work::Write => {
                buffer[..len as usize]
                    .copy_from_slice(&job.buffer[at as usize..(at + len) as usize]);
                OpKind::Write
            }
            Work::Zero => {
                buffer[..len as usize].fill(0);
                OpKind::Write
            }
            Work::Discard => OpKind::Discard,
            Work::Flush => OpKind::Flush,
        };
        let submitted = self
            .queue
            .submit(slot, op, job.offset + u64::from(at), len, job.fua);
        match submitted {
            Ok(()) => {
                active.outstanding += 1;
                self.io_in_flight += 1;
                self.uses[slot as usize] = SlotUse::Piece(Piece {
                    active: index,
                    at,
                    len,
                });
            }
            Err(error) => {
                active.error.get_or_insert(ErrorCode::from_io_error(&error));
                self.free_slots.push(slot);
                self.finish_if_done(index);
            }
        }
    }

    /// Reap completions (waiting for one when `wait` and I/O is in
    /// flight); a job's piece is finished here, a connection's request is
    /// passed to `on_request`. True if any came.
    pub(crate) fn reap(
        &mut self,
        wait: bool,
        on_request: &mut impl FnMut(&mut Slots, Completion, SlotRequest),
    ) -> bool {
        let min_complete = u32::from(wait && self.io_in_flight > 0);
        let mut completions = std::mem::take(&mut self.completions);
        let reaped = self.queue.reap(min_complete, &mut |c| completions.push(c));
        if let Err(error) = reaped {
            // A failed reap leaves the queue unusable: fail what is in flight.
            let code = ErrorCode::from_io_error(&error);
            let busy: Vec<u32> = (0..self.uses.len() as u32)
                .filter(|s| {
                    matches!(
                        self.uses[*s as usize],
                        SlotUse::Piece(_) | SlotUse::Request(_) | SlotUse::Ublk(_)
                    )
                })
                .collect();
            completions.extend(busy.into_iter().map(|slot| Completion {
                slot,
                result: Err(code.to_errno()),
            }));
        }
        let any = !completions.is_empty();
        if any {
            self.tick();
        }
        for completion in completions.drain(..) {
            match self.uses[completion.slot as usize] {
                SlotUse::Piece(piece) => {
                    self.io_done(completion.slot);
                    self.complete_piece(completion, piece);
                }
                SlotUse::Request(request) => {
                    self.io_done(completion.slot);
                    let op = LatencyOp::of(request.request.command);
                    self.record_latency(
                        Export::Nbd,
                        op,
                        self.submitted_at[completion.slot as usize],
                    );
                    on_request(self, completion, request);
                }
                SlotUse::Ublk(request) => {
                    self.io_done(completion.slot);
                    self.uses[completion.slot as usize] = SlotUse::UblkIdle;
                    let op = LatencyOp::of(request.command);
                    self.record_latency(
                        Export::Ublk,
                        op,
                        self.submitted_at[completion.slot as usize],
                    );
                    let result = match completion.result {
                        Ok(moved) if moved == request.len => moved as i32,
                        Ok(_) => -libc::EIO,
                        Err(errno) => -errno,
                    };
                    self.ublk_answers
                        .push((request.tag, request.command, request.len, result));
                }
                SlotUse::Free | SlotUse::Receiving | SlotUse::Sending | SlotUse::UblkIdle => {
                    panic!(
                        "invariant: a completion (slot {}) matches an operation submitted on it",
                        completion.slot
                    )
                }
            }
        }
        self.completions = completions;
        any
    }

    /// One submitted operation (slot `slot`) came back.
    fn io_done(&mut self, slot: u32) {
        assert!(
            self.io_in_flight > 0,
            "invariant: a completion (slot {slot}) has an operation in flight"
        );
        self.io_in_flight -= 1;
    }

    fn complete_piece(&mut self, completion: Completion, piece: Piece) {
        self.free_slot(completion.slot);
        let Some(active) = self.actives[piece.active].as_mut() else {
            panic!("invariant: a piece's job stays active until its last piece is back");
        };
        assert!(
            active.outstanding > 0,
            "invariant: a piece completes only while its job has pieces outstanding"
        );
        active.outstanding -= 1;
        match completion.result {
            Ok(moved) if moved == piece.len => {
                if active.job.work == Work::Read {
                    let source = &self.queue.buffer(completion.slot)[..piece.len as usize];
                    let at = piece.at as usize;
                    active.job.buffer[at..at + piece.len as usize].copy_from_slice(source);
                }
            }
            Ok(_) => {
                active.error.get_or_insert(ErrorCode::Io);
            }
            Err(errno) => {
                active.error.get_or_insert(ErrorCode::from_errno(errno));
            }
        }
        self.finish_if_done(piece.active);
    }

    fn finish_if_done(&mut self, index: usize) {
        let done = self.actives[index]
            .as_ref()
            .is_some_and(|a| a.pieces_left == 0 && a.outstanding == 0);
        if !done {
            return;
        }
        let Some(active) = self.actives[index].take() else {
            panic!("invariant: a finished job was active");
        };
        assert!(
            self.active_count > 0,
            "invariant: active_count counts this job"
        );
        self.active_count -= 1;
        if let Some(export) = active.job.timed {
            self.record_latency(export, LatencyOp::of(active.job.command), active.started);
        }
        let result = active.error.map_or(Ok(()), Err);
        let owner = Arc::clone(&active.job.owner);
        owner.finish(active.job, result);
    }
}
