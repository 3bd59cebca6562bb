//! One worker's pipelined connection to an NBD export.
//!
//! Operations become NBD requests (split at the server's maximum payload),
//! each under its own cookie (`sequence << 32 | slot`, so a stale or
//! invented cookie is recognised). Requests are sent with vectored,
//! non-blocking sends straight from the operation's buffers; replies are
//! read through a small staging buffer (many small replies per `recv`),
//! and a large read's data goes from the socket straight into the
//! operation's buffers. Everything runs on the thread that owns the
//! channel: no hand-off per request.
//!
//! A read pushed while a read that ends where it starts still waits to be
//! sent joins that request (up to the server's maximum payload and
//! `MERGE_PIECES` operations): a sequential stream cut into chunks by the
//! array reaches the server as fewer, larger requests. The reply's data is
//! spread over the pieces' buffers in order.
//!
//! The bad day:
//! - A request older than the request timeout, a closed connection or a
//!   reply that breaks the protocol ends the connection.
//! - Reads in flight on it are sent again on a new connection (once), and
//!   so is any request not a byte of which was sent (a connection found
//!   closed when a request was about to go on it); writes and flushes
//!   that were sent fail (ETIMEDOUT after a timeout, else EIO), and the
//!   array above decides (a redundant array marks the member faulty and
//!   goes on; RAID 0 reports the error).
//! - Every operation completes within the request timeout of its push,
//!   reconnections included: a retry goes only while its deadline leaves
//!   time (a request that timed out is not retried), and a new connection
//!   is given at most half the time left to the first operation waiting for it
//!   (it blocks the worker, whose other members' operations keep the rest)
//!   (the connect timeout bounds only the member's first connection, made
//!   when it is opened: a worker's channel connecting later, at its first
//!   operation, has that operation's deadline).
//! - Every new connection proves it reaches the member before a request
//!   is sent on it, once the array gave the member an identity check
//!   (`identity`); a different device there fails the operations with
//!   ENXIO.
//! - While the server cannot be reached, new operations fail at once
//!   with the reason's errno, and a new connection is tried with backoff
//!   (250 ms doubling to 5 s).

use crate::session::{self, ExportInfo, Session};
use crate::uri::NbdUri;
use nvraid_io::engine::{MemberOp, MemberOpKind};
use nvraid_io::remote::Channel;
use nvraid_nbd::consts::cmd_flags;
use nvraid_nbd::reply::{Event, ReplyReader, Sent, Want};
use nvraid_nbd::transmission::{Command, RequestHeader};
use nvraid_nbd::ErrorCode;
use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Timeouts of a remote member.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RemoteOptions {
    /// A request without a reply for this long ends its connection.
    pub request_timeout: Duration,
    /// Connecting and the handshake together.
    pub connect_timeout: Duration,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            request_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// Bytes of replies read per `recv` into the staging buffer.
const STAGING_BYTES: usize = 256 * 1024;
/// Read data at least this long goes from the socket straight into the
/// operation's buffer when the staging buffer is empty.
const DIRECT_MIN_BYTES: u32 = 32 * 1024;
/// Reads at least this long are *large*: while one is in flight, the
/// staging buffer takes at most `STAGING_SMALL_BYTES` per `recv`, so that
/// most of a large read's data goes straight to its buffer, not through a
/// copy.
const LARGE_READ_BYTES: u32 = 64 * 1024;
const STAGING_SMALL_BYTES: usize = 1024;
/// Highest receive low watermark set while a large read's data is due.
const RCVLOWAT_MAX_BYTES: usize = 128 * 1024;
/// Iovecs in one send.
const SEND_IOVECS: usize = 64;
/// Operations one merged read request may serve.
const MERGE_PIECES: u32 = 32;
/// No next piece.
const NO_WIRE: u32 = u32::MAX;
/// Backoff between reconnection attempts.
const BACKOFF_MIN: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

#[derive(Clone, Copy, Debug)]
struct OpRec {
    user_data: u64,
    kind: MemberOpKind,
    offset: u64,
    len: u32,
    memory: OpMemory,
    parts_left: u32,
    errno: i32,
    /// Durable on completion without FUA: a FLUSH follows the write.
    flush_after: bool,
    /// The operation completes by then, one way or the other: pushed plus
    /// the request timeout, whatever reconnections happen meanwhile.
    deadline: Instant,
    live: bool,
}

/// An operation's memory as its caller gave it (one buffer, or a list of
/// iovecs), kept by NBD's and NVMe/TCP's channels while it is in flight.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OpMemory {
    single: libc::iovec,
    iov: *const libc::iovec,
    iov_count: u32,
}

// SAFETY: the pointers are the caller's buffers, valid until completion
// (the `Channel::push` contract); the channel moves with its worker.
unsafe impl Send for OpMemory {}

impl OpMemory {
    /// `op`'s memory and its length in bytes.
    ///
    /// # Safety
    /// `op`'s iovecs (when it has some) are valid (`Channel::push`'s
    /// contract), here and until the operation completes.
    pub(crate) unsafe fn of(op: &MemberOp) -> (OpMemory, u32) {
        let memory = OpMemory {
            single: libc::iovec {
                iov_base: op.buf.cast(),
                iov_len: op.len as usize,
            },
            iov: op.iov,
            iov_count: op.iov_count,
        };
        let len = if op.iov_count > 0 {
            memory.iovecs().iter().map(|v| v.iov_len as u32).sum()
        } else {
            op.len
        };
        (memory, len)
    }

