//! md's partial parity log (RAID 5) at run time: what closes the write hole.
//!
//! Before the data and parity of a stripe write go to the members, an entry
//! for it goes to the log of the member that holds the stripe's parity: the
//! array sectors it writes and its *partial parity*, the XOR of the data
//! blocks it leaves alone (none for a full-stripe write). After a crash,
//! the parity of every logged stripe is recomputed as that partial parity
//! XOR the written blocks as they are now, whatever the interrupted write
//! had done to them: the parity then again covers the blocks nobody was
//! writing, so losing a member later rebuilds them right. The on-disk format
//! is md's ([`nvraid_metadata::ppl`]); the kernel replays nvraid's logs and
//! nvraid replays the kernel's.
//!
//! **Group commit, md's rule.** Each member's log takes one log write at a
//! time, carrying the entries of every request waiting for it (a *batch*).
//! The next batch is written only when every request of the previous one
//! has finished writing its stripes. After a crash the newest header on a
//! member is therefore the only one whose stripes may be torn, and it is
//! the only one replayed (md's `ppl_load_distributed`). A request waits for
//! its batch to be durable without blocking its worker (it is parked and
//! looked at again at each reap), and its rounds touch one parity member
//! each, so no request holds a place in one batch while waiting for
//! another (which could deadlock two logs).
//!
//! A batch is written by whichever waiter finds the log free: one write of
//! the header and the partial parity, then a flush, on that thread.

use crate::error::{Error, Result};
use crate::members::Members;
use crate::parity::plan::{bits, Column, Mode, ParityShape};
use crate::slot::is_member_failure;
use nvraid_metadata::ppl::{self, PplArea, PplEntry, PplHeader};
use nvraid_metadata::Superblock;
use std::collections::VecDeque;
use std::sync::Mutex;

/// Entries of one batch, the most partial parity a log write carries (in
/// an area of md's default size or larger; a smaller one carries less, see
/// [`Ppl::pp_max`]).
const BATCH_ENTRIES: usize = ppl::MAX_ENTRIES;
const BATCH_PP_BYTES: u64 = ppl::SPACE_BYTES as u64;
/// The widest column a PPL array writes at once: a column's partial
/// parity always fits one log write, with room for others beside it (in an
/// area smaller than md's default: at most what one log write holds).
pub const COLUMN_BYTES_MAX: u32 = 64 << 10;

/// The logs of an array's members.
#[derive(Debug)]
pub(crate) struct Ppl {
    area: PplArea,
    /// The most partial parity one log write carries here: md's 128 KiB,
    /// or less in an area too small for that (a write must never reach
    /// past the area: the sectors behind it belong to someone else).
    pp_max: u64,
    set_uuid: [u8; 16],
    /// Per role.
    logs: Vec<Mutex<Log>>,
}

/// A place in a batch: its member and generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ticket {
    pub role: u32,
    pub generation: u64,
}

#[derive(Debug, Default)]
struct Log {
    /// Batches not yet written, oldest first.
    waiting: VecDeque<Batch>,
    /// The generation the next new batch gets.
    next_generation: u64,
    /// The newest generation written (durable).
    durable: u64,
    /// A thread is writing the front batch now.
    writing: bool,
    /// Requests of the last written batch still writing their stripes.
    open: u32,
    /// Where the next log write goes, in sectors from the area's start.
    next_sector: u64,
    /// Batches written, kept for their room (the data path does not
    /// allocate once the log has come around): at most [`SPARE_BATCHES`].
    spare: Vec<Batch>,
    /// The last log write's header and image, kept for their room.
    header: Option<PplHeader>,
    image: Option<nvraid_io::AlignedBuf>,
}

/// Written batches a log keeps for reuse.
const SPARE_BATCHES: usize = 4;

#[derive(Debug)]
struct Batch {
    generation: u64,
    entries: Vec<PplEntry>,
    pp: Vec<u8>,
    requests: u32,
}

