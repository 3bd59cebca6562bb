//! One worker's I/O queue to an NVMe/TCP namespace.
//!
//! Operations become commands (cut at the controller's transfer limit and
//! at 65536 blocks), each in a slot of the queue under a command id that
//! carries the slot and a generation (`generation << 7 | slot`), so a
//! stale or invented id is recognised. Commands beyond the queue's depth
//! wait their turn. Write data goes in the capsule when the controller
//! takes it there, else it is sent as H2CData when the controller asks
//! with R2T; read data arrives as C2HData, checked by the codec's reader
//! against the command (in range, in order) before it lands in the
//! operation's buffers (copied from the staging buffer, or, for the rest
//! of a large read, received straight into them). Everything runs on the thread that owns the
//! channel.
//!
//! The bad day, as for NBD members:
//! - A command older than the request timeout, a closed connection, a
//!   TermReq or a PDU that breaks the protocol ends the connection.
//! - Reads in flight on it are sent again on a new connection (once), and
//!   so is any command not a byte of which was sent; writes and flushes
//!   that were sent fail (ETIMEDOUT after a timeout, else EIO) and the
//!   array above decides.
//! - A new connection gets at most half the time left to the first
//!   operation waiting for it, proves the member's identity before it is
//!   used, and while the target cannot be reached new operations fail at
//!   once, a new connection tried with backoff (250 ms doubling to 5 s).

use super::setup::Conn;
use super::target::Target;
use nvraid_io::engine::{MemberOp, MemberOpKind};
use nvraid_io::remote::Channel;
use nvraid_nvme_tcp::command::Sqe;
use nvraid_nvme_tcp::pdu::{
    crc32c_append, encode_capsule_cmd, encode_h2c_data, DataHeader, Header,
};
use nvraid_nvme_tcp::reader::{Event, Expect, Want};
use nvraid_nvme_tcp::ParseError;
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

const SLOT_BITS: u16 = 7;
const SLOT_MASK: u16 = (1 << SLOT_BITS) - 1;
/// Bytes read per `recv`.
const STAGING_BYTES: usize = 256 * 1024;
/// Read data at least this long goes from the socket straight into the
/// operation's buffer when the staging buffer holds none of it.
const DIRECT_MIN_BYTES: u32 = 16 * 1024;
/// New commands wait while this much is queued to send.
const SEND_QUEUE_BYTES: usize = 4 << 20;
const BACKOFF_MIN: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PieceKind {
    Read,
    Write,
    Flush,
    WriteZeroes,
    /// Zeros written as data (the controller has no Write Zeroes).
    ZeroWrite,
}

#[derive(Clone, Copy, Debug)]
struct Piece {
    op: u32,
    kind: PieceKind,
    /// Where the piece starts in its operation, and its length.
    at: u32,
    len: u32,
    fua: bool,
    resent: bool,
}

#[derive(Clone, Copy, Debug)]
struct Cmd {
    piece: Piece,
    cid: u16,
    /// Data received (reads) or asked for by R2T (writes) so far.
    next: u32,
    /// The controller fetches the data with R2T.
    r2t: bool,
    /// The first byte of the command on the wire (in bytes queued).
    wire_start: u64,
    live: bool,
}

#[derive(Clone, Copy, Debug)]
struct OpRec {
    user_data: u64,
    kind: MemberOpKind,
    offset: u64,
    len: u32,
    single: libc::iovec,
    iov: *const libc::iovec,
    iov_count: u32,
    parts_left: u32,
    errno: i32,
    deadline: Instant,
    live: bool,
}

// SAFETY: the pointers are the caller's buffers, valid until completion
// (the `Channel::push` contract); the channel moves with its worker.
unsafe impl Send for OpRec {}

impl OpRec {
    fn iovecs(&self) -> &[libc::iovec] {
        if self.iov_count == 0 {
            std::slice::from_ref(&self.single)
        } else {
            // SAFETY: the caller keeps `iov_count` iovecs at `iov` valid
            // until the operation completes.
            unsafe { std::slice::from_raw_parts(self.iov, self.iov_count as usize) }
        }
    }
}

struct Live {
    conn: Conn,
    qid: u16,
    /// The controller's generation when the queue connected.
    generation: u64,
}

