//! A grow with no room to move the data offset: the same forwards reshape
//! of a RAID 4/5/6 with the old members' data offset kept, the new shape's
//! rows written over the old shape's ("in place").
//!
//! Near the start the new shape's next row is one the old shape still
//! reads from, so no step is safe by itself (`Reshape::step_is_safe`):
//! that is the critical section. Each of its steps moves one new stripe
//! and first copies the member rows it will overwrite on the old members
//! into a backup area on the new members: the room between the old data
//! offset and the new member's own data offset, which the grow set that
//! much higher (the rows of one stripe of every old member, and a 4 KiB
//! header):
//!
//! | bytes below a new member's data offset `D` | what |
//! |---|---|
//! | `[D - 4096 - n·len, D - 4096)` | the rows, `len` bytes of each of `n` old members |
//! | `[D - 4096, D)` | the header: `nvraid-backup-v1`, the array's UUID, the step's position and end, the new member count, each row's role and device offset, CRC-32C of the rows and of the header |
//!
//! A step of the section: the header cleared, the rows copied, the header
//! written (each flushed, on every new member); then the step's rows
//! (`step::move_rows`) and the recorded position, as any step. After a
//! crash `grow --continue` looks for a header whose position is the one
//! recorded and whose checksums hold, and writes its rows back: the old
//! shape from the recorded position is whole again and the step is done
//! again. A header for another position (a step recorded done, or one
//! whose rows were being copied) is ignored. Once the position has run
//! far enough for the old shape's reads to stay ahead of the new shape's
//! writes, the steps are safe without it.
//!
//! A shrink in place (the kernel's, mdadm having kept a backup file) has
//! its critical section at the end, near the array's start: its backwards
//! steps there move one new stripe each, the rows they overwrite kept the
//! same way on the members that leave, at the top of their old rows (rows
//! only the end the shrink cut off used, which neither shape reads).
//!
//! The format is nvraid's own, kept step by step for `grow --continue`.
//! Beside it, where it fits, the grow writes mdadm's own backup of the
//! whole section at the tail of the new members' data (`md_backup`), so
//! that `mdadm --assemble` restores an array left inside the section and
//! the kernel finishes it; past the section, and once the grow is done,
//! the array is md's ordinary one.

use super::degraded::Failed;
use super::grow::Placed;
use super::step::{MemberFailure, StepResult};
use crate::error::{Error, Result};
use nvraid_io::AlignedBuf;
use nvraid_layout::{Direction, Geometry, Reshape, Shape};
use nvraid_metadata::ppl::crc32c;

/// The header's size, and its place just below a new member's data.
pub(super) const HEADER: u64 = 4096;
const MAGIC: &[u8; 16] = b"nvraid-backup-v1";
/// Where the entries (role, device offset) start in the header.
const ENTRIES: usize = 72;

/// The room a new member needs below its data for the backup of a grow
/// from `old`: one chunk of every old member, and the header.
pub(super) fn room_bytes(old: &Geometry) -> u64 {
    old.chunk_bytes().unwrap_or(0) * u64::from(old.members()) + HEADER
}

/// The backup areas of an in-place grow: the new members (by role) that
/// hold one, each with its header's device offset (the rows below it).
/// An in-place shrink keeps its backup the same way on the members that
/// leave, in rows only the cut-off end of the old shape used (`of`).
#[derive(Debug)]
pub(super) struct Backup {
    hosts: Vec<(usize, u64)>,
}

/// The rows one step of the section overwrites, as copied.
pub(super) struct Saved {
    /// `(role, device offset)` of each old member's rows.
    entries: Vec<(u32, u64)>,
    /// Bytes of each.
    len: u64,
    /// The rows, role after role.
    data: AlignedBuf,
}

fn io(p: &Placed, e: std::io::Error) -> Error {
    Error::io(p.member.spec(), e)
}

/// The member of `role` (placed as `p`) failed an I/O of a step.
fn failure(role: usize, p: &Placed, e: std::io::Error) -> MemberFailure {
    MemberFailure {
        role: role as u32,
        error: io(p, e),
    }
}

