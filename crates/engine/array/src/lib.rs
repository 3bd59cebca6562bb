//! nvraid-array: arrays built from members.
//!
//! - [`create()`]: validate members, then write md v1.2 superblocks;
//! - [`assemble()`]: read superblocks, order members by role, start the array;
//! - [`scan()`]: find members among paths and group them into arrays;
//! - [`Array`]: the data path (read, write with FUA, flush, discard) and the
//!   clean/dirty state;
//! - [`info`]: what `detail` and `examine` print.

mod add_journal;
mod array;
mod assemble;
mod badlog;
mod create;
pub mod decision;
mod error;
mod failpoint;
mod fanout;
mod identity;
pub mod info;
mod intent;
pub mod journal;
mod ppl;
pub mod recovery;
mod scan;
mod signature;
mod stripe;

pub use add_journal::{add_journal, AddJournalOptions, JournalAdded};
pub use array::{read_superblock, Array, MemberCounters, ReadLimit, SetAsideMember, Slot};
pub use assemble::{assemble, geometry_of, has_every_byte, level_of, AssembleOptions};
pub use create::{
    create, create_with_spares, BitmapChoice, CreateOptions, CHUNK_BYTES_DEFAULT,
    DATA_OFFSET_SECTORS, JOURNAL_LOG_MIN_BYTES,
};
pub use decision::SetAside;
pub use error::{Error, Result};
pub use fanout::{FanoutQueue, FanoutTarget};
pub use intent::{BitmapDaemon, BitmapInfo};
pub use scan::{scan, Ignored, ScanReport, ScannedArray, ScannedMember};
pub use signature::detect as detect_signature;
