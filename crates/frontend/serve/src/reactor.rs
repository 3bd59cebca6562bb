//! Connections a worker owns: after the handshake a connection (plaintext
//! or TLS, see `wire`) is handed to one worker (the one owning fewest),
//! which from then on reads its requests and writes its replies itself, on
//! its own thread, without blocking on the socket:
//!
//! - request headers are read through a 64 KiB buffer (one `recv` takes in
//!   many small requests);
//! - a write's payload goes into the slot that will write it: what the
//!   buffer already holds is copied, the rest is read from the socket
//!   straight into the slot (one `readv` fills the slot and the header
//!   buffer behind it);
//! - a read's reply is sent from the slot its data was read into (one
//!   `writev` sends the replies of many requests), and the slot is free
//!   again once the client has all of it.
//!
//! A request longer than one slot becomes a job of this worker (split into
//! slot-sized pieces); a request that is not block-aligned (from a client
//! that negotiated no block sizes) becomes jobs too: a read of the blocks
//! around it, or a read-modify-write (`unaligned`). Nothing a request does
//! blocks the worker: every wait is a job or slot waiting in the queue,
//! reaped with all the others.
//!
//! Bounds: a connection takes no more requests while its in-flight budget
//! (requests, payload bytes) is spent, or while the worker has no free
//! slot; what it sent stays unread in the socket meanwhile. A client
//! cannot hold what it was given for as long as it likes: a request's
//! payload must arrive, and each reply must be taken by the client, within
//! the transfer deadline (`ServeOptions::transfer_timeout`), or the
//! connection is ended (`enforce_deadlines`).

use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvraid_io::queue::{Completion, OpKind};
use nvraid_nbd::consts::REQUEST_HEADER_BYTES;
use nvraid_nbd::{Command, ErrorCode, RequestHeader, RequestRules};

use crate::connection::Connection;
use crate::job::{Finish, Job, Work};
use crate::reply::{block_status_head, data_reply_head, Head};
use crate::slots::{SlotRequest, SlotUse, Slots};
use crate::unaligned::{Answer, Io, Unaligned};
use crate::wire::Wire;

/// Bytes of request headers (and small payloads) read per `recv`.
const RECEIVE_BYTES: usize = 64 * 1024;
/// With a queue that completes inside `submit`, the request bytes taken
/// from one connection before replies are sent (see `pump`).
const INLINE_BATCH_BYTES: u64 = 256 * 1024;
/// Replies gathered into one `writev`.
const SEND_BATCH: usize = 32;

/// A connection past its handshake, on its way to a worker.
pub(crate) struct Handoff {
    pub connection: Arc<Connection>,
    pub wire: Wire,
    pub rules: RequestRules,
    pub structured: bool,
    /// The minimum block size, for the connection's unaligned requests.
    pub block_bytes: u32,
    /// Told why the connection ended, once it has.
    pub done: SyncSender<String>,
}

/// What the bytes arriving next are.
enum Input {
    /// Request headers.
    Header,
    /// A write's payload, going into `slot`.
    Payload {
        slot: u32,
        request: SlotRequest,
        got: u32,
    },
    /// The payload of a refused write, read and dropped.
    Skip { left: u64 },
    /// A write's payload gathered in memory: a write longer than a slot
    /// (`unaligned` false, a job), or one not block-aligned.
    Collect {
        request: RequestHeader,
        permit: u64,
        buffer: Vec<u8>,
        got: usize,
        unaligned: bool,
    },
}

/// Where a reply's data is.
enum Data {
    None,
    /// In a slot's buffer (the slot is held until it is sent).
    Slot(u32, u32),
    Owned(Vec<u8>),
}

/// A reply waiting to be sent.
struct Reply {
    head: Head,
    data: Data,
    command: Command,
    length: u32,
    ok: bool,
    permit_bytes: u64,
}

impl Reply {
    fn data<'a>(&'a self, slots: &'a Slots) -> &'a [u8] {
        match &self.data {
            Data::None => &[],
            Data::Slot(slot, len) => &slots.queue.buffer(*slot)[..*len as usize],
            Data::Owned(bytes) => bytes,
        }
    }

    fn total(&self) -> usize {
        self.head.as_slice().len()
            + match &self.data {
                Data::None => 0,
                Data::Slot(_, len) => *len as usize,
                Data::Owned(bytes) => bytes.len(),
            }
    }
}

