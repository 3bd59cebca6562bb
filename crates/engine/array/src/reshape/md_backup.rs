//! mdadm's own backup of a grow in place's critical section, written
//! beside nvraid's (`backup`), so that `mdadm --assemble` can take over an
//! array nvraid left inside the section.
//!
//! nvraid's backup keeps, step by step, the old rows the next step will
//! overwrite; `grow --continue` puts them back and redoes the step. mdadm
//! keeps something else: before the kernel reshapes the section, it copies
//! the array's bytes of the whole section, in array order, to the tail of
//! each new member's data area; at assembly (`Grow_restart` in mdadm's
//! Grow.c) it writes them back in the new shape, with parity, and records
//! the position at the section's end, from where the kernel's raid5 can go
//! on by itself. nvraid writes that copy too, when it fits:
//!
//! | bytes of a new member (`E`: its data offset plus the array's used size per member) | what |
//! |---|---|
//! | `[E - 4096 - L - 4096, E - 4096 - L)` | a copy of the record below (its first 512 bytes) |
//! | `[E - 4096 - L, E - 4096)` | the section's `L` array bytes, from array byte 0 |
//! | `[E - 4096, E)` | the record (`md_backup_data-1`, the array's UUID, a time, the copy's device sector, array sector 0, `L` in sectors, mdadm's checksum), where mdadm looks first |
//!
//! - **When.** Written once the reshape is recorded and before the first
//!   step of the section writes over an old row: the bytes, flushed, then
//!   both records, flushed. Forgotten (the record rewritten with length 0,
//!   as mdadm forgets its own) before the first step past the section, so
//!   no later step's rows in that tail are ever taken for it. Before the
//!   grow records anything, the record's place is cleared: a record left
//!   there by an earlier grow of the same array is never believed.
//! - **Why it is right at any crash inside the section.** An offline grow
//!   changes no array byte, so the copy holds the section's bytes at every
//!   moment; written in the new shape they make `[0, end)` right, and a new
//!   row up to `end` only overwrites old rows whose bytes lie below `end`.
//! - **When nvraid does not write it** (mdadm then refuses the array inside
//!   the section, as before, and `nvraid grow --continue` is the way on):
//!   a member failed (the copy is read straight through the map); the tail
//!   of a new member would meet the rows the section writes at the start of
//!   its data area; the section ends past the old array (a tiny array).

use super::degraded::Failed;
use super::grow::Placed;
use super::step::{read_around, MemberFailure, StepResult, Unreadable};
use crate::error::Error;
use nvraid_io::AlignedBuf;
use nvraid_layout::{Direction, Reshape};
use nvraid_metadata::Timestamp;

const MAGIC: &[u8; 16] = b"md_backup_data-1";
/// A record's block (the record itself is its first 512 bytes).
const BLOCK: u64 = 4096;
/// The most of the section read and written at once.
const PIECE: u64 = 16 << 20;

/// mdadm's backup of one grow in place's critical section: the new
/// members (by role) holding it, and the section's end (array bytes).
#[derive(Debug)]
pub(super) struct MdBackup {
    hosts: Vec<usize>,
    end: u64,
}

impl MdBackup {
    /// The backup of `reshape` (a forwards grow in place whose new members
    /// `hosts` hold nvraid's backup), or `None` where nvraid does not write
    /// one (see the module's doc).
    pub(super) fn of(
        placed: &[Placed],
        failed: &Failed,
        reshape: &Reshape,
        hosts: &[usize],
    ) -> Option<MdBackup> {
        let (old, new) = (reshape.old(), reshape.new_shape());
        if reshape.direction() != Direction::Forwards
            || new.members() <= old.members()
            || (0..placed.len()).any(|r| failed.is_failed(r))
        {
            return None;
        }
        let end = section_end(reshape)?;
        if reshape.position() >= end || end > old.array_bytes() {
            return None;
        }
        if !reshape.at(end).is_ok_and(|r| r.md_can_continue()) {
            return None;
        }
        let chunk = new.chunk_bytes()?;
        let data_members = u64::from(new.members() - new.level().parity_chunks());
        // What the section writes at the start of each member's data.
        let rows = end.div_ceil(chunk * data_members) * chunk;
        let fits = |p: &Placed| {
            let used = p.sb.size_sectors * 512;
            rows + end + 2 * BLOCK <= used
        };
        if hosts.is_empty() || !hosts.iter().all(|&h| fits(&placed[h])) {
            return None;
        }
        Some(MdBackup {
            hosts: hosts.to_vec(),
            end,
        })
    }

    /// The section's end: where the grow forgets the backup.
    pub(super) fn end(&self) -> u64 {
        self.end
    }