    pub(crate) fn iovecs(&self) -> &[libc::iovec] {
        if self.iov_count == 0 {
            std::slice::from_ref(&self.single)
        } else {
            // SAFETY: `push`'s caller keeps `iov_count` iovecs at `iov`
            // valid until the operation completes (`OpMemory::of`).
            unsafe { std::slice::from_raw_parts(self.iov, self.iov_count as usize) }
        }
    }
}

impl OpRec {
    fn iovecs(&self) -> &[libc::iovec] {
        self.memory.iovecs()
    }
}

#[derive(Clone, Copy, Debug)]
struct Wire {
    op: u32,
    seq: u32,
    command: Command,
    flags: u16,
    /// Offset on the export, and of this piece inside its operation.
    offset: u64,
    at: u32,
    len: u32,
    /// The request on the wire: its length (this piece and the pieces
    /// merged into it, `len` for a request of one piece), its piece count,
    /// the next piece and the last (`NO_WIRE`: none). Meaningful on the
    /// first piece, which owns the cookie.
    span: u32,
    pieces: u32,
    next: u32,
    tail: u32,
    /// Counted in `large_reads`.
    large: bool,
    /// Read bytes delivered (data or holes).
    covered: u32,
    errno: i32,
    resent: bool,
    live: bool,
}

impl Wire {
    /// A live request of one piece: `[at, at + len)` of operation `op`, at
    /// `offset` on the export.
    fn new(
        op: u32,
        seq: u32,
        command: Command,
        flags: u16,
        offset: u64,
        at: u32,
        len: u32,
    ) -> Wire {
        Wire {
            op,
            seq,
            command,
            flags,
            offset,
            at,
            len,
            span: len,
            pieces: 1,
            next: NO_WIRE,
            tail: NO_WIRE,
            large: command == Command::Read && len >= LARGE_READ_BYTES,
            covered: 0,
            errno: 0,
            resent: false,
            live: true,
        }
    }
}

/// A pipelined NBD connection owned by one worker.
pub struct NbdChannel {
    uri: NbdUri,
    options: RemoteOptions,
    info: ExportInfo,
    session: Option<Session>,
    reader: ReplyReader,
    ops: Vec<OpRec>,
    free_ops: Vec<u32>,
    wires: Vec<Wire>,
    free_wires: Vec<u32>,
    seq: u32,
    /// Wires to send, the first `head_sent` bytes of the first already sent.
    send_queue: VecDeque<u32>,
    head_sent: usize,
    headers: Vec<[u8; 28]>,
    /// Wires in the order they were sent with their deadlines.
    deadlines: VecDeque<(Instant, u32, u32)>,
    staging: Vec<u8>,
    rx_start: usize,
    rx_end: usize,
    ready: Vec<(u64, i32)>,
    live_ops: u32,
    /// Large reads in flight (see `LARGE_READ_BYTES`).
    large_reads: u32,
    /// The socket's receive low watermark as last set.
    rcvlowat: std::cell::Cell<usize>,
    /// While down: when to try again, and the errno to fail with meanwhile.
    down: Option<(Instant, i32)>,
    backoff: Duration,
    /// Why the connection last ended (for the log and tests).
    last_failure: Option<String>,
    /// What every new connection must prove before a request is sent on
    /// it (None: nothing, as for the first connection of a member).
    identity: Option<Arc<dyn ConnectionProof>>,
    /// The identity probe's own channel: it never reconnects.
    prober: bool,
    /// The next `progress` looks for a closed connection before sending.
    check_alive: bool,
}

impl std::fmt::Debug for NbdChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NbdChannel")
            .field("uri", &self.uri.to_string())
            .field("live_ops", &self.live_ops)
            .finish()
    }
}

impl NbdChannel {
    /// Connect to `uri`; `expected` is what the first connection
    /// negotiated (a server that now says otherwise is refused).
    pub fn connect(
        uri: &NbdUri,
        options: RemoteOptions,
        expected: Option<&ExportInfo>,
    ) -> Result<NbdChannel, session::ConnectError> {
        let session = open_session(uri, options.connect_timeout, expected, None)?;
        Ok(NbdChannel::from_session(uri.clone(), options, session))
    }

