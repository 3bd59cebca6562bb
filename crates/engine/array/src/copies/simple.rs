//! The simple path of the copies family (RAID 0, 1, 10): a request cut into
//! pieces at chunk boundaries; a read takes one readable copy of each piece
//! (the least loaded, or the first while the array is unsynced), around bad
//! blocks and recovery points; a write goes to every present copy, failing
//! over a member that errs.

use crate::array::Array;
use crate::error::{Error, Result};
use crate::slot::{is_member_failure, Slot};
use nvraid_layout::{Geometry, Piece};
use std::sync::atomic::Ordering;

impl Array {
    /// The copies family's state. Only the copies family's code calls
    /// this, and only on a RAID 0/1/10 (the personality chose it).
    fn copies_family(&self) -> &crate::personality::Copies {
        let crate::personality::Personality::Copies(copies) = self.personality() else {
            panic!("invariant: copies-family code runs on RAID 0/1/10 only");
        };
        copies
    }

    /// Read `buf.len()` bytes at `offset`, piece by piece.
    pub(crate) fn read_copies(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let mut at = 0usize;
        for piece in self.geometry().pieces(offset, buf.len() as u64) {
            let len = piece.len as usize;
            self.read_piece(piece, &mut buf[at..at + len])?;
            at += len;
        }
        Ok(())
    }

    /// Discard `[offset, offset + len)` on every present copy.
    pub(crate) fn discard_copies(&self, offset: u64, len: u64) -> Result<()> {
        self.while_admitted(offset, len, || {
            for piece in self.geometry().pieces(offset, len) {
                for (_, slot, member_offset) in self.present_copies(piece.logical_offset) {
                    slot.member
                        .discard(member_offset, piece.len)
                        .map_err(|e| Error::io(slot.member.spec(), e))?;
                }
            }
            Ok(())
        })
    }

    fn read_piece(&self, piece: Piece, buf: &mut [u8]) -> Result<()> {
        let mut result = Ok(());
        let sector = u64::from(self.sector_bytes());
        let covered = self.cover(
            piece,
            sector,
            &mut |part, copy| {
                if result.is_ok() {
                    let at = (part.logical_offset - piece.logical_offset) as usize;
                    result = self.read_copy(part, copy, &mut buf[at..at + part.len as usize]);
                }
            },
            &mut |part| self.choose_copy(part.logical_offset, part.len).ok(),
        );
        if !covered {
            return Err(Error::Unreadable {
                offset: piece.logical_offset,
                len: piece.len,
            });
        }
        result
    }

    /// Cover `piece` with readable copies: one copy for the whole piece when
    /// one can be read there (`choose`), otherwise the piece is halved (at
    /// multiples of `sector`) until each part has one, as md reads around a
    /// bad range or a recovery point. `emit` gets each part and its copy.
    /// False when some sector has no readable copy at all.
    pub(crate) fn cover(
        &self,
        piece: Piece,
        sector: u64,
        emit: &mut dyn FnMut(Piece, u32),
        choose: &mut dyn FnMut(Piece) -> Option<u32>,
    ) -> bool {
        if let Some(copy) = choose(piece) {
            emit(piece, copy);
            return true;
        }
        if !self.read_limited() || piece.len <= sector {
            return false;
        }
        let half = (piece.len / 2)
            .next_multiple_of(sector)
            .min(piece.len - sector);
        let first = Piece {
            logical_offset: piece.logical_offset,
            len: half,
        };
        let second = Piece {
            logical_offset: piece.logical_offset + half,
            len: piece.len - half,
        };
        self.cover(first, sector, emit, choose) && self.cover(second, sector, emit, choose)
    }

    /// Read `piece` from `copy`; when that member fails, mark it faulty and
    /// read the piece from another copy (until none is left).
    fn read_copy(&self, piece: Piece, copy: u32, buf: &mut [u8]) -> Result<()> {
        let mut copy = copy;
        loop {
            let location = self.geometry().locate(piece.logical_offset, copy);
            let role = location.member as usize;
            let slot = self.slot(role).expect("chosen copy is present");
            let member_offset = slot.data_offset_bytes() + location.member_offset;
            match slot.member.read_at(buf, member_offset) {
                Ok(()) => return Ok(()),
                Err(e) if is_member_failure(&e) && self.geometry().copies() > 1 => {
                    self.fail_member(role, &e)?;
                    copy = self.choose_copy(piece.logical_offset, piece.len)?;
                }
                Err(e) => return Err(Error::io(slot.member.spec(), e)),
            }
        }
    }