impl Ppl {
    /// The logs of an array whose superblocks name a PPL area (`None` when
    /// they do not).
    pub fn of(sb: &Superblock, roles: usize) -> Result<Option<Ppl>> {
        let area = PplArea::from_superblock(sb).map_err(|e| Error::Unsupported {
            spec: sb.name(),
            what: format!("its partial parity log: {e}"),
        })?;
        Ok(area.map(|area| Ppl {
            pp_max: area.entry_space_bytes().min(BATCH_PP_BYTES),
            area,
            set_uuid: sb.set_uuid,
            logs: (0..roles)
                .map(|_| {
                    Mutex::new(Log {
                        next_generation: 1,
                        ..Log::default()
                    })
                })
                .collect(),
        }))
    }

    /// The most partial parity one log write carries in this array's area.
    pub(crate) fn pp_max(&self) -> u64 {
        self.pp_max
    }

    fn log(&self, role: u32) -> std::sync::MutexGuard<'_, Log> {
        self.logs[role as usize]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Put `entries` (with their partial parity, in order) into the next
    /// batch of `role`'s log that has room. They must fit one log write.
    pub fn enqueue(&self, role: u32, entries: &[PplEntry], pp: &[u8]) -> Ticket {
        assert!(
            entries.len() <= BATCH_ENTRIES && pp.len() as u64 <= self.pp_max,
            "invariant: the entries enqueued together fit one log write"
        );
        assert_eq!(
            entries.iter().map(|e| u64::from(e.pp_size)).sum::<u64>(),
            pp.len() as u64,
            "invariant: the partial parity enqueued is its entries' pp_size bytes, in order"
        );
        let mut log = self.log(role);
        let fits = |b: &Batch| {
            b.entries.len() + entries.len() <= BATCH_ENTRIES
                && (b.pp.len() + pp.len()) as u64 <= self.pp_max
        };
        // The front batch is being written when `writing`: join only a
        // batch nobody has taken yet.
        let taken = usize::from(log.writing);
        let joinable = log.waiting.len() > taken && log.waiting.back().is_some_and(&fits);
        let generation = if joinable {
            let Some(b) = log.waiting.back_mut() else {
                panic!("invariant: a joinable batch is waiting");
            };
            b.entries.extend_from_slice(entries);
            b.pp.extend_from_slice(pp);
            b.requests += 1;
            b.generation
        } else {
            let generation = log.next_generation;
            log.next_generation += 1;
            let mut batch = log.spare.pop().unwrap_or_else(|| Batch {
                generation,
                entries: Vec::with_capacity(BATCH_ENTRIES),
                pp: Vec::new(),
                requests: 0,
            });
            batch.generation = generation;
            batch.entries.clear();
            batch.entries.extend_from_slice(entries);
            batch.pp.clear();
            batch.pp.extend_from_slice(pp);
            batch.requests = 1;
            log.waiting.push_back(batch);
            generation
        };
        Ticket { role, generation }
    }

    /// Whether the ticket's batch is durable. When it is not, and the log
    /// is free (no write in progress, every request of the last batch done),
    /// write the front batch now, on this thread. A log write that fails
    /// fails its member (said on stderr): its stripes are then degraded and
    /// their writes leave that member out.
    pub fn ready(&self, array: &Members, ticket: Ticket) -> bool {
        let mut log = self.log(ticket.role);
        if log.durable >= ticket.generation {
            return true;
        }
        if log.writing || log.open > 0 {
            return false;
        }
        if log.waiting.is_empty() {
            return false;
        }
        // The header and image of the last write, reused for their room.
        let (header, image) = (log.header.take(), log.image.take());
        let batch = &log.waiting[0];
        let generation = batch.generation;
        let sectors = ppl::HEADER_SECTORS + batch.pp.len() as u64 / 512;
        let (header, image, len) = self.encode_batch(batch, header, image);
        let usable = self.area.usable_sectors();
        if !self.area.is_ring() || log.next_sector + sectors > usable {
            log.next_sector = 0;
        }
        let at = log.next_sector;
        assert!(
            at + sectors <= usable,
            "invariant: a log write stays inside the PPL area ({sectors} sectors at {at} of {usable})"
        );
        log.writing = true;
        drop(log);
        let written = self.write_log(array, ticket.role, at, &image[..len]);
        self.record_written(ticket.role, generation, at + sectors, header, image);
        if let Err(e) = written {
            eprintln!("nvraid: partial parity log of role {}: {e}", ticket.role);
        }
        generation >= ticket.generation
    }