    /// [`NbdChannel::connect`], the new connection proving `identity`
    /// before it is used; the channel checks its later connections too.
    pub fn connect_as<P: ConnectionProof + 'static>(
        uri: &NbdUri,
        options: RemoteOptions,
        expected: &ExportInfo,
        identity: &Arc<P>,
    ) -> Result<NbdChannel, session::ConnectError> {
        // A later connection: operations wait for it, so it must not take
        // longer than one may.
        let timeout = options.connect_timeout.min(options.request_timeout);
        let session = open_session(uri, timeout, Some(expected), Some(identity.as_ref()))?;
        Ok(NbdChannel::from_session(uri.clone(), options, session).with_identity(identity))
    }

    /// Check every later connection of this channel against `identity`.
    pub fn with_identity<P: ConnectionProof + 'static>(mut self, identity: &Arc<P>) -> NbdChannel {
        self.identity = Some(Arc::clone(identity) as Arc<dyn ConnectionProof>);
        self
    }

    /// A channel for one request on a new session (the identity probe):
    /// it never reconnects.
    pub(crate) fn prober(uri: NbdUri, options: RemoteOptions, session: Session) -> NbdChannel {
        let mut channel = NbdChannel::from_session(uri, options, session);
        channel.prober = true;
        channel
    }

    /// The session back, when nothing is in flight on it and nothing more
    /// arrived than was asked for.
    pub(crate) fn take_idle_session(&mut self) -> Option<Session> {
        if self.live_ops > 0 || !self.send_queue.is_empty() || self.rx_start != self.rx_end {
            return None;
        }
        self.session.take()
    }

    /// A channel that connects at its first operation (a worker's channel
    /// to a member it may never use: one that failed, say).
    pub fn unconnected(uri: &NbdUri, options: RemoteOptions, info: ExportInfo) -> NbdChannel {
        NbdChannel::with_info(uri.clone(), options, info)
    }

    pub(crate) fn from_session(
        uri: NbdUri,
        options: RemoteOptions,
        session: Session,
    ) -> NbdChannel {
        let mut channel = NbdChannel::with_info(uri, options, session.info.clone());
        channel.session = Some(session);
        channel
    }

    fn with_info(uri: NbdUri, options: RemoteOptions, info: ExportInfo) -> NbdChannel {
        NbdChannel {
            reader: ReplyReader::new(info.structured_replies),
            info,
            session: None,
            uri,
            options,
            ops: Vec::new(),
            free_ops: Vec::new(),
            wires: Vec::new(),
            free_wires: Vec::new(),
            seq: 1,
            send_queue: VecDeque::new(),
            head_sent: 0,
            headers: Vec::new(),
            deadlines: VecDeque::new(),
            staging: vec![0; STAGING_BYTES],
            rx_start: 0,
            rx_end: 0,
            ready: Vec::new(),
            live_ops: 0,
            large_reads: 0,
            rcvlowat: std::cell::Cell::new(1),
            down: None,
            backoff: BACKOFF_MIN,
            last_failure: None,
            identity: None,
            prober: false,
            check_alive: false,
        }
    }

    pub fn info(&self) -> &ExportInfo {
        &self.info
    }

    /// Why the connection last ended, if it did.
    pub fn last_failure(&self) -> Option<&str> {
        self.last_failure.as_deref()
    }

    fn alloc_op(&mut self, rec: OpRec) -> u32 {
        match self.free_ops.pop() {
            Some(i) => {
                assert!(
                    !self.ops[i as usize].live,
                    "invariant: operation record {i} on the free list is not in flight"
                );
                self.ops[i as usize] = rec;
                i
            }
            None => {
                self.ops.push(rec);
                (self.ops.len() - 1) as u32
            }
        }
    }

    fn alloc_wire(&mut self, wire: Wire) -> u32 {
        match self.free_wires.pop() {
            Some(i) => {
                assert!(
                    !self.wires[i as usize].live,
                    "invariant: request {i} on the free list is not in flight"
                );
                self.wires[i as usize] = wire;
                i
            }
            None => {
                self.wires.push(wire);
                self.headers.push([0; 28]);
                (self.wires.len() - 1) as u32
            }
        }
    }

    fn cookie(&self, wire: u32) -> u64 {
        (u64::from(self.wires[wire as usize].seq) << 32) | u64::from(wire)
    }

    /// Put a request for `[at, at + len)` of operation `op` on the send
    /// queue.
    fn issue(&mut self, op: u32, command: Command, at: u32, len: u32, flags: u16) {
        self.seq = self.seq.wrapping_add(1).max(1);
        let offset = self.ops[op as usize].offset + u64::from(at);
        let wire = self.add_wire(Wire::new(op, self.seq, command, flags, offset, at, len));
        self.enqueue(wire);
    }

    /// Take `wire` into the table (counted in `large_reads` where it is
    /// large).
    fn add_wire(&mut self, wire: Wire) -> u32 {
        self.large_reads += u32::from(wire.large);
        self.alloc_wire(wire)
    }

    /// Add the whole of read operation `op` (`len` bytes) to the last
    /// request waiting to be sent when that is a read ending where `op`
    /// starts and the sum stays within `max`. False: nothing changed.
    fn merge_read(&mut self, op: u32, len: u32, max: u32) -> bool {
        let Some(&first) = self.send_queue.back() else {
            return false;
        };
        // A request whose header is partly sent keeps its length.
        if self.send_queue.len() == 1 && self.head_sent > 0 {
            return false;
        }
        let lead = self.wires[first as usize];
        let offset = self.ops[op as usize].offset;
        if lead.command != Command::Read
            || lead.flags != 0
            || lead.resent
            || lead.pieces >= MERGE_PIECES
            || lead.offset + u64::from(lead.span) != offset
            || u64::from(lead.span) + u64::from(len) > u64::from(max)
        {
            return false;
        }
        // Sequence 0: a piece is never sent under a cookie of its own.
        let piece = self.add_wire(Wire::new(op, 0, Command::Read, 0, offset, 0, len));
        let last = if lead.tail == NO_WIRE {
            first
        } else {
            lead.tail
        };
        self.wires[last as usize].next = piece;
        let span = lead.span + len;
        let lead_large = !lead.large && span >= LARGE_READ_BYTES;
        self.large_reads += u32::from(lead_large);
        let w = &mut self.wires[first as usize];
        w.tail = piece;
        w.span = span;
        w.pieces += 1;
        w.large |= lead_large;
        self.headers[first as usize] = RequestHeader {
            flags: 0,
            command: Command::Read,
            cookie: self.cookie(first),
            offset: lead.offset,
            length: span,
        }
        .encode();
        true
    }

    /// Call `part` with each buffer piece of `[at, at + len)` of request
    /// `wire`'s data (its pieces' operation buffers, in order) until it
    /// returns false.
    fn for_each_target(
        &self,
        wire: u32,
        mut at: usize,
        mut len: usize,
        mut part: impl FnMut(libc::iovec) -> bool,
    ) {
        let mut piece = wire;
        while len > 0 && piece != NO_WIRE {
            let w = &self.wires[piece as usize];
            let plen = w.len as usize;
            if at < plen {
                let take = (plen - at).min(len);
                let mut more = true;
                for_each_part(
                    self.ops[w.op as usize].iovecs(),
                    w.at as usize + at,
                    take,
                    |v| {
                        more = part(v);
                        more
                    },
                );
                if !more {
                    return;
                }
                len -= take;
                at = 0;
            } else {
                at -= plen;
            }
            piece = w.next;
        }
    }

    fn enqueue(&mut self, wire: u32) {
        let w = self.wires[wire as usize];
        let (offset, length) = match w.command {
            Command::Flush => (0, 0),
            _ => (w.offset, w.span),
        };
        self.headers[wire as usize] = RequestHeader {
            flags: w.flags,
            command: w.command,
            cookie: self.cookie(wire),
            offset,
            length,
        }
        .encode();
        self.send_queue.push_back(wire);
        let deadline = self.ops[w.op as usize].deadline;
        self.deadlines.push_back((deadline, wire, w.seq));
    }

    fn fail_now(&mut self, user_data: u64, errno: i32) {
        self.ready.push((user_data, -errno));
    }

    /// Send as much of the queue as the socket takes.
    /// Whether an operation pushed now can be queued: there is a
    /// connection, or a new one was made within half the request timeout.
    /// False: the operation (`user_data`) has failed already (the member
    /// is backing off, or the connection could not be made).
    fn ready_to_send(&mut self, user_data: u64) -> bool {
        if self.session.is_some() {
            if self.live_ops == 0 {
                // The connection was idle: see whether the server closed it
                // meanwhile before sending on it (then this request goes on
                // a new connection, not a byte of it sent on the dead one).
                self.check_alive = true;
            }
            return true;
        }
        if let Some((at, errno)) = self.down {
            if Instant::now() < at {
                self.fail_now(user_data, errno);
                return false;
            }
        }
        // The connection counts against the operation's deadline (the
        // member's first connection, made when it was opened, had the
        // connect timeout). It is made on the worker's thread, which other
        // members' operations wait on meanwhile: it gets half of the
        // deadline, so that theirs, pushed at the same time, keep the other
        // half to complete (a member that does not answer must not time
        // out the ones that do).
        let timeout = self
            .options
            .connect_timeout
            .min(self.options.request_timeout / 2);
        if let Err(errno) = self.reconnect(timeout) {
            self.fail_now(user_data, errno);
            return false;
        }
        true
    }

    /// Queue operation `index` (`len` bytes, not zero) as requests of at
    /// most the server's maximum payload, a read merged into the request
    /// before it where it continues it.
    fn issue_parts(&mut self, index: u32, command: Command, flags: u16, len: u32) {
        let max = self.info.maximum_payload.clamp(4096, 32 << 20) / 4096 * 4096;
        self.ops[index as usize].parts_left = len.div_ceil(max);
        if command == Command::Read && self.merge_read(index, len, max) {
            return;
        }
        let mut at = 0;
        while at < len {
            let part = (len - at).min(max);
            self.issue(index, command, at, part, flags);
            at += part;
        }
    }

    fn flush_send(&mut self) -> io::Result<()> {
        let Some(session) = &mut self.session else {
            return Ok(());
        };
        session.transport.flush_tls()?;
        while !self.send_queue.is_empty() {
            let mut iov = IovList::new();
            let mut skip = self.head_sent;
            for &wire in self.send_queue.iter() {
                if iov.count + 2 > SEND_IOVECS {
                    break;
                }
                let w = self.wires[wire as usize];
                let header = &self.headers[wire as usize];
                if skip < header.len() {
                    iov.push(libc::iovec {
                        iov_base: header[skip..].as_ptr().cast_mut().cast(),
                        iov_len: header.len() - skip,
                    });
                    skip = 0;
                } else {
                    skip -= header.len();
                }
                if w.command == Command::Write {
                    let rec = &self.ops[w.op as usize];
                    let (start, len) = (w.at as usize + skip, w.len as usize - skip);
                    for_each_part(rec.iovecs(), start, len, |part| iov.push(part));
                    skip = 0;
                }
            }
            // SAFETY: the iovecs point into `headers` (not touched during
            // the call) and into operations' buffers, valid until they
            // complete.
            let transport = connected_transport(&mut self.session);
            let sent = match unsafe { transport.send_vectored(iov.as_slice()) } {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            self.consume_sent(sent);
        }
        Ok(())
    }

    fn consume_sent(&mut self, mut sent: usize) {
        while let Some(&wire) = self.send_queue.front() {
            let w = self.wires[wire as usize];
            let total = 28
                + if w.command == Command::Write {
                    w.len as usize
                } else {
                    0
                };
            let left = total - self.head_sent;
            if sent >= left {
                sent -= left;
                self.head_sent = 0;
                self.send_queue.pop_front();
            } else {
                self.head_sent += sent;
                return;
            }
        }
    }

    /// Read what has arrived; Err ends the connection.
    fn receive(&mut self) -> Result<(), String> {
        let Some(session) = &self.session else {
            return Ok(());
        };
        // Over TLS every byte comes through rustls's buffer: no direct reads.
        let direct = (!session.transport.is_tls()).then(|| session.transport.raw_fd());
        loop {
            if self.rx_start == self.rx_end {
                self.rx_start = 0;
                self.rx_end = 0;
                if let (Want::Data { cookie, at, len }, Some(fd)) = (self.reader.want(), direct) {
                    if len >= DIRECT_MIN_BYTES {
                        match self.read_direct(fd, cookie, at, len)? {
                            Some(n) => {
                                let event = self.reader.data_moved(n);
                                self.on_event(event)?;
                                continue;
                            }
                            None => return Ok(()),
                        }
                    }
                }
                let take = if self.large_reads > 0 && direct.is_some() {
                    STAGING_SMALL_BYTES
                } else {
                    self.staging.len()
                };
                let transport = connected_transport(&mut self.session);
                match transport.recv(&mut self.staging[..take]) {
                    Ok(0) => return Err("the server closed the connection".into()),
                    Ok(n) => self.rx_end = n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                        return Err(format!("TLS: {e}"))
                    }
                    Err(e) => return Err(format!("receive failed: {e}")),
                }
            }
            let avail = self.rx_end - self.rx_start;
            let event = match self.reader.want() {
                Want::Bytes(n) => {
                    let take = n.min(avail);
                    let src = &self.staging[self.rx_start..self.rx_start + take];
                    self.reader.buffer()[..take].copy_from_slice(src);
                    self.rx_start += take;
                    let wires = &self.wires;
                    let lookup = |cookie: u64| sent_for(wires, cookie);
                    self.reader
                        .filled(take, &lookup)
                        .map_err(|e| format!("protocol error: {e}"))?
                }
                Want::Data { cookie, at, len } => {
                    let take = (len as usize).min(avail);
                    let src = &self.staging[self.rx_start..self.rx_start + take];
                    let mut from = 0;
                    self.for_each_target(cookie as u32, at as usize, take, |part| {
                        copy_into(part, &src[from..from + part.iov_len]);
                        from += part.iov_len;
                        true
                    });
                    self.rx_start += take;
                    self.reader.data_moved(take as u32)
                }
            };
            self.on_event(event)?;
        }
    }

    /// readv straight into an operation's buffers. None: nothing to read.
    fn read_direct(
        &mut self,
        fd: RawFd,
        cookie: u64,
        at: u32,
        len: u32,
    ) -> Result<Option<u32>, String> {
        let mut iov = IovList::new();
        self.for_each_target(cookie as u32, at as usize, len as usize, |part| {
            iov.push(part)
        });
        loop {
            // SAFETY: the iovecs lie inside the operation's buffers, which
            // stay valid and unused by others until it completes.
            match unsafe { nvraid_io::sys::readv(fd, iov.as_slice()) } {
                Ok(0) => return Err("the server closed the connection".into()),
                Ok(n) => return Ok(Some(n as u32)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("receive failed: {e}")),
            }
        }
    }

    fn on_event(&mut self, event: Option<Event>) -> Result<(), String> {
        let Some(event) = event else {
            return Ok(());
        };
        let (cookie, done) = match event {
            Event::DataEnd {
                cookie, len, done, ..
            } => {
                self.wire_mut(cookie).covered += len;
                (cookie, done)
            }
            Event::Hole {
                cookie,
                at,
                len,
                done,
            } => {
                self.for_each_target(cookie as u32, at as usize, len as usize, |part| {
                    // SAFETY: `part` lies inside an operation's buffer (the
                    // reply reader checked the range against the request),
                    // writable until the operation completes.
                    unsafe { std::ptr::write_bytes(part.iov_base.cast::<u8>(), 0, part.iov_len) };
                    true
                });
                self.wire_mut(cookie).covered += len;
                (cookie, done)
            }
            Event::Error {
                cookie,
                error,
                done,
            } => {
                let errno = ErrorCode::from_value(error).map_or(libc::EIO, ErrorCode::to_errno);
                let w = self.wire_mut(cookie);
                if w.errno == 0 {
                    w.errno = errno;
                }
                (cookie, done)
            }
            Event::Done { cookie } => (cookie, true),
        };
        if done {
            let w = self.wires[cookie as u32 as usize];
            if w.command == Command::Read && w.errno == 0 && w.covered != w.span {
                return Err(format!(
                    "protocol error: a read's reply covered {} of its {} bytes",
                    w.covered, w.span
                ));
            }
            // Every piece of the request ends with its reply.
            let mut piece = cookie as u32;
            while piece != NO_WIRE {
                let next = self.wires[piece as usize].next;
                self.finish_wire(piece, w.errno);
                piece = next;
            }
        }
        Ok(())
    }

    fn wire_mut(&mut self, cookie: u64) -> &mut Wire {
        &mut self.wires[cookie as u32 as usize]
    }

    /// A request is over: release it and account it to its operation.
    fn finish_wire(&mut self, wire: u32, errno: i32) {
        let w = &mut self.wires[wire as usize];
        assert!(w.live, "invariant: request {wire} finishes once");
        w.live = false;
        let op = w.op;
        if w.large {
            assert!(
                self.large_reads > 0,
                "invariant: large_reads counts request {wire}"
            );
            self.large_reads -= 1;
        }
        self.free_wires.push(wire);
        let rec = &mut self.ops[op as usize];
        assert!(
            rec.live && rec.parts_left > 0,
            "invariant: request {wire} is a part of operation {op}, in flight"
        );
        if rec.errno == 0 {
            rec.errno = errno;
        }
        rec.parts_left -= 1;
        if rec.parts_left > 0 {
            return;
        }
        if rec.flush_after && rec.errno == 0 {
            rec.flush_after = false;
            rec.parts_left = 1;
            self.issue(op, Command::Flush, 0, 0, 0);
            return;
        }
        let result = if rec.errno != 0 {
            -rec.errno
        } else if matches!(rec.kind, MemberOpKind::Flush | MemberOpKind::Zero) {
            0
        } else {
            rec.len as i32
        };
        rec.live = false;
        let user_data = rec.user_data;
        self.free_ops.push(op);
        assert!(
            self.live_ops > 0,
            "invariant: live_ops counts operation {op}"
        );
        self.live_ops -= 1;
        self.ready.push((user_data, result));
    }

    /// The connection is over. Requests not a byte of which was sent, and
    /// reads in flight, go again on a new one while their deadline leaves
    /// time; everything else fails.
    fn connection_lost(&mut self, reason: String, errno: i32) {
        self.last_failure = Some(reason);
        self.session = None;
        self.reader = ReplyReader::new(self.info.structured_replies);
        let unsent = self.unsent_requests();
        self.send_queue.clear();
        self.head_sent = 0;
        self.deadlines.clear();
        self.rx_start = 0;
        self.rx_end = 0;
        // Merged reads come apart: each piece is its own request again.
        for w in self.wires.iter_mut() {
            w.span = w.len;
            w.pieces = 1;
            w.next = NO_WIRE;
            w.tail = NO_WIRE;
        }
        self.retry_or_fail(&unsent, errno);
    }

    /// Which requests (by index) the server never saw a byte of: those
    /// waiting in the send queue, but the one partly sent. Nothing of them
    /// can have happened, so they go on the new connection, whatever they
    /// are (a write found its idle connection closed, say).
    fn unsent_requests(&self) -> Vec<bool> {
        let mut unsent = vec![false; self.wires.len()];
        for (i, &wire) in self.send_queue.iter().enumerate() {
            if i == 0 && self.head_sent > 0 {
                continue;
            }
            let mut piece = wire;
            while piece != NO_WIRE {
                unsent[piece as usize] = true;
                piece = self.wires[piece as usize].next;
            }
        }
        unsent
    }

    /// After a lost connection: the requests in flight that may go again
    /// (unsent ones, and reads not resent before) do so on a new
    /// connection while their deadline leaves time; the others, and all of
    /// them if no connection can be made, fail with `errno`.
    fn retry_or_fail(&mut self, unsent: &[bool], errno: i32) {
        let now = Instant::now();
        let mut again = Vec::new();
        let mut first_deadline: Option<Instant> = None;
        for index in 0..self.wires.len() as u32 {
            let w = self.wires[index as usize];
            if !w.live {
                continue;
            }
            let deadline = self.ops[w.op as usize].deadline;
            let retry = unsent[index as usize] || (w.command == Command::Read && !w.resent);
            if retry && deadline > now && !self.prober {
                again.push(index);
                first_deadline = Some(first_deadline.map_or(deadline, |d| d.min(deadline)));
            } else {
                // A timed-out request has had its time: it fails (a read
                // is then read from another copy by the array above).
                self.finish_wire(index, errno);
            }
        }
        let Some(first_deadline) = first_deadline else {
            return;
        };
        // Sent again in deadline order, so that the oldest deadline stays
        // at the front of `deadlines`.
        again.sort_by_key(|&wire| self.ops[self.wires[wire as usize].op as usize].deadline);
        // The new connection must not hold the retried requests (nor this
        // worker's others, which wait on the same thread) past the first of
        // their deadlines: it gets half of the time left.
        let timeout = self
            .options
            .connect_timeout
            .min(first_deadline.saturating_duration_since(now) / 2);
        match self.reconnect(timeout) {
            Ok(()) => {
                for wire in again {
                    self.seq = self.seq.wrapping_add(1).max(1);
                    let w = &mut self.wires[wire as usize];
                    w.seq = self.seq;
                    w.resent |= !unsent[wire as usize];
                    w.covered = 0;
                    w.errno = 0;
                    self.enqueue(wire);
                }
            }
            Err(errno) => {
                for wire in again {
                    self.finish_wire(wire, errno);
                }
            }
        }
    }

    /// Try a new connection now, within `timeout`; on failure, back off.
    fn reconnect(&mut self, timeout: Duration) -> Result<(), i32> {
        let fresh = open_session(
            &self.uri,
            timeout,
            Some(&self.info),
            self.identity.as_deref(),
        );
        match fresh {
            Ok(fresh) => {
                self.session = Some(fresh);
                self.rcvlowat.set(1);
                self.reader = ReplyReader::new(self.info.structured_replies);
                self.down = None;
                self.backoff = BACKOFF_MIN;
                Ok(())
            }
            Err(e) => {
                let errno = e.errno();
                self.last_failure = Some(e.to_string());
                self.down = Some((Instant::now() + self.backoff, errno));
                self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
                Err(errno)
            }
        }
    }

    fn check_deadlines(&mut self) {
        let now = Instant::now();
        while let Some(&(deadline, wire, seq)) = self.deadlines.front() {
            let w = self.wires[wire as usize];
            if !w.live || w.seq != seq {
                self.deadlines.pop_front();
                continue;
            }
            if deadline <= now {
                let reason = format!(
                    "a request had no reply within {:.1} s",
                    self.options.request_timeout.as_secs_f64()
                );
                self.connection_lost(reason, libc::ETIMEDOUT);
            }
            return;
        }
    }

    /// Block until every operation in flight has been passed to
    /// `on_complete` (the simple, one-request-at-a-time path).
    pub fn wait_all(&mut self, on_complete: &mut dyn FnMut(u64, i32)) {
        while self.inflight() > 0 {
            if self.progress(on_complete) == 0 {
                nvraid_io::remote::wait_for(std::iter::once(self as &dyn Channel), None);
            }
        }
    }
}

