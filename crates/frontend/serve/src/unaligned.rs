//! Requests whose offset or length is not a multiple of the export's
//! minimum block size, from clients that negotiated no block sizes
//! (NBD_OPT_EXPORT_NAME, or GO without NBD_INFO_BLOCK_SIZE). proto.md says a
//! server SHOULD serve them; this one does, through the worker's own queue,
//! as jobs of the connection's worker (never a queue or a wait of their
//! own):
//!
//! - a read reads the aligned blocks around the range and returns its part;
//! - a write (or write-zeroes) reads the first and last partial block,
//!   patches them and writes the aligned range back (read-modify-write),
//!   holding the aligned range in the server's [`RangeLocks`] from before
//!   the reads until the write is done, so that two such writes into one
//!   block cannot lose each other's bytes;
//! - a trim trims only the whole blocks inside its range (a trim may leave
//!   any byte as it was).
//!
//! Nothing here blocks a worker. The range is taken with a try-lock; a
//! write that finds it held waits in its connection's table and is tried
//! again at each turn of the worker's loop. Its reads and its write are
//! ordinary jobs, reaped with every other request of the worker, so a
//! request of this worker that holds a stripe the read-modify-write needs
//! still completes (a worker that waited inside an unaligned request for
//! such a stripe, or for a lock another worker held while its own queue
//! sat unreaped, stopped serving for good). A range holder waits only for
//! stripes, which are taken all or none and never held while waiting for
//! anything but I/O, so no cycle of waits can form.
//!
//! This module is the bookkeeping (sans I/O): what to read, what to write,
//! what to answer; `reactor` turns its [`Io`]s into jobs and its
//! [`Answer`]s into replies. Aligned requests never come here. Each
//! unaligned request costs one round trip to the array for a read, two for
//! a write that is unaligned at either end, which is what the protocol's
//! block-size negotiation exists to avoid.

use std::sync::Mutex;

use nvraid_nbd::{ErrorCode, RequestHeader};

use crate::job::Work;

/// Byte ranges of the export being read-modify-written, server-wide.
#[derive(Default)]
pub(crate) struct RangeLocks {
    held: Mutex<Vec<(u64, u64)>>,
}

impl RangeLocks {
    /// Take `[start, end)` if no held range overlaps it; never waits.
    pub(crate) fn try_take(&self, start: u64, end: u64) -> bool {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if held.iter().any(|&(s, e)| s < end && start < e) {
            return false;
        }
        held.push((start, end));
        true
    }

    /// Give back a range [`RangeLocks::try_take`] gave.
    pub(crate) fn release(&self, start: u64, end: u64) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let Some(at) = held.iter().position(|&r| r == (start, end)) else {
            panic!("invariant: range {start}..{end} is released once, by its holder");
        };
        held.swap_remove(at);
    }
}

/// An I/O for the worker to run as a job: `id` comes back with its end.
pub(crate) struct Io {
    pub id: u64,
    pub work: Work,
    pub offset: u64,
    pub length: u32,
    pub fua: bool,
    /// A read's destination, or a write's data (`length` long).
    pub buffer: Vec<u8>,
}

/// A request of this connection that is done.
pub(crate) struct Answer {
    pub request: RequestHeader,
    pub permit: u64,
    pub result: Result<(), ErrorCode>,
    /// A read's data.
    pub data: Option<Vec<u8>>,
}

/// Where one unaligned request is.
#[derive(Clone, Copy)]
enum Phase {
    /// A read of the aligned range, in flight.
    Reading,
    /// A write waiting for its range.
    Waiting,
    /// A write's reads of its partial end blocks, in flight.
    Filling { left: u32 },
    /// A write's write of the aligned range, in flight.
    Writing,
}

struct Patch {
    request: RequestHeader,
    permit: u64,
    /// The aligned range around the request.
    start: u64,
    len: u32,
    /// A write's data (None: zeroes).
    data: Option<Vec<u8>>,
    /// The aligned range's bytes (a write's, once its ends are read).
    buffer: Vec<u8>,
    phase: Phase,
    error: Option<ErrorCode>,
}

/// A connection's unaligned requests.
pub(crate) struct Unaligned {
    block: u64,
    size: u64,
    patches: Vec<Option<Patch>>,
    /// Writes in `Phase::Waiting`.
    waiting: usize,
}

impl Unaligned {
    pub(crate) fn new(block: u32, size: u64) -> Unaligned {
        Unaligned {
            block: u64::from(block.max(1)),
            size,
            patches: Vec::new(),
            waiting: 0,
        }
    }

    pub(crate) fn is_aligned(&self, offset: u64, length: u32) -> bool {
        offset.is_multiple_of(self.block) && u64::from(length).is_multiple_of(self.block)
    }

    /// Whether a write waits for a range another request holds.
    pub(crate) fn is_waiting(&self) -> bool {
        self.waiting > 0
    }

