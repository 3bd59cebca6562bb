//! md's RAID 4/5/6 write journal (raid5-cache): the journal member joins
//! the array, a writable assembly replays its log as the kernel does before
//! anything else is written, and from then on every write is logged first
//! (see "Logging" below).
//!
//! The log format is [`nvraid_metadata::r5log`]. Replay, following md's
//! recovery (`r5c_recovery_flush_log` and what follows it):
//!
//! 1. Units are read from `journal_tail` while each is whole and carries the
//!    next sequence number.
//! 2. Their payloads gather into stripes by the stripe's sector on the
//!    members: data pages by member, parity pages (P, Q). A stripe with
//!    parity is *complete*: the log holds every page its last write put on
//!    the members. A data page for a complete stripe means a later write:
//!    the complete stripe is written out first, then a new one begins. A
//!    flush payload drops the stripes it lists (md wrote them already).
//! 3. Complete stripes are written page by page to the members, exactly as
//!    logged (data and parity; a stripe with parity and no data is left, as
//!    md leaves it: its data reached the members before the tail moved).
//!    Stripes with data only (md's write-back mode acknowledged them from
//!    the log) are written through the array's own write path, their
//!    parity computed from all of their data (never updated from parity a
//!    crash may have torn).
//! 4. The members are flushed, an empty meta block goes where the log ends
//!    (its sequence number 10000 past the last one, as md does: units the
//!    crash left out of order beyond the end must not read as its
//!    continuation), and `journal_tail` moves to it in every superblock:
//!    the log is empty, and the kernel reads it as empty too.
//!
//! A block at `journal_tail` that does not decode means an empty log; a
//! writable assembly then starts one at the ring's start, with a random
//! sequence number, as md does.
//!
//! **Logging** (md's write-through mode). Both data paths hand each write
//! round, once its parity is computed, to [`MdJournal::enqueue`]: every
//! data page under its array sector, then P (and Q) under the stripe's
//! member sector, in as many units as the meta blocks need. The round's
//! member writes start only when [`MdJournal::ready`] says its units are
//! durable; whoever finds the log free writes every waiting round in one
//! write and one flush (group commit), and nobody blocks on another round.
//! [`MdJournal::done`] marks a round's stripes on the members. When the
//! ring is half full the members are flushed and the tail moves to the
//! oldest round not done (or the newest unit); the ring never passes the
//! tail. A journaled array is never recorded dirty: the log, not a resync,
//! repairs a crash.

use crate::array::{Array, Slot};
use crate::error::{Error, Result};
use nvraid_io::AlignedBuf;
use nvraid_metadata::r5log::{
    self, MetaBlock, Payload, Ring, HEADER_BYTES, PAGE_BYTES, PAGE_SECTORS,
};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

/// Counts `payload` into a meta block with `size` bytes in use (what
/// `MetaBlock::fits` decides, without summing the block again): true when
/// it does not fit there and begins the next block, whose `size` it then
/// counts. The one packing rule of [`pack`] and [`packed_sectors`].
fn begins_block(size: &mut usize, payload: &Payload) -> bool {
    let bytes = payload.encoded_bytes();
    let next = *size + bytes > PAGE_BYTES;
    if next {
        *size = HEADER_BYTES;
    }
    *size += bytes;
    next
}

/// Payloads in units: as many per meta block as fit.
fn pack(payloads: Vec<Payload>) -> Vec<MetaBlock> {
    let mut units = Vec::new();
    let mut unit = MetaBlock::empty(0, 0);
    let mut size = HEADER_BYTES;
    for payload in payloads {
        if begins_block(&mut size, &payload) {
            units.push(std::mem::replace(&mut unit, MetaBlock::empty(0, 0)));
        }
        unit.payloads.push(payload);
    }
    units.push(unit);
    units
}

/// Sectors of ring that [`pack`] would make of `payloads` (meta blocks
/// and pages), without making them.
fn packed_sectors(payloads: &[Payload]) -> u64 {
    let (mut blocks, mut pages, mut size) = (1u64, 0u64, HEADER_BYTES);
    for payload in payloads {
        blocks += u64::from(begins_block(&mut size, payload));
        pages += payload.pages() as u64;
    }
    (blocks + pages) * PAGE_SECTORS
}

/// Bits of [`MdJournal`]'s `flags`.
const ACTIVE: u8 = 1;
const UNLOGGED: u8 = 2;
const FAILED: u8 = 4;

/// Page buffers of written cached groups kept for reuse, and the largest.
const SPARE_PAGES: usize = 256;
const SPARE_PAGE_BYTES: usize = 64 * 1024;

/// The largest batch buffer [`MdJournal`] keeps between batches.
const IMAGE_KEPT_BYTES: usize = 8 << 20;

/// The units one write of the log carries: every payload of a batch of
/// groups, in order, packed afresh, so that groups share meta blocks (4 KiB
/// writes from many clients cost one meta block per batch, not one each).
/// Replays read payloads in log order whatever units hold them, so this
/// changes nothing they see.
struct Batch {
    units: Vec<MetaBlock>,
    /// Per unit, where each of its pages comes from: (group, byte offset in
    /// the group's pages).
    pages: Vec<Vec<(usize, usize)>>,
    /// Per group, the unit holding its first payload (for an empty group,
    /// that of the group before it): the tail may not pass it while the
    /// group is open.
    first_unit: Vec<usize>,
}

impl Batch {
    fn of(groups: &[Group]) -> Batch {
        // Each payload's group, and where its first page is in the group's.
        let mut sources = Vec::new();
        let mut payloads = Vec::new();
        for (index, group) in groups.iter().enumerate() {
            let mut from = 0usize;
            for payload in &group.payloads {
                sources.push((index, from));
                from += payload.pages() * PAGE_BYTES;
                payloads.push(payload.clone());
            }
        }
        let units = pack(payloads);
        let mut first: Vec<Option<usize>> = vec![None; groups.len()];
        let mut sources = sources.into_iter();
        let pages = units
            .iter()
            .enumerate()
            .map(|(at, unit)| {
                let mut pages = Vec::with_capacity(unit.pages());
                for payload in &unit.payloads {
                    let (group, from) = sources.next().expect("a source per payload");
                    first[group].get_or_insert(at);
                    pages.extend((0..payload.pages()).map(|i| (group, from + i * PAGE_BYTES)));
                }
                pages
            })
            .collect();
        // A group with no payloads takes the unit of the group before it.
        let mut last = 0;
        let first_unit = first
            .into_iter()
            .map(|unit| {
                last = unit.unwrap_or(last);
                last
            })
            .collect();
        Batch {
            units,
            pages,
            first_unit,
        }
    }

    fn sectors(&self) -> u64 {
        self.units.iter().map(MetaBlock::unit_sectors).sum()
    }
}

/// A page's row on the members and its member (array byte `offset`).
fn row_of(array: &Array, offset: u64) -> Row {
    let at = array.geometry().locate(offset, 0);
    (at.member_offset / 512, at.member)
}

