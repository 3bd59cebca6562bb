//! One worker's I/O queue to an NVMe/TCP namespace.
//!
//! Operations become commands (cut at the controller's transfer limit and
//! at 65536 blocks), each in a slot of the queue under a command id that
//! carries the slot and a generation (`generation << 7 | slot`), so a
//! stale or invented id is recognised. Commands beyond the queue's depth
//! wait their turn. Write data goes in the capsule when the controller
//! takes it there, else it is sent as H2CData when the controller asks
//! with R2T.
//!
//! No copies of the data: the send queue is a list of segments, PDU
//! headers and digests in a small buffer and the data itself as the
//! operation's own buffers, sent with vectored, non-blocking sends; a
//! command's answer is not believed before all of it was sent (the queue
//! refers to the caller's buffers until then). Read data arrives as
//! C2HData, checked by the codec's reader against the command (in range,
//! in order); data the staging buffer does not already hold is received
//! straight into the operation's buffers (readv, the staging buffer last
//! for the PDUs after it), and while a large read is in flight the staging
//! buffer takes little per call, so most of its data lands directly.
//! Small reads that arrive together, header and data, in one receive are
//! copied out of the staging buffer (one call for many PDUs costs less
//! than one call for each). Everything runs on the thread that owns the
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
use crate::channel::{for_each_part, OpMemory};
use nvraid_io::engine::{MemberOp, MemberOpKind};
use nvraid_io::remote::Channel;
use nvraid_nvme_tcp::command::Sqe;
use nvraid_nvme_tcp::pdu::{
    crc32c_append, encode_capsule_cmd, encode_h2c_data, DataHeader, Header,
};
use nvraid_nvme_tcp::reader::{Event, Expect, Want};
use nvraid_nvme_tcp::ParseError;
use std::collections::VecDeque;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

const SLOT_BITS: u16 = 7;
const SLOT_MASK: u16 = (1 << SLOT_BITS) - 1;
/// Bytes received per call into the staging buffer (many PDUs at once;
/// data that arrives in it behind its header is copied out).
const STAGING_BYTES: usize = 256 * 1024;
/// Reads at least this long are *large*: while one is in flight, the
/// staging buffer takes at most `STAGING_SMALL_BYTES` per call, so that
/// most of its data goes straight to its buffers.
const LARGE_READ_BYTES: u32 = 64 * 1024;
const STAGING_SMALL_BYTES: usize = 1024;
/// Iovecs in one receive (a read's buffers, then the staging buffer).
const RECV_IOVECS: usize = 64;
/// Pieces one merged Read command may serve.
const MERGE_PIECES: usize = 32;
/// New commands wait while this much is queued to send.
const SEND_QUEUE_BYTES: u64 = 4 << 20;
/// Iovecs in one send.
const SEND_IOVECS: usize = 64;
/// Sent bytes of the send queue's header buffer are dropped past this.
const OUT_COMPACT_BYTES: usize = 256 * 1024;
/// What a Write Zeroes the controller lacks sends as its data.
static ZEROS: [u8; 65536] = [0; 65536];
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

/// A run of bytes on the send queue: PDU headers, digests and padding
/// (in `out`), an operation's own data (sent from its buffers), or zeros.
#[derive(Clone, Copy, Debug)]
enum Seg {
    Bytes { start: usize, len: usize },
    Data { op: u32, at: u32, len: u32 },
    Zeros { len: u32 },
}

