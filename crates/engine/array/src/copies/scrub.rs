//! Scrub and rebuild for the copies family (RAID 1, 10): compare every
//! copy of a region with the first readable one (and in repair mode
//! rewrite those that differ), and fill a new member from the other copies.

use crate::array::Array;
use crate::error::{Error, Result};
use crate::recovery::rebuild::REGION_BYTES;
use crate::recovery::{Mode, Scrubbed};
use crate::slot::is_member_failure;
use nvraid_io::AlignedBuf;
use nvraid_layout::Piece;

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
    for piece in array.geometry().pieces(at, end - at) {
        let len = piece.len as usize;
        let read = read_every_copy(array, piece, bufs)?;
        let (first, rest) = bufs.split_at_mut(1);
        let reference = &first[0][..len];
        for (i, &(role, data_at)) in read.iter().enumerate().skip(1) {
            let Some((sectors, from, to)) = differing_sectors(reference, &rest[i - 1][..len])
            else {
                continue;
            };
            found.mismatch(
                (piece.logical_offset + from, piece.logical_offset + to),
                sectors,
            );
            if mode == Mode::Repair
                && array.on_member(role, data_at, |slot, at| {
                    slot.member.write_at(reference, at)
                })?
            {
                found.repaired_sectors += sectors;
            }
        }
    }
    Ok(())
}

/// Read every readable copy of `piece` into `bufs`, in copy order: the
/// role and data-area offset of each copy read (a member that fails is
/// marked faulty and left out). An error when none could be read.
fn read_every_copy(
    array: &Array,
    piece: Piece,
    bufs: &mut [AlignedBuf],
) -> Result<Vec<(usize, u64)>> {
    let geometry = array.geometry();
    let len = piece.len as usize;
    let mut read: Vec<(usize, u64)> = Vec::with_capacity(geometry.copies() as usize);
    for copy in 0..geometry.copies() {
        let loc = geometry.locate(piece.logical_offset, copy);
        let role = loc.member as usize;
        if !array.readable(role, loc.member_offset, piece.len) {
            continue;
        }
        let buf = &mut bufs[read.len()][..len];
        if array.on_member(role, loc.member_offset, |slot, at| {
            slot.member.read_at(buf, at)
        })? {
            read.push((role, loc.member_offset));
        }
    }
    if read.is_empty() {
        return Err(Error::Unreadable {
            offset: piece.logical_offset,
            len: piece.len,
        });
    }
    Ok(read)
}

/// The 512-byte sectors where `a` and `b` differ: how many, and the byte
/// range from the first to the end of the last (`None`: they agree).
pub(crate) fn differing_sectors(a: &[u8], b: &[u8]) -> Option<(u64, u64, u64)> {
    const SECTOR: usize = 512;
    let mut differing = 0u64;
    let (mut first, mut last) = (usize::MAX, 0usize);
    for (k, (x, y)) in a.chunks(SECTOR).zip(b.chunks(SECTOR)).enumerate() {
        if x != y {
            differing += 1;
            first = first.min(k);
            last = k;
        }
    }
    (differing > 0).then(|| {
        (
            differing,
            (first * SECTOR) as u64,
            ((last + 1) * SECTOR) as u64,
        )
    })
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