/// A round's `payloads` and `pages` as logged (see [`MdJournal::enqueue`]):
/// trimmed for a write cache's copies in the log (`held`), with the lost
/// members' pages the round rebuilt (`rebuilt`) before its parity; and the
/// newest cache group whose copies the round left out (it must wait until
/// that group is durable).
fn trim_for_cache(
    array: &Array,
    held: Held<'_>,
    payloads: Vec<Payload>,
    pages: Vec<u8>,
    rebuilt: (Vec<Payload>, Vec<u8>),
) -> (Vec<Payload>, Vec<u8>, u64) {
    let (rebuilt, rebuilt_pages) = rebuilt;
    if held.rows.is_empty() && rebuilt.is_empty() {
        return (payloads, pages, 0);
    }
    // The (row, member) pages this round writes (a round is a few pages:
    // a list is cheaper than a map).
    let mut written: Vec<Row> = Vec::with_capacity(payloads.len());
    let mut logged = Vec::with_capacity(payloads.len());
    let mut waits = 0;
    for payload in &payloads {
        let mut already = false;
        if let Payload::Data {
            location, checksum, ..
        } = payload
        {
            let (row, member) = row_of(array, location * 512);
            if let Some(&(_, _, group)) = held.newest(row, member).filter(|c| c.1 == *checksum) {
                already = true;
                waits = waits.max(group);
            }
            written.push((row, member));
        }
        logged.push(already);
    }
    // A row's parity is logged wherever it covers every copy the cache
    // holds in the row (as md does). Left out, every row written back
    // would be data-only at a replay, and the kernel's replay loads every
    // data-only row into md's stripe cache at once: in a CI run that
    // left them out, mdadm hung in the kernel assembling a cache-killed
    // array (md itself never logs more data-only stripes than its stripe
    // cache holds).
    let parity_logged = |row: u64| {
        written.iter().any(|w| w.0 == row)
            && held.rows.get(&row).is_none_or(|copies| {
                copies
                    .live(held.released)
                    .all(|c| written.contains(&(row, c.0)))
            })
    };
    let mut kept = Vec::with_capacity(payloads.len() + rebuilt.len());
    let mut kept_pages = Vec::with_capacity(pages.len() + rebuilt_pages.len());
    // The rebuilt pages go after the data and before the first parity
    // page: a data page after its row's parity would begin a new stripe.
    let mut rebuilt = Some((rebuilt, rebuilt_pages));
    let mut at = 0usize;
    for (payload, already) in payloads.into_iter().zip(logged) {
        let n = payload.pages() * PAGE_BYTES;
        if matches!(payload, Payload::Parity { .. }) {
            keep_rebuilt(array, held, &mut rebuilt, &mut kept, &mut kept_pages);
        }
        let drop = already
            || matches!(&payload, Payload::Parity { location, .. } if !parity_logged(*location));
        if !drop {
            kept_pages.extend_from_slice(&pages[at..at + n]);
            kept.push(payload);
        }
        at += n;
    }
    keep_rebuilt(array, held, &mut rebuilt, &mut kept, &mut kept_pages);
    (kept, kept_pages, waits)
}

/// Files the copies listed in `w.unfiled` into `w.held_rows` (those of
/// groups released already are dropped).
fn file_copies(array: &Array, w: &mut Writer) {
    let released = w.released;
    for (offset, checksum, id) in w.unfiled.drain(..) {
        if id <= released {
            continue;
        }
        let (row, member) = row_of(array, offset);
        let copy = (member, checksum, id);
        match w.held_rows.entry(row) {
            std::collections::hash_map::Entry::Occupied(mut e) => e.get_mut().add(copy, released),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(Copies::new(copy));
            }
        }
    }
}

/// What a write cache holds in the log: the row table, read with the log's
/// `released` (copies of groups up to it are no longer held, see
/// [`Copies`]).
#[derive(Clone, Copy)]
struct Held<'a> {
    rows: &'a HeldRows,
    released: u64,
}

impl<'a> Held<'a> {
    /// The newest copy the cache holds of `member`'s page in `row`.
    fn newest(self, row: u64, member: u32) -> Option<&'a (u32, u32, u64)> {
        self.rows
            .get(&row)?
            .live(self.released)
            .rev()
            .find(|c| c.0 == member)
    }
}

/// The copies a write cache logged in one row, oldest first: member,
/// checksum and group. Most rows hold one, kept without an allocation.
///
/// A copy whose group is released (the group is at most the log's
/// `released`) is no longer held. It is not removed at the release, which
/// would cost a lookup per page released: it is left out when the row is
/// looked at, dropped when the row gets a new copy, and swept out with the
/// others once they are a fifth of the table ([`MdJournal::release_through`]).
///
/// Kept small (32 bytes, 40 with its key in the table: a row's other copies
/// behind one pointer): the table is probed at random once per page cached
/// and once per page written back, and its size decides how many of those
/// probes miss the processor's caches.
#[derive(Debug)]
struct Copies {
    first: (u32, u32, u64),
    more: Option<Box<[(u32, u32, u64)]>>,
}

impl Copies {
    fn new(first: (u32, u32, u64)) -> Copies {
        Copies { first, more: None }
    }

    fn more(&self) -> &[(u32, u32, u64)] {
        self.more.as_deref().unwrap_or(&[])
    }

    fn iter(&self) -> impl DoubleEndedIterator<Item = &(u32, u32, u64)> {
        std::iter::once(&self.first).chain(self.more().iter())
    }

    /// The copies still held when groups up to `released` are released.
    fn live(&self, released: u64) -> impl DoubleEndedIterator<Item = &(u32, u32, u64)> {
        self.iter().filter(move |c| c.2 > released)
    }

    /// Drops the copies released; true when none is left.
    fn purge(&mut self, released: u64) -> bool {
        // Groups are released oldest first: released copies lead the list.
        let dead = self.iter().take_while(|c| c.2 <= released).count();
        if dead == 0 {
            return false;
        }
        if dead > self.more().len() {
            return true;
        }
        let more = self.more.take().expect("dead copies past the first");
        self.first = more[dead - 1];
        if dead < more.len() {
            self.more = Some(more[dead..].into());
        }
        false
    }

    /// Adds a newer copy, dropping those released.
    fn add(&mut self, copy: (u32, u32, u64), released: u64) {
        if self.purge(released) {
            self.first = copy;
            self.more = None;
        } else {
            // (Rare: a row with copies of more than one page.)
            let mut more = self.more.take().map(Vec::from).unwrap_or_default();
            more.push(copy);
            self.more = Some(more.into_boxed_slice());
        }
    }
}

/// Hashes a row (a member sector) for [`HeldRows`]: a mix of every bit
/// (splitmix64's finalizer) under a per-journal random key, much cheaper
/// than the default hasher on the write path, and not predictable by a
/// client choosing where to write.
#[derive(Clone, Debug, Default)]
struct RowHash(u64);

impl std::hash::BuildHasher for RowHash {
    type Hasher = RowHasher;
    fn build_hasher(&self) -> RowHasher {
        RowHasher(self.0)
    }
}

struct RowHasher(u64);