    /// The read policy: among readable copies, the member with the fewest
    /// requests in flight; ties broken by a rotating start so that equal
    /// mirrors share the load (or the first readable copy, see
    /// [`Array::first_copy_reads`]).
    pub fn choose_copy(&self, logical_offset: u64, len: u64) -> Result<u32> {
        // RAID 0 has one copy: no shared rotor to bump.
        let first = self.first_copy_reads();
        let start = if self.geometry().copies() > 1 && !first {
            self.copies_family()
                .read_rotor
                .fetch_add(1, Ordering::Relaxed)
        } else {
            0
        };
        let load = |member: usize, member_offset: u64| {
            let slot = self.slot(member)?;
            self.readable(member, member_offset, len)
                .then(|| slot.member.inflight())
        };
        least_loaded_copy(self.geometry(), logical_offset, start, first, load).ok_or(
            Error::Unreadable {
                offset: logical_offset,
                len,
            },
        )
    }

    /// Write `buf` at `offset` to every present copy of every piece; which
    /// roles were written (a FUA write flushes those).
    pub(crate) fn write_copies(&self, buf: &[u8], offset: u64) -> Result<Vec<bool>> {
        let mut touched = vec![false; self.roles()];
        let mut at = 0usize;
        for piece in self.geometry().pieces(offset, buf.len() as u64) {
            let len = piece.len as usize;
            self.write_piece(piece, &buf[at..at + len], &mut touched)?;
            at += len;
        }
        Ok(touched)
    }

    /// Write `piece` to every usable copy. A member that fails is marked
    /// faulty and the write goes on to the others; it fails only when no
    /// copy could be written ([`Array::fail_member`] refuses to fail the
    /// last one).
    fn write_piece(&self, piece: Piece, buf: &[u8], touched: &mut [bool]) -> Result<()> {
        for (role, slot, member_offset) in self.present_copies(piece.logical_offset) {
            match slot.member.write_at(buf, member_offset) {
                Ok(()) => touched[role] = true,
                Err(e) if is_member_failure(&e) => self.fail_member(role, &e)?,
                Err(e) => return Err(Error::io(slot.member.spec(), e)),
            }
        }
        Ok(())
    }

    /// Every present copy of the piece starting at `logical_offset`: its
    /// role, its slot and its byte offset on the member.
    fn present_copies(
        &self,
        logical_offset: u64,
    ) -> impl Iterator<Item = (usize, &Slot, u64)> + '_ {
        (0..self.geometry().copies()).filter_map(move |copy| {
            let location = self.geometry().locate(logical_offset, copy);
            if self.is_faulty(location.member as usize) {
                return None;
            }
            let slot = self.slot(location.member as usize)?;
            Some((
                location.member as usize,
                slot,
                slot.data_offset_bytes() + location.member_offset,
            ))
        })
    }
}

/// The read policy of both data paths: among the copies of the byte at
/// `logical_offset` that may be read (`load` gives the requests in flight on
/// the copy's member, given the member and the offset on it, or `None` when
/// the member is missing or may not be read there), the least loaded one;
/// the scan starts at copy `start % copies`, so ties rotate as `start`
/// advances. With `first`, the first readable copy in copy order.
pub(crate) fn least_loaded_copy(
    geometry: &Geometry,
    logical_offset: u64,
    start: u32,
    first: bool,
    load: impl Fn(usize, u64) -> Option<u32>,
) -> Option<u32> {
    let copies = geometry.copies();
    let mut best: Option<(u32, u32)> = None;
    for step in 0..copies {
        let copy = (start % copies + step) % copies;
        let at = geometry.locate(logical_offset, copy);
        let Some(member_load) = load(at.member as usize, at.member_offset) else {
            continue;
        };
        if first {
            return Some(copy);
        }
        if best.is_none_or(|(_, best_load)| member_load < best_load) {
            best = Some((copy, member_load));
        }
    }
    best.map(|(copy, _)| copy)
}