/// A pipelined NVMe/TCP I/O queue owned by one worker.
pub struct NvmeChannel {
    target: Arc<Target>,
    live: Option<Live>,
    ops: Vec<OpRec>,
    free_ops: Vec<u32>,
    cmds: Vec<Cmd>,
    free_slots: Vec<u16>,
    generation: u16,
    pending: VecDeque<Piece>,
    out: Vec<u8>,
    out_pos: usize,
    queued_total: u64,
    sent_total: u64,
    rx: Vec<u8>,
    ready: Vec<(u64, i32)>,
    live_ops: u32,
    down: Option<(Instant, i32)>,
    backoff: Duration,
    last_failure: Option<String>,
}

impl std::fmt::Debug for NvmeChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmeChannel")
            .field("uri", &self.target.uri.to_string())
            .field("live_ops", &self.live_ops)
            .finish()
    }
}

impl NvmeChannel {
    /// A channel that connects its I/O queue at its first operation.
    pub(crate) fn new(target: Arc<Target>) -> NvmeChannel {
        let depth = target.info.queue_depth.min(super::target::MAX_QUEUE_DEPTH);
        NvmeChannel {
            target,
            live: None,
            ops: Vec::new(),
            free_ops: Vec::new(),
            cmds: vec![
                Cmd {
                    piece: Piece {
                        op: 0,
                        kind: PieceKind::Flush,
                        at: 0,
                        len: 0,
                        fua: false,
                        resent: false,
                    },
                    cid: 0,
                    next: 0,
                    r2t: false,
                    wire_start: 0,
                    live: false,
                };
                usize::from(depth)
            ],
            free_slots: (0..depth).rev().collect(),
            generation: 0,
            pending: VecDeque::new(),
            out: Vec::new(),
            out_pos: 0,
            queued_total: 0,
            sent_total: 0,
            rx: vec![0; STAGING_BYTES],
            ready: Vec::new(),
            live_ops: 0,
            down: None,
            backoff: BACKOFF_MIN,
            last_failure: None,
        }
    }

    /// Why the connection last ended, if it did.
    pub fn last_failure(&self) -> Option<&str> {
        self.last_failure.as_deref()
    }

    /// Block until every operation in flight has been passed on.
    pub fn wait_all(&mut self, on_complete: &mut dyn FnMut(u64, i32)) {
        while self.inflight() > 0 {
            if self.progress(on_complete) == 0 {
                nvraid_io::remote::wait_for(std::iter::once(self as &dyn Channel), None);
            }
        }
    }

    fn alloc_op(&mut self, rec: OpRec) -> u32 {
        match self.free_ops.pop() {
            Some(i) => {
                self.ops[i as usize] = rec;
                i
            }
            None => {
                self.ops.push(rec);
                (self.ops.len() - 1) as u32
            }
        }
    }

    /// One piece of operation `op` done, with `errno` (0: success).
    fn finish_piece(&mut self, piece: Piece, errno: i32) {
        let rec = &mut self.ops[piece.op as usize];
        assert!(
            rec.live,
            "invariant: a piece finishes an operation in flight"
        );
        if errno != 0 && rec.errno == 0 {
            rec.errno = errno;
        }
        rec.parts_left -= 1;
        if rec.parts_left == 0 {
            rec.live = false;
            let result = match (rec.errno, rec.kind) {
                (0, MemberOpKind::Flush) => 0,
                (0, _) => rec.len as i32,
                (e, _) => -e,
            };
            self.ready.push((rec.user_data, result));
            self.free_ops.push(piece.op);
            self.live_ops -= 1;
        }
    }

    fn fail_pending(&mut self, errno: i32) {
        while let Some(piece) = self.pending.pop_front() {
            self.finish_piece(piece, errno);
        }
    }

