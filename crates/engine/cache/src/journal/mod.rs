//! The write journal at run time: group commit, space in the ring, the
//! checkpoint that frees it, and replay after a crash.
//!
//! A write is *appended*: taken into the cache and into the batch waiting
//! for the next commit, both under the cache's lock (the journal's own lock
//! is taken inside it, never the other way round), so that the journal holds
//! writes in the order the cache applied them. Its slot completes once a
//! commit has made it durable. Whoever finds writes waiting and nobody
//! committing becomes the committer: it takes the whole batch, writes it as
//! records at the head of the ring and flushes the journal member once, so
//! writes from every worker share one flush.
//!
//! The ring's tail moves at a *checkpoint* (the write-back thread's job):
//! note the head, write every dirty page back, flush the array, then record
//! the noted head as the tail in the superblock. Everything before it is
//! then on the array.

pub mod format;
pub mod md;

use std::io;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use nvraid_io::AlignedBuf;

use format::{Extent, Header, RecordKind, Superblock, BLOCK_BYTES, EXTENTS_MAX, RING_START};

/// The most payload one record carries.
pub const RECORD_PAYLOAD_MAX: u64 = 4 << 20;
/// The smallest journal member: the superblock and a ring that holds at
/// least two of the largest records.
pub const JOURNAL_BYTES_MIN: u64 = 16 << 20;

/// What the cache needs of a journal: nvraid's own ring ([`Journal`]), or
/// md's write journal of a RAID 4/5/6 array ([`md::MdCacheLog`]).
pub trait JournalLog: Send + Sync {
    /// The journal's member, for messages.
    fn name(&self) -> String;
    /// What an append of `data` at array byte `offset` can do before any
    /// lock is taken (md's journal: the pages' checksums and their copy for
    /// the log), for [`JournalLog::append`].
    fn prepare(&self, _offset: u64, _data: &[u8]) -> Result<Prepared, String> {
        Ok(Prepared::Nothing)
    }
    /// Appends a write of `data` at array byte `offset` (`prepared` is what
    /// [`JournalLog::prepare`] made of it). The cache calls this with its
    /// lock held and takes the write in under the same lock, so both see
    /// writes in one order: the journal's lock is taken inside the cache's,
    /// never the other way round. Its ticket; `None` when the journal has
    /// no room for it now (nothing appended).
    fn append(&self, offset: u64, data: &[u8], prepared: Prepared) -> Result<Option<u64>, String>;
    /// Whether a write to a page being written back must wait for that
    /// write-back: md's journal logs the write-back's pages too, and a newer
    /// write logged before them would be undone by a replay.
    fn write_back_first(&self) -> bool {
        false
    }
    /// Whether the cache writes back in slices now: the journal releases
    /// appends in ticket order (md's), and once more than half of its
    /// share ([`JournalLog::held_share`]) is held, the cache writes back
    /// the older half of what it holds and releases it
    /// ([`JournalLog::set_tail`] with that half's newest ticket), while
    /// writers fill the other half.
    fn slices(&self) -> bool {
        false
    }
    /// With slices: what the cache holds in the journal, and the most it
    /// may hold (sectors or bytes, the same unit).
    fn held_share(&self) -> (u64, u64) {
        (0, 0)
    }
    /// Waits until `ticket` is durable (see [`Journal::commit_or_wait`]).
    fn commit_or_wait(&self, ticket: u64, timeout: Option<Duration>) -> Commit;
    /// The last ticket known durable, and whether the journal failed.
    fn committed(&self) -> (u64, bool);
    /// Why the journal failed, if it did.
    fn failure(&self) -> Option<String>;
    /// Bytes of ring in use, and the ring's size.
    fn usage(&self) -> (u64, u64);
    /// Whether a committer waits for room.
    fn wants_room(&self) -> bool;
    /// A mark noted before a checkpoint: every append before it is on the
    /// array once the checkpoint has written back and flushed.
    fn head(&self) -> (u64, u64);
    /// The checkpoint from `head` is done: the ring before it is free.
    fn set_tail(&self, tail: u64, tail_seq: u64) -> io::Result<()>;
    /// Marks the journal failed (the member disappeared, say).
    fn mark_failed(&self, why: String);
    /// The journal failed and the cache is about to write back what it
    /// acknowledged: let those writes reach the array.
    fn rescue(&self) {}
}

