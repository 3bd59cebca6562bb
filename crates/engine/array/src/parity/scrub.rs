//! Scrub and rebuild for the parity family (RAID 4, 5, 6): compare each
//! stripe's parity with its data (and in repair mode rewrite the parity),
//! and fill a new member by recovering its blocks from the others.

use super::plan::ParityShape;
use crate::array::Array;
use crate::error::Result;
use crate::personality::Parity;
use crate::recovery::{Mode, Scrubbed};
use nvraid_io::AlignedBuf;

/// Compare (and in repair mode rewrite) the parity of every stripe holding
/// some of `[at, end)` of a RAID 4/5/6 (each held against client writes
/// while it is compared: a stripe can reach outside the held region).
/// Stripes with a block that cannot be read have nothing to compare with
/// and are left as they are. A mismatch counts the 512-byte sectors of the
/// chunk where P or Q differs from the data's.
pub(crate) fn compare_parity(
    array: &Array,
    parity_family: &Parity,
    at: u64,
    end: u64,
    mode: Mode,
    found: &mut Scrubbed,
    done: &mut Option<u64>,
) -> Result<()> {
    let shape = parity_family.shape;
    let (first, last) = shape.stripes(at, end - at);
    let chunk = shape.chunk as usize;
    let members = (shape.data + shape.parity) as usize;
    let mut blocks = AlignedBuf::zeroed(chunk * members);
    let mut parity = AlignedBuf::zeroed(2 * chunk);
    for stripe in first..=last {
        if done.is_some_and(|d| stripe <= d) {
            continue;
        }
        *done = Some(stripe);
        parity_family.locks.lock_range(stripe, stripe);
        let compared = compare_stripe(array, &shape, stripe, mode, &mut blocks, &mut parity, found);
        parity_family.locks.unlock_range(stripe, stripe);
        compared?;
    }
    Ok(())
}

fn compare_stripe(
    array: &Array,
    shape: &ParityShape,
    stripe: u64,
    mode: Mode,
    blocks: &mut [u8],
    parity: &mut [u8],
    found: &mut Scrubbed,
) -> Result<()> {
    if !read_stripe(array, shape, stripe, blocks)? {
        return Ok(());
    }
    let chunk = shape.chunk as usize;
    let count = (shape.data + shape.parity) as usize;
    let (data_blocks, stored) = blocks[..count * chunk].split_at(shape.data as usize * chunk);
    let mut data: Vec<&[u8]> = vec![&[]; shape.data as usize];
    for (d, block) in data_blocks.chunks_exact(chunk).enumerate() {
        data[shape.q_order(stripe, d as u32)] = block;
    }
    let parity = &mut parity[..shape.parity as usize * chunk];
    shape.generate(nvraid_parity::Kernel::best(), &data, parity, chunk);
    let differing = differing_parity_sectors(parity, stored, chunk);
    if differing == 0 {
        return Ok(());
    }
    let width = shape.stripe_data_bytes();
    found.mismatch((stripe * width, (stripe + 1) * width), differing);
    if mode == Mode::Repair {
        for (k, (want, have)) in parity.chunks(chunk).zip(stored.chunks(chunk)).enumerate() {
            if want != have {
                let role = shape.member_of(stripe, shape.data + k as u32) as usize;
                let at = stripe * shape.chunk;
                array.on_member(role, at, |slot, at| slot.member.write_at(want, at))?;
            }
        }
        found.repaired_sectors += differing;
    }
    Ok(())
}

/// Read every block of `stripe` (data, then P and Q) into `blocks`. False
/// when one cannot be read (not readable there, or its member failed now):
/// the stripe has nothing to be compared with.
fn read_stripe(array: &Array, shape: &ParityShape, stripe: u64, blocks: &mut [u8]) -> Result<bool> {
    let chunk = shape.chunk as usize;
    let member_offset = stripe * shape.chunk;
    let count = (shape.data + shape.parity) as usize;
    for (b, block) in blocks.chunks_exact_mut(chunk).take(count).enumerate() {
        let role = shape.member_of(stripe, b as u32) as usize;
        if !array.readable(role, member_offset, shape.chunk)
            || !array.on_member(role, member_offset, |slot, at| {
                slot.member.read_at(block, at)
            })?
        {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The 512-byte sectors of a chunk where the computed parity (`want`: P,
/// then Q) and the stored one differ, in P or in Q.
fn differing_parity_sectors(want: &[u8], stored: &[u8], chunk: usize) -> u64 {
    const SECTOR: usize = 512;
    (0..chunk / SECTOR)
        .filter(|&k| {
            want.chunks(chunk)
                .zip(stored.chunks(chunk))
                .any(|(w, h)| w[k * SECTOR..(k + 1) * SECTOR] != h[k * SECTOR..(k + 1) * SECTOR])
        })
        .count() as u64
}

/// Fill `buf` with what `role` holds at `[at, end)` of its data area,
/// recovered stripe by stripe from the other members.
pub(crate) fn rebuild_from_parity(
    array: &Array,
    parity: &Parity,
    role: usize,
    at: u64,
    end: u64,
    buf: &mut [u8],
    sources: &mut Vec<AlignedBuf>,
) -> Result<()> {
    let shape = parity.shape;
    if !array.bad_blocks_beside(role, at, end - at) {
        return array.rebuild_range(role, at, end, &mut buf[..(end - at) as usize], sources);
    }
    // Bad blocks beside: chunk by chunk, so that only the stripes that
    // hold them are left unrebuilt (see `Array::rebuild_block`).
    let mut piece_at = at;
    while piece_at < end {
        let len = (shape.chunk - piece_at % shape.chunk).min(end - piece_at);
        let from = (piece_at - at) as usize;
        array.rebuild_block(role, piece_at, &mut buf[from..from + len as usize])?;
        piece_at += len;
    }
    Ok(())
}
