//! The parity family: RAID 4, 5 and 6.
//!
//! Everything a parity array does that a mirror does not lives here:
//!
//! | file | what it holds |
//! |---|---|
//! | [`plan`] | the pure planner: which stripes and columns a request touches, reconstruct-write or read-modify-write, the parity arithmetic |
//! | [`locks`] | the stripe locks that keep two writes to one stripe apart |
//! | [`simple`] | the simple path: columns done one after another with synchronous member I/O |
//! | [`fast`] | the fast path: the same columns as state machines on a fanout queue |
//! | [`work`] | what each slot of a fanout queue keeps for them |
//! | [`ppl`] | md's partial parity log (RAID 5), which closes the write hole |
//! | [`scrub`] | parity check and repair, and rebuilding a member from the others |
//! | [`journal`] | md's write journal (RAID 4/5/6): the log, replay, group commit, what a write cache calls |

pub(crate) mod fast;
pub mod journal;
pub(crate) mod locks;
pub(crate) mod plan;
pub(crate) mod ppl;
pub(crate) mod scrub;
pub(crate) mod simple;
pub(crate) mod work;

pub(crate) use locks::StripeLocks;
pub(crate) use plan::ParityShape;
pub use plan::DATA_BLOCKS_MAX;