impl Seg {
    fn len(&self) -> usize {
        match *self {
            Seg::Bytes { len, .. } => len,
            Seg::Data { len, .. } | Seg::Zeros { len } => len as usize,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Cmd {
    /// The command's first piece; a read may carry more (`NvmeChannel::
    /// merged`), contiguous on the namespace, `len` bytes in all.
    piece: Piece,
    len: u32,
    /// The earliest deadline of its pieces' operations.
    deadline: Instant,
    cid: u16,
    /// Data received (reads) or asked for by R2T (writes) so far.
    next: u32,
    /// The controller fetches the data with R2T.
    r2t: bool,
    /// The first byte of the command on the wire (in bytes queued), and
    /// the end of the last one queued for it so far (capsule, H2CData). A
    /// command is not answered before all of it was sent: the send queue
    /// refers to its operation's buffers until then.
    wire_start: u64,
    wire_end: u64,
    live: bool,
}

#[derive(Clone, Copy, Debug)]
struct OpRec {
    user_data: u64,
    kind: MemberOpKind,
    offset: u64,
    len: u32,
    memory: OpMemory,
    parts_left: u32,
    errno: i32,
    deadline: Instant,
    live: bool,
}

impl OpRec {
    fn iovecs(&self) -> &[libc::iovec] {
        self.memory.iovecs()
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
    /// Per slot: the pieces of a merged read after its first.
    merged: Vec<Vec<Piece>>,
    generation: u16,
    pending: VecDeque<Piece>,
    /// The send queue: `segs` in order, `head_sent` bytes of the first
    /// already sent; `out` holds the bytes of its `Seg::Bytes`.
    segs: VecDeque<Seg>,
    head_sent: usize,
    out: Vec<u8>,
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
                    len: 0,
                    deadline: Instant::now(),
                    cid: 0,
                    next: 0,
                    r2t: false,
                    wire_start: 0,
                    wire_end: 0,
                    live: false,
                };
                usize::from(depth)
            ],
            free_slots: (0..depth).rev().collect(),
            merged: vec![Vec::new(); usize::from(depth)],
            generation: 0,
            pending: VecDeque::new(),
            segs: VecDeque::new(),
            head_sent: 0,
            out: Vec::new(),
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
            && self.queued_total - self.sent_total < SEND_QUEUE_BYTES
        {
            let piece = self.pending.pop_front().expect("checked non-empty");
            let slot = self.free_slots.pop().expect("checked non-empty");
            // Generations 0..=510: command id FFFFh is never used (the
            // error log's "no command").
            self.generation = (self.generation + 1) % (u16::MAX >> SLOT_BITS);
            let cid = (self.generation << SLOT_BITS) | slot;
            let len = self.merge_reads(slot, piece);
            self.encode(slot, cid, piece, len);
        }
    }

    /// Reads waiting behind `piece` (a read) that continue it on the
    /// namespace join its command, up to the controller's transfer limit
    /// and `MERGE_PIECES` pieces: the array's chunks of one sequential
    /// stream reach the target as fewer, larger commands. Returns the
    /// command's length.
    fn merge_reads(&mut self, slot: u16, piece: Piece) -> u32 {
        let mut len = piece.len;
        if piece.kind != PieceKind::Read || piece.resent {
            return len;
        }
        let block = self.target.info.block_bytes;
        let max = self
            .target
            .info
            .max_command_bytes
            .min(65536u32.saturating_mul(block));
        let mut end = self.ops[piece.op as usize].offset + u64::from(piece.at) + u64::from(len);
        let extra = &mut self.merged[usize::from(slot)];
        while let Some(&next) = self.pending.front() {
            let start = self.ops[next.op as usize].offset + u64::from(next.at);
            let fits = u64::from(len) + u64::from(next.len) <= u64::from(max);
            if next.kind != PieceKind::Read
                || next.resent
                || start != end
                || !fits
                || extra.len() + 1 >= MERGE_PIECES
            {
                break;
            }
            self.pending.pop_front();
            extra.push(next);
            len += next.len;
            end += u64::from(next.len);
        }
        len
    }

    /// The pieces of the command in `slot`, in order.
    fn cmd_pieces(&self, slot: usize) -> impl Iterator<Item = Piece> + '_ {
        std::iter::once(self.cmds[slot].piece).chain(self.merged[slot].iter().copied())
    }

    /// The memory of `[offset, offset + len)` of the command in `slot`'s
    /// data (its pieces' buffers, in order), while `part` returns true.
    fn for_each_cmd_part(
        &self,
        slot: usize,
        offset: u32,
        len: u32,
        mut part: impl FnMut(libc::iovec) -> bool,
    ) {
        let (mut at, end) = (0u32, offset + len);
        let mut more = true;
        for p in self.cmd_pieces(slot) {
            let (lo, hi) = (at.max(offset), (at + p.len).min(end));
            if lo < hi && more {
                let rec = &self.ops[p.op as usize];
                for_each_part(
                    rec.iovecs(),
                    (p.at + lo - at) as usize,
                    (hi - lo) as usize,
                    |v| {
                        more = part(v);
                        more
                    },
                );
            }
            at += p.len;
            if at >= end || !more {
                return;
            }
        }
    }