impl std::hash::Hasher for RowHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 ^= x;
    }
    fn finish(&self) -> u64 {
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Appends the lost members' pages a round rebuilt (taken from `rebuilt`,
/// once), but for those where a write cache holds a newer version (its
/// checksum differs: the member lacks it, and the log has it after the
/// row's last parity).
fn keep_rebuilt(
    array: &Array,
    held: Held<'_>,
    rebuilt: &mut Option<(Vec<Payload>, Vec<u8>)>,
    kept: &mut Vec<Payload>,
    kept_pages: &mut Vec<u8>,
) {
    let Some((rebuilt, rebuilt_pages)) = rebuilt.take() else {
        return;
    };
    for (i, payload) in rebuilt.into_iter().enumerate() {
        let Payload::Data {
            location, checksum, ..
        } = &payload
        else {
            continue;
        };
        let (row, member) = row_of(array, location * 512);
        let newer = held.newest(row, member).is_some_and(|c| c.1 != *checksum);
        if !newer {
            kept.push(payload);
            kept_pages.extend_from_slice(&rebuilt_pages[i * PAGE_BYTES..(i + 1) * PAGE_BYTES]);
        }
    }
}

/// How far the sequence jumps where a replayed log ends (md's 10000).
const SEQ_JUMP: u64 = 10_000;

/// The array's journal member.
#[derive(Debug)]
pub struct MdJournal {
    pub slot: Slot,
    ring: Ring,
    seed: u32,
    /// `journal_tail` as the member's superblock holds it now.
    tail: Mutex<u64>,
    /// The log at run time (see "Logging" in the module documentation).
    writer: Mutex<Writer>,
    /// Signalled when the log moves on: a batch written, the tail moved,
    /// the journal failed ([`MdJournal::wait_ready`] sleeps on it).
    /// [`MdJournal::cached_stripes_max`] as set (0: the default).
    stripes_max: std::sync::atomic::AtomicUsize,
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
    /// ([`Array::record_journal_failure`]).
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

/// The most stripes (4 KiB rows of the members, md's unit) a write cache
/// keeps in md's log as data-only units (md's write-back mode). After a crash the kernel's md loads every data-only
/// stripe of the log into its stripe cache before it writes any of them
/// out, doubling the cache (256 stripes by default, 32,768 at most) as it
/// goes; where the doubled cache does not fit in memory, the assembly
/// waits for a stripe that never comes (reported on the linux-raid list
/// in April 2025 for 6.15-rc3, a RAID 6 hung after growing to 32,768; issue
/// 29 saw `mdadm --assemble` hang on a log nvraid left with 1,893 data-only
/// stripes, which runs here did not reproduce: up to 6,214 were recovered
/// in a 512 MiB guest on 6.1 and 6.12). md's own write-back cache never
/// holds more data-only stripes than its stripe cache. nvraid keeps the
/// stripes of its logged, unreleased cache pages at 4,096: the kernel's
/// cache then grows to 8,192 stripes at most (about 170 MB for a
/// five-member array), and a replay loads no more than that.
pub const CACHED_STRIPES_MAX: usize = 4096;

/// The stripe (md's unit: the 4 KiB row of the members) of array byte
/// `offset`, as its page number on a member.
fn stripe_key(array: &Array, offset: u64) -> u64 {
    match array.parity {
        Some(shape) => {
            let row = offset / shape.stripe_data_bytes();
            (row * shape.chunk + offset % shape.chunk) / PAGE_BYTES as u64
        }
        None => offset / PAGE_BYTES as u64,
    }
}

/// A page's row (its sector on the members) and member.
type Row = (u64, u32);

/// Per row (a page's sector on the members), the copies a cache holds
/// there: member, checksum and group.
type HeldRows = std::collections::HashMap<u64, Copies, RowHash>;

/// A write cache's write made ready for the log
/// ([`MdJournal::prepare_cached`]).
#[derive(Debug)]
pub struct CachedWrite {
    offset: u64,
    payloads: Vec<Payload>,
    sectors: u64,
    pages: Vec<u8>,
}

/// One request round's pages, as units of the log.
#[derive(Debug)]
struct Group {
    id: u64,
    /// A write cache's pages (held until released).
    cached: bool,
    payloads: Vec<Payload>,
    /// The ring its payloads take packed on their own ([`packed_sectors`];
    /// a batch packs them with others' into no more).
    sectors: u64,
    /// Every payload's pages, in order.
    pages: Vec<u8>,
}

impl Group {
    fn sectors(&self) -> u64 {
        self.sectors
    }
}

/// What a replay did, for the caller to report.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Replay {
    /// Units read from the log.
    pub units: usize,
    /// Stripes written back exactly as logged (data and parity).
    pub complete_stripes: usize,
    /// Stripes whose logged data was written through the array.
    pub data_only_stripes: usize,
    /// Pages written in all.
    pub pages: usize,
}

/// Stripes by their sector on the members.
type Stripes = Vec<(u64, Stripe)>;

/// One stripe gathered from the log.
#[derive(Default)]
struct Stripe {
    /// Data pages by member role.
    data: BTreeMap<u32, (u64, Vec<u8>)>,
    /// P, then Q.
    parity: Option<Vec<Vec<u8>>>,
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

    /// `journal_tail` now (sectors into the ring).
    pub fn tail(&self) -> u64 {
        *self.tail.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Units with payloads from the tail on (what a replay would read).
    pub fn units_logged(&self) -> Result<usize> {
        Ok(match self.scan()? {
            Ok(scan) => scan
                .units
                .iter()
                .filter(|u| !u.block.payloads.is_empty())
                .count(),
            Err(_) => 0,
        })
    }

    /// Sectors of the ring.
    pub fn ring_sectors(&self) -> u64 {
        self.ring.sectors
    }

    fn writer(&self) -> std::sync::MutexGuard<'_, Writer> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits, at most `timeout`, until `ticket` is durable, the journal
    /// failed, or a call of [`MdJournal::ready`] could write (no batch or
    /// tail move in flight, and groups waiting). A committer calls it where
    /// `ready` said "not yet": it sleeps until the batch in flight ends
    /// instead of polling.
    pub fn wait_ready(&self, ticket: u64, timeout: std::time::Duration) {
        let mut w = self.writer();
        w.sleepers += 1;
        let (mut w, _) = self
            .progress
            .wait_timeout_while(w, timeout, |w| {
                w.durable < ticket && w.failed.is_none() && (w.writing || w.waiting.is_empty())
            })
            .unwrap_or_else(|p| p.into_inner());
        w.sleepers -= 1;
    }

    fn spare(&self) -> std::sync::MutexGuard<'_, Vec<Vec<u8>>> {
        self.spare_pages.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keep `pages` for a later cached write, unless enough are kept or it
    /// is large.
    fn keep_spare(&self, pages: Vec<u8>) {
        let mut spare = self.spare();
        if spare.len() < SPARE_PAGES && pages.capacity() <= SPARE_PAGE_BYTES {
            spare.push(pages);
        }
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

    /// A write cache's pages, `data` at array byte `offset` (whole 4 KiB
    /// pages), as data-only units (md's write-back mode): held open until
    /// [`MdJournal::release_through`], so the tail never passes them while
    /// the members lack them. Its ticket, or `None` when the cache holds
    /// its share of the log already (nothing queued). The caller orders
    /// these calls as it takes the writes in (a cache: under its lock).
    pub fn enqueue_cached(
        &self,
        array: &Array,
        offset: u64,
        data: &[u8],
    ) -> std::result::Result<Option<u64>, String> {
        let write = self.prepare_cached(offset, data)?;
        self.enqueue_prepared(array, write)
    }

    /// The part of [`MdJournal::enqueue_cached`] that needs no lock: the
    /// pages' checksums and their copy for the log.
    pub fn prepare_cached(
        &self,
        offset: u64,
        data: &[u8],
    ) -> std::result::Result<CachedWrite, String> {
        if !offset.is_multiple_of(PAGE_BYTES as u64) || !data.len().is_multiple_of(PAGE_BYTES) {
            return Err(format!(
                "{offset}+{}: the journal logs whole 4 KiB pages",
                data.len()
            ));
        }
        let payloads: Vec<Payload> = data
            .chunks(PAGE_BYTES)
            .enumerate()
            .map(|(i, page)| Payload::Data {
                flags: 0,
                location: (offset + (i * PAGE_BYTES) as u64) / 512,
                checksum: r5log::md_crc(self.seed, page),
            })
            .collect();
        let sectors = packed_sectors(&payloads);
        // A buffer of a batch already written, when one of the size is kept.
        let mut pages = {
            let mut spare = self.spare();
            match spare.iter().position(|b| b.capacity() >= data.len()) {
                Some(at) => spare.swap_remove(at),
                None => Vec::with_capacity(data.len()),
            }
        };
        pages.clear();
        pages.extend_from_slice(data);
        Ok(CachedWrite {
            offset,
            payloads,
            sectors,
            pages,
        })
    }

    /// Queues a write [`MdJournal::prepare_cached`] made ready (see
    /// [`MdJournal::enqueue_cached`]).
    pub fn enqueue_prepared(
        &self,
        array: &Array,
        write: CachedWrite,
    ) -> std::result::Result<Option<u64>, String> {
        let CachedWrite {
            offset,
            payloads,
            sectors,
            pages,
        } = write;
        let mut w = self.writer();
        if let Some(why) = &w.failed {
            return Err(why.clone());
        }
        let stripe_of = |i: usize| stripe_key(array, offset + (i * PAGE_BYTES) as u64);
        let new_stripes = (0..payloads.len())
            .filter(|&i| !w.held_stripes.contains_key(&stripe_of(i)))
            .count();
        let over_stripes = w.held_stripes.len() + new_stripes > self.cached_stripes_max();
        if w.held_sectors > 0
            && (w.held_sectors + sectors > self.cache_share(array) || over_stripes)
        {
            w.wants_room = true;
            drop(w);
            self.keep_spare(pages);
            return Ok(None);
        }
        let id = w.next_group.max(1);
        w.next_group = id + 1;
        let w = &mut *w;
        for (i, payload) in payloads.iter().enumerate() {
            let Payload::Data { checksum, .. } = *payload else {
                unreachable!("data payloads only")
            };
            w.unfiled
                .push((offset + (i * PAGE_BYTES) as u64, checksum, id));
        }
        for i in 0..payloads.len() {
            let stripe = stripe_of(i);
            *w.held_stripes.entry(stripe).or_insert(0) += 1;
            w.held_order.push_back((id, stripe));
        }
        w.held.push_back((id, sectors, payloads.len()));
        w.held_sectors += sectors;
        w.held_count += payloads.len();
        w.waiting.push_back(Group {
            id,
            cached: true,
            payloads,
            sectors,
            pages,
        });
        Ok(Some(id))
    }

    /// The most a write cache may hold in the log (sectors; and at most
    /// [`CACHED_STRIPES_MAX`] stripes). Writing its
    /// pages back logs each row's parity again (P, and Q on RAID 6; not the
    /// data, which the log holds: see [`MdJournal::enqueue`]), and the
    /// cache writes back in slices, each logged page released within two
    /// of them. For 4 KiB writes (the worst case: a meta block per page
    /// both ways) the ring then holds at most the share plus two slices'
    /// parity, 3 shares on RAID 4/5 and 4 on RAID 6. The share is a fifth
    /// of the ring on RAID 4/5 and a seventh on RAID 6 (or one write at a
    /// time), which leaves two fifths of the ring to spare.
    fn cache_share(&self, array: &Array) -> u64 {
        let parity = array.parity.map_or(2, |shape| u64::from(shape.parity));
        self.ring.sectors / (3 + 2 * parity)
    }

    /// The most stripes a write cache keeps data-only in the log
    /// ([`CACHED_STRIPES_MAX`] unless set).
    pub fn cached_stripes_max(&self) -> usize {
        match self.stripes_max.load(std::sync::atomic::Ordering::Relaxed) {
            0 => CACHED_STRIPES_MAX,
            n => n,
        }
    }

    /// Set [`MdJournal::cached_stripes_max`] (at least 16).
    pub fn set_cached_stripes_max(&self, stripes: usize) {
        assert!(stripes >= 16, "a cache of {stripes} stripes");
        self.stripes_max
            .store(stripes, std::sync::atomic::Ordering::Relaxed);
    }

    /// How much of its share of the log a write cache holds now, as a
    /// pair `(held, share)` to compare: the fuller of its sectors against
    /// [`MdJournal::cache_share`] and its stripes against
    /// [`CACHED_STRIPES_MAX`] (`held / share` is the larger fraction).
    pub fn held_share(&self, array: &Array) -> (u64, u64) {
        let w = self.writer();
        let (sectors, share) = (w.held_sectors, self.cache_share(array).max(1));
        let (stripes, stripes_max) = (
            w.held_stripes.len() as u64,
            self.cached_stripes_max() as u64,
        );
        (
            (sectors * stripes_max).max(stripes * share),
            share * stripes_max,
        )
    }

    /// A write cache's pages up to group `ticket` are on the members and
    /// flushed: the tail may pass them.
    pub fn release_through(&self, ticket: u64) {
        let mut w = self.writer();
        let w = &mut *w;
        w.released = w.released.max(ticket);
        while let Some(&(_, sectors, count)) = w.held.front().filter(|g| g.0 <= ticket) {
            w.held.pop_front();
            w.held_sectors -= sectors;
            w.held_count -= count;
        }
        while let Some(&(_, stripe)) = w.held_order.front().filter(|p| p.0 <= ticket) {
            w.held_order.pop_front();
            if let std::collections::hash_map::Entry::Occupied(mut held) =
                w.held_stripes.entry(stripe)
            {
                *held.get_mut() -= 1;
                if *held.get() == 0 {
                    held.remove();
                }
            }
        }
        // Paired with the enqueue: every held page is counted in its stripe.
        assert_eq!(
            w.held_order.len(),
            w.held_count,
            "held pages and their stripes"
        );
        // (Listed in group order: the released lead.)
        let released = w.unfiled.partition_point(|c| c.2 <= w.released);
        w.unfiled.drain(..released);
        while w.open_cached.front().is_some_and(|g| g.0 <= ticket) {
            w.open_cached.pop_front();
        }
        // Rows whose copies are all released are swept out once they are
        // a fifth of the table: one pass over the table, not a lookup per
        // page released. The table is probed at random (once per page
        // cached, once per page written back), so it is kept near the size
        // of what is held, and given back its room once it is three times
        // larger than that: the smaller it is, the fewer probes miss the
        // processor's caches.
        if w.held_rows.len() > w.held_count + w.held_count / 4 + 1024 {
            let released = w.released;
            w.held_rows.retain(|_, copies| !copies.purge(released));
            if w.held_rows.capacity() > 3 * w.held_rows.len().max(1024) {
                w.held_rows.shrink_to(2 * w.held_rows.len());
            }
        }
    }

    /// True once, for the caller that is to record the failure on the
    /// members.
    pub(crate) fn take_failure_to_record(&self) -> bool {
        !self
            .failure_recorded
            .swap(true, std::sync::atomic::Ordering::AcqRel)
    }

    /// Move the tail as far as the members allow: past every unit of a
    /// group that is done (the members flushed first, then every
    /// superblock). Waits while another thread writes the log.
    pub fn checkpoint(&self, array: &Array) -> Result<()> {
        let moved = self.checkpoint_inner(array);
        if moved.is_err() && self.failure().is_some() {
            let _ = array.record_journal_failure();
        }
        moved
    }

    /// Whether `error` is the journal member's own (it names it).
    fn is_own_failure(&self, error: &Error) -> bool {
        matches!(error, Error::Io { spec, .. } if spec == self.spec())
    }

    fn checkpoint_inner(&self, array: &Array) -> Result<()> {
        loop {
            let w = self.writer();
            if w.failed.is_some() {
                return Ok(());
            }
            if w.writing {
                drop(w);
                std::thread::sleep(std::time::Duration::from_micros(50));
                continue;
            }
            return self.move_tail(array, w).1;
        }
    }

    /// [`MdJournal::checkpoint`] with the lock held and nobody writing;
    /// gives the lock back.
    fn move_tail<'a>(
        &'a self,
        array: &Array,
        mut w: std::sync::MutexGuard<'a, Writer>,
    ) -> (std::sync::MutexGuard<'a, Writer>, Result<()>) {
        // The oldest group still writing its stripes (or held by a cache),
        // or else the newest written (all on the members; replaying it is
        // harmless).
        let oldest_round = w.open.first_key_value().map(|(&id, &at)| (id, at));
        let oldest = match (oldest_round, w.open_cached.front().copied()) {
            (Some(round), Some(cached)) => Some(round.min(cached)),
            (round, cached) => round.or(cached),
        };
        let new_tail = oldest.map(|(_, at)| at).or(w.last_written);
        let Some(new_tail) = new_tail.filter(|&t| t != self.tail()) else {
            return (w, Ok(()));
        };
        w.writing = true;
        drop(w);
        let old_tail = self.tail();
        let moved = array.flush().and_then(|()| {
            *self.tail.lock().unwrap_or_else(|p| p.into_inner()) = new_tail;
            array.write_journal_tail()
        });
        let mut w = self.writer();
        w.writing = false;
        w.wants_room = false;
        self.wake(&w);
        let result = match moved {
            Ok(()) => Ok(()),
            Err(e) if self.is_own_failure(&e) => {
                Err(self.fail(&mut w, format!("moving its tail: {e}")))
            }
            Err(e) => {
                // A member of the array, not the journal, failed its flush
                // or superblock (one the array could not lose, or it would
                // have been marked faulty and the update gone on): the log
                // is whole, the tail stays where it was (the ring does not
                // reuse what a replay may still need), and a later
                // checkpoint moves it.
                *self.tail.lock().unwrap_or_else(|p| p.into_inner()) = old_tail;
                Err(e)
            }
        };
        (w, result)
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

    /// Queue a round's pages (`payloads` in order, `pages` their bytes)
    /// for the log: its ticket.
    ///
    /// Under a write cache (md's write-back mode) the log holds the pages
    /// the cache acknowledged, and a round writing them back is trimmed:
    /// - a data page the log holds already (the newest copy the cache
    ///   logged for its place, same checksum) is not logged again;
    /// - a row's parity is logged only where it covers every copy the
    ///   cache holds in the row, as md logs the parity of a cached stripe
    ///   it writes out. A replay puts a row together from every data page
    ///   logged for it and the last parity after them, and writes that as
    ///   it stands; a row with no parity after its data it writes through
    ///   the array, parity computed from all of it, whatever a crash left
    ///   on the members. So a parity page that would not cover another
    ///   member's page the cache holds in its row (the round read that
    ///   page's old bytes) is never logged.
    ///
    /// On a degraded array a round that rebuilt a lost member's pages (to
    /// compute parity) logs them as they are (`rebuilt`), before its
    /// parity, unless the cache holds a newer version there (which the log
    /// has, after the row's last parity). A replay then never rebuilds a
    /// lost member's page from the members where the log's rows say
    /// otherwise: parity a crash tore mid-round, or the parity of an
    /// earlier complete stripe of the row, which the replay puts back
    /// although a later round (logging no parity) changed the row.
    ///
    /// A round that so logs nothing takes no place in the log: its ticket
    /// is the newest cache group whose copies it left out, and its writes
    /// wait until that group is durable.
    pub(crate) fn enqueue(
        &self,
        array: &Array,
        payloads: Vec<Payload>,
        pages: Vec<u8>,
        rebuilt: (Vec<Payload>, Vec<u8>),
    ) -> u64 {
        let mut w = self.writer();
        file_copies(array, &mut w);
        let held = Held {
            rows: &w.held_rows,
            released: w.released,
        };
        let (payloads, pages, waits) = trim_for_cache(array, held, payloads, pages, rebuilt);
        if payloads.is_empty() && waits > 0 {
            return waits;
        }
        let sectors = packed_sectors(&payloads);
        let id = w.next_group.max(1);
        w.next_group = id + 1;
        w.waiting.push_back(Group {
            id,
            cached: false,
            payloads,
            sectors,
            pages,
        });
        id
    }

    /// Whether `ticket`'s pages are durable in the log (then its stripes may
    /// be written). Never blocks on other requests: a caller that finds the
    /// log free writes every waiting group in one write and one flush; when
    /// the ring is half full it first moves the tail past the groups whose
    /// stripes are on the members (the members flushed, then every
    /// superblock). An error: the journal failed, and no write may go on.
    pub fn ready(&self, array: &Array, ticket: u64) -> Result<bool> {
        let ready = self.ready_inner(array, ticket);
        if ready.is_err() {
            // (Not under the log's lock: the members' superblocks are written.)
            let _ = array.record_journal_failure();
        }
        ready
    }

    fn ready_inner(&self, array: &Array, ticket: u64) -> Result<bool> {
        if self.flags() & FAILED == 0
            && self.durable.load(std::sync::atomic::Ordering::Acquire) >= ticket
        {
            return Ok(true);
        }
        let mut w = self.writer();
        if let Some(why) = &w.failed {
            return Err(self.refused(why));
        }
        if w.durable >= ticket {
            return Ok(true);
        }
        if w.writing || w.waiting.is_empty() {
            return Ok(false);
        }
        let need: u64 = w.waiting.iter().map(Group::sectors).sum();
        let used = self.ring.distance(self.tail(), w.head);
        if used + need + PAGE_SECTORS > self.ring.sectors || used > self.ring.sectors / 2 {
            let (back, moved) = self.move_tail(array, w);
            w = back;
            moved?;
            if w.durable >= ticket {
                return Ok(true);
            }
            if w.writing || w.waiting.is_empty() {
                return Ok(false);
            }
        }
        // As many waiting groups as the ring has room for, at least one.
        let used = self.ring.distance(self.tail(), w.head);
        let mut room = self.ring.sectors - used - PAGE_SECTORS.min(self.ring.sectors - used);
        let mut take = 0;
        for g in &w.waiting {
            let sectors = g.sectors();
            if sectors > room {
                break;
            }
            room -= sectors;
            take += 1;
        }
        if take == 0 {
            let first = w.waiting.front().expect("not empty").sectors();
            if first + PAGE_SECTORS > self.ring.sectors {
                let why = format!(
                    "a write of {} sectors of log does not fit its ring of {}",
                    first, self.ring.sectors
                );
                return Err(self.fail(&mut w, why));
            }
            // Wait for stripes to reach the members, then the tail moves.
            w.wants_room = true;
            return Ok(false);
        }
        let groups: Vec<Group> = w.waiting.drain(..take).collect();
        // The batch is built and written without the lock: `writing` keeps
        // every other writer off the head until it is moved below.
        let start = w.head;
        let mut seq = w.seq;
        w.writing = true;
        drop(w);
        let batch = Batch::of(&groups);
        let len = (batch.sectors() * 512) as usize;
        let mut kept = self.image.lock().unwrap_or_else(|p| p.into_inner());
        let mut own = None;
        let image: &mut [u8] = if len <= IMAGE_KEPT_BYTES {
            if kept.len() < len {
                *kept = AlignedBuf::zeroed(len.next_power_of_two().min(IMAGE_KEPT_BYTES));
            }
            &mut kept[..len]
        } else {
            &mut own.insert(AlignedBuf::zeroed(len))[..]
        };
        let mut positions = Vec::with_capacity(batch.units.len());
        let mut pos = start;
        let mut at = 0usize;
        for (unit, pages) in batch.units.iter().zip(&batch.pages) {
            positions.push(pos);
            let mut block = unit.clone();
            block.seq = seq;
            block.position = pos;
            block
                .encode(&mut image[at..at + PAGE_BYTES], self.seed)
                .expect("units are filled to fit");
            at += PAGE_BYTES;
            for &(group, from) in pages {
                image[at..at + PAGE_BYTES]
                    .copy_from_slice(&groups[group].pages[from..from + PAGE_BYTES]);
                at += PAGE_BYTES;
            }
            pos = self.ring.add(pos, unit.unit_sectors());
            seq += 1;
        }
        let firsts: Vec<(u64, bool, u64)> = groups
            .iter()
            .zip(&batch.first_unit)
            .map(|(g, &unit)| (g.id, g.cached, positions[unit]))
            .collect();
        let written = self.write_ring(start, image);
        drop(own);
        drop(kept);
        for group in groups {
            if group.cached {
                self.keep_spare(group.pages);
            }
        }
        let mut w = self.writer();
        w.writing = false;
        self.wake(&w);
        if let Err(e) = written {
            return Err(self.fail(&mut w, e.to_string()));
        }
        w.head = pos;
        w.seq = seq;
        for (id, cached, first) in firsts {
            if !cached {
                w.open.insert(id, first);
            } else if id > w.released {
                // (A cache's group released before it was written stays
                // closed.)
                w.open_cached.push_back((id, first));
            }
            w.last_written = Some(first);
            w.durable = id;
        }
        self.durable
            .store(w.durable, std::sync::atomic::Ordering::Release);
        Ok(w.durable >= ticket)
    }

    /// The request holding `ticket` has written its stripes (a cache's
    /// group waits for [`MdJournal::release_through`] instead).
    pub(crate) fn done(&self, ticket: u64) {
        // (A cache's group is not in `open`: a round that logged nothing
        // has one's ticket.)
        self.writer().open.remove(&ticket);
    }

    /// Write `image` into the ring from `start` (two writes when it passes
    /// the ring's end), then flush the journal member.
    fn write_ring(&self, start: u64, image: &[u8]) -> std::io::Result<()> {
        let member = &self.slot.member;
        let first = ((self.ring.sectors - start) * 512).min(image.len() as u64) as usize;
        member.write_at(&image[..first], self.ring_offset(start))?;
        if first < image.len() {
            member.write_at(&image[first..], self.ring_offset(0))?;
        }
        member.flush()
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

    /// At an orderly stop: the tail moves to the newest unit (every stripe
    /// is on the members, and they are flushed).
    pub(crate) fn close(&self, array: &Array) -> Result<()> {
        let w = self.writer();
        if !w.active || w.failed.is_some() {
            return Ok(());
        }
        let Some(last) = w.last_written.filter(|&t| t != self.tail()) else {
            return Ok(());
        };
        drop(w);
        *self.tail.lock().unwrap_or_else(|p| p.into_inner()) = last;
        array.write_journal_tail()
    }

    fn io_error(&self, e: std::io::Error) -> Error {
        Error::io(self.spec(), e)
    }

    fn ring_offset(&self, position: u64) -> u64 {
        (self.slot.superblock.data_offset_sectors + position) * 512
    }

    /// Read the log from the tail (`Err` inside: no valid block there).
    fn scan(&self) -> Result<std::result::Result<r5log::Scan, r5log::LogError>> {
        let tail = self.tail();
        let tail = if tail >= self.ring.sectors || !tail.is_multiple_of(PAGE_SECTORS) {
            // md starts over at 0 from a tail outside the ring.
            0
        } else {
            tail
        };
        let mut page = AlignedBuf::zeroed(PAGE_BYTES);
        r5log::scan(self.ring, tail, self.seed, |pos, buf| {
            self.slot.member.read_at(&mut page, self.ring_offset(pos))?;
            buf.copy_from_slice(&page);
            Ok(())
        })
        .map_err(|e| self.io_error(e))
    }

    /// Start an empty log at `position` with sequence `seq`: the block,
    /// flushed; the caller then writes the superblocks with the new tail.
    fn start_log(&self, position: u64, seq: u64) -> Result<()> {
        let mut page = AlignedBuf::zeroed(PAGE_BYTES);
        MetaBlock::empty(seq, position)
            .encode(&mut page, self.seed)
            .expect("an empty block fits");
        let member = &self.slot.member;
        member
            .write_at(&page, self.ring_offset(position))
            .and_then(|()| member.flush())
            .map_err(|e| self.io_error(e))?;
        *self.tail.lock().unwrap_or_else(|p| p.into_inner()) = position;
        self.activate(position, seq);
        Ok(())
    }

    /// Log from here on: the log is the empty block at `position` (the
    /// tail) with sequence `seq`.
    pub(crate) fn activate(&self, position: u64, seq: u64) {
        let mut w = self.writer();
        w.head = self.ring.add(position, PAGE_SECTORS);
        w.seq = seq + 1;
        w.last_written = Some(position);
        w.next_group = w.next_group.max(w.durable + 1);
        w.active = true;
        self.set_flag(ACTIVE);
    }
}

/// A new journal's log: one empty meta block at its start, with a random
/// sequence number (what mdadm writes at create), which it returns.
pub(crate) fn write_empty_log(
    member: &nvraid_member::Member,
    sb: &nvraid_metadata::Superblock,
) -> Result<u64> {
    let seq = random_seq()?;
    let mut page = AlignedBuf::zeroed(PAGE_BYTES);
    MetaBlock::empty(seq, 0)
        .encode(&mut page, r5log::uuid_checksum(&sb.set_uuid))
        .expect("an empty block fits");
    member
        .write_at(&page, sb.data_offset_sectors * 512)
        .map_err(|e| Error::io(member.spec(), e))?;
    Ok(seq)
}

/// A random 32-bit start for a log's sequence numbers, as md picks.
fn random_seq() -> Result<u64> {
    let bytes = crate::create::random_uuid()?;
    Ok(u64::from(u32::from_le_bytes(
        bytes[..4].try_into().expect("4 bytes"),
    )))
}

impl Array {
    /// The array's write journal, when it has one.
    pub fn md_journal(&self) -> Option<&MdJournal> {
        self.md_journal.as_ref()
    }

    /// Stripes the journal holds data for that the members may not have
    /// at all: data-only stripes (md's write-back mode acknowledges writes
    /// once they are logged). A look that writes nothing.
    pub fn journal_data_only_stripes(&self) -> Result<usize> {
        let Some(journal) = &self.md_journal else {
            return Ok(0);
        };
        match journal.scan()? {
            Ok(scan) => Ok(self.gather(journal, &scan)?.1.len()),
            Err(_) => Ok(0),
        }
    }

    /// Replay the journal (writable assembly). `None` when the array has no
    /// journal member or is read-only.
    pub(crate) fn replay_md_journal(&self) -> Result<Option<Replay>> {
        let Some(journal) = &self.md_journal else {
            return Ok(None);
        };
        if !self.is_writable() {
            return Ok(None);
        }
        let scan = match journal.scan()? {
            Ok(scan) => scan,
            Err(_) => {
                // No log: start one, as md does.
                journal.start_log(0, random_seq()?)?;
                self.write_journal_tail()?;
                return Ok(Some(Replay::default()));
            }
        };
        let mut replay = Replay {
            units: scan
                .units
                .iter()
                .filter(|u| !u.block.payloads.is_empty())
                .count(),
            ..Replay::default()
        };
        let (complete, mut data_only) = self.gather(journal, &scan)?;
        // A lost member's page of a data-only stripe the log lacks is
        // rebuilt now, from the members as the crash left them, before a
        // complete stripe of the same row puts back parity that a later
        // round (which logged none) made stale.
        for (key, stripe) in &mut data_only {
            for (role, offset) in self.lost_data_pages(*key) {
                if stripe.data.contains_key(&role) {
                    continue;
                }
                let mut page = AlignedBuf::zeroed(PAGE_BYTES);
                self.read_at(&mut page, offset)?;
                stripe.data.insert(role, (offset, page.to_vec()));
            }
        }
        for (key, stripe) in &complete {
            replay.pages += self.write_logged_stripe(*key, stripe)?;
        }
        replay.complete_stripes = complete.len();
        self.flush()?;
        // Data-only stripes go through the array, their parity computed
        // from all of their data (a crash may have torn what the members
        // hold, so it is not updated from it); the log is not written yet,
        // and a crash now replays them again from the same log.
        journal
            .replaying
            .store(true, std::sync::atomic::Ordering::Release);
        let written = (|| {
            for (_, stripe) in &data_only {
                // The lost members' pages first: each later page's write
                // then rebuilds them from parity that agrees with them.
                let mut pages: Vec<(bool, &(u64, Vec<u8>))> = stripe
                    .data
                    .iter()
                    .map(|(&role, page)| (self.is_usable(role as usize), page))
                    .collect();
                pages.sort_by_key(|&(usable, _)| usable);
                for (_, (offset, page)) in pages {
                    let mut buf = AlignedBuf::zeroed(PAGE_BYTES);
                    buf.copy_from_slice(page);
                    self.write_at(&buf, *offset, false)?;
                    replay.pages += 1;
                }
            }
            Ok::<(), Error>(())
        })();
        journal
            .replaying
            .store(false, std::sync::atomic::Ordering::Release);
        written?;
        replay.data_only_stripes = data_only.len();
        self.flush()?;
        // md's jump: units written out of order may sit past the end with
        // the next few sequence numbers; the new log must not continue
        // into them.
        journal.start_log(scan.next_position, scan.next_seq + SEQ_JUMP)?;
        self.write_journal_tail()?;
        Ok(Some(replay))
    }

    /// The stripes a scanned log holds, md's way: those to write exactly as
    /// logged (in log order), and those with data only.
    fn gather(&self, journal: &MdJournal, scan: &r5log::Scan) -> Result<(Stripes, Stripes)> {
        let shape = self.parity.expect("a journal array has parity");
        let mut stripes: BTreeMap<u64, Stripe> = BTreeMap::new();
        // Stripes to write exactly, in log order.
        let mut complete: Vec<(u64, Stripe)> = Vec::new();
        // The newest page logged for each (stripe, member) of a lost
        // member (see below).
        let lost: Vec<u32> = (0..self.roles() as u32)
            .filter(|&role| !self.is_usable(role as usize))
            .collect();
        let mut newest: BTreeMap<(u64, u32), (u64, Vec<u8>)> = BTreeMap::new();
        for unit in &scan.units {
            let mut pages = unit.pages.iter();
            for payload in &unit.block.payloads {
                match payload {
                    Payload::Data { location, .. } => {
                        let page = pages.next().expect("scan read one page per checksum");
                        let offset = location * 512;
                        if offset + PAGE_BYTES as u64 > self.size_bytes() {
                            return Err(self.bad_log(
                                journal,
                                format!(
                                    "a data page for array sector {location}, past the array's end"
                                ),
                            ));
                        }
                        let at = self.geometry().locate(offset, 0);
                        let key = at.member_offset / 512;
                        if lost.contains(&at.member) {
                            newest.insert((key, at.member), (offset, page.clone()));
                        }
                        if stripes.get(&key).is_some_and(|s| s.parity.is_some()) {
                            complete.push((key, stripes.remove(&key).expect("present")));
                        }
                        stripes
                            .entry(key)
                            .or_default()
                            .data
                            .insert(at.member, (offset, page.clone()));
                    }
                    Payload::Parity {
                        location,
                        checksums,
                        ..
                    } => {
                        if checksums.len() != shape.parity as usize {
                            return Err(self.bad_log(
                                journal,
                                format!(
                                    "{} parity pages for stripe sector {location} of a {}",
                                    checksums.len(),
                                    self.geometry().level()
                                ),
                            ));
                        }
                        if (location + PAGE_SECTORS) * 512 > self.geometry().member_used_bytes() {
                            return Err(self.bad_log(
                                journal,
                                format!(
                                    "parity for stripe sector {location}, past the members' end"
                                ),
                            ));
                        }
                        let got: Vec<Vec<u8>> = checksums
                            .iter()
                            .map(|_| pages.next().expect("one page per checksum").clone())
                            .collect();
                        stripes.entry(*location).or_default().parity = Some(got);
                    }
                    Payload::Flush {
                        stripes: flushed, ..
                    } => {
                        for s in flushed {
                            stripes.remove(s);
                            newest.retain(|&(key, _), _| key != *s);
                        }
                    }
                }
            }
        }
        let (rest_complete, mut data_only): (Vec<_>, Vec<_>) =
            stripes.into_iter().partition(|(_, s)| s.parity.is_some());
        // A data-only stripe is written through the array, which rebuilds
        // a lost member's page from the parity on the members. Where the
        // log holds that page (in an earlier, complete stripe of the row,
        // say), its newest copy is what the member holds: every write of
        // that page after the tail is logged, data or rebuilt.
        for (key, stripe) in &mut data_only {
            for &role in &lost {
                if let Some(page) = newest.get(&(*key, role)) {
                    stripe.data.entry(role).or_insert_with(|| page.clone());
                }
            }
        }
        complete.extend(rest_complete);
        // Parity with no data: its data went to the members before the
        // tail moved past it; md writes nothing for it either.
        complete.retain(|(_, s)| !s.data.is_empty());
        Ok((complete, data_only))
    }

    /// The lost members that hold data (not parity) at member sector
    /// `key`, each with the array offset of its page there.
    fn lost_data_pages(&self, key: u64) -> Vec<(u32, u64)> {
        let shape = self.parity.expect("a journal array has parity");
        (0..self.roles() as u32)
            .filter(|&role| !self.is_usable(role as usize))
            .filter_map(|role| Some((role, shape.array_offset_of(key * 512, role)?)))
            .collect()
    }

    fn bad_log(&self, journal: &MdJournal, what: String) -> Error {
        Error::Unsupported {
            spec: journal.spec().into(),
            what: format!("its write journal: {what}"),
        }
    }

    /// Write a complete stripe's logged pages where they belong: each data
    /// page on its member, P and Q on theirs, at the stripe's sector.
    fn write_logged_stripe(&self, key: u64, stripe: &Stripe) -> Result<usize> {
        let shape = self.parity.expect("a parity array");
        let row = key * 512 / shape.chunk;
        let (p, q) = shape.map.parity_members(row);
        let mut writes: Vec<(u32, &[u8])> = stripe
            .data
            .iter()
            .map(|(member, (_, page))| (*member, &page[..]))
            .collect();
        if let Some(parity) = &stripe.parity {
            writes.push((p, &parity[0]));
            if let (Some(q), Some(page)) = (q, parity.get(1)) {
                writes.push((q, page));
            }
        }
        let mut buf = AlignedBuf::zeroed(PAGE_BYTES);
        let mut written = 0;
        for (member, page) in writes {
            let role = member as usize;
            if !self.is_usable(role) {
                continue;
            }
            let slot = self.slot(role).expect("usable");
            buf.copy_from_slice(page);
            slot.member
                .write_at(&buf, slot.data_offset_bytes() + key * 512)
                .map_err(|e| Error::io(slot.member.spec(), e))?;
            written += 1;
        }
        Ok(written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(i: u64) -> Payload {
        Payload::Data {
            flags: 0,
            location: i * 8,
            checksum: i as u32,
        }
    }

    fn parity(i: u64, pages: usize) -> Payload {
        Payload::Parity {
            flags: 0,
            location: i * 8,
            checksums: vec![7; pages],
        }
    }

    /// `pack` fills each meta block as far as `MetaBlock::fits` allows, and
    /// `packed_sectors` says what `pack` makes, for lists that fill one
    /// block, cross into more, and mix data with P and P+Q pages.
    #[test]
    fn packing_fills_blocks_and_its_size_is_known_beforehand() {
        let lists: Vec<Vec<Payload>> = vec![
            vec![],
            vec![data(1)],
            (0..203).map(data).collect(),
            (0..204).map(data).collect(),
            (0..700).map(data).collect(),
            (0..300)
                .map(|i| match i % 3 {
                    0 => data(i),
                    1 => parity(i, 1),
                    _ => parity(i, 2),
                })
                .collect(),
        ];
        for payloads in lists {
            let n = payloads.len();
            let expected = packed_sectors(&payloads);
            let units = pack(payloads.clone());
            assert_eq!(
                units.iter().map(MetaBlock::unit_sectors).sum::<u64>(),
                expected,
                "{n} payloads"
            );
            let flat: Vec<Payload> = units.iter().flat_map(|u| u.payloads.clone()).collect();
            assert_eq!(flat, payloads, "order kept");
            for pair in units.windows(2) {
                assert!(pair[0].meta_size() <= PAGE_BYTES);
                assert!(
                    !pair[0].fits(&pair[1].payloads[0]),
                    "{n} payloads: a block closed before it was full"
                );
            }
        }
    }

    /// A write-back's round is trimmed against the copies a cache holds,
    /// and a copy whose group is released counts as not held: the page is
    /// logged again (the tail may have passed its copy), and the row's
    /// parity is logged although the released page is not in the round.
    #[test]
    fn a_released_copy_neither_stands_for_the_page_nor_holds_parity_back() {
        let dir = tempfile::tempdir().unwrap();
        let specs: Vec<String> = (0..5)
            .map(|i| dir.path().join(format!("m{i}")).display().to_string())
            .collect();
        let options = crate::CreateOptions {
            level: nvraid_layout::Level::Raid5 {
                layout: nvraid_layout::parity::ParityLayout::LeftSymmetric,
            },
            chunk_bytes: 64 << 10,
            name: "trim".into(),
            size_bytes: Some(16 << 20),
            force: false,
            direct: false,
            bitmap: crate::BitmapChoice::Journal,
        };
        let array = crate::create(&specs, &options).unwrap();
        // Page 0 of data chunks 0 (x) and 1 (y): one row, two members.
        let ((row, x), (_, y)) = (row_of(&array, 0), row_of(&array, 64 << 10));
        let round = |checksum_x| {
            let payloads = vec![
                Payload::Data {
                    flags: 0,
                    location: 0,
                    checksum: checksum_x,
                },
                Payload::Parity {
                    flags: 0,
                    location: row,
                    checksums: vec![9],
                },
            ];
            (payloads, vec![0u8; 2 * PAGE_BYTES])
        };
        let mut held = HeldRows::with_hasher(RowHash(1));
        // The cache holds x (checksum 5, group 3) and y (group 4).
        held.insert(
            row,
            Copies {
                first: (x, 5, 3),
                more: Some(vec![(y, 6, 4)].into()),
            },
        );
        let view = |released| Held {
            rows: &held,
            released,
        };
        let kinds = |kept: &[Payload]| {
            kept.iter()
                .map(|p| matches!(p, Payload::Parity { .. }))
                .collect::<Vec<_>>()
        };
        // Nothing released: x's page is in the log already (the round
        // waits for group 3), and y, held and not in the round, keeps the
        // parity out.
        let (payloads, pages) = round(5);
        let (kept, _, waits) = trim_for_cache(&array, view(0), payloads, pages, (vec![], vec![]));
        assert_eq!((kinds(&kept), waits), (vec![], 3));
        // Group 3 released (groups are released oldest first): x's copy
        // no longer stands for the page, which is logged again; y still
        // holds the parity back.
        let (payloads, pages) = round(5);
        let (kept, _, waits) = trim_for_cache(&array, view(3), payloads, pages, (vec![], vec![]));
        assert_eq!((kinds(&kept), waits), (vec![false], 0));
        // Group 4 released too: nothing is held, page and parity are logged.
        let (payloads, pages) = round(5);
        let (kept, _, waits) = trim_for_cache(&array, view(4), payloads, pages, (vec![], vec![]));
        assert_eq!((kinds(&kept), waits), (vec![false, true], 0));
        array.close().unwrap();
    }

    /// A row's copies come back oldest first; those of released groups are
    /// left out of `live`, dropped by `purge` (which says when none is
    /// left) and by `add`, which then keeps the rest in order.
    #[test]
    fn a_rows_released_copies_drop_out_in_order() {
        let mut copies = Copies {
            first: (0, 1, 1),
            more: Some(vec![(1, 2, 2), (0, 3, 3)].into()),
        };
        let all = |c: &Copies| c.iter().copied().collect::<Vec<_>>();
        let live = |c: &Copies, r| c.live(r).copied().collect::<Vec<_>>();
        assert_eq!(all(&copies), [(0, 1, 1), (1, 2, 2), (0, 3, 3)]);
        assert_eq!(live(&copies, 0), all(&copies));
        assert_eq!(live(&copies, 2), [(0, 3, 3)]);
        assert_eq!(copies.live(1).next_back(), Some(&(0, 3, 3)));
        assert!(!copies.purge(0), "nothing released: nothing changes");
        assert_eq!(all(&copies), [(0, 1, 1), (1, 2, 2), (0, 3, 3)]);
        assert!(!copies.purge(1));
        assert_eq!(all(&copies), [(1, 2, 2), (0, 3, 3)]);
        copies.add((2, 4, 5), 2);
        assert_eq!(all(&copies), [(0, 3, 3), (2, 4, 5)]);
        assert!(copies.purge(5), "every copy released");
        copies.add((1, 6, 7), 5);
        assert_eq!(all(&copies), [(1, 6, 7)], "a new copy over released ones");
        assert_eq!(live(&copies, 7), []);
    }
}