impl Backup {
    /// The backup of `reshape` when it grows a RAID 4/5/6 in place (the
    /// old members' data offset the same in both shapes): the new members
    /// not failed whose data starts at least [`room_bytes`] above the old
    /// members'. `None` for any other reshape.
    pub(super) fn of(placed: &[Placed], failed: &Failed, reshape: &Reshape) -> Option<Backup> {
        let (old, new) = (reshape.old(), reshape.new_shape());
        if super::shrink::is_shrink(reshape) {
            return Self::of_shrink(placed, failed, reshape);
        }
        if reshape.direction() != Direction::Forwards
            || new.level().parity_chunks() == 0
            || new.members() <= old.members()
        {
            return None;
        }
        let mut top = 0;
        // (A missing role's stand-in carries another member's offsets.)
        for role in (0..old.members()).filter(|&r| !failed.is_failed(r as usize)) {
            let at = reshape.data_offset(Shape::Old, role)?;
            if reshape.data_offset(Shape::New, role) != Some(at) {
                return None;
            }
            top = top.max(at);
        }
        let hosts = (old.members()..new.members())
            .filter(|&r| !failed.is_failed(r as usize))
            .filter(|&r| {
                reshape
                    .data_offset(Shape::New, r)
                    .is_some_and(|at| at >= top + room_bytes(old))
            })
            .map(|r| r as usize)
            .filter(|&r| r < placed.len())
            .map(|r| (r, placed[r].sb.data_offset_sectors * 512 - HEADER))
            .collect();
        Some(Backup { hosts })
    }

    /// The backup of a shrink in place (md's own with mdadm's backup file,
    /// the data offset kept): its last steps, near the start, write new
    /// rows over old rows still to be read. The members that leave hold
    /// it: the new shape never writes them, and their rows past the old
    /// stripes that still hold array bytes (the end the shrink cut off)
    /// are read by neither shape. The header sits at the top of a leaving
    /// member's old rows, one chunk of every member the new shape keeps
    /// below it. `None` for a shrink that moved its data offset.
    fn of_shrink(placed: &[Placed], failed: &Failed, reshape: &Reshape) -> Option<Backup> {
        let (old, new) = (reshape.old(), reshape.new_shape());
        // md shrinks a RAID 10 only with its data offset moved.
        if old.level().parity_chunks() == 0 {
            return None;
        }
        for role in 0..new.members() {
            if reshape.data_offset(Shape::Old, role) != reshape.data_offset(Shape::New, role) {
                return None;
            }
        }
        let chunk = old.chunk_bytes()?;
        let old_unit = chunk * u64::from(old.members() - old.level().parity_chunks());
        let rows = old.member_used_bytes() / chunk;
        // The first old row holding no array byte of the smaller size.
        let dead = reshape.array_bytes().div_ceil(old_unit);
        let need = chunk * u64::from(new.members()) + HEADER;
        let hosts = (new.members()..old.members())
            .filter(|&r| !failed.is_failed(r as usize) && (r as usize) < placed.len())
            .filter_map(|r| {
                let base = reshape.data_offset(Shape::Old, r)?;
                let top = base + rows * chunk;
                (top >= base + dead * chunk + need).then_some((r as usize, top - HEADER))
            })
            .collect();
        Some(Backup { hosts })
    }

    /// Whether any member holds the backup.
    pub(super) fn is_held(&self) -> bool {
        !self.hosts.is_empty()
    }

    /// The members (by role) holding the backup.
    pub(super) fn hosts(&self) -> Vec<usize> {
        self.hosts.iter().map(|&(h, _)| h).collect()
    }

    /// Clear every host's header (flushed): before a grow records the
    /// reshape, so nothing found there later predates it.
    pub(super) fn clear(&self, placed: &[Placed]) -> Result<()> {
        let zero = AlignedBuf::zeroed(HEADER as usize);
        for &(h, at) in &self.hosts {
            let p = &placed[h];
            p.member.write_at(&zero, at).map_err(|e| io(p, e))?;
            p.member.flush().map_err(|e| io(p, e))?;
        }
        Ok(())
    }