    fn encode(&mut self, slot: u16, cid: u16, piece: Piece, len: u32) {
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
            PieceKind::Read => {
                let blocks = (u64::from(len) / block) as u32;
                Sqe::read(cid, nsid, slba, blocks, len)
            }
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
        let start = self.out.len();
        encode_capsule_cmd(&mut self.out, &sqe, inline as usize, digests, cpda);
        self.queue_bytes(start);
        if inline > 0 {
            self.queue_data(piece, 0, inline, digests.data);
        }
        let deadline = self.merged[usize::from(slot)]
            .iter()
            .map(|p| self.ops[p.op as usize].deadline)
            .fold(rec.deadline, Instant::min);
        self.cmds[usize::from(slot)] = Cmd {
            piece,
            len,
            deadline,
            cid,
            next: 0,
            r2t,
            wire_start,
            wire_end: self.queued_total,
            live: true,
        };
    }

    /// Queue the bytes of `out` from `start` on (just encoded) to send.
    fn queue_bytes(&mut self, start: usize) {
        let len = self.out.len() - start;
        self.queued_total += len as u64;
        if let Some(Seg::Bytes { start: s, len: l }) = self.segs.back_mut() {
            if *s + *l == start {
                *l += len;
                return;
            }
        }
        self.segs.push_back(Seg::Bytes { start, len });
    }

    /// Queue `[at, at + len)` of the piece's data to send from the
    /// operation's own buffers (zeros for a ZeroWrite), then its data
    /// digest if `digest`.
    fn queue_data(&mut self, piece: Piece, at: u32, len: u32, digest: bool) {
        let seg = if piece.kind == PieceKind::ZeroWrite {
            Seg::Zeros { len }
        } else {
            Seg::Data {
                op: piece.op,
                at: piece.at + at,
                len,
            }
        };
        self.segs.push_back(seg);
        self.queued_total += u64::from(len);
        if digest {
            let mut crc = 0;
            self.for_each_seg_part(seg, 0, |part| {
                // SAFETY: `part` lies inside the operation's buffer (valid
                // for reads until it completes) or in ZEROS.
                let bytes =
                    unsafe { std::slice::from_raw_parts(part.iov_base.cast::<u8>(), part.iov_len) };
                crc = crc32c_append(crc, bytes);
                true
            });
            let start = self.out.len();
            self.out.extend_from_slice(&crc.to_le_bytes());
            self.queue_bytes(start);
        }
    }

    /// The memory of `seg` past its first `skip` bytes, in pieces, while
    /// `part` returns true.
    fn for_each_seg_part(&self, seg: Seg, skip: usize, mut part: impl FnMut(libc::iovec) -> bool) {
        match seg {
            Seg::Bytes { start, len } => {
                part(libc::iovec {
                    iov_base: self.out[start + skip..].as_ptr().cast_mut().cast(),
                    iov_len: len - skip,
                });
            }
            Seg::Data { op, at, len } => {
                let rec = &self.ops[op as usize];
                for_each_part(rec.iovecs(), at as usize + skip, len as usize - skip, part);
            }
            Seg::Zeros { len } => {
                let mut left = len as usize - skip;
                while left > 0 {
                    let n = left.min(ZEROS.len());
                    let more = part(libc::iovec {
                        iov_base: ZEROS.as_ptr().cast_mut().cast(),
                        iov_len: n,
                    });
                    if !more {
                        return;
                    }
                    left -= n;
                }
            }
        }
    }

