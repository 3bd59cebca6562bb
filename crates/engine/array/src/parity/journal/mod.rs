//! md's RAID 4/5/6 write journal (raid5-cache): the journal member joins
//! the array, a writable assembly replays its log as the kernel does before
//! anything else is written, and from then on every write is logged first.
//!
//! The log format is [`nvraid_metadata::r5log`]. This module holds the
//! journal's type, [`MdJournal`] (its member, the ring, the run-time state
//! every part shares under one lock, and the journal's failure), and says
//! nothing of how the log is laid out, replayed or written. Those are:
//!
//! - `log.rs`: the log on the member: meta blocks packed and encoded (each
//!   checked by decoding it back before it is written), the ring read from
//!   the tail, an empty log started (at create, or where a replay ends),
//!   the tail, and activation;
//! - `replay.rs`: the recovery at a writable assembly (md's
//!   `r5c_recovery_flush_log` and what follows it);
//! - `commit.rs`: the group commit of the running array (md's write-through
//!   mode): request rounds queued, batches written, the tail moved;
//! - `cache.rs`: what a write cache over the array (md's write-back mode;
//!   nvraid-cache's `journal::md` adapter) calls: its pages queued and held
//!   until released, and its share of the log;
//! - `held.rs`: the table of the pages a write cache holds in the log, and
//!   the trimming of the array's own rounds against it.

use crate::error::{Error, Result};
use crate::members::{Companion, Members, Update};
use crate::slot::Slot;
use nvraid_io::AlignedBuf;
use nvraid_metadata::r5log::{self, Ring, PAGE_SECTORS};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

mod cache;
mod commit;
mod held;
mod log;
mod replay;

pub use cache::{CachedWrite, CACHED_STRIPES_MAX};
pub(crate) use log::write_empty_log;
pub use replay::Replay;

use commit::Group;
use held::{HeldRows, RowHash};
use log::random_seq;

/// Bits of [`MdJournal`]'s `flags`.
const ACTIVE: u8 = 1;
const UNLOGGED: u8 = 2;
const FAILED: u8 = 4;

/// The array's journal member.
#[derive(Debug)]
pub struct MdJournal {
    pub slot: Slot,
    ring: Ring,
    seed: u32,
    /// `journal_tail` as the member's superblock holds it now.
    tail: Mutex<u64>,
    /// The log at run time (see `commit.rs` and `cache.rs`).
    writer: Mutex<Writer>,
    /// [`MdJournal::cached_stripes_max`] as set (0: the default).
    stripes_max: std::sync::atomic::AtomicUsize,
    /// Signalled when the log moves on: a batch written, the tail moved,
    /// the journal failed ([`MdJournal::wait_ready`] sleeps on it).
    progress: std::sync::Condvar,
    /// The buffer a batch is built in, kept between batches (one is written
    /// at a time): a fresh one each time cost a page fault per 4 KiB.
    image: Mutex<AlignedBuf>,
    /// Page buffers of cached groups already written, for the next ones (a
    /// fresh allocation per write, freed on another thread, cost more than
    /// the copy), under a lock of their own: the copy is made before the
    /// log's lock is taken.
    spare_pages: Mutex<Vec<Vec<u8>>>,
    /// `Writer`'s `active`, `unlogged` and failed state as bits (`ACTIVE`,
    /// `UNLOGGED`, `FAILED`), set with them under its lock: the data path
    /// asks for them on every write without taking that lock.
    flags: std::sync::atomic::AtomicU8,
    /// `Writer`'s `durable`, stored with it under its lock: a queue asking
    /// whether its writes are durable takes no lock.
    durable: std::sync::atomic::AtomicU64,
    /// A replay is writing: parity is recomputed from the data, never
    /// updated from what a crash may have torn.
    replaying: std::sync::atomic::AtomicBool,
    /// The failure is recorded on the members, or being recorded
    /// ([`MdJournal::record_failure`]).
    failure_recorded: std::sync::atomic::AtomicBool,
}