impl Channel for NbdChannel {
    unsafe fn push(&mut self, op: &MemberOp) -> io::Result<()> {
        let deadline = Instant::now() + self.options.request_timeout;
        if !self.ready_to_send(op.user_data) {
            return Ok(());
        }
        let fua = op.dsync && self.info.can_fua();
        // SAFETY: forwarded from the caller (its iovecs are valid).
        let rec = unsafe { op_record(op, fua, deadline) };
        let index = self.alloc_op(rec);
        self.live_ops += 1;
        let (command, flags) = match op.kind {
            MemberOpKind::Read => (Command::Read, 0),
            MemberOpKind::Write if fua => (Command::Write, cmd_flags::FUA),
            MemberOpKind::Write => (Command::Write, 0),
            MemberOpKind::Flush => (Command::Flush, 0),
            MemberOpKind::Zero if fua => (Command::WriteZeroes, cmd_flags::FUA),
            MemberOpKind::Zero => (Command::WriteZeroes, 0),
        };
        if command == Command::Flush {
            self.ops[index as usize].parts_left = 1;
            self.issue(index, Command::Flush, 0, 0, 0);
        } else if rec.len == 0 {
            self.live_ops -= 1;
            self.ops[index as usize].live = false;
            self.free_ops.push(index);
            self.ready.push((op.user_data, 0));
        } else {
            self.issue_parts(index, command, flags, rec.len);
        }
        // Sent at the next `progress` (which every caller reaches before it
        // waits), together with whatever else was pushed until then: one
        // sendmsg, and one wake-up of the server, for a batch of requests.
        Ok(())
    }