    /// The log write of `batch`: its header (in `header`'s room, when
    /// given) and partial parity encoded into `image` (reused when it has
    /// room); returns them with the write's length in bytes.
    fn encode_batch(
        &self,
        batch: &Batch,
        header: Option<PplHeader>,
        image: Option<nvraid_io::AlignedBuf>,
    ) -> (PplHeader, nvraid_io::AlignedBuf, usize) {
        let mut header = header.unwrap_or_else(|| PplHeader {
            signature: 0,
            generation: 0,
            entries: Vec::with_capacity(BATCH_ENTRIES),
        });
        let len = ppl::HEADER_BYTES + batch.pp.len();
        header.signature = ppl::signature_for(&self.set_uuid);
        header.generation = batch.generation;
        header.entries.clear();
        header.entries.extend_from_slice(&batch.entries);
        let mut image = match image {
            Some(image) if image.len() >= len => image,
            _ => {
                nvraid_io::AlignedBuf::zeroed(len.max(ppl::HEADER_BYTES + BATCH_PP_BYTES as usize))
            }
        };
        assert_eq!(
            header.pp_bytes(),
            batch.pp.len() as u64,
            "invariant: a batch's partial parity is its entries' pp_size bytes"
        );
        if let Err(e) = header.encode(&mut image[..ppl::HEADER_BYTES]) {
            panic!(
                "invariant: a batch's header encodes (its entries were checked when built): {e}"
            );
        }
        image[ppl::HEADER_BYTES..len].copy_from_slice(&batch.pp);
        (header, image, len)
    }

    /// Record the front batch of `role`'s log, `generation`, as written
    /// (durable, its requests now writing their stripes; the next write
    /// goes at `next_sector`), keeping its room for reuse.
    fn record_written(
        &self,
        role: u32,
        generation: u64,
        next_sector: u64,
        header: PplHeader,
        image: nvraid_io::AlignedBuf,
    ) {
        let mut log = self.log(role);
        log.header = Some(header);
        log.image = Some(image);
        let Some(batch) = log.waiting.pop_front() else {
            panic!(
                "invariant: the batch being written stays at the front until its writer pops it"
            );
        };
        assert_eq!(
            batch.generation, generation,
            "invariant: the batch popped is the one written"
        );
        log.writing = false;
        log.durable = generation;
        log.next_sector = next_sector;
        log.open = batch.requests;
        if log.spare.len() < SPARE_BATCHES {
            log.spare.push(batch);
        }
    }

    /// The request holding `ticket` has written its stripes.
    pub fn done(&self, ticket: Ticket) {
        let mut log = self.log(ticket.role);
        assert_eq!(
            log.durable, ticket.generation,
            "invariant: a request is done only with the last batch written"
        );
        log.open = log.open.saturating_sub(1);
    }

    fn write_log(&self, array: &Members, role: u32, at: u64, image: &[u8]) -> Result<()> {
        let Some(slot) = array.slot(role as usize) else {
            return Ok(());
        };
        let start = self
            .area
            .start_sector(slot.superblock.super_offset_sectors)
            .expect("checked at assembly");
        let result = slot
            .member
            .write_at(image, (start + at) * 512)
            .and_then(|()| slot.member.flush());
        match result {
            Ok(()) => Ok(()),
            Err(e) if is_member_failure(&e) => array.fail_member(role as usize, &e),
            Err(e) => Err(Error::io(slot.member.spec(), e)),
        }
    }

    /// The area's bytes on a member, as the log's reader wants them.
    fn read_area(&self, array: &Members, role: usize) -> Result<nvraid_io::AlignedBuf> {
        let slot = array.slot(role).expect("present");
        let start = self
            .area
            .start_sector(slot.superblock.super_offset_sectors)
            .expect("checked at assembly");
        let mut area = nvraid_io::AlignedBuf::zeroed((self.area.usable_sectors() * 512) as usize);
        slot.member
            .read_at(&mut area, start * 512)
            .map_err(|e| Error::io(slot.member.spec(), e))?;
        Ok(area)
    }