    /// Send what the queue holds, vectored, without copying: headers from
    /// `out`, data from the operations' buffers.
    fn flush_send(&mut self) -> io::Result<()> {
        let Some(live) = self.live.as_ref() else {
            return Ok(());
        };
        let fd = live.conn.stream.as_raw_fd();
        while !self.segs.is_empty() {
            let mut iov = [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; SEND_IOVECS];
            let mut count = 0;
            let mut skip = self.head_sent;
            for &seg in &self.segs {
                self.for_each_seg_part(seg, skip, |part| {
                    if count == SEND_IOVECS {
                        return false;
                    }
                    iov[count] = part;
                    count += 1;
                    true
                });
                skip = 0;
                if count == SEND_IOVECS {
                    break;
                }
            }
            // SAFETY: the iovecs point into `out` (not touched during the
            // call), into ZEROS and into operations' buffers, valid for
            // reads until the operations complete, which they do not
            // before their bytes are sent (`wire_end`) or the queue is
            // dropped (`connection_lost`).
            let sent = match unsafe { nvraid_io::sys::send_vectored(fd, &iov[..count]) } {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            self.sent_total += sent as u64;
            let mut sent = sent;
            while let Some(seg) = self.segs.front() {
                let left = seg.len() - self.head_sent;
                if sent < left {
                    self.head_sent += sent;
                    break;
                }
                sent -= left;
                self.head_sent = 0;
                self.segs.pop_front();
            }
            self.compact_out();
        }
        self.out.clear();
        Ok(())
    }

    /// Drop the bytes of `out` already sent once they are many (a queue
    /// that never empties would otherwise keep them all).
    fn compact_out(&mut self) {
        let first = self.segs.iter().find_map(|seg| match *seg {
            Seg::Bytes { start, .. } => Some(start),
            _ => None,
        });
        let sent = first.unwrap_or(self.out.len());
        if sent < OUT_COMPACT_BYTES {
            return;
        }
        self.out.drain(..sent);
        for seg in self.segs.iter_mut() {
            if let Seg::Bytes { start, .. } = seg {
                *start -= sent;
            }
        }
    }

    fn lookup(&self, cid: u16) -> Option<Expect> {
        let cmd = self.cmds.get(usize::from(cid & SLOT_MASK))?;
        if !cmd.live || cmd.cid != cid {
            return None;
        }
        let to_host = cmd.piece.kind == PieceKind::Read;
        (to_host || cmd.r2t).then_some(Expect {
            limit: cmd.len,
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
            let fd = live.conn.stream.as_raw_fd();
            for _ in 0..16 {
                // While a large read is in flight, the staging buffer takes
                // little per call, so that most of its data is received
                // straight into its buffer, not copied.
                let large = self.cmds.iter().any(|c| {
                    c.live && c.piece.kind == PieceKind::Read && c.len >= LARGE_READ_BYTES
                });
                let take = if large { STAGING_SMALL_BYTES } else { rx.len() };
                let mut iov = [libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                }; RECV_IOVECS];
                let mut count = 0;
                let mut direct = 0;
                // Read data the staging buffer does not hold goes from the
                // socket straight into the operation's buffers; what
                // follows it, into the staging buffer in the same call.
                if let Want::Data { cid, offset, len } = live.conn.reader.want() {
                    let slot = usize::from(cid & SLOT_MASK);
                    self.for_each_cmd_part(slot, offset, len, |part| {
                        if count == RECV_IOVECS - 1 {
                            return false;
                        }
                        iov[count] = part;
                        count += 1;
                        direct += part.iov_len;
                        true
                    });
                }
                iov[count] = libc::iovec {
                    iov_base: rx.as_mut_ptr().cast(),
                    iov_len: take,
                };
                count += 1;
                // SAFETY: the first iovecs lie inside a read's buffers (the
                // reader checked the range against the command), valid for
                // writes until the operation completes, with nothing else
                // referring to them meanwhile; the last is the staging
                // buffer.
                let n = match unsafe { nvraid_io::sys::readv(fd, &iov[..count]) } {
                    Ok(0) => return Err("the target closed the connection".to_string()),
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                        return Err("the target closed the connection (reset)".to_string())
                    }
                    Err(e) => return Err(format!("receive failed: {e}")),
                };
                let mut left = n.min(direct);
                for part in &iov[..count - 1] {
                    if left == 0 {
                        break;
                    }
                    let k = part.iov_len.min(left);
                    left -= k;
                    // SAFETY: `readv` filled these bytes of the part.
                    let bytes =
                        unsafe { std::slice::from_raw_parts(part.iov_base.cast::<u8>(), k) };
                    let event = live
                        .conn
                        .reader
                        .data_moved(bytes)
                        .map_err(|e| format!("protocol error: {e}"))?;
                    if let Some(event) = event {
                        self.handle(live, event)?;
                    }
                }
                let staged = n - n.min(direct);
                self.take_staged(live, &rx[..staged])?;
                if n < direct + take {
                    return Ok(());
                }
            }
            Ok(())
        })();
        self.rx = rx;
        result
    }

    /// Pass received bytes through the PDU reader; read data is copied
    /// to its operation's buffers.
    fn take_staged(&mut self, live: &mut Live, rx: &[u8]) -> Result<(), String> {
        let mut at = 0;
        while at < rx.len() {
            let avail = rx.len() - at;
            let event = match live.conn.reader.want() {
                Want::Bytes(k) => {
                    let take = k.min(avail);
                    live.conn.reader.buffer()[..take].copy_from_slice(&rx[at..at + take]);
                    at += take;
                    live.conn.reader.filled(take, &|cid| self.lookup(cid))
                }
                Want::Data { cid, offset, len } => {
                    let take = (len as usize).min(avail);
                    let src = &rx[at..at + take];
                    let mut from = 0;
                    self.for_each_cmd_part(
                        usize::from(cid & SLOT_MASK),
                        offset,
                        take as u32,
                        |part| {
                            // SAFETY: `part` lies inside a read's buffer (the
                            // reader checked the range against the command),
                            // valid for writes until the operation completes;
                            // `src` is the staging buffer.
                            unsafe {
                                std::ptr::copy_nonoverlapping(
                                    src[from..].as_ptr(),
                                    part.iov_base.cast::<u8>(),
                                    part.iov_len,
                                )
                            };
                            from += part.iov_len;
                            true
                        },
                    );
                    let e = live.conn.reader.data_moved(src);
                    at += take;
                    e
                }
            };
            let event = event.map_err(|e| format!("protocol error: {e}"))?;
            if let Some(event) = event {
                self.handle(live, event)?;
            }
        }
        Ok(())
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
        let mut extra = std::mem::take(&mut self.merged[slot]);
        for piece in extra.drain(..) {
            self.finish_piece(piece, errno);
        }
        self.merged[slot] = extra;
    }

    fn handle(&mut self, live: &mut Live, event: Event) -> Result<(), String> {
        match event {
            Event::Header(Header::CapsuleResp { cqe }) => {
                let slot = self.cmd_for(cqe.cid, "CapsuleResp")?;
                let cmd = self.cmds[slot];
                if self.sent_total < cmd.wire_end {
                    // Its data is still on the send queue (which refers to
                    // the operation's buffers): the target cannot have it.
                    return Err(format!(
                        "protocol error: command id {} was answered before all of it was sent ({} of its bytes still queued)",
                        cqe.cid,
                        cmd.wire_end - self.sent_total.max(cmd.wire_start)
                    ));
                }
                if !cqe.status.is_success() {
                    self.last_failure = Some(format!(
                        "{}: command {:?} at +{} failed: {}",
                        self.target.uri, cmd.piece.kind, cmd.piece.at, cqe.status
                    ));
                    self.complete_cmd(slot, cqe.status.errno());
                    return Ok(());
                }
                let moves_data = cmd.piece.kind == PieceKind::Read || cmd.r2t;
                if moves_data && cmd.next != cmd.len {
                    return Err(format!(
                        "protocol error: command id {} completed after {} of its {} data bytes",
                        cqe.cid, cmd.next, cmd.len
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
                    let start = self.out.len();
                    let h = DataHeader {
                        cid: data.cid,
                        ttag: data.ttag,
                        offset: at,
                        length: n,
                    };
                    encode_h2c_data(&mut self.out, &h, at + n == end, digests, cpda);
                    self.queue_bytes(start);
                    self.queue_data(piece, at, n, digests.data);
                    at += n;
                }
                self.cmds[slot].wire_end = self.queued_total;
            }
            Event::DataDone {
                cid, len, success, ..
            } => {
                let slot = self.cmd_for(cid, "C2HData")?;
                self.cmds[slot].next += len;
                if success {
                    let cmd = self.cmds[slot];
                    if cmd.next != cmd.len {
                        return Err(format!(
                            "protocol error: command id {cid} reported success after {} of its {} bytes",
                            cmd.next, cmd.len
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
        // The send queue goes first: it refers to operations' buffers.
        self.segs.clear();
        self.head_sent = 0;
        self.out.clear();
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
            let mut extra = std::mem::take(&mut self.merged[slot]);
            for piece in std::iter::once(cmd.piece).chain(extra.drain(..)) {
                let retry_read = piece.kind == PieceKind::Read && !piece.resent;
                let in_time = self.ops[piece.op as usize].deadline > now;
                if (unsent || retry_read) && in_time && errno != libc::ETIMEDOUT {
                    let mut piece = piece;
                    piece.resent |= !unsent;
                    again.push(piece);
                } else {
                    self.finish_piece(piece, errno);
                }
            }
            self.merged[slot] = extra;
        }
        self.queued_total = self.sent_total;
        for piece in again.into_iter().rev() {
            self.pending.push_front(piece);
        }
    }

    fn check_deadlines(&mut self) {
        let now = Instant::now();
        let expired = self.cmds.iter().any(|c| c.live && c.deadline <= now);
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
        // SAFETY: the caller's iovecs are valid (push contract).
        let (memory, len) = unsafe { OpMemory::of(op) };
        let rec = OpRec {
            user_data: op.user_data,
            kind: op.kind,
            offset: op.offset,
            len,
            memory,
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
        if !self.segs.is_empty() {
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
            .map(|c| c.deadline)
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