    fn progress(&mut self, on_complete: &mut dyn FnMut(u64, i32)) -> u32 {
        if std::mem::take(&mut self.check_alive) && self.session.is_some() {
            if let Err(reason) = self.receive() {
                self.connection_lost(reason, libc::EIO);
            }
        }
        if self.session.is_some() {
            if let Err(e) = self.flush_send() {
                self.connection_lost(format!("send failed: {e}"), libc::EIO);
            }
        }
        if self.session.is_some() {
            if let Err(reason) = self.receive() {
                self.connection_lost(reason, libc::EIO);
            }
        }
        if self.live_ops > 0 {
            self.check_deadlines();
        }
        let passed = self.ready.len() as u32;
        for (user_data, result) in self.ready.drain(..) {
            on_complete(user_data, result);
        }
        passed
    }

    fn poll_fds(&self, out: &mut Vec<libc::pollfd>) {
        if let Some((fd, events)) = self.poll_fd() {
            out.push(libc::pollfd {
                fd,
                events,
                revents: 0,
            });
        }
    }

    fn inflight(&self) -> u32 {
        self.live_ops + self.ready.len() as u32
    }

    fn wake_at(&self) -> Option<Instant> {
        NbdChannel::wake_at(self)
    }
}

impl NbdChannel {
    /// The socket and the events wanted, while requests are in flight.
    pub(crate) fn poll_fd(&self) -> Option<(RawFd, i16)> {
        let session = self.session.as_ref()?;
        if self.live_ops == 0 {
            return None;
        }
        let mut events = libc::POLLIN;
        if !self.send_queue.is_empty() || session.transport.wants_write() {
            events |= libc::POLLOUT;
        }
        // In the middle of a large read's data, wake only when a good part
        // of it has arrived (never more than what is still due: the
        // watermark must not wait for bytes that will not come).
        let lowat = match self.reader.want() {
            Want::Data { len, .. } if self.rx_start == self.rx_end => {
                (len as usize).clamp(1, RCVLOWAT_MAX_BYTES)
            }
            _ => 1,
        };
        if lowat != self.rcvlowat.get() {
            let fd = session.transport.raw_fd();
            if nvraid_io::sys::set_rcvlowat(fd, lowat).is_ok() {
                self.rcvlowat.set(lowat);
            }
        }
        Some((session.transport.raw_fd(), events))
    }