    /// Replay every member's newest log write (an array not shut down
    /// cleanly): each entry's parity recomputed from its partial parity and
    /// the blocks it wrote. An entry whose written blocks cannot all be read
    /// is left alone (md's rule: nothing protects a stripe that lost the
    /// block being written). Returns how many entries were replayed, and
    /// whether any member's log had been written since it was emptied (an
    /// array whose logs are all empty was never written through them: one
    /// created over used members still needs its first full resync).
    pub fn replay(&self, array: &Members, shape: ParityShape) -> Result<(usize, bool)> {
        let mut replayed = 0;
        let mut written = false;
        for role in 0..array.roles() {
            if !array.is_usable(role) {
                continue;
            }
            let area = self.read_area(array, role)?;
            let spec = array.slot(role).expect("usable").member.spec().to_string();
            let bad_log = |e: ppl::PplError| Error::Unsupported {
                spec: spec.clone(),
                what: format!("its partial parity log: {e}"),
            };
            let Some(newest) = ppl::newest(&area, &self.set_uuid).map_err(bad_log)? else {
                continue;
            };
            written |= newest.header.generation > 0;
            let pps = newest.partial_parity(&area).map_err(bad_log)?;
            for (entry, pp) in newest.header.entries.iter().zip(pps) {
                if replay_entry(array, &shape, role, entry, pp)? {
                    replayed += 1;
                }
            }
        }
        Ok((replayed, written))
    }

    /// Empty every member's log (zeros, then an empty header at its start),
    /// as the kernel does after its recovery and mdadm at create: headers of
    /// earlier runs must never be taken for this run's.
    pub fn reset(&self, array: &Members) -> Result<()> {
        for role in 0..array.roles() {
            if !array.is_usable(role) {
                continue;
            }
            let slot = array.slot(role).expect("usable");
            reset_area(&slot.member, &slot.superblock, &self.area)?;
        }
        for log in &self.logs {
            let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
            *log = Log {
                next_generation: 1,
                ..Log::default()
            };
        }
        Ok(())
    }
}

/// Zeros over `member`'s log area and an empty header at its start.
pub(crate) fn reset_area(
    member: &nvraid_member::Member,
    sb: &Superblock,
    area: &PplArea,
) -> Result<()> {
    let start = area
        .start_sector(sb.super_offset_sectors)
        .ok_or_else(|| Error::Unsupported {
            spec: member.spec().into(),
            what: "a partial parity log before the start of the member".into(),
        })?;
    let mut image = nvraid_io::AlignedBuf::zeroed((area.usable_sectors() * 512) as usize);
    PplHeader::empty(&sb.set_uuid)
        .encode(&mut image[..ppl::HEADER_BYTES])
        .expect("an empty header");
    member
        .write_at(&image, start * 512)
        .and_then(|()| member.flush())
        .map_err(|e| Error::io(member.spec(), e))
}

/// md's `ppl_recover_entry`: recompute the parity of the rows `entry`
/// covers. Returns false when a written block cannot be read (skipped).
fn replay_entry(
    array: &Members,
    shape: &ParityShape,
    log_role: usize,
    entry: &PplEntry,
    pp: &[u8],
) -> Result<bool> {
    let Some(rows) = EntryRows::of(shape, entry) else {
        return Ok(false);
    };
    if (rows.first + 1) * 512 > array.size_bytes() {
        return Ok(false);
    }
    let Some(blocks) = read_written_blocks(array, &rows)? else {
        return Ok(false);
    };
    let (parity, updated) = recompute_parity(&rows, &blocks, pp);
    let parity_at = parity_offset(array, shape, log_role, entry)?;
    write_parity_runs(array, log_role, parity_at, &parity, &updated)?;
    Ok(true)
}

/// The rows an entry covers, in md's reading of its sizes: from array
/// sector `first`, `disks` written blocks a chunk apart, each `strip`
/// sectors long, the rows ending before array sector `last`.
struct EntryRows {
    chunk_sectors: u64,
    pp_sectors: u64,
    first: u64,
    disks: u64,
    strip: u64,
    last: u64,
}

