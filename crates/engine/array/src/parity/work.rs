//! What a slot of a fast-path queue keeps for RAID 4/5/6 stripe work (the
//! state machines that use it are in `fast.rs`), and how much scratch a
//! slot may use. Data only: the queue holds one per slot.

use crate::parity::plan::{BlockIo, Column};
use nvraid_io::AlignedBuf;

/// One slot's stripe work.
pub(crate) struct StripeWork {
    /// The slot is doing stripe work (between start and finish).
    pub(super) active: bool,
    pub(super) write: bool,
    /// The request (kept for reads too: a read that fails on the fast
    /// path is done again here).
    pub(crate) offset: u64,
    pub(super) len: u32,
    pub(super) fua: bool,
    pub(super) columns: Vec<Column>,
    /// The first column not done yet; the round is `next..round_end`.
    pub(super) next: usize,
    pub(super) round_end: usize,
    /// Scratch offset of each column of the round.
    pub(super) bases: Vec<usize>,
    pub(super) scratch: AlignedBuf,
    /// The round's writes are in flight (else its reads).
    pub(super) writing: bool,
    /// Member operations of the phase not yet completed.
    pub(super) outstanding: u32,
    /// A read failed and its member is now faulty: plan the round again.
    pub(super) replan: bool,
    /// The request fails with this errno (0: none so far).
    pub(super) errno: i32,
    /// Stripes held.
    pub(super) stripes: Option<(u64, u64)>,
    /// A read on the plain path failed: do it again here once its other
    /// parts have finished.
    pub(crate) redo: bool,
    pub(super) ios: Vec<BlockIo>,
    /// A PPL array: the round's place in its parity member's log, and its
    /// partial parity (one column after another).
    pub(super) ticket: Option<crate::parity::ppl::Ticket>,
    /// The round's place in md's write journal (a journaled array).
    pub(super) jticket: Option<u64>,
    pub(super) pp: Vec<u8>,
    /// The round's log entries (kept for their room).
    pub(super) entries: Vec<nvraid_metadata::ppl::PplEntry>,
}

impl StripeWork {
    /// The scratch's address, for the engine.
    pub(crate) fn scratch_ptr(&mut self) -> *mut u8 {
        self.scratch.as_mut_ptr()
    }

    pub(crate) fn new() -> StripeWork {
        StripeWork {
            active: false,
            write: false,
            offset: 0,
            len: 0,
            fua: false,
            columns: Vec::new(),
            next: 0,
            round_end: 0,
            bases: Vec::new(),
            scratch: AlignedBuf::zeroed(4096),
            writing: false,
            outstanding: 0,
            replan: false,
            errno: 0,
            stripes: None,
            redo: false,
            ios: Vec::new(),
            ticket: None,
            jticket: None,
            pp: Vec::new(),
            entries: Vec::new(),
        }
    }
}

/// The scratch a slot may use at most: enough for any request's
/// read-modify-write or reconstruct-write at once, and for one column
/// rebuilt whole.
pub(crate) fn scratch_cap(shape: &crate::parity::ParityShape, max_io_bytes: u32) -> usize {
    let members = (shape.data + shape.parity) as usize;
    let max_io = max_io_bytes as usize;
    ((1 + shape.parity as usize) * max_io).max(members * max_io.min(shape.chunk as usize))
}