    /// Connect when operations wait and there is no connection.
    fn ensure_connected(&mut self) {
        if self.live.is_some() || self.pending.is_empty() {
            return;
        }
        let now = Instant::now();
        if let Some((at, errno)) = self.down {
            if now < at {
                self.fail_pending(errno);
                return;
            }
        }
        let first = self
            .pending
            .iter()
            .map(|p| self.ops[p.op as usize].deadline)
            .min()
            .unwrap_or(now);
        let timeout = self
            .target
            .options
            .connect_timeout
            .min(first.saturating_duration_since(now) / 2);
        let generation = self.target.generation();
        match self.target.connect_io(now + timeout) {
            Ok((conn, qid)) => {
                if let Err(e) = conn.stream.set_nonblocking(true) {
                    self.target.release_qid(qid);
                    self.last_failure = Some(e.to_string());
                    self.fail_pending(libc::EIO);
                    return;
                }
                let _ = conn.stream.set_read_timeout(None);
                let _ = conn.stream.set_write_timeout(None);
                self.live = Some(Live {
                    conn,
                    qid,
                    generation,
                });
                self.down = None;
                self.backoff = BACKOFF_MIN;
            }
            Err(e) => {
                let errno = e.errno();
                self.last_failure = Some(e.to_string());
                self.down = Some((Instant::now() + self.backoff, errno));
                self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
                self.fail_pending(errno);
            }
        }
    }

    /// Put waiting pieces into free slots, their capsules on the send
    /// queue.
    fn issue(&mut self) {
        while self.live.is_some()
            && !self.pending.is_empty()
            && !self.free_slots.is_empty()
            && self.out.len() - self.out_pos < SEND_QUEUE_BYTES
        {
            let piece = self.pending.pop_front().expect("checked non-empty");
            let slot = self.free_slots.pop().expect("checked non-empty");
            // Generations 0..=510: command id FFFFh is never used (the
            // error log's "no command").
            self.generation = (self.generation + 1) % (u16::MAX >> SLOT_BITS);
            let cid = (self.generation << SLOT_BITS) | slot;
            self.encode(slot, cid, piece);
        }
    }

    fn encode(&mut self, slot: u16, cid: u16, piece: Piece) {
        let info = &self.target.info;
        let nsid = self.target.uri.nsid;
        let block = u64::from(info.block_bytes);
        let rec = self.ops[piece.op as usize];
        let slba = (rec.offset + u64::from(piece.at)) / block;
        let blocks = (u64::from(piece.len) / block) as u32;
        let live = self.live.as_ref().expect("issue checked the connection");
        let (digests, cpda) = (live.conn.digests, live.conn.cpda);
        let mut r2t = false;
        let mut inline = 0;
        let sqe = match piece.kind {
            PieceKind::Read => Sqe::read(cid, nsid, slba, blocks, piece.len),
            PieceKind::Write | PieceKind::ZeroWrite => {
                let in_capsule = piece.len <= info.in_capsule_bytes;
                r2t = !in_capsule;
                if in_capsule {
                    inline = piece.len;
                }
                Sqe::write(cid, nsid, slba, blocks, piece.len, in_capsule, piece.fua)
            }
            PieceKind::Flush => Sqe::flush(cid, nsid),
            PieceKind::WriteZeroes => Sqe::write_zeroes(cid, nsid, slba, blocks, false, piece.fua),
        };
        let wire_start = self.queued_total;
        let before = self.out.len();
        encode_capsule_cmd(&mut self.out, &sqe, inline as usize, digests, cpda);
        if inline > 0 {
            let crc = self.append_data(piece, 0, inline);
            if digests.data {
                self.out.extend_from_slice(&crc.to_le_bytes());
            }
        }
        self.queued_total += (self.out.len() - before) as u64;
        self.cmds[usize::from(slot)] = Cmd {
            piece,
            cid,
            next: 0,
            r2t,
            wire_start,
            live: true,
        };
    }

    /// Append `[at, at + len)` of the piece's data (the operation's
    /// buffers, or zeros) to the send queue; returns its CRC32C.
    fn append_data(&mut self, piece: Piece, at: u32, len: u32) -> u32 {
        let start = self.out.len();
        self.out.resize(start + len as usize, 0);
        if piece.kind != PieceKind::ZeroWrite {
            let rec = self.ops[piece.op as usize];
            copy_from_iovecs(
                rec.iovecs(),
                (piece.at + at) as usize,
                &mut self.out[start..],
            );
        }
        crc32c_append(0, &self.out[start..])
    }