impl EntryRows {
    /// `entry`'s rows: with partial parity under a chunk, as many blocks
    /// as its data holds strips of its partial parity's size; without,
    /// every data block of the stripe; with a chunk of it, whole chunks.
    /// `None` when the sizes name no block (nothing to replay).
    fn of(shape: &ParityShape, entry: &PplEntry) -> Option<EntryRows> {
        let chunk_sectors = shape.chunk / 512;
        let data = u64::from(shape.data);
        let first = entry.data_sector;
        let data_sectors = u64::from(entry.data_size) / 512;
        let pp_sectors = u64::from(entry.pp_size) / 512;
        let (disks, strip, last) = if pp_sectors < chunk_sectors {
            let (disks, strip) = match data_sectors.checked_div(pp_sectors) {
                Some(disks) => (disks, pp_sectors),
                None => (data, data_sectors / data),
            };
            (
                disks,
                strip,
                first + disks.saturating_sub(1) * chunk_sectors + strip,
            )
        } else {
            (data, chunk_sectors, first + data_sectors)
        };
        (disks != 0 && strip != 0).then_some(EntryRows {
            chunk_sectors,
            pp_sectors,
            first,
            disks,
            strip,
            last,
        })
    }
}

/// Written blocks read for a replay: the array sector each starts at, and
/// its bytes.
type WrittenBlocks = Vec<(u64, Vec<u8>)>;

/// Every written block's sectors, read whole (one read per block), with
/// the array sector each starts at; `None` when one cannot be read.
fn read_written_blocks(array: &Members, rows: &EntryRows) -> Result<Option<WrittenBlocks>> {
    let geometry = array.geometry();
    let mut blocks: WrittenBlocks = Vec::new();
    for disk in 0..rows.disks {
        let r = rows.first + disk * rows.chunk_sectors;
        if r >= rows.last || (r + 1) * 512 > array.size_bytes() {
            continue;
        }
        let at = geometry.locate(r * 512, 0);
        let role = at.member as usize;
        let len = rows.strip.min(rows.last - r) * 512;
        if !array.readable(role, at.member_offset, len) {
            return Ok(None);
        }
        let Some(slot) = array.slot(role) else {
            panic!("invariant: a member readable for a PPL replay is present");
        };
        let mut bytes = vec![0u8; len as usize];
        slot.member
            .read_at(&mut bytes, slot.data_offset_bytes() + at.member_offset)
            .map_err(|e| Error::io(slot.member.spec(), e))?;
        blocks.push((r, bytes));
    }
    Ok(Some(blocks))
}

/// The rows' parity: the written blocks XOR the entry's partial parity,
/// and which sectors of the strip a written block covered (only those are
/// written back).
fn recompute_parity(
    rows: &EntryRows,
    blocks: &[(u64, Vec<u8>)],
    pp: &[u8],
) -> (Vec<u8>, Vec<bool>) {
    let mut parity = vec![0u8; (rows.strip * 512) as usize];
    let mut updated = vec![false; rows.strip as usize];
    for (r, bytes) in blocks {
        assert!(
            bytes.len() <= parity.len(),
            "invariant: a written block read for a PPL replay is at most a strip"
        );
        for (i, sector) in bytes.chunks(512).enumerate() {
            if r + i as u64 >= rows.last {
                break;
            }
            updated[i] = true;
            let out = &mut parity[i * 512..][..512];
            nvraid_parity::xor_into(nvraid_parity::Kernel::best(), out, sector);
        }
    }
    if rows.pp_sectors > 0 {
        let len = parity.len().min(pp.len());
        nvraid_parity::xor_into(
            nvraid_parity::Kernel::best(),
            &mut parity[..len],
            &pp[..len],
        );
    }
    (parity, updated)
}