    /// The aligned range around `[offset, offset + length)`.
    fn around(&self, offset: u64, length: u32) -> (u64, u32) {
        let start = offset / self.block * self.block;
        let end = (offset + u64::from(length)).div_ceil(self.block) * self.block;
        let end = end.min(self.size);
        (start, (end - start) as u32)
    }

    fn file(&mut self, patch: Patch) -> u64 {
        let id = match self.patches.iter().position(Option::is_none) {
            Some(free) => {
                self.patches[free] = Some(patch);
                free
            }
            None => {
                self.patches.push(Some(patch));
                self.patches.len() - 1
            }
        };
        id as u64
    }

    /// A read: the I/O that reads the aligned range around it.
    pub(crate) fn read(&mut self, request: RequestHeader, permit: u64, buffer: Vec<u8>) -> Io {
        let (start, len) = self.around(request.offset, request.length);
        let mut buffer = buffer;
        buffer.clear();
        buffer.resize(len as usize, 0);
        let id = self.file(Patch {
            request,
            permit,
            start,
            len,
            data: None,
            buffer: Vec::new(),
            phase: Phase::Reading,
            error: None,
        });
        Io {
            id,
            work: Work::Read,
            offset: start,
            length: len,
            fua: false,
            buffer,
        }
    }

    /// A write of `data` (None: zeroes): it waits for its range; `start`
    /// starts it when the range is free.
    pub(crate) fn write(&mut self, request: RequestHeader, permit: u64, data: Option<Vec<u8>>) {
        let (start, len) = self.around(request.offset, request.length);
        self.file(Patch {
            request,
            permit,
            start,
            len,
            data,
            buffer: Vec::new(),
            phase: Phase::Waiting,
            error: None,
        });
        self.waiting += 1;
    }

    /// Start the writes whose range is free now: their first I/Os go to
    /// `out`.
    pub(crate) fn start(&mut self, locks: &RangeLocks, out: &mut Vec<Io>) {
        if self.waiting == 0 {
            return;
        }
        let block = self.block as u32;
        for (id, entry) in self.patches.iter_mut().enumerate() {
            let Some(patch) = entry else { continue };
            if !matches!(patch.phase, Phase::Waiting) {
                continue;
            }
            let end = patch.start + u64::from(patch.len);
            if !locks.try_take(patch.start, end) {
                continue;
            }
            self.waiting -= 1;
            let offset = patch.request.offset;
            let head_partial = offset != patch.start;
            let tail_partial = offset + u64::from(patch.request.length) != end;
            patch.buffer = vec![0u8; patch.len as usize];
            // The partial blocks at the ends are read; the whole blocks
            // between are overwritten anyway. One read covers both ends
            // when the range is at most two blocks.
            let mut reads: Vec<(u64, u32)> = Vec::with_capacity(2);
            if (head_partial || tail_partial) && patch.len <= 2 * block {
                reads.push((patch.start, patch.len));
            } else {
                if head_partial {
                    reads.push((patch.start, block));
                }
                if tail_partial {
                    reads.push((end - u64::from(block), block));
                }
            }
            if reads.is_empty() {
                patch.phase = Phase::Writing;
                out.push(patched_write(id as u64, patch));
                continue;
            }
            patch.phase = Phase::Filling {
                left: reads.len() as u32,
            };
            out.extend(reads.into_iter().map(|(at, length)| Io {
                id: id as u64,
                work: Work::Read,
                offset: at,
                length,
                fua: false,
                buffer: vec![0u8; length as usize],
            }));
        }
    }

    /// An I/O of request `id` ended: its next I/O goes to `out`, or the
    /// request is done (its answer; its range, if held, is given back).
    pub(crate) fn finished(
        &mut self,
        locks: &RangeLocks,
        io: Io,
        result: Result<(), ErrorCode>,
        out: &mut Vec<Io>,
    ) -> Option<Answer> {
        let id = io.id as usize;
        let Some(patch) = self.patches[id].as_mut() else {
            panic!("invariant: an I/O's request {id} is in flight until its last I/O ends");
        };
        assert_eq!(
            io.buffer.len(),
            io.length as usize,
            "invariant: an I/O's buffer is as long as the I/O"
        );
        assert!(
            io.offset >= patch.start
                && io.offset + u64::from(io.length) <= patch.start + u64::from(patch.len),
            "invariant: request {id}'s I/O lies inside its block-aligned range"
        );
        if let Err(code) = result {
            patch.error.get_or_insert(code);
        }
        match patch.phase {
            Phase::Reading => {
                let Some(patch) = self.patches[id].take() else {
                    unreachable!("request {id} was found above");
                };
                let data = patch.error.is_none().then(|| {
                    let mut data = io.buffer;
                    let skip = (patch.request.offset - patch.start) as usize;
                    data.drain(..skip);
                    data.truncate(patch.request.length as usize);
                    data
                });
                Some(Answer {
                    request: patch.request,
                    permit: patch.permit,
                    result: patch.error.map_or(Ok(()), Err),
                    data,
                })
            }
            Phase::Filling { left } => {
                assert!(left > 0, "invariant: a filling write waits for its reads");
                let at = (io.offset - patch.start) as usize;
                patch.buffer[at..at + io.length as usize].copy_from_slice(&io.buffer);
                patch.phase = Phase::Filling { left: left - 1 };
                if left > 1 {
                    return None;
                }
                if patch.error.is_some() {
                    return Some(self.done(locks, id));
                }
                patch.phase = Phase::Writing;
                out.push(patched_write(id as u64, patch));
                None
            }
            Phase::Writing => Some(self.done(locks, id)),
            Phase::Waiting => unreachable!("a waiting write has no I/O"),
        }
    }

