//! nvraid-array: arrays built from members.
//!
//! - [`create()`]: validate members, then write md v1.2 superblocks;
//! - [`assemble()`]: read superblocks, order members by role, start the array;
//! - [`scan()`]: find members among paths and group them into arrays;
//! - [`Array`]: the data path (read, write with FUA, flush, discard) and the
//!   clean/dirty state;
//! - [`info`]: what `detail` and `examine` print.
//!
//! Inside, each level family has a home: `copies/` (RAID 0/1/10) and
//! `parity/` (RAID 4/5/6), chosen once at assembly by `personality`; `slot`
//! and `barrier` hold what a role and the resync barrier are, below the
//! array that uses them.

mod add_journal;
mod array;
mod assemble;
mod badlog;
mod barrier;
mod copies;
mod create;
pub mod decision;
mod error;
mod failpoint;
mod fanout;
mod identity;
pub mod info;
mod intent;
mod members;
mod ops;
mod parity;
mod personality;
pub mod recovery;
pub mod reshape;
mod scan;
mod signature;
mod slot;

pub use add_journal::{add_journal, AddJournalOptions, JournalAdded};
pub use array::{Array, BitmapDaemon};
pub use assemble::{assemble, geometry_of, has_every_byte, level_of, AssembleOptions};
pub use create::{
    create, create_with_spares, BitmapChoice, CreateOptions, CHUNK_BYTES_DEFAULT,
    DATA_OFFSET_SECTORS, JOURNAL_LOG_MIN_BYTES,
};
pub use decision::SetAside;
pub use error::{Error, Result};
pub use fanout::{FanoutQueue, FanoutTarget};
pub use intent::BitmapInfo;
pub use members::{Members, SetAsideMember};
/// md's write journal, as the write-back cache uses it.
pub use parity::journal;
pub use scan::{scan, Ignored, ScanReport, ScannedArray, ScannedMember};
pub use signature::detect as detect_signature;
pub use slot::{read_superblock, MemberCounters, ReadLimit, Slot};