    pub(crate) fn wake_at(&self) -> Option<Instant> {
        if !self.ready.is_empty() || self.rx_start < self.rx_end {
            return Some(Instant::now());
        }
        self.deadlines.front().map(|&(at, _, _)| at)
    }
}

impl Drop for NbdChannel {
    fn drop(&mut self) {
        // An orderly goodbye when nothing is in flight (best effort).
        if let (Some(session), 0) = (&mut self.session, self.live_ops) {
            if self.send_queue.is_empty() {
                let disc = RequestHeader {
                    flags: 0,
                    command: Command::Disconnect,
                    cookie: 0,
                    offset: 0,
                    length: 0,
                }
                .encode();
                let iov = [libc::iovec {
                    iov_base: disc.as_ptr().cast_mut().cast(),
                    iov_len: disc.len(),
                }];
                // SAFETY: the iovec covers `disc`.
                let _ = unsafe { session.transport.send_vectored(&iov) };
            }
        }
    }
}

/// The record of operation `op` in flight on a channel (its length the sum
/// of its iovecs where it has them), due by `deadline`; a durable write
/// without FUA is followed by a FLUSH.
///
/// # Safety
/// `op`'s iovecs, if any, are valid (the `Channel::push` contract).
unsafe fn op_record(op: &MemberOp, fua: bool, deadline: Instant) -> OpRec {
    // SAFETY: the caller's iovecs are valid (push contract).
    let (memory, len) = unsafe { OpMemory::of(op) };
    OpRec {
        user_data: op.user_data,
        kind: op.kind,
        offset: op.offset,
        len,
        memory,
        parts_left: 0,
        errno: 0,
        flush_after: op.dsync
            && !fua
            && matches!(op.kind, MemberOpKind::Write | MemberOpKind::Zero),
        deadline,
        live: true,
    }
}