/// The log's run-time state.
#[derive(Debug, Default)]
struct Writer {
    /// Logging is on (a writable array, after its replay).
    active: bool,
    /// Where the next unit goes, and its sequence number.
    head: u64,
    seq: u64,
    /// The group the next enqueue gets; the newest durable one.
    next_group: u64,
    durable: u64,
    /// A thread is writing a batch or moving the tail.
    writing: bool,
    /// Groups enqueued, not written yet, oldest first.
    waiting: std::collections::VecDeque<Group>,
    /// Request rounds' groups written whose stripes are not all on the
    /// members yet, and their first unit's position.
    open: BTreeMap<u64, u64>,
    /// A write cache's groups written and not released yet
    /// ([`MdJournal::release_through`] closes them), and their first
    /// unit's position, oldest first (groups are written, and released,
    /// in order).
    open_cached: VecDeque<(u64, u64)>,
    /// The first unit of the newest group written.
    last_written: Option<u64>,
    /// Why the log stopped taking writes (a journal member that failed).
    failed: Option<String>,
    /// After a failure: writes may go to the members unlogged (a write
    /// cache saving what it acknowledged), the array recorded dirty.
    unlogged: bool,
    /// Groups a write cache holds open until its pages are on the members
    /// ([`MdJournal::release_through`]), oldest first, with their sectors
    /// of log and their pages; and how far it released.
    held: VecDeque<(u64, u64, usize)>,
    held_sectors: u64,
    held_count: usize,
    /// The stripes (md's unit: a 4 KiB row of the members) the held pages
    /// are in, each with its number of held pages; and every held page's
    /// group and stripe, oldest first (released from the front). What the
    /// kernel would load as data-only stripes after a crash.
    held_stripes: std::collections::HashMap<u64, u32>,
    held_order: VecDeque<(u64, u64)>,
    released: u64,
    /// Per row, the copies a cache logged there, oldest first (see
    /// [`MdJournal::enqueue`]); those of groups released included until
    /// they are swept out ([`Copies`]).
    held_rows: HeldRows,
    /// Copies logged and not in `held_rows` yet (array byte offset,
    /// checksum, group), oldest first. The cache's writers only list them:
    /// the table (a lookup that misses the processor's caches, per page)
    /// is brought up to date by whoever reads it next ([`file_copies`]),
    /// the write-back's rounds.
    unfiled: Vec<(u64, u32, u64)>,
    /// A round found no room in the ring (the tail must move).
    wants_room: bool,
    /// Threads asleep in [`MdJournal::wait_ready`] (`progress` is signalled
    /// only when there are some: a signal is a system call each time).
    sleepers: u32,
}

impl MdJournal {
    pub(crate) fn new(slot: Slot) -> Result<MdJournal> {
        let sb = &slot.superblock;
        let ring = Ring::new(sb.data_size_sectors);
        let needed = (sb.data_offset_sectors + ring.sectors) * 512;
        if ring.sectors < 2 * PAGE_SECTORS || slot.member.size_bytes() < needed {
            return Err(Error::Unsupported {
                spec: slot.member.spec().into(),
                what: format!(
                    "a write journal of {} sectors from sector {} on a member of {} bytes",
                    ring.sectors,
                    sb.data_offset_sectors,
                    slot.member.size_bytes()
                ),
            });
        }
        Ok(MdJournal {
            seed: r5log::uuid_checksum(&sb.set_uuid),
            tail: Mutex::new(sb.recovery_offset),
            writer: Mutex::new(Writer {
                held_rows: HeldRows::with_hasher(RowHash(random_seq()?)),
                ..Writer::default()
            }),
            progress: std::sync::Condvar::new(),
            stripes_max: std::sync::atomic::AtomicUsize::new(0),
            image: Mutex::new(AlignedBuf::zeroed(0)),
            spare_pages: Mutex::new(Vec::new()),
            flags: std::sync::atomic::AtomicU8::new(0),
            durable: std::sync::atomic::AtomicU64::new(0),
            replaying: std::sync::atomic::AtomicBool::new(false),
            failure_recorded: std::sync::atomic::AtomicBool::new(false),
            ring,
            slot,
        })
    }

    pub fn spec(&self) -> &str {
        self.slot.member.spec()
    }

    /// Sectors of the ring.
    pub fn ring_sectors(&self) -> u64 {
        self.ring.sectors
    }

    fn writer(&self) -> std::sync::MutexGuard<'_, Writer> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wake the threads in [`MdJournal::wait_ready`], if any (called with
    /// the writer's lock held, as every change they wait for is made).
    fn wake(&self, w: &Writer) {
        if w.sleepers > 0 {
            self.progress.notify_all();
        }
    }

    /// The seed of every checksum in the log.
    pub(crate) fn seed(&self) -> u32 {
        self.seed
    }

    /// Whether writes are logged now.
    pub(crate) fn logging(&self) -> bool {
        self.flags() & (ACTIVE | UNLOGGED) == ACTIVE
    }