/// Jobs of an owned connection finish here; the worker collects them.
#[derive(Default)]
struct LocalFinish {
    done: Mutex<Vec<(Job, Result<(), ErrorCode>)>>,
}

impl Finish for LocalFinish {
    fn finish(&self, job: Job, result: Result<(), ErrorCode>) {
        self.done.lock().expect("finished jobs").push((job, result));
    }
}

/// A connection a worker owns.
pub(crate) struct Owned {
    connection: Arc<Connection>,
    wire: Wire,
    rules: RequestRules,
    structured: bool,
    unaligned: Unaligned,
    done: SyncSender<String>,
    rx: Box<[u8]>,
    rx_start: usize,
    rx_end: usize,
    input: Input,
    /// Requests are still read (false after the client closed, sent
    /// DISC, broke the protocol, or the server stopped reading).
    reading: bool,
    /// A request waits for a slot, a job entry or a permit.
    stalled: bool,
    /// Why reading stopped.
    reason: Option<String>,
    tx: VecDeque<Reply>,
    /// Bytes of the first reply already sent.
    tx_sent: usize,
    /// Bytes of `tx` not yet sent.
    unsent: usize,
    /// Slots holding this connection's unsent read data.
    held: u32,
    /// Sending failed: replies are dropped from now on.
    broken: bool,
    local: Arc<LocalFinish>,
    /// The jobs of unaligned requests finish here.
    patches: Arc<LocalFinish>,
    /// When the payload being received was announced (its header taken).
    body_since: Option<Instant>,
    /// Since when the client has had a reply to take and taken none whole.
    out_since: Option<Instant>,
}

/// What looking at the buffered input gave.
enum Step {
    Progress,
    /// A request waits for room (a slot, a permit).
    Stalled,
    NeedBytes,
}

impl Owned {
    /// Start serving a handed-over connection.
    pub(crate) fn new(handoff: Handoff) -> Owned {
        let size_bytes = handoff.rules.size_bytes;
        Owned {
            connection: handoff.connection,
            wire: handoff.wire,
            rules: handoff.rules,
            structured: handoff.structured,
            unaligned: Unaligned::new(handoff.block_bytes, size_bytes),
            done: handoff.done,
            rx: vec![0u8; RECEIVE_BYTES].into_boxed_slice(),
            rx_start: 0,
            rx_end: 0,
            input: Input::Header,
            reading: true,
            stalled: false,
            reason: None,
            tx: VecDeque::new(),
            tx_sent: 0,
            unsent: 0,
            held: 0,
            broken: false,
            local: Arc::new(LocalFinish::default()),
            patches: Arc::new(LocalFinish::default()),
            body_since: None,
            out_since: None,
        }
    }

    /// Replies for this connection's jobs that finished (its unaligned
    /// requests moved on first); true if anything moved.
    pub(crate) fn collect(&mut self, slots: &mut Slots) -> bool {
        let mut any = self.advance_unaligned(slots);
        let finished = std::mem::take(&mut *self.local.done.lock().expect("finished jobs"));
        for (job, result) in finished {
            any = true;
            let request = RequestHeader {
                flags: 0,
                command: job.command,
                cookie: job.cookie,
                offset: job.offset,
                length: job.length,
            };
            let permit = job.permit_bytes;
            let result = result.map_err(|code| (code, "storage error"));
            let data = match job.work {
                Work::Read if result.is_ok() => Data::Owned(job.buffer),
                _ => {
                    self.connection.recycle(job.buffer);
                    Data::None
                }
            };
            self.answer(slots, &request, result, data, permit);
        }
        any
    }

    /// Whether the connection ended and has nothing in flight (its worker
    /// may let it go).
    pub(crate) fn has_ended(&self) -> bool {
        !self.reading
            && self.tx.is_empty()
            && (self.broken || !self.wire.wants_write())
            && self.connection.in_flight() == 0
    }

    /// Close an ended connection and tell its thread why it ended.
    pub(crate) fn close(mut self) {
        let reason = self.reason.take().unwrap_or_else(|| "ended".into());
        self.wire.close();
        let _ = self.done.send(reason);
    }