    /// A write is done: its range is given back.
    fn done(&mut self, locks: &RangeLocks, id: usize) -> Answer {
        let Some(patch) = self.patches[id].take() else {
            panic!("invariant: a request is done once");
        };
        locks.release(patch.start, patch.start + u64::from(patch.len));
        Answer {
            request: patch.request,
            permit: patch.permit,
            result: patch.error.map_or(Ok(()), Err),
            data: None,
        }
    }

    /// The whole blocks inside a trim's range, if any.
    pub(crate) fn trim_inside(&self, offset: u64, length: u32) -> Option<(u64, u32)> {
        let start = offset.div_ceil(self.block) * self.block;
        let end = (offset + u64::from(length)) / self.block * self.block;
        (end > start).then(|| (start, (end - start) as u32))
    }
}

/// The write of a patch's aligned range: its end blocks as read, its
/// request's bytes (or zeroes) laid over them.
fn patched_write(id: u64, patch: &mut Patch) -> Io {
    let skip = (patch.request.offset - patch.start) as usize;
    let length = patch.request.length as usize;
    match &patch.data {
        Some(data) => patch.buffer[skip..skip + length].copy_from_slice(data),
        None => patch.buffer[skip..skip + length].fill(0),
    }
    Io {
        id,
        work: Work::Write,
        offset: patch.start,
        length: patch.len,
        fua: patch.request.fua(),
        buffer: std::mem::take(&mut patch.buffer),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvraid_nbd::Command;

    fn request(command: Command, offset: u64, length: u32) -> RequestHeader {
        RequestHeader {
            flags: 0,
            command,
            cookie: 1,
            offset,
            length,
        }
    }

    #[test]
    fn overlapping_ranges_are_refused_until_released() {
        let locks = RangeLocks::default();
        assert!(locks.try_take(0, 4096));
        assert!(!locks.try_take(4095, 8192));
        assert!(locks.try_take(4096, 8192));
        locks.release(0, 4096);
        assert!(locks.try_take(0, 512));
    }

    #[test]
    fn a_write_waits_for_its_range_then_reads_its_ends_and_writes_them_patched() {
        let locks = RangeLocks::default();
        let mut unaligned = Unaligned::new(512, 1 << 20);
        // Another request holds the first block.
        assert!(locks.try_take(0, 512));
        unaligned.write(request(Command::Write, 500, 1100), 0, Some(vec![7u8; 1100]));
        let mut out = Vec::new();
        unaligned.start(&locks, &mut out);
        assert!(out.is_empty() && unaligned.is_waiting());
        locks.release(0, 512);
        unaligned.start(&locks, &mut out);
        assert!(!unaligned.is_waiting());
        // 500..1600 lies in blocks 0..4 (0..2048): the head and tail
        // blocks are read.
        let reads: Vec<(u64, u32)> = out.iter().map(|io| (io.offset, io.length)).collect();
        assert_eq!(reads, vec![(0, 512), (1536, 512)]);
        assert!(!locks.try_take(1024, 1536), "the whole range is held");
        let mut next = Vec::new();
        for mut io in out.drain(..) {
            io.buffer.fill(1);
            assert!(unaligned.finished(&locks, io, Ok(()), &mut next).is_none());
        }
        let write = next.pop().expect("the write");
        assert_eq!((write.offset, write.length), (0, 2048));
        assert!(write.buffer[..500].iter().all(|&b| b == 1));
        assert!(write.buffer[500..1600].iter().all(|&b| b == 7));
        assert!(write.buffer[1600..].iter().all(|&b| b == 1));
        let answer = unaligned
            .finished(&locks, write, Ok(()), &mut next)
            .expect("answered");
        assert!(answer.result.is_ok());
        assert!(locks.try_take(0, 2048), "the range was given back");
    }

    #[test]
    fn a_failed_end_read_fails_the_write_and_gives_its_range_back() {
        let locks = RangeLocks::default();
        let mut unaligned = Unaligned::new(4096, 1 << 20);
        unaligned.write(request(Command::WriteZeroes, 10, 20), 0, None);
        let mut out = Vec::new();
        unaligned.start(&locks, &mut out);
        let read = out.pop().expect("one read");
        let answer = unaligned
            .finished(&locks, read, Err(ErrorCode::Io), &mut out)
            .expect("answered");
        assert_eq!(answer.result, Err(ErrorCode::Io));
        assert!(out.is_empty(), "nothing written");
        assert!(locks.try_take(0, 4096));
    }
}