    /// Copy the section's array bytes (read through `reshape`'s map) to
    /// every host, flushed, then both records, flushed.
    pub(super) fn write(&self, placed: &[Placed], reshape: &Reshape) -> StepResult<()> {
        let members: Vec<&nvraid_member::Member> = placed.iter().map(|p| &p.member).collect();
        let none = vec![false; placed.len()];
        let unreadable = Unreadable {
            old: &none,
            new: &none,
        };
        // In pieces: a section of large chunks over many members runs to
        // hundreds of MiB.
        let mut data = AlignedBuf::zeroed(PIECE.min(self.end) as usize);
        let mut at = 0;
        while at < self.end {
            let len = PIECE.min(self.end - at) as usize;
            read_around(reshape, &members, unreadable, &mut data[..len], at)?;
            for &h in &self.hosts {
                let p = &placed[h];
                p.member
                    .write_at(&data[..len], record_at(p) - self.end + at)
                    .map_err(|e| failure(h, p, e))?;
            }
            at += len as u64;
        }
        for &h in &self.hosts {
            let p = &placed[h];
            let failed = |e| failure(h, p, e);
            let record_at = record_at(p);
            let devstart = record_at - self.end;
            p.member.flush().map_err(failed)?;
            let record = self.record(p, devstart, self.end);
            p.member
                .write_at(&record, devstart - BLOCK)
                .map_err(failed)?;
            p.member.write_at(&record, record_at).map_err(failed)?;
            p.member.flush().map_err(failed)?;
        }
        Ok(())
    }

    /// Rewrite every host's record with length 0 (mdadm's way of saying
    /// the section is done), flushed. Hosts failed since are left out.
    pub(super) fn forget(&self, placed: &[Placed], failed: &Failed) -> StepResult<()> {
        for &h in self.hosts.iter().filter(|&&h| !failed.is_failed(h)) {
            let p = &placed[h];
            let at = record_at(p);
            let record = self.record(p, at - self.end, 0);
            p.member
                .write_at(&record, at)
                .map_err(|e| failure(h, p, e))?;
            p.member.flush().map_err(|e| failure(h, p, e))?;
        }
        Ok(())
    }

    /// The record for a copy at device byte `devstart` of `len` bytes.
    fn record(&self, p: &Placed, devstart: u64, len: u64) -> AlignedBuf {
        let mut r = AlignedBuf::zeroed(BLOCK as usize);
        r[0..16].copy_from_slice(MAGIC);
        r[16..32].copy_from_slice(&p.sb.set_uuid);
        r[32..40].copy_from_slice(&Timestamp::now().seconds.to_le_bytes());
        r[40..48].copy_from_slice(&(devstart / 512).to_le_bytes());
        // arraystart: 0.
        r[56..64].copy_from_slice(&(len / 512).to_le_bytes());
        let csum = checksum(64);
        r[64..68].copy_from_slice(&csum.to_le_bytes());
        r
    }
}

/// Clear the place of mdadm's record on the new members `hosts` (flushed),
/// before a grow in place records its reshape.
pub(super) fn clear(placed: &[Placed], hosts: &[usize]) -> crate::error::Result<()> {
    let zero = AlignedBuf::zeroed(BLOCK as usize);
    for &h in hosts {
        let p = &placed[h];
        let io = |e| Error::io(p.member.spec(), e);
        p.member.write_at(&zero, record_at(p)).map_err(io)?;
        p.member.flush().map_err(io)?;
    }
    Ok(())
}

/// Where mdadm looks for the record: the last 4 KiB of the array's used
/// size per member, from the member's data offset.
fn record_at(p: &Placed) -> u64 {
    (p.sb.data_offset_sectors + p.sb.size_sectors) * 512 - BLOCK
}

fn failure(role: usize, p: &Placed, e: std::io::Error) -> MemberFailure {
    MemberFailure {
        role: role as u32,
        error: Error::io(p.member.spec(), e),
    }
}

/// mdadm's checksum of a record's first `len` bytes, as mdadm computes it:
/// it adds the first byte (of the magic: `m`) at every step, so it
/// depends on `len` alone; kept so, since mdadm compares with it.
pub(super) fn checksum(len: usize) -> u32 {
    let first = i32::from(MAGIC[0] as i8);
    (0..len).fold(0i32, |c, _| c.wrapping_shl(3).wrapping_add(first)) as u32
}

/// The end of the critical section as mdadm computes it (its
/// `Grow_restart`, for a growing member count): the first new stripe
/// boundary from which the kernel's reads stay ahead of its writes.
pub(super) fn section_end(reshape: &Reshape) -> Option<u64> {
    let (old, new) = (reshape.old(), reshape.new_shape());
    let odata = u64::from(old.members() - old.level().parity_chunks());
    let ndata = u64::from(new.members() - new.level().parity_chunks());
    let (ochunk, nchunk) = (old.chunk_bytes()? / 512, new.chunk_bytes()? / 512);
    let (mut nstripe, mut ostripe, mut last) = (0u64, 0u64, 0u64);
    while nstripe >= ostripe {
        nstripe += nchunk;
        last = nstripe * ndata;
        ostripe = last / odata / ochunk * ochunk;
    }
    Some(last * 512)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checksum_is_mdadms() {
        // mdadm's own bsb_csum, compiled with gcc, over the first 64 bytes
        // of a record "md_backup_data-1..." gives 613566741.
        assert_eq!(checksum(64), 613_566_741);
    }
}