impl JournalLog for Journal {
    fn name(&self) -> String {
        Journal::name(self)
    }
    fn append(&self, offset: u64, data: &[u8], _: Prepared) -> Result<Option<u64>, String> {
        Journal::append(self, offset, data).map(Some)
    }
    fn commit_or_wait(&self, ticket: u64, timeout: Option<Duration>) -> Commit {
        Journal::commit_or_wait(self, ticket, timeout)
    }
    fn committed(&self) -> (u64, bool) {
        Journal::committed(self)
    }
    fn failure(&self) -> Option<String> {
        Journal::failure(self)
    }
    fn usage(&self) -> (u64, u64) {
        Journal::usage(self)
    }
    fn wants_room(&self) -> bool {
        Journal::wants_room(self)
    }
    fn head(&self) -> (u64, u64) {
        Journal::head(self)
    }
    fn set_tail(&self, tail: u64, tail_seq: u64) -> io::Result<()> {
        Journal::set_tail(self, tail, tail_seq)
    }
    fn mark_failed(&self, why: String) {
        Journal::mark_failed(self, why)
    }
}

/// What [`JournalLog::prepare`] made of a write, handed back to
/// [`JournalLog::append`] by value: a closed set of the journals' own
/// types, so nothing is boxed or downcast per write.
#[derive(Debug, Default)]
pub enum Prepared {
    /// Nothing prepared (nvraid's own journal copies under its lock).
    #[default]
    Nothing,
    /// md's write journal: the write's pages checksummed and copied for
    /// the log ([`nvraid_array::journal::MdJournal::prepare_cached`]).
    Md(nvraid_array::journal::CachedWrite),
}

/// What the journal lives on (a member, or a test double).
pub trait JournalDevice: Send + Sync {
    /// Its name, for messages.
    fn name(&self) -> String;
    /// Its size in bytes.
    fn size_bytes(&self) -> u64;
    /// Reads `buf.len()` bytes at `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes `buf` at `offset`.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes every completed write durable.
    fn flush(&self) -> io::Result<()>;
}

impl JournalDevice for nvraid_member::Member {
    fn name(&self) -> String {
        self.spec().to_string()
    }
    fn size_bytes(&self) -> u64 {
        nvraid_member::Member::size_bytes(self)
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        nvraid_member::Member::read_at(self, buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        nvraid_member::Member::write_at(self, buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        nvraid_member::Member::flush(self)
    }
}

/// A record being filled: room for its header block, then its payload, in
/// one buffer aligned for O_DIRECT, so that a commit writes it as it is
/// (a write is copied once, into its record).
struct Record {
    buf: AlignedBuf,
    /// Payload bytes so far.
    payload: usize,
    extents: Vec<Extent>,
}

impl Record {
    fn fits(&self, len: usize) -> bool {
        self.extents.len() < EXTENTS_MAX && self.payload + len <= RECORD_PAYLOAD_MAX as usize
    }
}

/// The writes waiting for the next commit, as records.
#[derive(Default)]
struct Batch {
    records: Vec<Record>,
    /// The ticket of the last write in it.
    last: u64,
}

/// Record buffers kept for reuse.
const SPARE_RECORDS: usize = 4;

struct State {
    batch: Batch,
    /// Buffers of committed records, for new ones.
    spare: Vec<AlignedBuf>,
    next_ticket: u64,
    /// Every ticket up to this one is durable.
    committed: u64,
    committing: bool,
    /// Where the next record goes, and its sequence number.
    head: u64,
    head_seq: u64,
    /// The oldest record not known to be on the array.
    tail: u64,
    tail_seq: u64,
    /// Why the journal stopped taking writes.
    failed: Option<String>,
    /// A committer waits for the tail to move.
    wants_room: bool,
}

/// How a wait for a commit ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Commit {
    Durable,
    Pending,
    Failed,
}

/// A journal in use.
pub struct Journal {
    device: Box<dyn JournalDevice>,
    superblock: Superblock,
    state: Mutex<State>,
    changed: Condvar,
}

/// What replay found and applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Replayed {
    pub records: u64,
    pub bytes: u64,
}