/// The connection's transport, where the caller found a session on entry
/// and nothing in between drops it.
fn connected_transport(session: &mut Option<Session>) -> &mut crate::session::Transport {
    let Some(session) = session.as_mut() else {
        panic!("invariant: the channel is connected (checked on entry)");
    };
    &mut session.transport
}

fn sent_for(wires: &[Wire], cookie: u64) -> Option<Sent> {
    let w = wires.get(cookie as u32 as usize)?;
    // Sequence 0 is a piece merged into another request: never sent
    // under its own cookie.
    (w.live && w.seq != 0 && u64::from(w.seq) == cookie >> 32).then_some(Sent {
        command: w.command,
        offset: w.offset,
        length: if w.command == Command::Flush {
            0
        } else {
            w.span
        },
    })
}

/// What a new connection must pass before any request is sent on it: the
/// member's proof of identity (the `identity` module's `Identity`, which
/// reads its probe through a channel of its own, so the channel knows it
/// only by this interface).
pub trait ConnectionProof: Send + Sync {
    /// Prove that `session`, just connected to `uri`, reaches the member,
    /// all before `deadline`: the session back when it does, the reason
    /// (`ConnectError::NotTheMember` for another device) when not.
    fn prove(
        &self,
        uri: &NbdUri,
        session: Session,
        deadline: Instant,
    ) -> Result<Session, session::ConnectError>;
}