    fn flush_send(&mut self) -> io::Result<()> {
        let Some(live) = self.live.as_mut() else {
            return Ok(());
        };
        while self.out_pos < self.out.len() {
            match live.conn.stream.write(&self.out[self.out_pos..]) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
                Ok(n) => {
                    self.out_pos += n;
                    self.sent_total += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.out.clear();
        self.out_pos = 0;
        Ok(())
    }

    fn lookup(&self, cid: u16) -> Option<Expect> {
        let cmd = self.cmds.get(usize::from(cid & SLOT_MASK))?;
        if !cmd.live || cmd.cid != cid {
            return None;
        }
        let to_host = cmd.piece.kind == PieceKind::Read;
        (to_host || cmd.r2t).then_some(Expect {
            limit: cmd.piece.len,
            next: cmd.next,
            to_host,
            ttag: 0,
        })
    }

    /// Take in what has arrived. Err: why the connection must end.
    fn receive(&mut self) -> Result<(), String> {
        let Some(mut live) = self.live.take() else {
            return Ok(());
        };
        let result = self.receive_on(&mut live);
        self.live = Some(live);
        result
    }

    fn receive_on(&mut self, live: &mut Live) -> Result<(), String> {
        let mut rx = std::mem::take(&mut self.rx);
        let result = (|| {
            for _ in 0..16 {
                // Read data the staging buffer does not hold goes from the
                // socket straight into the operation's buffer.
                if let Want::Data { cid, offset, len } = live.conn.reader.want() {
                    if len >= DIRECT_MIN_BYTES {
                        let cmd = self.cmds[usize::from(cid & SLOT_MASK)];
                        let rec = self.ops[cmd.piece.op as usize];
                        let part = iovec_part(
                            rec.iovecs(),
                            (cmd.piece.at + offset) as usize,
                            len as usize,
                        );
                        // SAFETY: `part` lies inside the read's buffer (the
                        // reader checked the range against the command),
                        // valid for writes until the operation completes;
                        // nothing else refers to it meanwhile.
                        let dest = unsafe {
                            std::slice::from_raw_parts_mut(part.iov_base.cast::<u8>(), part.iov_len)
                        };
                        let k = match live.conn.stream.read(dest) {
                            Ok(0) => return Err("the target closed the connection".to_string()),
                            Ok(k) => k,
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                                return Err("the target closed the connection (reset)".to_string())
                            }
                            Err(e) => return Err(format!("receive failed: {e}")),
                        };
                        let event = live
                            .conn
                            .reader
                            .data_moved(&dest[..k])
                            .map_err(|e| format!("protocol error: {e}"))?;
                        if let Some(event) = event {
                            self.handle(live, event)?;
                        }
                        continue;
                    }
                }
                let n = match live.conn.stream.read(&mut rx) {
                    Ok(0) => return Err("the target closed the connection".to_string()),
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                        return Err("the target closed the connection (reset)".to_string())
                    }
                    Err(e) => return Err(format!("receive failed: {e}")),
                };
                let mut at = 0;
                while at < n {
                    let avail = n - at;
                    let event = match live.conn.reader.want() {
                        Want::Bytes(k) => {
                            let take = k.min(avail);
                            live.conn.reader.buffer()[..take].copy_from_slice(&rx[at..at + take]);
                            at += take;
                            live.conn.reader.filled(take, &|cid| self.lookup(cid))
                        }
                        Want::Data { cid, offset, len } => {
                            let take = (len as usize).min(avail);
                            let cmd = self.cmds[usize::from(cid & SLOT_MASK)];
                            let rec = self.ops[cmd.piece.op as usize];
                            copy_to_iovecs(
                                rec.iovecs(),
                                (cmd.piece.at + offset) as usize,
                                &rx[at..at + take],
                            );
                            let e = live.conn.reader.data_moved(&rx[at..at + take]);
                            at += take;
                            e
                        }
                    };
                    let event = event.map_err(|e| format!("protocol error: {e}"))?;
                    if let Some(event) = event {
                        self.handle(live, event)?;
                    }
                }
                if n < rx.len() {
                    return Ok(());
                }
            }
            Ok(())
        })();
        self.rx = rx;
        result
    }