impl Journal {
    /// A journal over `device` whose superblock is `superblock` (after
    /// replay: its tail is where new records go).
    pub fn new(device: Box<dyn JournalDevice>, superblock: Superblock) -> Journal {
        Journal {
            device,
            superblock,
            state: Mutex::new(State {
                batch: Batch::default(),
                spare: Vec::new(),
                next_ticket: 0,
                committed: 0,
                committing: false,
                head: superblock.tail,
                head_seq: superblock.tail_seq,
                tail: superblock.tail,
                tail_seq: superblock.tail_seq,
                failed: None,
                wants_room: false,
            }),
            changed: Condvar::new(),
        }
    }

    /// The device's name.
    pub fn name(&self) -> String {
        self.device.name()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends a write of `data` at array byte `offset` to the batch of the
    /// next commit. Returns the ticket to wait for.
    pub fn append(&self, offset: u64, data: &[u8]) -> Result<u64, String> {
        let mut state = self.lock();
        if let Some(why) = &state.failed {
            return Err(why.clone());
        }
        state.next_ticket += 1;
        let ticket = state.next_ticket;
        let state = &mut *state;
        // Pieces of at most a record's payload (the queues' writes are far
        // smaller; a larger one spans records, all in this commit).
        for (i, piece) in data.chunks(RECORD_PAYLOAD_MAX as usize).enumerate() {
            let padded = piece.len().next_multiple_of(BLOCK_BYTES);
            if !state.batch.records.last().is_some_and(|r| r.fits(padded)) {
                let buf = state.spare.pop().unwrap_or_else(|| {
                    AlignedBuf::zeroed(BLOCK_BYTES + RECORD_PAYLOAD_MAX as usize)
                });
                state.batch.records.push(Record {
                    buf,
                    payload: 0,
                    extents: Vec::new(),
                });
            }
            let record = state.batch.records.last_mut().expect("a record");
            let at = BLOCK_BYTES + record.payload;
            record.buf[at..at + piece.len()].copy_from_slice(piece);
            record.buf[at + piece.len()..at + padded].fill(0);
            record.payload += padded;
            record.extents.push(Extent {
                offset: offset + (i * RECORD_PAYLOAD_MAX as usize) as u64,
                len: piece.len() as u32,
            });
        }
        state.batch.last = ticket;
        Ok(ticket)
    }

    /// Waits until `ticket` is durable, committing the batch when nobody
    /// else is. With `timeout`, gives up after it (`Pending`) unless a
    /// commit is due to this thread.
    pub fn commit_or_wait(&self, ticket: u64, timeout: Option<Duration>) -> Commit {
        let mut state = self.lock();
        loop {
            if state.committed >= ticket {
                return Commit::Durable;
            }
            if state.failed.is_some() {
                return Commit::Failed;
            }
            if !state.committing && !state.batch.records.is_empty() {
                let mut batch = std::mem::take(&mut state.batch);
                state.committing = true;
                state = self.commit(state, &mut batch);
                state.committing = false;
                if state.failed.is_none() {
                    state.committed = batch.last;
                }
                for record in batch.records {
                    if state.spare.len() < SPARE_RECORDS {
                        state.spare.push(record.buf);
                    }
                }
                self.changed.notify_all();
                continue;
            }
            match timeout {
                Some(timeout) => {
                    let (next, waited) = self
                        .changed
                        .wait_timeout(state, timeout)
                        .unwrap_or_else(|e| e.into_inner());
                    state = next;
                    if waited.timed_out() && state.committed < ticket && state.failed.is_none() {
                        return Commit::Pending;
                    }
                }
                None => state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner()),
            }
        }
    }

    /// The last ticket known durable, and whether the journal failed.
    pub fn committed(&self) -> (u64, bool) {
        let state = self.lock();
        (state.committed, state.failed.is_some())
    }

    /// Why the journal failed, if it did.
    pub fn failure(&self) -> Option<String> {
        self.lock().failed.clone()
    }

    /// Bytes of ring in use, and the ring's size.
    pub fn usage(&self) -> (u64, u64) {
        let state = self.lock();
        (state.head - state.tail, self.superblock.ring_bytes)
    }

    /// Whether a committer waits for room.
    pub fn wants_room(&self) -> bool {
        self.lock().wants_room
    }

    /// The head: where the next record goes and its sequence number.
    pub fn head(&self) -> (u64, u64) {
        let state = self.lock();
        (state.head, state.head_seq)
    }