    /// End the connection if its request payload has not arrived, or its
    /// client has not taken a reply, within the transfer deadline (a
    /// deadline, not a timeout between bytes: a client trickling a byte
    /// now and then holds its slots no longer); true if it was ended.
    /// Lowers `wake_by` to when its next deadline falls, or to a little
    /// later than now when an unaligned write waits for a range another
    /// worker holds (nobody wakes this one when it is given back). `now`
    /// is read once, by the first connection that needs it.
    pub(crate) fn enforce_deadlines(
        &mut self,
        slots: &mut Slots,
        now: &mut Option<Instant>,
        wake_by: &mut Option<Instant>,
    ) -> bool {
        let limit = self.connection.transfer_timeout();
        let mut overdue = None;
        let mut at = |since: &mut Option<Instant>, what: &'static str| {
            let now = *now.get_or_insert_with(Instant::now);
            let deadline = *since.get_or_insert(now) + limit;
            if deadline <= now {
                overdue.get_or_insert(what);
            } else {
                *wake_by = Some(wake_by.map_or(deadline, |w| w.min(deadline)));
            }
        };
        if self.reading && !matches!(self.input, Input::Header) {
            at(&mut self.body_since, "request payload not received");
        }
        if !self.broken && (!self.tx.is_empty() || self.wire.wants_write()) {
            at(&mut self.out_since, "reply not taken by the client");
        } else {
            self.out_since = None;
        }
        if self.unaligned.is_waiting() {
            let now = *now.get_or_insert_with(Instant::now);
            let soon = now + Duration::from_millis(1);
            *wake_by = Some(wake_by.map_or(soon, |w| w.min(soon)));
        }
        match overdue {
            Some(what) => {
                self.end_overdue(slots, what, limit);
                true
            }
            None => false,
        }
    }

    /// What a sleeping worker waits for on this connection: readable when
    /// it can take requests, writable when replies wait (None: neither).
    pub(crate) fn poll_fd(&self) -> Option<libc::pollfd> {
        let mut events = 0;
        if self.reading && !self.stalled {
            events |= libc::POLLIN;
        }
        if (!self.tx.is_empty() || self.wire.wants_write()) && !self.broken {
            events |= libc::POLLOUT;
        }
        (events != 0).then(|| libc::pollfd {
            fd: self.wire.raw_fd(),
            events,
            revents: 0,
        })
    }

    /// Read and start what the client sent; true if anything moved.
    pub(crate) fn pump(&mut self, slots: &mut Slots, index: usize) -> bool {
        let mut progress = false;
        self.stalled = false;
        // A queue that moves data inside `submit` (psync over RAM) has
        // done a request's copy by the time it is taken: take about
        // INLINE_BATCH_BYTES before sending, so that a large read's data
        // is sent while it is still in the CPU's cache.
        let budget = if slots.queue.completes_inline() {
            slots.started_bytes + INLINE_BATCH_BYTES
        } else {
            u64::MAX
        };
        loop {
            if slots.started_bytes >= budget {
                break;
            }
            if budget != u64::MAX && self.unsent >= INLINE_BATCH_BYTES as usize {
                // Send what was read before reading more.
                self.stalled = true;
                break;
            }
            match self.consume(slots, index) {
                Step::Progress => {
                    progress = true;
                    continue;
                }
                Step::Stalled => {
                    self.stalled = true;
                    break;
                }
                Step::NeedBytes => {}
            }
            if !self.reading {
                break;
            }
            match receive(&mut slots.queue, self) {
                Ok(0) => {
                    let reason = match self.input {
                        Input::Header if self.rx_start == self.rx_end => {
                            "client closed the connection".to_string()
                        }
                        _ => "disconnected mid-request: unexpected end of stream".to_string(),
                    };
                    self.stop_reading(slots, reason);
                    progress = true;
                    break;
                }
                Ok(_) => progress = true,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.stop_reading(slots, format!("disconnected mid-request: {e}"));
                    progress = true;
                    break;
                }
            }
        }
        progress
    }

    /// Act on what the receive buffer holds.
    fn consume(&mut self, slots: &mut Slots, index: usize) -> Step {
        let available = self.rx_end - self.rx_start;
        match &mut self.input {
            Input::Header => self.consume_header(slots, index, available),
            Input::Payload { .. } => self.consume_payload(slots, available),
            Input::Skip { left } => {
                let take = (available as u64).min(*left);
                self.rx_start += take as usize;
                *left -= take;
                if *left > 0 {
                    return Step::NeedBytes;
                }
                self.input = Input::Header;
                Step::Progress
            }
            Input::Collect { .. } => self.consume_collect(slots, available),
        }
    }

    /// A request header at the front of the buffer: parsed and accepted.
    fn consume_header(&mut self, slots: &mut Slots, index: usize, available: usize) -> Step {
        if !self.reading || available < REQUEST_HEADER_BYTES {
            return Step::NeedBytes;
        }
        let bytes: &[u8; REQUEST_HEADER_BYTES] = self.rx
            [self.rx_start..self.rx_start + REQUEST_HEADER_BYTES]
            .try_into()
            .expect("header length");
        let request = match RequestHeader::parse(bytes) {
            Ok(request) => request,
            Err(e) => {
                self.connection
                    .log(&format!("event=bad-request reason=\"{e}\""));
                self.stop_reading(slots, "protocol violation".into());
                return Step::NeedBytes;
            }
        };
        if !self.accept(slots, index, request) {
            return Step::Stalled;
        }
        self.rx_start += REQUEST_HEADER_BYTES;
        Step::Progress
    }

    /// A write's payload arriving into its slot: submitted once whole.
    fn consume_payload(&mut self, slots: &mut Slots, available: usize) -> Step {
        let Input::Payload { slot, request, got } = &mut self.input else {
            unreachable!("consume found a payload");
        };
        let (slot, request) = (*slot, *request);
        let length = request.request.length;
        let take = available.min((length - *got) as usize);
        if take > 0 {
            let at = *got as usize;
            slots.queue.buffer_mut(slot)[at..at + take]
                .copy_from_slice(&self.rx[self.rx_start..self.rx_start + take]);
            self.rx_start += take;
            *got += take as u32;
        }
        if *got < length {
            return Step::NeedBytes;
        }
        self.input = Input::Header;
        let submitted = slots.submit_request(slot, OpKind::Write, request);
        if let Err(code) = submitted {
            self.answer_request(slots, &request, Err(code), Data::None);
        }
        Step::Progress
    }

    /// A write's payload collected into a buffer of its own: started as a
    /// job (or as an unaligned write) once whole.
    fn consume_collect(&mut self, slots: &mut Slots, available: usize) -> Step {
        let Input::Collect { buffer, got, .. } = &mut self.input else {
            unreachable!("consume found a collected payload");
        };
        let take = available.min(buffer.len() - *got);
        buffer[*got..*got + take].copy_from_slice(&self.rx[self.rx_start..self.rx_start + take]);
        self.rx_start += take;
        *got += take;
        if *got < buffer.len() {
            return Step::NeedBytes;
        }
        let Input::Collect {
            request,
            permit,
            buffer,
            unaligned,
            ..
        } = std::mem::replace(&mut self.input, Input::Header)
        else {
            unreachable!("matched above");
        };
        if unaligned {
            self.unaligned.write(request, permit, Some(buffer));
            self.start_unaligned(slots);
        } else {
            slots.start(job(self, &request, Work::Write, buffer, permit));
        }
        Step::Progress
    }

    /// Take one request whose header is at the front of the buffer; false
    /// when it must wait for room (it stays in the buffer).
    fn accept(&mut self, slots: &mut Slots, index: usize, request: RequestHeader) -> bool {
        self.connection.note_request();
        if request.command == Command::Disconnect {
            self.stop_reading(slots, "client sent NBD_CMD_DISC".into());
            return true;
        }
        if let Err(rejection) = self.rules.check(&request) {
            if !self.connection.try_acquire(0) {
                return false;
            }
            if request.command == Command::Write {
                expect_body(
                    self,
                    Input::Skip {
                        left: u64::from(request.length),
                    },
                );
            }
            self.connection.log(&format!(
                "event=request-refused command={:?} offset={} length={} error={:?} reason=\"{}\"",
                request.command, request.offset, request.length, rejection.code, rejection.reason
            ));
            let result = Err((rejection.code, rejection.reason));
            self.answer(slots, &request, result, Data::None, 0);
            return true;
        }
        let data_command = matches!(
            request.command,
            Command::Read | Command::Write | Command::WriteZeroes | Command::Trim
        );
        if data_command && !self.unaligned.is_aligned(request.offset, request.length) {
            return self.accept_unaligned(slots, index, request);
        }
        match request.command {
            Command::Read
            | Command::Write
            | Command::Flush
            | Command::Trim
            | Command::WriteZeroes => self.accept_io(slots, index, request),
            Command::BlockStatus => {
                if !self.connection.try_acquire(0) {
                    return false;
                }
                let head = block_status_head(request.cookie, request.length);
                self.queue_reply(slots, reply(head, Data::None, &request, true, 0));
                true
            }
            _ => self.succeed_at_once(slots, &request),
        }
    }

    /// Answer success to a request that moves nothing (false: it waits for
    /// a permit, like every other).
    fn succeed_at_once(&mut self, slots: &mut Slots, request: &RequestHeader) -> bool {
        if !self.connection.try_acquire(0) {
            return false;
        }
        self.answer(slots, request, Ok(()), Data::None, 0);
        true
    }

    /// A request for the target.
    fn accept_io(&mut self, slots: &mut Slots, index: usize, request: RequestHeader) -> bool {
        let with_data = matches!(request.command, Command::Read | Command::Write);
        let bytes = if with_data {
            u64::from(request.length)
        } else {
            0
        };
        if request.command != Command::Flush && request.length == 0 {
            // Nothing to move (and no payload follows).
            return self.succeed_at_once(slots, &request);
        }
        if request.command != Command::Flush && request.length > slots.slot_bytes {
            return self.accept_as_job(slots, request, with_data, bytes);
        }
        if !slots.has_free_slot() || !self.connection.try_acquire(bytes) {
            return false;
        }
        let slot_request = SlotRequest {
            conn: index,
            request,
            permit_bytes: bytes,
        };
        let Some(slot) = slots.take_slot(SlotUse::Receiving) else {
            panic!("invariant: has_free_slot() was checked above");
        };
        if request.command == Command::Write {
            expect_body(
                self,
                Input::Payload {
                    slot,
                    request: slot_request,
                    got: 0,
                },
            );
            return true;
        }
        let Some(work) = Work::of(request.command) else {
            panic!("invariant: accept_io takes the target's commands only");
        };
        let op = slots.prepare(slot, work, request.length);
        if let Err(code) = slots.submit_request(slot, op, slot_request) {
            self.answer_request(slots, &slot_request, Err(code), Data::None);
        }
        true
    }

    /// A request longer than a slot: a job, split into slot-sized pieces
    /// (a write's payload collected first); false when it must wait for
    /// room.
    fn accept_as_job(
        &mut self,
        slots: &mut Slots,
        request: RequestHeader,
        with_data: bool,
        bytes: u64,
    ) -> bool {
        if !slots.has_free_active() || !self.connection.try_acquire(bytes) {
            return false;
        }
        let work = match request.command {
            Command::Read => Work::Read,
            Command::Write => Work::Write,
            Command::Trim => Work::Discard,
            _ => Work::Zero,
        };
        let buffer = if with_data {
            self.connection.buffer(request.length)
        } else {
            Vec::new()
        };
        if work == Work::Write {
            self.collect_payload(request, bytes, buffer, false);
        } else {
            slots.start(job(self, &request, work, buffer, bytes));
        }
        true
    }

    /// Write `request`'s payload follows: collected into `buffer` (of its
    /// length), then started as a job (`unaligned`: as an unaligned write).
    fn collect_payload(
        &mut self,
        request: RequestHeader,
        permit: u64,
        buffer: Vec<u8>,
        unaligned: bool,
    ) {
        assert_eq!(
            buffer.len(),
            request.length as usize,
            "invariant: a write's payload buffer is as long as the write"
        );
        expect_body(
            self,
            Input::Collect {
                request,
                permit,
                buffer,
                got: 0,
                unaligned,
            },
        );
    }

    /// A data request not aligned to the block size: jobs of this worker
    /// (see `unaligned`); false when it must wait for room.
    fn accept_unaligned(
        &mut self,
        slots: &mut Slots,
        index: usize,
        request: RequestHeader,
    ) -> bool {
        if request.command == Command::Trim {
            // The whole blocks inside go the usual way, as their own trim.
            return match self.unaligned.trim_inside(request.offset, request.length) {
                Some((offset, length)) => {
                    let inner = RequestHeader {
                        offset,
                        length,
                        ..request
                    };
                    self.accept_io(slots, index, inner)
                }
                None => self.succeed_at_once(slots, &request),
            };
        }
        let bytes = match request.command {
            Command::Read | Command::Write => u64::from(request.length),
            _ => 0,
        };
        if !slots.has_free_active() || !self.connection.try_acquire(bytes) {
            return false;
        }
        match request.command {
            Command::Read => {
                let buffer = self.connection.buffer(0);
                let io = self.unaligned.read(request, bytes, buffer);
                self.start_patch_io(slots, io);
            }
            Command::Write => {
                let buffer = self.connection.buffer(request.length);
                self.collect_payload(request, bytes, buffer, true);
            }
            _ => {
                self.unaligned.write(request, bytes, None);
                self.start_unaligned(slots);
            }
        }
        true
    }

    /// Start the connection's unaligned writes whose range is free; true
    /// if any started.
    fn start_unaligned(&mut self, slots: &mut Slots) -> bool {
        if !self.unaligned.is_waiting() {
            return false;
        }
        let mut ios = Vec::new();
        self.unaligned
            .start(self.connection.unaligned_ranges(), &mut ios);
        let any = !ios.is_empty();
        for io in ios {
            self.start_patch_io(slots, io);
        }
        any
    }

    /// Run one I/O of an unaligned request as a job of this worker.
    fn start_patch_io(&self, slots: &mut Slots, io: Io) {
        slots.start(Job {
            owner: Arc::clone(&self.patches) as Arc<dyn Finish>,
            cookie: io.id,
            work: io.work,
            offset: io.offset,
            length: io.length,
            fua: io.fua,
            buffer: io.buffer,
            permit_bytes: 0,
            command: match io.work {
                Work::Read => Command::Read,
                _ => Command::Write,
            },
            timed: None,
        });
    }

    /// Move the connection's unaligned requests on: their finished I/Os
    /// lead to the next, or to their answers; waiting writes whose range
    /// is free start. True if anything moved.
    fn advance_unaligned(&mut self, slots: &mut Slots) -> bool {
        let finished = std::mem::take(&mut *self.patches.done.lock().expect("finished jobs"));
        let mut any = !finished.is_empty();
        let mut next = Vec::new();
        for (job, result) in finished {
            let io = Io {
                id: job.cookie,
                work: job.work,
                offset: job.offset,
                length: job.length,
                fua: job.fua,
                buffer: job.buffer,
            };
            let ranges = self.connection.unaligned_ranges();
            if let Some(answer) = self.unaligned.finished(ranges, io, result, &mut next) {
                self.answer_unaligned(slots, answer);
            }
        }
        for io in next {
            self.start_patch_io(slots, io);
        }
        any |= self.start_unaligned(slots);
        any
    }

    fn answer_unaligned(&mut self, slots: &mut Slots, answer: Answer) {
        let result = answer
            .result
            .map_err(|code| (code, "unaligned request failed"));
        let data = match answer.data {
            Some(bytes) => Data::Owned(bytes),
            None => Data::None,
        };
        self.answer(slots, &answer.request, result, data, answer.permit);
    }

    fn answer_request(
        &mut self,
        slots: &mut Slots,
        request: &SlotRequest,
        result: Result<(), ErrorCode>,
        data: Data,
    ) {
        let result = result.map_err(|code| (code, "storage error"));
        self.answer(slots, &request.request, result, data, request.permit_bytes);
    }

    fn answer(
        &mut self,
        slots: &mut Slots,
        request: &RequestHeader,
        result: Result<(), (ErrorCode, &str)>,
        data: Data,
        permit_bytes: u64,
    ) {
        let data_bytes = match &data {
            Data::Slot(_, len) => *len,
            Data::Owned(bytes) => bytes.len() as u32,
            Data::None => 0,
        };
        let head = data_reply_head(
            self.structured,
            request.cookie,
            request.command,
            request.offset,
            data_bytes,
            result,
        );
        let reply = reply(head, data, request, result.is_ok(), permit_bytes);
        self.queue_reply(slots, reply);
    }

    fn queue_reply(&mut self, slots: &mut Slots, reply: Reply) {
        // Counted when answered, before a byte of it reaches the client:
        // a client that asks for the status once it has its reply finds
        // the request there (counting at `settle`, after the write, lost
        // that race now and then).
        self.connection
            .counters
            .record(reply.command, reply.length, reply.ok);
        if self.broken {
            self.settle(slots, reply);
        } else {
            self.unsent += reply.total();
            self.tx.push_back(reply);
        }
    }

    /// A reply was sent (or dropped): give back its permit, slot and
    /// buffer.
    fn settle(&mut self, slots: &mut Slots, reply: Reply) {
        match reply.data {
            Data::Slot(slot, _) => {
                self.held -= 1;
                slots.free_slot(slot);
            }
            Data::Owned(bytes) => self.connection.recycle(bytes),
            Data::None => {}
        }
        self.connection.release(reply.permit_bytes);
    }

    /// Send what waits for the client; true if anything moved.
    pub(crate) fn send(&mut self, slots: &mut Slots) -> bool {
        let mut progress = false;
        if self.wire.wants_write() && !self.broken {
            // TLS records from earlier replies go first.
            match self.wire.flush() {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(e) => {
                    self.break_output(slots, &e);
                    return true;
                }
            }
        }
        while !self.tx.is_empty() && !self.broken {
            let sent = {
                let Owned {
                    tx, tx_sent, wire, ..
                } = &mut *self;
                let mut slices: [IoSlice<'_>; 2 * SEND_BATCH] =
                    std::array::from_fn(|_| IoSlice::new(&[]));
                let mut count = 0;
                let mut skip = *tx_sent;
                for reply in tx.iter().take(SEND_BATCH) {
                    for part in [reply.head.as_slice(), reply.data(slots)] {
                        if skip >= part.len() {
                            skip -= part.len();
                            continue;
                        }
                        slices[count] = IoSlice::new(&part[skip..]);
                        skip = 0;
                        count += 1;
                    }
                }
                wire.send(&slices[..count])
            };
            match sent {
                Ok(0) => {
                    self.break_output(slots, &io::ErrorKind::WriteZero.into());
                }
                Ok(bytes) => {
                    // Progress only when a reply went out whole (its slot
                    // and permit are free again): a socket taking a few
                    // bytes at a time is waited for in poll, not spun on.
                    progress |= self.advance(slots, bytes);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    progress = true;
                    self.break_output(slots, &e);
                }
            }
        }
        progress
    }

    /// `bytes` more of the queued replies went out; true if a reply was
    /// completed.
    fn advance(&mut self, slots: &mut Slots, mut bytes: usize) -> bool {
        self.unsent -= bytes;
        let mut completed = false;
        while let Some(front) = self.tx.front() {
            let left = front.total() - self.tx_sent;
            if bytes < left {
                self.tx_sent += bytes;
                break;
            }
            bytes -= left;
            self.tx_sent = 0;
            let Some(reply) = self.tx.pop_front() else {
                panic!("invariant: the reply being sent is at the front of tx");
            };
            self.settle(slots, reply);
            completed = true;
        }
        if completed {
            // The next reply has the whole deadline to itself.
            self.out_since = None;
        }
        completed
    }

    /// The client cannot be written to: drop every reply, read no more.
    fn break_output(&mut self, slots: &mut Slots, error: &io::Error) {
        self.broken = true;
        self.connection.write_failed(error);
        self.tx_sent = 0;
        self.unsent = 0;
        while let Some(reply) = self.tx.pop_front() {
            self.settle(slots, reply);
        }
        self.stop_reading(slots, format!("write failed: {error}"));
    }

    /// Take no more requests from this connection; a write half-received is dropped.
    fn stop_reading(&mut self, slots: &mut Slots, reason: String) {
        if self.reading {
            self.reading = false;
            self.reason = Some(reason);
        }
        match std::mem::replace(&mut self.input, Input::Header) {
            Input::Payload { slot, request, .. } => {
                slots.free_slot(slot);
                self.connection.release(request.permit_bytes);
            }
            Input::Collect { permit, buffer, .. } => {
                self.connection.recycle(buffer);
                self.connection.release(permit);
            }
            Input::Header | Input::Skip { .. } => {}
        }
    }

    /// A client missed the transfer deadline: say so, drop its replies,
    /// take no more of its requests and hang up.
    fn end_overdue(&mut self, slots: &mut Slots, what: &str, limit: Duration) {
        let reason = format!("{what} within {}s", limit.as_secs_f64());
        self.connection
            .log(&format!("event=transfer-timeout reason=\"{reason}\""));
        self.broken = true;
        self.tx_sent = 0;
        self.unsent = 0;
        while let Some(reply) = self.tx.pop_front() {
            self.settle(slots, reply);
        }
        self.stop_reading(slots, reason);
        self.connection.hang_up();
    }

    /// A request of this connection that sat in a slot completed.
    pub(crate) fn complete_request(
        &mut self,
        slots: &mut Slots,
        completion: Completion,
        request: SlotRequest,
    ) {
        let length = request.request.length;
        let is_read = request.request.command == Command::Read;
        let expected = if request.request.command == Command::Flush {
            0
        } else {
            length
        };
        match completion.result {
            Ok(moved) if moved == expected => {
                if is_read && !self.broken && self.held < slots.hold_limit() {
                    slots.uses[completion.slot as usize] = SlotUse::Sending;
                    self.held += 1;
                    let data = Data::Slot(completion.slot, length);
                    self.answer_request(slots, &request, Ok(()), data);
                } else if is_read && !self.broken {
                    // A client slow to read keeps its data, not the
                    // worker's slots (other clients need them).
                    let mut copy = self.connection.buffer(length);
                    copy.copy_from_slice(&slots.queue.buffer(completion.slot)[..length as usize]);
                    slots.free_slot(completion.slot);
                    self.answer_request(slots, &request, Ok(()), Data::Owned(copy));
                } else {
                    slots.free_slot(completion.slot);
                    self.answer_request(slots, &request, Ok(()), Data::None);
                }
            }
            Ok(_) => {
                slots.free_slot(completion.slot);
                self.answer_request(slots, &request, Err(ErrorCode::Io), Data::None);
            }
            Err(errno) => {
                slots.free_slot(completion.slot);
                let code = ErrorCode::from_errno(errno);
                self.answer_request(slots, &request, Err(code), Data::None);
            }
        }
    }
}

