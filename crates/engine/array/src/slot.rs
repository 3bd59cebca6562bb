//! One role of an array and what belongs to it alone: the member, its
//! superblock, the ranges md would not read from it (recovery point, bad
//! blocks), its I/O counters, and reading and writing its superblock.
//! Nothing here knows the array around it.

use crate::error::{Error, Result};
use nvraid_member::Member;
use nvraid_metadata::{badblocks, features, Superblock, SUPER_OFFSET_BYTES};
use std::sync::atomic::{AtomicU64, Ordering};

/// One role of the array: a member, its own superblock, and the parts of
/// it that md would not read.
#[derive(Debug)]
pub struct Slot {
    /// Shared: a served reshape's end gives the same member a new slot
    /// (its superblock as the new shape records it; see
    /// `Members::adopt_shape`).
    pub member: std::sync::Arc<Member>,
    pub superblock: Superblock,
    pub read_limit: ReadLimit,
    /// What the member must prove on each new connection (remote members;
    /// see `identity`).
    identity: std::sync::Arc<crate::identity::MemberIdentity>,
}

impl Slot {
    /// A slot for `member`, reading its bad-block log when the superblock
    /// has one and noting how far a member being recovered is in sync.
    pub fn new(member: Member, superblock: Superblock) -> Result<Slot> {
        Slot::shared(std::sync::Arc::new(member), superblock)
    }

    /// A slot for a member already open and shared (one a served reshape
    /// keeps or added), as [`Slot::new`] makes one.
    pub fn shared(member: std::sync::Arc<Member>, superblock: Superblock) -> Result<Slot> {
        let read_limit = ReadLimit::of(&member, &superblock)?;
        // The superblock was just read from (or written to) the member
        // over its open connection: every later connection must find the
        // same member there.
        let identity = std::sync::Arc::new(crate::identity::MemberIdentity::of(&superblock));
        member.set_identity_check(identity.clone());
        Ok(Slot {
            member,
            superblock,
            read_limit,
            identity,
        })
    }

    /// A superblock with `events` reached the member (written and
    /// flushed): its next connection must find that one or a newer one.
    pub(crate) fn superblock_written(&self, events: u64) {
        self.identity.written(events);
    }

    pub fn data_offset_bytes(&self) -> u64 {
        self.superblock.data_offset_sectors * 512
    }
}

/// What md would not read from a member: the part above a recovery that has
/// not finished (`RECOVERY_OFFSET`), and the ranges of its bad-block log
/// (`BAD_BLOCKS`), those it had at assembly and those recorded while the
/// array ran ([`Array::write_failed`]). Offsets are bytes from the start of
/// the member's data.
#[derive(Debug, Default)]
pub struct ReadLimit {
    /// The member is in sync below this many bytes only (`None`: all of it).
    pub in_sync_bytes: Option<u64>,
    /// Bad ranges, `(start, end)`, sorted and disjoint. Only ever grows
    /// while the array runs (a range once bad stays bad until the member
    /// is replaced), so a reader that saw a range readable before a write
    /// failed there is ordered by the stripe lock that write held.
    bad: std::sync::RwLock<Vec<(u64, u64)>>,
}

impl ReadLimit {
    fn of(member: &Member, sb: &Superblock) -> Result<ReadLimit> {
        let recovering = sb.feature_map & (features::RECOVERY_OFFSET | features::RECOVERY_BITMAP);
        let in_sync_bytes = (recovering != 0).then(|| sb.recovery_offset.saturating_mul(512));
        let data_start = sb.data_offset_sectors * 512;
        let ranges: Vec<(u64, u64)> = bad_blocks(member, sb)?
            .into_iter()
            .map(|r| (r.sector * 512, (r.sector + r.sectors) * 512))
            .filter(|&(_, end)| end > data_start)
            .map(|(start, end)| (start.saturating_sub(data_start), end - data_start))
            .collect();
        let limit = ReadLimit {
            in_sync_bytes,
            bad: Default::default(),
        };
        limit.add_bad(&ranges);
        Ok(limit)
    }

    /// Whether nothing limits reads.
    pub fn is_none(&self) -> bool {
        self.in_sync_bytes.is_none() && self.bad_ranges().is_empty()
    }

    /// Whether md would read `[offset, offset + len)` of the data area.
    pub fn allows(&self, offset: u64, len: u64) -> bool {
        let end = offset + len;
        if self.in_sync_bytes.is_some_and(|in_sync| end > in_sync) {
            return false;
        }
        self.no_bad_block_in(offset, len)
    }

    /// Whether no bad-block range touches `[offset, offset + len)`.
    pub fn no_bad_block_in(&self, offset: u64, len: u64) -> bool {
        let end = offset + len;
        let bad = self.bad.read().unwrap_or_else(|p| p.into_inner());
        !bad.iter().any(|&(s, e)| offset < e && s < end)
    }