    /// Copy the rows a step of `reshape` to `to` will write on the old
    /// members (`unreadable_old` by role: not read, not kept) to every
    /// host, each flushed, with the header last. Returns the copy, for
    /// putting the rows back if the step stops part-way; or the member
    /// that failed (an old member read, a host written), with nothing of
    /// the step written to the old members.
    pub(super) fn save(
        &self,
        placed: &[Placed],
        unreadable_old: &[bool],
        reshape: &Reshape,
        to: u64,
    ) -> StepResult<Saved> {
        let old = reshape.old();
        let new = reshape.new_shape();
        let chunk = new.chunk_bytes().expect("parity levels have chunks");
        let unit = reshape.position_unit();
        // The new rows the step writes, on the members both shapes have.
        let (first_row, end_row) = match reshape.direction() {
            Direction::Forwards => (reshape.position() / unit, to.div_ceil(unit)),
            Direction::Backwards => (to / unit, reshape.position().div_ceil(unit)),
        };
        let len = (end_row - first_row) * chunk;
        let entries: Vec<(u32, u64)> = (0..old.members().min(new.members()))
            .filter(|&r| !unreadable_old.get(r as usize).copied().unwrap_or(false))
            .map(|r| {
                let at = reshape
                    .data_offset(Shape::New, r)
                    .expect("an old member is in the new shape")
                    + first_row * chunk;
                (r, at)
            })
            .collect();
        assert!(
            entries.len() as u64 * len + HEADER <= room_bytes(old),
            "invariant: a step of the section fits the backup area"
        );
        assert!(
            ENTRIES + entries.len() * 12 <= HEADER as usize,
            "invariant: the entries fit the header"
        );
        let mut data = AlignedBuf::zeroed((entries.len() as u64 * len) as usize);
        for (k, &(role, at)) in entries.iter().enumerate() {
            let p = &placed[role as usize];
            let k = k * len as usize;
            p.member
                .read_at(&mut data[k..k + len as usize], at)
                .map_err(|e| failure(role as usize, p, e))?;
        }
        let saved = Saved { entries, len, data };
        let header = saved.header(&placed[0].sb, reshape, to);
        let zero = AlignedBuf::zeroed(HEADER as usize);
        for &(h, at) in &self.hosts {
            let p = &placed[h];
            let failed = |e| failure(h, p, e);
            p.member.write_at(&zero, at).map_err(failed)?;
            p.member.flush().map_err(failed)?;
            crate::failpoint::hit("reshape-backup");
            p.member
                .write_at(&saved.data, at - saved.data.len() as u64)
                .map_err(failed)?;
            p.member.flush().map_err(failed)?;
            crate::failpoint::hit("reshape-backup");
            p.member.write_at(&header, at).map_err(failed)?;
            p.member.flush().map_err(failed)?;
            crate::failpoint::hit("reshape-backup");
        }
        Ok(saved)
    }

