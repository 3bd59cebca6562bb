//! The per-worker queue interface.
//!
//! A [`Target`] is something that can be read and written at byte offsets: an
//! assembled array, one raw member, or a test double. Each worker thread opens
//! its own [`Queue`] on the target with [`Target::open_queue`]; a queue is owned
//! by exactly one thread and is never shared, so the hot path needs no lock.
//!
//! A queue has `depth` *slots*. Slot `s` owns one I/O buffer
//! ([`Queue::buffer_mut`]) of `max_io_bytes` bytes, aligned for O_DIRECT. A
//! caller fills the buffer (for writes), then [`Queue::submit`]s the slot, and
//! later learns of its completion from [`Queue::reap`]. A slot must not be
//! submitted again, nor its buffer touched, until its completion was reaped.

use std::io;

/// What a request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// Read `len` bytes at `offset` into the slot's buffer.
    Read,
    /// Write `len` bytes from the slot's buffer at `offset`.
    Write,
    /// Make every write completed before this request durable: on this
    /// queue *and on every other queue of the same target* (a flush of the
    /// members' files, not of this queue's own writes). NBD's CAN_MULTI_CONN
    /// relies on that. `offset` and `len` are ignored.
    Flush,
    /// The range's contents may be discarded (reads afterwards return either
    /// the old data or zeros).
    Discard,
}

/// One finished request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The slot that was submitted.
    pub slot: u32,
    /// Bytes transferred (the full `len` on success: short transfers are
    /// retried or turned into an error by the queue, never returned), or a
    /// positive errno.
    pub result: Result<u32, i32>,
}

/// A per-thread submission/completion queue on a [`Target`].
pub trait Queue {
    /// Number of slots (the most requests in flight at once).
    fn depth(&self) -> u32;

    /// The I/O buffer of `slot` (`max_io_bytes` long, sector aligned).
    fn buffer_mut(&mut self, slot: u32) -> &mut [u8];

    /// The I/O buffer of `slot`, to read (the data a completed read left
    /// there). Several slots' buffers may be borrowed at once this way.
    fn buffer(&self, slot: u32) -> &[u8];

    /// Never free the slot buffers, not even when the queue is dropped
    /// (everything else of the queue goes as usual): something outside
    /// the queue may still write into a slot's memory afterwards (a ublk
    /// device left to the next server writes a request's data into the
    /// tag buffer it was given until the thread that fetched the tag has
    /// exited; nvraid-serve's tags are slots). Called with no request in
    /// flight.
    fn leak_buffers(&mut self);

    /// Queue a request on `slot`. It may be handed to the kernel now or at
    /// the next [`Queue::reap`]. `offset` and `len` must be multiples of the
    /// target's sector size and lie inside the target; `fua` asks for the
    /// write to be durable when it completes. An error means the request
    /// was refused and will never complete; once accepted, a request
    /// completes exactly once (a failure as an errno in its completion).
    fn submit(&mut self, slot: u32, op: OpKind, offset: u64, len: u32, fua: bool)
        -> io::Result<()>;

    /// Hand queued requests to the kernel, wait until at least `min_complete`
    /// requests have completed (0: do not wait), and call `on_complete` once
    /// for every completed request. Returns how many completions were passed.
    fn reap(
        &mut self,
        min_complete: u32,
        on_complete: &mut dyn FnMut(Completion),
    ) -> io::Result<u32>;

    /// Whether [`Queue::submit`] performs the I/O before it returns (a
    /// synchronous engine). Such a queue gains nothing from depth; callers
    /// that time I/Os reap each one before submitting the next.
    fn completes_inline(&self) -> bool {
        false
    }
}

/// Something queues can be opened on.
pub trait Target: Send + Sync {
    /// Usable size in bytes.
    fn size_bytes(&self) -> u64;
    /// Smallest unit of I/O (offsets and lengths are multiples of it).
    fn sector_bytes(&self) -> u32;
    /// Whether writes are allowed.
    fn writable(&self) -> bool;
    /// A short human-readable name (for reports).
    fn describe(&self) -> String;
    /// Open a queue for one worker thread with `depth` slots whose buffers
    /// are `max_io_bytes` long.
    fn open_queue(&self, depth: u32, max_io_bytes: u32) -> io::Result<Box<dyn Queue>>;
}