    fn flags(&self) -> u8 {
        self.flags.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Set `bit` in `flags` (with the writer's lock held, as the state it
    /// mirrors changes).
    fn set_flag(&self, bit: u8) {
        self.flags
            .fetch_or(bit, std::sync::atomic::Ordering::Release);
    }

    /// Whether writes go to the members unlogged (the journal failed and a
    /// write cache is saving what it acknowledged).
    pub fn unlogged(&self) -> bool {
        self.flags() & UNLOGGED != 0
    }

    /// The journal failed: let the writes that follow reach the members
    /// without it (a write cache saving what it acknowledged; the array is
    /// then recorded dirty, as one with no journal).
    pub fn allow_unlogged(&self) {
        let mut w = self.writer();
        if w.failed.is_some() && !w.unlogged {
            w.unlogged = true;
            self.set_flag(UNLOGGED);
            eprintln!(
                "nvraid: write journal {}: writing to the members without it; the array is \
                 recorded dirty (a resync follows the next assembly)",
                self.spec()
            );
        }
    }

    /// Mark the journal failed (its member disappeared, say).
    pub fn mark_failed(&self, why: String) {
        let mut w = self.writer();
        let _ = self.fail(&mut w, why);
    }

    /// The newest group durable, and whether the journal failed.
    pub fn committed(&self) -> (u64, bool) {
        let durable = self.durable.load(std::sync::atomic::Ordering::Acquire);
        (durable, self.flags() & FAILED != 0)
    }

    /// The newest group queued so far.
    pub fn newest(&self) -> u64 {
        self.writer().next_group.saturating_sub(1)
    }

    /// Bytes of ring in use, and the ring's size.
    pub fn usage(&self) -> (u64, u64) {
        let w = self.writer();
        (
            self.ring.distance(self.tail(), w.head) * 512,
            self.ring.sectors * 512,
        )
    }

    /// Whether a round waits for the tail to move.
    pub fn wants_room(&self) -> bool {
        self.writer().wants_room
    }

    /// True once, for the caller that is to record the failure on the
    /// members.
    pub(crate) fn take_failure_to_record(&self) -> bool {
        !self
            .failure_recorded
            .swap(true, std::sync::atomic::Ordering::AcqRel)
    }

    /// Whether `error` is the journal member's own (it names it).
    fn is_own_failure(&self, error: &Error) -> bool {
        matches!(error, Error::Io { spec, .. } if spec == self.spec())
    }

    pub(crate) fn replaying(&self) -> bool {
        self.replaying.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Why writes are refused, when the journal failed.
    pub fn failure(&self) -> Option<String> {
        if self.flags() & FAILED == 0 {
            return None;
        }
        self.writer().failed.clone()
    }

    /// The journal failed: said once, and every write refused from now on.
    fn fail(&self, w: &mut Writer, why: String) -> Error {
        if w.failed.is_none() {
            eprintln!(
                "nvraid: write journal {}: {why}; the array refuses writes from now on",
                self.spec()
            );
            w.failed = Some(why.clone());
            self.set_flag(FAILED);
            self.wake(w);
        }
        self.refused(&why)
    }

    fn refused(&self, why: &str) -> Error {
        Error::io(
            self.spec(),
            std::io::Error::other(format!(
                "the write journal failed ({why}); writes are refused until the array is \
                 assembled again with a working journal"
            )),
        )
    }
}

impl MdJournal {
    /// The write journal failed: record it faulty on every member (its
    /// device slot becomes md's faulty role, events + 1), once, so that
    /// every later assembly, nvraid's or the kernel's, sees a failed
    /// journal rather than a stale one, and `add-journal` may replace it.
    /// The journal member itself is not written (md writes nothing more to
    /// a faulty member).
    pub(crate) fn record_failure(&self, members: &Members) -> Result<()> {
        if self.failure().is_none() || !self.take_failure_to_record() {
            return Ok(());
        }
        let recorded = members.rewrite_superblocks();
        match &recorded {
            Ok(()) => eprintln!(
                "nvraid: write journal {}: recorded faulty on the members",
                self.spec()
            ),
            Err(e) => eprintln!(
                "nvraid: write journal {}: could not record it faulty: {e}",
                self.spec()
            ),
        }
        recorded
    }
}

/// The journal member takes every superblock update too (md's rule: a
/// member behind the array's events is stale), keeping its journal_tail;
/// not once it has failed (md writes nothing more to a faulty member),
/// when its role table entry says faulty instead.
impl Companion for MdJournal {
    fn after_superblocks(&self, update: &Update<'_>) -> Result<()> {
        if self.failure().is_some() {
            return Ok(());
        }
        let mut sb = self.slot.superblock.clone();
        sb.events = update.events;
        sb.resync_offset = update.resync_offset;
        sb.utime = update.utime;
        sb.roles_raw = update.roles_raw.to_vec();
        sb.recovery_offset = self.tail();
        crate::slot::write_superblock(&self.slot.member, &sb)?;
        self.slot
            .member
            .flush()
            .map_err(|e| Error::io(self.spec(), e))?;
        self.slot.superblock_written(update.events);
        Ok(())
    }

    fn role_table(&self, table: &mut [u16]) {
        use nvraid_metadata::Role;
        if self.failure().is_none() {
            return;
        }
        let dev = self.slot.superblock.dev_number as usize;
        if table.get(dev).map(|&r| Role::from_raw(r)) == Some(Role::Journal) {
            table[dev] = Role::Faulty.to_raw();
        }
    }
}