/// A new connection to `uri` within `timeout`: connected, the handshake
/// done, the export still as `expected` and, with `identity`, proven to be
/// the member (before any request is sent on it).
pub(crate) fn open_session(
    uri: &NbdUri,
    timeout: Duration,
    expected: Option<&ExportInfo>,
    identity: Option<&dyn ConnectionProof>,
) -> Result<Session, session::ConnectError> {
    let deadline = Instant::now() + timeout;
    let session = session::connect(uri, timeout)?;
    if let Some(expected) = expected {
        check_same_export(uri, expected, &session.info)?;
    }
    match identity {
        Some(identity) => identity.prove(uri, session, deadline),
        None => Ok(session),
    }
}

/// A server answering a new connection must still be the export the array
/// was built on.
fn check_same_export(
    uri: &NbdUri,
    expected: &ExportInfo,
    found: &ExportInfo,
) -> Result<(), session::ConnectError> {
    let problem = if found.size_bytes < expected.size_bytes {
        Some(format!(
            "the export shrank from {} to {} bytes",
            expected.size_bytes, found.size_bytes
        ))
    } else if found.read_only() && !expected.read_only() {
        Some("the export became read-only".to_string())
    } else if found.structured_replies != expected.structured_replies {
        Some("the server changed its reply style".to_string())
    } else {
        None
    };
    match problem {
        Some(reason) => Err(session::ConnectError::Io {
            uri: uri.to_string(),
            source: io::Error::other(reason),
        }),
        None => Ok(()),
    }
}

/// Call `part` with each piece of `[start, start + len)` of `iov`'s
/// concatenation, in order, until it returns false (NBD's and NVMe/TCP's
/// channels alike).
pub(crate) fn for_each_part(
    iov: &[libc::iovec],
    mut start: usize,
    mut len: usize,
    mut part: impl FnMut(libc::iovec) -> bool,
) {
    for v in iov {
        if len == 0 {
            return;
        }
        if start >= v.iov_len {
            start -= v.iov_len;
            continue;
        }
        let take = (v.iov_len - start).min(len);
        let piece = libc::iovec {
            // Pointer arithmetic only: `start < iov_len`.
            iov_base: v.iov_base.cast::<u8>().wrapping_add(start).cast(),
            iov_len: take,
        };
        if !part(piece) {
            return;
        }
        start = 0;
        len -= take;
    }
}

/// An operation on one buffer of `len` bytes at `offset` of a member, for
/// the simple path's waited-for calls (NBD's and NVMe/TCP's exports, the
/// identity check).
pub(crate) fn single_op(
    kind: MemberOpKind,
    offset: u64,
    buf: *mut u8,
    len: usize,
    dsync: bool,
) -> MemberOp {
    MemberOp {
        kind,
        file: 0,
        offset,
        buf,
        len: len as u32,
        iov: std::ptr::null(),
        iov_count: 0,
        buf_index: 0,
        dsync,
        user_data: 1,
    }
}

/// A fixed list of iovecs for one system call (no allocation on the I/O
/// path).
struct IovList {
    items: [libc::iovec; SEND_IOVECS],
    count: usize,
}

impl IovList {
    fn new() -> IovList {
        IovList {
            items: [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; SEND_IOVECS],
            count: 0,
        }
    }

    /// Add `v`; false when the list is full.
    fn push(&mut self, v: libc::iovec) -> bool {
        if self.count == SEND_IOVECS {
            return false;
        }
        self.items[self.count] = v;
        self.count += 1;
        true
    }

    fn as_slice(&self) -> &[libc::iovec] {
        &self.items[..self.count]
    }
}

/// Copy `src` into `part` (of the same length).
fn copy_into(part: libc::iovec, src: &[u8]) {
    debug_assert_eq!(part.iov_len, src.len());
    // SAFETY: `part` lies inside an operation's buffer (the reply reader
    // checked the range against the request), valid for writes until the
    // operation completes; `src` is the staging buffer, a distinct one.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), part.iov_base.cast::<u8>(), src.len()) };
}