/// Read from the socket: straight into the payload being received (and
/// the header buffer behind it), or into the header buffer.
fn receive(queue: &mut Box<dyn nvraid_io::queue::Queue>, conn: &mut Owned) -> io::Result<usize> {
    if conn.rx_start == conn.rx_end {
        conn.rx_start = 0;
        conn.rx_end = 0;
    } else if conn.rx.len() - conn.rx_end < REQUEST_HEADER_BYTES {
        conn.rx.copy_within(conn.rx_start..conn.rx_end, 0);
        conn.rx_end -= conn.rx_start;
        conn.rx_start = 0;
    }
    let Owned {
        input,
        rx,
        rx_end,
        wire,
        ..
    } = conn;
    let spare = &mut rx[*rx_end..];
    let payload: &mut [u8] = match input {
        Input::Payload { slot, request, got } => {
            let length = request.request.length as usize;
            &mut queue.buffer_mut(*slot)[*got as usize..length]
        }
        Input::Collect { buffer, got, .. } => &mut buffer[*got..],
        Input::Header | Input::Skip { .. } => &mut [],
    };
    let room = payload.len();
    let received = if room == 0 {
        wire.recv(&mut [IoSliceMut::new(spare)])?
    } else {
        wire.recv(&mut [IoSliceMut::new(payload), IoSliceMut::new(spare)])?
    };
    let into_payload = received.min(room);
    match input {
        Input::Payload { got, .. } => *got += into_payload as u32,
        Input::Collect { got, .. } => *got += into_payload,
        _ => {}
    }
    *rx_end += received - into_payload;
    Ok(received)
}

/// The bytes arriving next are a request's payload (`input`): its transfer
/// deadline starts now.
fn expect_body(conn: &mut Owned, input: Input) {
    conn.input = input;
    conn.body_since = Some(Instant::now());
}

fn reply(head: Head, data: Data, request: &RequestHeader, ok: bool, permit_bytes: u64) -> Reply {
    Reply {
        head,
        data,
        command: request.command,
        length: request.length,
        ok,
        permit_bytes,
    }
}

fn job(conn: &Owned, request: &RequestHeader, work: Work, buffer: Vec<u8>, permit: u64) -> Job {
    Job {
        owner: Arc::clone(&conn.local) as Arc<dyn Finish>,
        cookie: request.cookie,
        work,
        offset: request.offset,
        length: request.length,
        fua: request.fua(),
        buffer,
        permit_bytes: permit,
        command: request.command,
        timed: Some(crate::stats::Export::Nbd),
    }
}