    fn cmd_for(&self, cid: u16, pdu: &'static str) -> Result<usize, String> {
        let slot = usize::from(cid & SLOT_MASK);
        match self.cmds.get(slot) {
            Some(c) if c.live && c.cid == cid => Ok(slot),
            _ => Err(format!(
                "protocol error: {}",
                ParseError::UnknownCommand { pdu, cid }
            )),
        }
    }

    fn complete_cmd(&mut self, slot: usize, errno: i32) {
        let cmd = self.cmds[slot];
        self.cmds[slot].live = false;
        self.free_slots.push(slot as u16);
        self.finish_piece(cmd.piece, errno);
    }

    fn handle(&mut self, live: &mut Live, event: Event) -> Result<(), String> {
        match event {
            Event::Header(Header::CapsuleResp { cqe }) => {
                let slot = self.cmd_for(cqe.cid, "CapsuleResp")?;
                let cmd = self.cmds[slot];
                if !cqe.status.is_success() {
                    self.last_failure = Some(format!(
                        "{}: command {:?} at +{} failed: {}",
                        self.target.uri, cmd.piece.kind, cmd.piece.at, cqe.status
                    ));
                    self.complete_cmd(slot, cqe.status.errno());
                    return Ok(());
                }
                let moves_data = cmd.piece.kind == PieceKind::Read || cmd.r2t;
                if moves_data && cmd.next != cmd.piece.len {
                    return Err(format!(
                        "protocol error: command id {} completed after {} of its {} data bytes",
                        cqe.cid, cmd.next, cmd.piece.len
                    ));
                }
                self.complete_cmd(slot, 0);
            }
            Event::Header(Header::R2T { data }) => {
                let slot = self.cmd_for(data.cid, "R2T")?;
                self.cmds[slot].next += data.length;
                let piece = self.cmds[slot].piece;
                let (digests, cpda, max) =
                    (live.conn.digests, live.conn.cpda, live.conn.maxh2cdata);
                let mut at = data.offset;
                let end = data.offset + data.length;
                while at < end {
                    let n = (end - at).min(max);
                    let before = self.out.len();
                    let h = DataHeader {
                        cid: data.cid,
                        ttag: data.ttag,
                        offset: at,
                        length: n,
                    };
                    encode_h2c_data(&mut self.out, &h, at + n == end, digests, cpda);
                    let crc = self.append_data(piece, at, n);
                    if digests.data {
                        self.out.extend_from_slice(&crc.to_le_bytes());
                    }
                    self.queued_total += (self.out.len() - before) as u64;
                    at += n;
                }
            }
            Event::DataDone {
                cid, len, success, ..
            } => {
                let slot = self.cmd_for(cid, "C2HData")?;
                self.cmds[slot].next += len;
                if success {
                    let cmd = self.cmds[slot];
                    if cmd.next != cmd.piece.len {
                        return Err(format!(
                            "protocol error: command id {cid} reported success after {} of its {} bytes",
                            cmd.next, cmd.piece.len
                        ));
                    }
                    self.complete_cmd(slot, 0);
                }
            }
            Event::Header(Header::C2HData { .. }) => {}
            Event::Term(t) => return Err(format!("the target ended the connection: {t}")),
            Event::Header(other) => {
                return Err(format!("protocol error: unexpected PDU {other:?}"))
            }
        }
        Ok(())
    }

    /// End the connection: reads (once) and commands never sent go again
    /// on a new one; the rest fail with `errno`.
    fn connection_lost(&mut self, reason: String, errno: i32) {
        self.last_failure = Some(format!("{}: {reason}", self.target.uri));
        if let Some(live) = self.live.take() {
            let _ = live.conn.stream.shutdown(std::net::Shutdown::Both);
            self.target.release_qid(live.qid);
        }
        self.out.clear();
        self.out_pos = 0;
        let now = Instant::now();
        let mut again = Vec::new();
        for slot in 0..self.cmds.len() {
            let cmd = self.cmds[slot];
            if !cmd.live {
                continue;
            }
            self.cmds[slot].live = false;
            self.free_slots.push(slot as u16);
            let unsent = self.sent_total <= cmd.wire_start;
            let retry_read = cmd.piece.kind == PieceKind::Read && !cmd.piece.resent;
            let in_time = self.ops[cmd.piece.op as usize].deadline > now;
            if (unsent || retry_read) && in_time && errno != libc::ETIMEDOUT {
                let mut piece = cmd.piece;
                piece.resent |= !unsent;
                again.push(piece);
            } else {
                self.finish_piece(cmd.piece, errno);
            }
        }
        self.queued_total = self.sent_total;
        for piece in again.into_iter().rev() {
            self.pending.push_front(piece);
        }
    }