    /// Records `(tail, tail_seq)` (a head noted before a checkpoint) in the
    /// superblock: the ring before it is free.
    pub fn set_tail(&self, tail: u64, tail_seq: u64) -> io::Result<()> {
        let superblock = Superblock {
            tail,
            tail_seq,
            ..self.superblock
        };
        let written = self
            .device
            .write_at(&superblock.encode(), 0)
            .and_then(|()| self.device.flush());
        let mut state = self.lock();
        match &written {
            Ok(()) => {
                state.tail = tail;
                state.tail_seq = tail_seq;
                state.wants_room = false;
            }
            Err(e) => self.fail(&mut state, format!("writing the journal superblock: {e}")),
        }
        self.changed.notify_all();
        written
    }

    fn fail(&self, state: &mut State, why: String) {
        if state.failed.is_none() {
            state.failed = Some(format!("journal {}: {why}", self.device.name()));
        }
    }

    /// Marks the journal failed (the member disappeared, say).
    pub fn mark_failed(&self, why: String) {
        let mut state = self.lock();
        self.fail(&mut state, why);
        self.changed.notify_all();
    }

    /// Writes `batch`'s records at the head and flushes; called with the
    /// lock held, returns it. Waits (lock released) for room in the ring.
    fn commit<'a>(
        &'a self,
        mut state: MutexGuard<'a, State>,
        batch: &mut Batch,
    ) -> MutexGuard<'a, State> {
        let ring = self.superblock.ring_bytes;
        for record in &mut batch.records {
            let record_bytes = (BLOCK_BYTES + record.payload) as u64;
            // Room: a skip to the next lap when the record would wrap.
            loop {
                let lap_left = ring - state.head % ring;
                let needed = if record_bytes > lap_left {
                    lap_left + record_bytes
                } else {
                    record_bytes
                };
                if state.head + needed - state.tail <= ring {
                    break;
                }
                if state.failed.is_some() {
                    return state;
                }
                state.wants_room = true;
                self.changed.notify_all();
                state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
            }
            let (mut head, mut seq) = (state.head, state.head_seq);
            drop(state);
            let mut written = Ok(());
            if record_bytes > ring - head % ring {
                let skip = Header {
                    kind: RecordKind::Skip,
                    seq,
                    extents: Vec::new(),
                };
                let block = skip.encode(&self.superblock.uuid, &[]);
                written = self.device.write_at(&block, RING_START + head % ring);
                head = head.next_multiple_of(ring);
                seq += 1;
            }
            if written.is_ok() {
                written = self.write_record(head, seq, record);
            }
            state = self.lock();
            if let Err(e) = written {
                self.fail(&mut state, format!("writing a record: {e}"));
                return state;
            }
            state.head = head + record_bytes;
            state.head_seq = seq + 1;
        }
        drop(state);
        let flushed = self.device.flush();
        state = self.lock();
        if let Err(e) = flushed {
            self.fail(&mut state, format!("flushing: {e}"));
        }
        state
    }

    /// Stamps `record`'s header (sequence number `seq`) into its buffer and
    /// writes it at linear position `head`.
    fn write_record(&self, head: u64, seq: u64, record: &mut Record) -> io::Result<()> {
        let header = Header {
            kind: RecordKind::Data,
            seq,
            extents: std::mem::take(&mut record.extents),
        };
        let end = BLOCK_BYTES + record.payload;
        let block = header.encode(&self.superblock.uuid, &record.buf[BLOCK_BYTES..end]);
        record.buf[..BLOCK_BYTES].copy_from_slice(&block);
        let ring = self.superblock.ring_bytes;
        self.device
            .write_at(&record.buf[..end], RING_START + head % ring)
    }
}

/// Why a journal member cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error(
        "{name}: {size} bytes is too small for a journal (at least {JOURNAL_BYTES_MIN} bytes)"
    )]
    TooSmall { name: String, size: u64 },
    #[error("{name}: holds the journal of another array (uuid {found}); this array is {expected}")]
    OtherArray {
        name: String,
        found: String,
        expected: String,
    },
    #[error("{name}: {source}")]
    Superblock {
        name: String,
        source: format::SuperError,
    },
    #[error("{name}: {source}")]
    Io { name: String, source: io::Error },
}

fn hex(uuid: &[u8; 16]) -> String {
    uuid.iter().map(|b| format!("{b:02x}")).collect()
}

/// A new, empty journal's superblock for a device of `size_bytes`.
pub fn new_superblock(size_bytes: u64, array_uuid: [u8; 16], uuid: [u8; 16]) -> Superblock {
    let ring_bytes = (size_bytes - RING_START) / BLOCK_BYTES as u64 * BLOCK_BYTES as u64;
    Superblock {
        uuid,
        array_uuid,
        ring_bytes,
        tail: 0,
        tail_seq: 1,
    }
}