/// Where the rows' parity lives on the log's member (its byte offset in
/// the member's data): the entry's parity member must be the log's, as the
/// layout puts it, or the log is refused.
fn parity_offset(
    array: &Members,
    shape: &ParityShape,
    log_role: usize,
    entry: &PplEntry,
) -> Result<u64> {
    let first = entry.data_sector;
    let at = array.geometry().locate(first * 512, 0);
    let stripe = at.member_offset / shape.chunk;
    let (p, _) = shape.map.parity_members(stripe);
    if p as usize != log_role || entry.parity_disk != p {
        return Err(Error::Unsupported {
            spec: log_member(array, log_role).member.spec().into(),
            what: format!(
                "a partial parity log entry for sector {first} naming parity member {} (the layout puts it on {p})",
                entry.parity_disk
            ),
        });
    }
    Ok(at.member_offset)
}

/// The slot of the member whose log is replayed.
fn log_member(array: &Members, log_role: usize) -> &crate::slot::Slot {
    let Some(slot) = array.slot(log_role) else {
        panic!("invariant: a PPL is replayed only from a present member");
    };
    slot
}

/// Write the sectors of `parity` a written block covered, in runs, at
/// `parity_at` in the log's member's data, and flush.
fn write_parity_runs(
    array: &Members,
    log_role: usize,
    parity_at: u64,
    parity: &[u8],
    updated: &[bool],
) -> Result<()> {
    let slot = log_member(array, log_role);
    for (i, run) in updated.chunk_by(|a, b| a == b).scan(0usize, |at, run| {
        let start = *at;
        *at += run.len();
        Some((start, run))
    }) {
        if !run[0] {
            continue;
        }
        let bytes = &parity[i * 512..(i + run.len()) * 512];
        slot.member
            .write_at(bytes, slot.data_offset_bytes() + parity_at + i as u64 * 512)
            .map_err(|e| Error::io(slot.member.spec(), e))?;
    }
    slot.member
        .flush()
        .map_err(|e| Error::io(slot.member.spec(), e))
}

impl ParityShape {
    /// The log entry of a write column (partial parity `pp`, empty for a
    /// full-stripe write), in md's terms: it names the first written data
    /// block's first sector, and its data size counts every written block.
    pub fn ppl_entry(&self, col: &Column, pp: &[u8]) -> PplEntry {
        let Some(first) = bits(col.written).next() else {
            panic!("invariant: a write column writes a data block");
        };
        let sector = ((col.stripe * u64::from(self.data) + u64::from(first)) * self.chunk
            + u64::from(col.lo))
            / 512;
        let data_size = col.width() as u32 * col.written.count_ones();
        let (p, _) = self.map.parity_members(col.stripe);
        let entry = PplEntry::new(sector, data_size, p, pp);
        self.check_ppl_entry(col, &entry, pp);
        entry
    }

    /// Paired with the log's reader ([`ppl::PplHeader::decode`]'s limits
    /// and the replay's reading of the sizes): an entry built for writing
    /// covers whole sectors inside its stripe's chunks, carries a column's
    /// width of partial parity (none for a full-stripe write), and names
    /// the sector and parity member replay maps back to its stripe.
    fn check_ppl_entry(&self, col: &Column, entry: &PplEntry, pp: &[u8]) {
        assert!(
            col.lo < col.hi
                && u64::from(col.hi) <= self.chunk
                && col.lo.is_multiple_of(512)
                && col.hi.is_multiple_of(512),
            "invariant: a logged column is whole sectors inside its chunks"
        );
        assert!(
            col.written != 0 && col.written >> self.data == 0,
            "invariant: a logged column writes data blocks of its stripe only"
        );
        let pp_expected = if col.mode == Mode::Full {
            0
        } else {
            col.width()
        };
        assert!(
            pp.len() == pp_expected && entry.pp_size as usize == pp.len(),
            "invariant: a PPL entry's partial parity is its column's width (none for a \
             full-stripe write)"
        );
        assert!(
            entry.pp_size <= entry.data_size && entry.data_size.is_multiple_of(512),
            "invariant: a PPL entry holds whole sectors of data, no less than its partial parity"
        );
        assert!(
            entry.data_sector * 512 / (self.chunk * u64::from(self.data)) == col.stripe,
            "invariant: a PPL entry's sector lies in its column's stripe"
        );
        assert!(
            entry.parity_disk < self.data + self.parity,
            "invariant: a PPL entry names a member of the array as its parity member"
        );
    }
}