    fn check_deadlines(&mut self) {
        let now = Instant::now();
        let expired = self
            .cmds
            .iter()
            .any(|c| c.live && self.ops[c.piece.op as usize].deadline <= now);
        if expired {
            let reason = format!(
                "a command had no completion within {:.1} s",
                self.target.options.request_timeout.as_secs_f64()
            );
            self.connection_lost(reason, libc::ETIMEDOUT);
        }
        // Operations still waiting for a slot past their deadline fail.
        let mut keep = VecDeque::new();
        while let Some(piece) = self.pending.pop_front() {
            if self.ops[piece.op as usize].deadline <= now {
                self.finish_piece(piece, libc::ETIMEDOUT);
            } else {
                keep.push_back(piece);
            }
        }
        self.pending = keep;
    }
}

impl Channel for NvmeChannel {
    unsafe fn push(&mut self, op: &MemberOp) -> io::Result<()> {
        let deadline = Instant::now() + self.target.options.request_timeout;
        let info = &self.target.info;
        let len: u32 = if op.iov_count > 0 {
            // SAFETY: the caller's iovecs are valid (push contract).
            unsafe { std::slice::from_raw_parts(op.iov, op.iov_count as usize) }
                .iter()
                .map(|v| v.iov_len as u32)
                .sum()
        } else {
            op.len
        };
        let rec = OpRec {
            user_data: op.user_data,
            kind: op.kind,
            offset: op.offset,
            len,
            single: libc::iovec {
                iov_base: op.buf.cast(),
                iov_len: op.len as usize,
            },
            iov: op.iov,
            iov_count: op.iov_count,
            parts_left: 0,
            errno: 0,
            deadline,
            live: true,
        };
        let block = info.block_bytes;
        let end = op.offset.checked_add(u64::from(len));
        let bad = op.kind != MemberOpKind::Flush
            && (!op.offset.is_multiple_of(u64::from(block))
                || !len.is_multiple_of(block)
                || end.is_none_or(|e| e > info.size_bytes));
        if bad {
            self.last_failure = Some(format!(
                "{}: I/O at {}+{len} is not inside the namespace in whole {block}-byte blocks",
                self.target.uri, op.offset
            ));
            self.ready.push((op.user_data, -libc::EINVAL));
            return Ok(());
        }
        if op.kind != MemberOpKind::Flush && len == 0 {
            self.ready.push((op.user_data, 0));
            return Ok(());
        }
        let (kind, max) = match op.kind {
            MemberOpKind::Read => (PieceKind::Read, info.max_command_bytes),
            MemberOpKind::Write => (PieceKind::Write, info.max_command_bytes),
            MemberOpKind::Flush => (PieceKind::Flush, u32::MAX),
            MemberOpKind::Zero if info.write_zeroes => (
                PieceKind::WriteZeroes,
                65536u32.saturating_mul(block).min(1 << 30),
            ),
            MemberOpKind::Zero => (PieceKind::ZeroWrite, info.max_command_bytes),
        };
        let index = self.alloc_op(rec);
        self.live_ops += 1;
        let fua = op.dsync;
        let mut at = 0u32;
        let mut parts = 0;
        loop {
            let n = (len - at).min(max);
            self.pending.push_back(Piece {
                op: index,
                kind,
                at,
                len: n,
                fua,
                resent: false,
            });
            parts += 1;
            at += n;
            if at >= len {
                break;
            }
        }
        self.ops[index as usize].parts_left = parts;
        Ok(())
    }

