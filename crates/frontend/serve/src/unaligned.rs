//! Requests whose offset or length is not a multiple of the export's
//! minimum block size, from clients that negotiated no block sizes
//! (NBD_OPT_EXPORT_NAME, or GO without NBD_INFO_BLOCK_SIZE). proto.md says a
//! server SHOULD serve them; this one does, on the connection's own thread:
//!
//! - a read reads the aligned blocks around the range and returns its part;
//! - a write (or write-zeroes) reads the first and last partial block,
//!   patches them and writes the aligned range back (read-modify-write),
//!   holding the server's unaligned-write lock, so that two such writes into
//!   one block cannot lose each other's bytes;
//! - a trim trims only the whole blocks inside its range (a trim may leave
//!   any byte as it was).
//!
//! Aligned requests never come here. Each unaligned request costs one
//! synchronous round trip to the array (two for a write that is unaligned
//! at both ends and spans blocks), which is what the protocol's block-size
//! negotiation exists to avoid.

use nvraid_io::queue::{Completion, OpKind, Queue, Target};
use nvraid_nbd::ErrorCode;
use std::io;
use std::sync::{Arc, Mutex};

/// A connection's queue for unaligned requests, opened at the first one.
pub(crate) struct Unaligned {
    target: Arc<dyn Target>,
    block: u64,
    max_bytes: u32,
    queue: Option<Box<dyn Queue>>,
}

impl Unaligned {
    pub(crate) fn new(target: Arc<dyn Target>, block: u32, max_payload: u32) -> Unaligned {
        Unaligned {
            target,
            block: u64::from(block.max(1)),
            // The aligned range around the longest request.
            max_bytes: max_payload + 2 * block.max(1),
            queue: None,
        }
    }

    pub(crate) fn is_aligned(&self, offset: u64, length: u32) -> bool {
        offset.is_multiple_of(self.block) && u64::from(length).is_multiple_of(self.block)
    }

    fn queue(&mut self) -> io::Result<&mut Box<dyn Queue>> {
        if self.queue.is_none() {
            self.queue = Some(self.target.open_queue(1, self.max_bytes)?);
        }
        Ok(self.queue.as_mut().expect("opened above"))
    }

    /// The aligned range around `[offset, offset + length)`.
    fn around(&self, offset: u64, length: u32) -> (u64, u32) {
        let start = offset / self.block * self.block;
        let end = (offset + u64::from(length)).div_ceil(self.block) * self.block;
        let end = end.min(self.target.size_bytes());
        (start, (end - start) as u32)
    }

    fn run(&mut self, op: OpKind, offset: u64, len: u32, fua: bool) -> Result<(), ErrorCode> {
        let queue = self.queue().map_err(|e| ErrorCode::from_io_error(&e))?;
        queue
            .submit(0, op, offset, len, fua)
            .map_err(|e| ErrorCode::from_io_error(&e))?;
        let mut result = None;
        while result.is_none() {
            queue
                .reap(1, &mut |c: Completion| result = Some(c.result))
                .map_err(|e| ErrorCode::from_io_error(&e))?;
        }
        match result.expect("reaped") {
            Ok(_) => Ok(()),
            Err(errno) => Err(ErrorCode::from_errno(errno)),
        }
    }

    /// Read `[offset, offset + length)`.
    pub(crate) fn read(&mut self, offset: u64, length: u32) -> Result<Vec<u8>, ErrorCode> {
        let (start, len) = self.around(offset, length);
        self.run(OpKind::Read, start, len, false)?;
        let skip = (offset - start) as usize;
        let buffer = self.queue.as_mut().expect("used above").buffer_mut(0);
        Ok(buffer[skip..skip + length as usize].to_vec())
    }

    /// Write `data` (None: zeros) at `offset`, read-modify-write, under
    /// `lock`.
    pub(crate) fn write(
        &mut self,
        lock: &Mutex<()>,
        offset: u64,
        length: u32,
        data: Option<&[u8]>,
        fua: bool,
    ) -> Result<(), ErrorCode> {
        let _held = lock.lock().unwrap_or_else(|e| e.into_inner());
        let (start, len) = self.around(offset, length);
        let block = self.block as u32;
        let head_partial = offset != start;
        let tail_partial = (offset + u64::from(length)) != start + u64::from(len);
        // The partial blocks at the ends are read; the whole blocks between
        // are overwritten anyway. One read covers both ends when the range
        // is at most two blocks.
        if head_partial || tail_partial {
            if len <= 2 * block {
                self.run(OpKind::Read, start, len, false)?;
            } else {
                if head_partial {
                    self.run(OpKind::Read, start, block, false)?;
                }
                if tail_partial {
                    // Keep the head block read above: read the tail into
                    // place through a second pass.
                    let tail = start + u64::from(len - block);
                    let head_copy = head_partial.then(|| {
                        self.queue.as_mut().expect("used above").buffer_mut(0)[..block as usize]
                            .to_vec()
                    });
                    self.run(OpKind::Read, tail, block, false)?;
                    let buffer = self.queue.as_mut().expect("used above").buffer_mut(0);
                    buffer.copy_within(..block as usize, (len - block) as usize);
                    if let Some(head) = head_copy {
                        buffer[..block as usize].copy_from_slice(&head);
                    }
                }
            }
        }
        let skip = (offset - start) as usize;
        let buffer = self.queue.as_mut().expect("opened").buffer_mut(0);
        match data {
            Some(data) => buffer[skip..skip + length as usize].copy_from_slice(data),
            None => buffer[skip..skip + length as usize].fill(0),
        }
        self.run(OpKind::Write, start, len, fua)
    }

    /// The whole blocks inside a trim's range, if any.
    pub(crate) fn trim_inside(&self, offset: u64, length: u32) -> Option<(u64, u32)> {
        let start = offset.div_ceil(self.block) * self.block;
        let end = (offset + u64::from(length)) / self.block * self.block;
        (end > start).then(|| (start, (end - start) as u32))
    }
}