    /// After a crash: the copy on the first host whose header is for
    /// `reshape`'s recorded position (this array, its checksums right)
    /// written back over the old members' rows (none to a member failed
    /// since), flushed. Returns whether one was; refused when the only
    /// header for the position has rows that fail their checksum.
    pub(super) fn restore(
        &self,
        placed: &[Placed],
        failed: &Failed,
        reshape: &Reshape,
    ) -> Result<bool> {
        match self.find(placed, reshape)? {
            Some(saved) => {
                saved.put_back(placed, failed)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// The copy on the first host whose header is for `reshape`'s
    /// recorded position, this array's, with its checksums right: the old
    /// rows the step under way may have overwritten part of. `None` when
    /// no host has one; refused when the only header for the position has
    /// rows that fail their checksum.
    pub(super) fn find(&self, placed: &[Placed], reshape: &Reshape) -> Result<Option<Saved>> {
        // A header for this position whose rows fail their checksum: the
        // rows were flushed before the header was written, so the medium
        // changed them since. Without a good copy elsewhere, the step may
        // have been part-way over the old rows: refused.
        let mut spoiled = None;
        for &(h, at) in &self.hosts {
            let p = &placed[h];
            let mut header = AlignedBuf::zeroed(HEADER as usize);
            p.member.read_at(&mut header, at).map_err(|e| io(p, e))?;
            let Some((entries, len, crc)) = parse(&header, &placed[0].sb, reshape) else {
                continue;
            };
            let bytes = entries.len() as u64 * len;
            if bytes > at {
                spoiled.get_or_insert(p.member.spec().to_string());
                continue;
            }
            let mut data = AlignedBuf::zeroed(bytes as usize);
            p.member
                .read_at(&mut data, at - bytes)
                .map_err(|e| io(p, e))?;
            if crc32c(&data) != crc {
                spoiled.get_or_insert(p.member.spec().to_string());
                continue;
            }
            return Ok(Some(Saved { entries, len, data }));
        }
        match spoiled {
            Some(spec) => Err(Error::NotStartable(format!(
                "{spec}: the backup of the critical section for the recorded position ({} bytes) fails its checksum, and no other new member holds a good one; the rows it keeps may be needed, so nothing was written: give the member with a good copy, or restore the members from a backup",
                reshape.position()
            ))),
            None => Ok(None),
        }
    }
}

impl Saved {
    fn header(&self, sb: &nvraid_metadata::Superblock, reshape: &Reshape, to: u64) -> AlignedBuf {
        let mut h = AlignedBuf::zeroed(HEADER as usize);
        h[0..16].copy_from_slice(MAGIC);
        h[16..32].copy_from_slice(&sb.set_uuid);
        h[32..40].copy_from_slice(&reshape.position().to_le_bytes());
        h[40..48].copy_from_slice(&to.to_le_bytes());
        h[48..56].copy_from_slice(&self.len.to_le_bytes());
        h[56..60].copy_from_slice(&(self.entries.len() as u32).to_le_bytes());
        h[60..64].copy_from_slice(&crc32c(&self.data).to_le_bytes());
        h[68..72].copy_from_slice(&reshape.new_shape().members().to_le_bytes());
        for (k, &(role, at)) in self.entries.iter().enumerate() {
            let o = ENTRIES + k * 12;
            h[o..o + 4].copy_from_slice(&role.to_le_bytes());
            h[o + 4..o + 12].copy_from_slice(&at.to_le_bytes());
        }
        let crc = crc32c(&h);
        h[64..68].copy_from_slice(&crc.to_le_bytes());
        h
    }

    /// Lay the kept rows of role `role`'s member over `buf`, which was
    /// read from its device byte `at`.
    pub(super) fn overlay(&self, role: u32, at: u64, buf: &mut [u8]) {
        let end = at + buf.len() as u64;
        for (k, &(r, from)) in self.entries.iter().enumerate() {
            let to = from + self.len;
            if r != role || to <= at || from >= end {
                continue;
            }
            let (lo, hi) = (from.max(at), to.min(end));
            let kept = k as u64 * self.len + (lo - from);
            buf[(lo - at) as usize..(hi - at) as usize]
                .copy_from_slice(&self.data[kept as usize..(kept + hi - lo) as usize]);
        }
    }

    /// Write the rows back over the old members' (none to a member
    /// failed), flushed.
    pub(super) fn put_back(&self, placed: &[Placed], failed: &Failed) -> Result<()> {
        for (k, &(role, at)) in self.entries.iter().enumerate() {
            if failed.is_failed(role as usize) {
                continue;
            }
            let p = &placed[role as usize];
            let k = k * self.len as usize;
            p.member
                .write_at(&self.data[k..k + self.len as usize], at)
                .map_err(|e| io(p, e))?;
        }
        for &(role, _) in &self.entries {
            if !failed.is_failed(role as usize) {
                let p = &placed[role as usize];
                p.member.flush().map_err(|e| io(p, e))?;
            }
        }
        Ok(())
    }
}

/// A header's entries, bytes per entry and rows' checksum, when it is a
/// backup of this array's reshape at its recorded position.
#[allow(clippy::type_complexity)]
fn parse(
    h: &[u8],
    sb: &nvraid_metadata::Superblock,
    reshape: &Reshape,
) -> Option<(Vec<(u32, u64)>, u64, u32)> {
    let u64_at = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().expect("8 bytes"));
    let u32_at = |o: usize| u32::from_le_bytes(h[o..o + 4].try_into().expect("4 bytes"));
    if &h[0..16] != MAGIC || h[16..32] != sb.set_uuid {
        return None;
    }
    let mut copy = h.to_vec();
    copy[64..68].fill(0);
    if crc32c(&copy) != u32_at(64) {
        return None;
    }
    if u64_at(32) != reshape.position() || u32_at(68) != reshape.new_shape().members() {
        return None;
    }
    let count = u32_at(56) as usize;
    if ENTRIES + count * 12 > h.len() {
        return None;
    }
    let entries = (0..count)
        .map(|k| {
            let o = ENTRIES + k * 12;
            (u32_at(o), u64_at(o + 4))
        })
        .collect::<Vec<_>>();
    if entries
        .iter()
        .any(|&(role, _)| role >= reshape.old().members())
    {
        return None;
    }
    Some((entries, u64_at(48), u32_at(60)))
}