    fn progress(&mut self, on_complete: &mut dyn FnMut(u64, i32)) -> u32 {
        let gone = self
            .live
            .as_ref()
            .is_some_and(|l| l.generation != self.target.generation());
        if gone {
            let reason = format!(
                "its controller is gone ({}); the I/O queue ends",
                self.target.gone_reason()
            );
            self.connection_lost(reason, libc::EIO);
        }
        for _ in 0..2 {
            self.ensure_connected();
            self.issue();
            if let Err(e) = self.flush_send() {
                self.connection_lost(format!("send failed: {e}"), libc::EIO);
                continue;
            }
            if let Err(reason) = self.receive() {
                self.connection_lost(reason, libc::EIO);
                continue;
            }
            // Completions free slots: more can go now.
            self.issue();
            if let Err(e) = self.flush_send() {
                self.connection_lost(format!("send failed: {e}"), libc::EIO);
                continue;
            }
            break;
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

    fn inflight(&self) -> u32 {
        self.live_ops + self.ready.len() as u32
    }

    fn poll_fds(&self, out: &mut Vec<libc::pollfd>) {
        let Some(live) = &self.live else {
            return;
        };
        if self.live_ops == 0 {
            return;
        }
        let mut events = libc::POLLIN;
        if self.out_pos < self.out.len() {
            events |= libc::POLLOUT;
        }
        out.push(libc::pollfd {
            fd: live.conn.stream.as_raw_fd(),
            events,
            revents: 0,
        });
    }

    fn wake_at(&self) -> Option<Instant> {
        if !self.ready.is_empty() || (self.live.is_none() && !self.pending.is_empty()) {
            return Some(Instant::now());
        }
        self.cmds
            .iter()
            .filter(|c| c.live)
            .map(|c| self.ops[c.piece.op as usize].deadline)
            .chain(
                self.pending
                    .iter()
                    .map(|p| self.ops[p.op as usize].deadline),
            )
            .min()
    }
}

impl Drop for NvmeChannel {
    fn drop(&mut self) {
        if let Some(live) = self.live.take() {
            let _ = live.conn.stream.shutdown(std::net::Shutdown::Both);
            self.target.release_qid(live.qid);
        }
    }
}

/// Copy `dst.len()` bytes from byte `start` of `iov`'s concatenation.
fn copy_from_iovecs(iov: &[libc::iovec], mut start: usize, dst: &mut [u8]) {
    let mut done = 0;
    for v in iov {
        if done == dst.len() {
            return;
        }
        if start >= v.iov_len {
            start -= v.iov_len;
            continue;
        }
        let take = (v.iov_len - start).min(dst.len() - done);
        // SAFETY: the range lies inside the caller's buffer (valid for
        // reads until the operation completes); `dst` is the send queue.
        unsafe {
            std::ptr::copy_nonoverlapping(
                v.iov_base.cast::<u8>().add(start),
                dst[done..].as_mut_ptr(),
                take,
            )
        };
        done += take;
        start = 0;
    }
}

/// The contiguous piece of `iov`'s concatenation that starts at byte
/// `start`, at most `len` bytes (it ends where its iovec ends).
fn iovec_part(iov: &[libc::iovec], mut start: usize, len: usize) -> libc::iovec {
    for v in iov {
        if start >= v.iov_len {
            start -= v.iov_len;
            continue;
        }
        return libc::iovec {
            // Pointer arithmetic only: `start < iov_len`.
            iov_base: v.iov_base.cast::<u8>().wrapping_add(start).cast(),
            iov_len: (v.iov_len - start).min(len),
        };
    }
    panic!("invariant: data for a read lies inside its buffers");
}

/// Copy `src` to byte `start` of `iov`'s concatenation.
fn copy_to_iovecs(iov: &[libc::iovec], mut start: usize, src: &[u8]) {
    let mut done = 0;
    for v in iov {
        if done == src.len() {
            return;
        }
        if start >= v.iov_len {
            start -= v.iov_len;
            continue;
        }
        let take = (v.iov_len - start).min(src.len() - done);
        // SAFETY: the range lies inside the caller's buffer (the reader
        // checked it against the command), valid for writes until the
        // operation completes; `src` is the staging buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src[done..].as_ptr(),
                v.iov_base.cast::<u8>().add(start),
                take,
            )
        };
        done += take;
        start = 0;
    }
}