    /// The bad ranges now, `(start, end)` in data-area bytes, sorted.
    pub fn bad_ranges(&self) -> Vec<(u64, u64)> {
        self.bad.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Add `ranges` to the bad ones (merged with those that touch them).
    /// Returns the list as it stands after.
    pub(crate) fn add_bad(&self, ranges: &[(u64, u64)]) -> Vec<(u64, u64)> {
        let mut bad = self.bad.write().unwrap_or_else(|p| p.into_inner());
        bad.extend(ranges.iter().copied().filter(|&(s, e)| s < e));
        bad.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(bad.len());
        for &(s, e) in bad.iter() {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        // Paired with the readers' scan: sorted, disjoint, non-empty ranges.
        assert!(merged.windows(2).all(|w| w[0].1 < w[1].0));
        *bad = merged;
        bad.clone()
    }
}

/// A member whose log lists ranges says so in its superblock (md's
/// BAD_BLOCKS feature; assembly reads the log only then).
pub(crate) fn apply_bad_blocks(slot: &Slot, sb: &mut Superblock) {
    if sb.bblog_size > 0 && !slot.read_limit.bad_ranges().is_empty() {
        sb.feature_map |= features::BAD_BLOCKS;
    }
}

/// The member's bad-block log, when its superblock says it has entries.
fn bad_blocks(member: &Member, sb: &Superblock) -> Result<Vec<badblocks::BadRange>> {
    if sb.feature_map & features::BAD_BLOCKS == 0 || sb.bblog_size == 0 {
        return Ok(Vec::new());
    }
    // The log's offset is signed, in sectors from the superblock.
    let at = (sb.super_offset_sectors as i64 + i64::from(sb.bblog_offset as i32)) * 512;
    let len = usize::from(sb.bblog_size) * 512;
    let bad_log = |what: String| Error::Unsupported {
        spec: member.spec().into(),
        what,
    };
    if at <= 0 || len > 4096 || at as u64 + len as u64 > member.size_bytes() {
        return Err(bad_log(format!(
            "a bad-block log of {len} bytes at byte {at} (outside the member, or larger than md allows)"
        )));
    }
    let mut log = nvraid_io::AlignedBuf::zeroed(len);
    member
        .read_at(&mut log, at as u64)
        .map_err(|e| Error::io(member.spec(), e))?;
    Ok(badblocks::decode(&log[..len], sb.bblog_shift))
}

/// Operations, bytes and errors of one member: the simple path's and those
/// of the fast path's queues that have closed, plus (in a snapshot from
/// `Members::member_counters`) those of every open queue.
#[derive(Debug, Default)]
pub struct MemberCounters {
    pub ops: AtomicU64,
    pub bytes: AtomicU64,
    pub errors: AtomicU64,
}

impl MemberCounters {
    /// Add a batch of counts.
    pub fn add(&self, ops: u64, bytes: u64, errors: u64) {
        self.ops.fetch_add(ops, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.errors.fetch_add(errors, Ordering::Relaxed);
    }
}

/// One fast-path queue's counts of every member, written by that queue
/// alone: an add is a plain load and store, no locked instruction, and
/// each member's counts sit on cache lines of their own, so no two workers
/// write one line and a reader (`status`) sees them as they move.
#[derive(Debug)]
pub(crate) struct CounterShard {
    members: Box<[PaddedCounts]>,
}

#[derive(Debug, Default)]
#[repr(align(128))]
struct PaddedCounts {
    ops: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
}

impl CounterShard {
    pub(crate) fn new(members: usize) -> CounterShard {
        CounterShard {
            members: (0..members).map(|_| PaddedCounts::default()).collect(),
        }
    }

    /// Count one operation of `bytes` on `member`. Only the queue that owns
    /// the shard calls this (one writer: a load and a store suffice).
    #[inline]
    pub(crate) fn count(&self, member: usize, bytes: u64, error: bool) {
        let c = &self.members[member];
        c.ops
            .store(c.ops.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        c.bytes
            .store(c.bytes.load(Ordering::Relaxed) + bytes, Ordering::Relaxed);
        if error {
            c.errors
                .store(c.errors.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        }
    }

    /// `member`'s counts so far: (operations, bytes, errors).
    pub(crate) fn get(&self, member: usize) -> (u64, u64, u64) {
        self.members.get(member).map_or((0, 0, 0), |c| {
            (
                c.ops.load(Ordering::Relaxed),
                c.bytes.load(Ordering::Relaxed),
                c.errors.load(Ordering::Relaxed),
            )
        })
    }
}

/// Whether an error from a member means the member failed (md fails a
/// member on any I/O error), rather than a request nvraid got wrong.
pub(crate) fn is_member_failure(error: &std::io::Error) -> bool {
    !matches!(
        error.raw_os_error(),
        Some(libc::EINVAL | libc::EFAULT | libc::EBADF | libc::EOPNOTSUPP)
    )
}

/// Encode `sb` and write it at 4 KiB on `member` (not flushed). Only the
/// sectors the superblock occupies are written (whole logical blocks of the
/// member), so a bitmap or bad-block log that md placed right after it stays
/// as it is.
pub(crate) fn write_superblock(member: &Member, sb: &Superblock) -> Result<()> {
    let block_bytes = member.logical_block_bytes().max(512) as usize;
    let len = sb.encoded_len().div_ceil(block_bytes) * block_bytes;
    let mut block = nvraid_io::AlignedBuf::zeroed(len.max(4096));
    sb.encode(&mut block[..len])
        .map_err(|source| Error::Superblock {
            spec: member.spec().into(),
            source,
        })?;
    member
        .write_at(&block[..len], SUPER_OFFSET_BYTES)
        .map_err(|e| Error::io(member.spec(), e))
}

/// Read and decode the superblock at 4 KiB on `member`.
pub fn read_superblock(member: &Member) -> Result<Superblock> {
    let needed_bytes = SUPER_OFFSET_BYTES + 4096;
    if member.size_bytes() < needed_bytes {
        return Err(Error::Truncated {
            spec: member.spec().into(),
            needed_bytes,
            size_bytes: member.size_bytes(),
        });
    }
    let mut block = nvraid_io::AlignedBuf::zeroed(4096);
    member
        .read_at(&mut block, SUPER_OFFSET_BYTES)
        .map_err(|e| Error::io(member.spec(), e))?;
    Superblock::decode(&block).map_err(|source| Error::Superblock {
        spec: member.spec().into(),
        source,
    })
}
