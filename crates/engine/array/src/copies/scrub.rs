//! Scrub and rebuild for the copies family (RAID 1, 10): compare every
//! copy of a region with the first readable one (and in repair mode
//! rewrite those that differ), and fill a new member from the other copies.

use crate::array::Array;
use crate::error::{Error, Result};
use crate::recovery::rebuild::REGION_BYTES;
use crate::recovery::{Mode, Scrubbed};
use crate::slot::is_member_failure;
use nvraid_io::AlignedBuf;

/// Compare (and in repair mode rewrite) every copy of `[at, end)` of a
/// mirrored array against its first readable copy.
pub(crate) fn compare_copies(
    array: &Array,
    at: u64,
    end: u64,
    mode: Mode,
    bufs: &mut [AlignedBuf],
    found: &mut Scrubbed,
) -> Result<()> {
    let geometry = array.geometry();
    let copies = geometry.copies() as usize;
    let sector = 512usize;
    for piece in geometry.pieces(at, end - at) {
        let len = piece.len as usize;
        // Every readable copy of the piece, in copy order.
        let mut read: Vec<(usize, u64)> = Vec::with_capacity(copies);
        for copy in 0..geometry.copies() {
            let loc = geometry.locate(piece.logical_offset, copy);
            let role = loc.member as usize;
            if !array.readable(role, loc.member_offset, piece.len) {
                continue;
            }
            let slot = array.slot(role).expect("readable means present");
            let buf = &mut bufs[read.len()][..len];
            match slot
                .member
                .read_at(buf, slot.data_offset_bytes() + loc.member_offset)
            {
                Ok(()) => read.push((role, slot.data_offset_bytes() + loc.member_offset)),
                Err(e) if is_member_failure(&e) => array.fail_member(role, &e)?,
                Err(e) => return Err(Error::io(slot.member.spec(), e)),
            }
        }
        if read.is_empty() {
            return Err(Error::Unreadable {
                offset: piece.logical_offset,
                len: piece.len,
            });
        }
        let (first, rest) = bufs.split_at_mut(1);
        let reference = &first[0][..len];
        for (i, &(role, member_at)) in read.iter().enumerate().skip(1) {
            let other = &rest[i - 1][..len];
            let mut differing = 0u64;
            let (mut first_bad, mut last_bad) = (usize::MAX, 0usize);
            for (k, (a, b)) in reference
                .chunks(sector)
                .zip(other.chunks(sector))
                .enumerate()
            {
                if a != b {
                    differing += 1;
                    first_bad = first_bad.min(k);
                    last_bad = k;
                }
            }
            if differing == 0 {
                continue;
            }
            found.mismatch_sectors += differing;
            let range = (
                piece.logical_offset + (first_bad * sector) as u64,
                piece.logical_offset + ((last_bad + 1) * sector) as u64,
            );
            match found.regions.last_mut() {
                Some(last) if last.1 >= range.0 && last.0 <= range.1 => {
                    *last = (last.0.min(range.0), last.1.max(range.1))
                }
                _ => found.regions.push(range),
            }
            if mode == Mode::Repair {
                let slot = array.slot(role).expect("present");
                match slot.member.write_at(reference, member_at) {
                    Ok(()) => found.repaired_sectors += differing,
                    Err(e) if is_member_failure(&e) => array.fail_member(role, &e)?,
                    Err(e) => return Err(Error::io(slot.member.spec(), e)),
                }
            }
        }
    }
    Ok(())
}

/// Fill `buf` with what `role` holds at `[at, end)` of its data area, read
/// from the other copies of the same array bytes.
pub(crate) fn rebuild_from_copies(
    array: &Array,
    role: usize,
    at: u64,
    end: u64,
    buf: &mut [u8],
) -> Result<()> {
    let geometry = array.geometry();
    let step = geometry
        .chunk_bytes()
        .unwrap_or(REGION_BYTES)
        .min(REGION_BYTES);
    let mut piece_at = at;
    while piece_at < end {
        let len = (step - piece_at % step).min(end - piece_at);
        let from = (piece_at - at) as usize;
        let piece = &mut buf[from..from + len as usize];
        let (logical, _) = geometry
            .logical_of(role as u32, piece_at)
            .expect("a used member byte holds array data");
        read_other_copy(array, role, logical, piece)?;
        piece_at += len;
    }
    Ok(())
}

/// Read the array byte range starting at `logical` from a copy other than
/// `role`'s (a readable one; a copy that fails is marked faulty and the
/// next is tried, as a client read would).
pub(crate) fn read_other_copy(
    array: &Array,
    role: usize,
    logical: u64,
    buf: &mut [u8],
) -> Result<()> {
    let geometry = array.geometry();
    loop {
        let source = (0..geometry.copies())
            .map(|copy| geometry.locate(logical, copy))
            .find(|at| {
                at.member as usize != role
                    && array.readable(at.member as usize, at.member_offset, buf.len() as u64)
            })
            .ok_or(Error::Unreadable {
                offset: logical,
                len: buf.len() as u64,
            })?;
        let slot = array
            .slot(source.member as usize)
            .expect("readable means present");
        match slot
            .member
            .read_at(buf, slot.data_offset_bytes() + source.member_offset)
        {
            Ok(()) => return Ok(()),
            Err(e) if is_member_failure(&e) => array.fail_member(source.member as usize, &e)?,
            Err(e) => return Err(Error::io(slot.member.spec(), e)),
        }
    }
}