/// Reads the journal superblock of `device`: `Ok(None)` when the device
/// holds no journal, an error when it holds another array's or a damaged
/// one.
pub fn read_superblock(
    device: &dyn JournalDevice,
    array_uuid: &[u8; 16],
) -> Result<Option<Superblock>, JournalError> {
    let name = device.name();
    if device.size_bytes() < JOURNAL_BYTES_MIN {
        return Err(JournalError::TooSmall {
            name,
            size: device.size_bytes(),
        });
    }
    let mut block = AlignedBuf::zeroed(BLOCK_BYTES);
    device
        .read_at(&mut block, 0)
        .map_err(|source| JournalError::Io {
            name: name.clone(),
            source,
        })?;
    match Superblock::decode(&block) {
        Err(format::SuperError::NotJournal) => Ok(None),
        Err(source) => Err(JournalError::Superblock { name, source }),
        Ok(sb) if sb.array_uuid != *array_uuid => Err(JournalError::OtherArray {
            name,
            found: hex(&sb.array_uuid),
            expected: hex(array_uuid),
        }),
        Ok(sb) if RING_START + sb.ring_bytes > device.size_bytes() => {
            Err(JournalError::Superblock {
                name,
                source: format::SuperError::Inconsistent(
                    "ring larger than the member (it shrank?)",
                ),
            })
        }
        Ok(sb) => Ok(Some(sb)),
    }
}

/// Applies every record after the superblock's tail, in order, through
/// `apply(offset, data)`. Returns what was applied and the superblock to
/// write once the applied data is durable: its tail past the last record,
/// and its sequence numbers moved beyond any record an earlier lap may
/// have left after it (so that such a record can never pass for a new
/// one).
pub fn replay(
    device: &dyn JournalDevice,
    superblock: &Superblock,
    apply: &mut dyn FnMut(u64, &[u8]) -> io::Result<()>,
) -> Result<(Replayed, Superblock), JournalError> {
    let name = device.name();
    let io_error = |source| JournalError::Io {
        name: name.clone(),
        source,
    };
    let ring = superblock.ring_bytes;
    let (mut at, mut seq) = (superblock.tail, superblock.tail_seq);
    let mut replayed = Replayed::default();
    let mut header_block = AlignedBuf::zeroed(BLOCK_BYTES);
    loop {
        let place = at % ring;
        device
            .read_at(&mut header_block, RING_START + place)
            .map_err(io_error)?;
        let Some((header, crc)) = Header::decode(&header_block, &superblock.uuid, seq) else {
            break;
        };
        if header.kind == RecordKind::Skip {
            at = at.next_multiple_of(ring);
            seq += 1;
            continue;
        }
        let payload_bytes = header.payload_bytes();
        if place + BLOCK_BYTES as u64 + payload_bytes > ring || payload_bytes > RECORD_PAYLOAD_MAX {
            break;
        }
        let mut payload = AlignedBuf::zeroed(payload_bytes as usize);
        device
            .read_at(&mut payload, RING_START + place + BLOCK_BYTES as u64)
            .map_err(io_error)?;
        if !Header::payload_matches(&header_block, &payload, crc) {
            break;
        }
        let mut from = 0usize;
        for extent in &header.extents {
            let len = extent.len as usize;
            apply(extent.offset, &payload[from..from + len]).map_err(io_error)?;
            from += len.next_multiple_of(BLOCK_BYTES);
            replayed.bytes += len as u64;
        }
        replayed.records += 1;
        at += BLOCK_BYTES as u64 + payload_bytes;
        seq += 1;
    }
    let after = Superblock {
        tail: at,
        tail_seq: seq + ring / BLOCK_BYTES as u64 + 1,
        ..*superblock
    };
    Ok((replayed, after))
}

/// Writes `superblock` and flushes.
pub fn write_superblock(
    device: &dyn JournalDevice,
    superblock: &Superblock,
) -> Result<(), JournalError> {
    let mut block = AlignedBuf::zeroed(BLOCK_BYTES);
    block.copy_from_slice(&superblock.encode());
    device
        .write_at(&block, 0)
        .and_then(|()| device.flush())
        .map_err(|source| JournalError::Io {
            name: device.name(),
            source,
        })
}
