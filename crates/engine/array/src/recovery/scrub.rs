//! Scrub: compare every copy of every block (`check`), rewrite the copies
//! that differ from the first (`repair`), which on an array assembled dirty
//! is also its resync.

use super::rebuild::{CHECKPOINT_EVERY, REGION_BYTES};
use super::Progress;
use crate::array::Array;
use crate::array::BARRIER_REGION_BYTES;
use crate::error::{Error, Result};
use nvraid_io::AlignedBuf;
use std::time::Instant;

/// What a scrub does with copies that differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Count them only (reads every copy, writes nothing).
    Check,
    /// Rewrite them from the first readable copy (md's `repair`); on an
    /// array assembled dirty, resync it and record it clean.
    Repair,
}

/// What a scrub found (and, in repair mode, put right).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Scrubbed {
    /// Sectors (512 bytes) of some copy that differed from the first copy (RAID
    /// 4/5/6: of a chunk whose P or Q differed from its stripe's data).
    pub mismatch_sectors: u64,
    /// Array byte ranges `[start, end)` where some copy differed (adjacent
    /// ranges merged).
    pub regions: Vec<(u64, u64)>,
    /// Sectors rewritten (repair mode).
    pub repaired_sectors: u64,
    /// Bytes of the array compared (a resync of an array with a bitmap
    /// compares only the regions whose bits are set).
    pub bytes: u64,
    pub seconds: f64,
    /// The array was dirty and is now resynced and recorded clean.
    pub resynced: bool,
    /// RAID 4/5/6: mismatches are parity that disagrees with the data,
    /// repaired by recomputing the parity.
    pub parity: bool,
}

/// Compare (and in repair mode rewrite) every copy of the array. A repair
/// of an array assembled dirty starts where its last resync stopped (md's
/// `resync_offset`), checkpoints its progress every second, and records the
/// array clean at the end; a check always covers the whole array.
pub fn scrub(array: &Array, mode: Mode, progress: &mut dyn FnMut(Progress)) -> Result<Scrubbed> {
    scrub_with(array, mode, &Pace::default(), progress)
}

/// How fast a scrub may go, and when to stop early (a server shutting
/// down): a stopped repair keeps its last checkpoint, and the next one
/// resumes there.
#[derive(Debug, Default)]
pub struct Pace<'a> {
    /// Bytes per second at most (md's speed_limit_max); `None`: unlimited.
    pub max_rate: Option<u64>,
    /// Checked between regions.
    pub stop: Option<&'a std::sync::atomic::AtomicBool>,
}

/// [`scrub`], paced. Each region is held against client writes while it
/// is compared and rewritten (the array's barrier), so a scrub or resync can
/// run beside a server's clients: no client write to the region is in
/// flight or starts until the region is done.
pub fn scrub_with(
    array: &Array,
    mode: Mode,
    pace: &Pace,
    progress: &mut dyn FnMut(Progress),
) -> Result<Scrubbed> {
    let geometry = array.geometry();
    if !geometry.level().is_redundant() {
        return Err(Error::Unsupported {
            spec: array.superblock().name(),
            what: "check or repair of a raid0 (it keeps no copies to compare)".into(),
        });
    }
    if mode == Mode::Repair && !array.is_writable() {
        return Err(Error::ReadOnly);
    }
    let resync_from = match mode {
        Mode::Repair => array.resync_from(),
        Mode::Check => None,
    };
    let from = resync_from.unwrap_or(0);
    let total = array.size_bytes();
    let started = Instant::now();
    let mut last_checkpoint = Instant::now();
    let mut found = Scrubbed {
        mismatch_sectors: 0,
        regions: Vec::new(),
        repaired_sectors: 0,
        bytes: 0,
        seconds: 0.0,
        resynced: false,
        parity: array.parity.is_some(),
    };
    let copies = geometry.copies() as usize;
    let mut bufs: Vec<AlignedBuf> = (0..copies.max(2))
        .map(|_| AlignedBuf::zeroed(REGION_BYTES as usize))
        .collect();
    // RAID 4/5/6: the last stripe compared (a stripe can straddle two
    // regions; it is compared once).
    let mut stripes_done: Option<u64> = None;
    let mut at = from;
    while at < total {
        if pace
            .stop
            .is_some_and(|stop| stop.load(std::sync::atomic::Ordering::Acquire))
        {
            break;
        }
        let region = at / BARRIER_REGION_BYTES;
        let mut end = ((region + 1) * BARRIER_REGION_BYTES).min(total);
        if let Some(chunk) = array.bitmap_chunk_bytes().filter(|_| resync_from.is_some()) {
            // A resync visits only what the write-intent bitmap marks: the
            // run of marked chunks from `at`, within the region.
            let next = |from: u64| ((from / chunk + 1) * chunk).min(end);
            if !array.resync_wanted(at, next(at) - at) {
                at = next(at);
                continue;
            }
            let mut run_end = next(at);
            while run_end < end && array.resync_wanted(run_end, next(run_end) - run_end) {
                run_end = next(run_end);
            }
            end = run_end;
        }
        found.bytes += end - at;
        let held = array.hold_region(region);
        if array.parity.is_some() {
            compare_parity(array, at, end, mode, &mut found, &mut stripes_done)?;
        } else {
            compare_copies(array, at, end, mode, &mut bufs, &mut found)?;
        }
        drop(held);
        at = end;
        if let Some(rate) = pace.max_rate {
            let due = std::time::Duration::from_secs_f64((at - from) as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        if resync_from.is_some() && last_checkpoint.elapsed() >= CHECKPOINT_EVERY && at < total {
            array.flush()?;
            array.resync_checkpoint(Some(at))?;
            last_checkpoint = Instant::now();
        }
        progress(Progress {
            role: 0,
            done_bytes: at - from,
            total_bytes: total - from,
            elapsed: started.elapsed(),
        });
    }
    if mode == Mode::Repair {
        array.flush()?;
        if at < total {
            // Stopped early: the last checkpoint stands.
            if resync_from.is_some() {
                array.resync_checkpoint(Some(at))?;
            }
        } else if resync_from.is_some() {
            array.resync_checkpoint(None)?;
            found.resynced = true;
            // In sync everywhere: the bitmap's bits may go.
            array.bitmap_pass(true, true)?;
        }
    }
    found.seconds = started.elapsed().as_secs_f64();
    Ok(found)
}

/// Compare (and in repair mode rewrite) every copy of `[at, end)` of a
/// mirrored array against its first readable copy.
fn compare_copies(
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
                Err(e) if crate::array::is_member_failure(&e) => array.fail_member(role, &e)?,
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
                    Err(e) if crate::array::is_member_failure(&e) => array.fail_member(role, &e)?,
                    Err(e) => return Err(Error::io(slot.member.spec(), e)),
                }
            }
        }
    }
    Ok(())
}

/// Compare (and in repair mode rewrite) the parity of every stripe holding
/// some of `[at, end)` of a RAID 4/5/6 (each held against client writes
/// while it is compared: a stripe can reach outside the held region).
/// Stripes with a block that cannot be read have nothing to compare with
/// and are left as they are. A mismatch counts the 512-byte sectors of the
/// chunk where P or Q differs from the data's.
fn compare_parity(
    array: &Array,
    at: u64,
    end: u64,
    mode: Mode,
    found: &mut Scrubbed,
    done: &mut Option<u64>,
) -> Result<()> {
    let shape = array.parity.expect("a parity array");
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
        array.stripe_locks.lock_range(stripe, stripe);
        let compared = compare_stripe(array, &shape, stripe, mode, &mut blocks, &mut parity, found);
        array.stripe_locks.unlock_range(stripe, stripe);
        compared?;
    }
    Ok(())
}

fn compare_stripe(
    array: &Array,
    shape: &crate::stripe::ParityShape,
    stripe: u64,
    mode: Mode,
    blocks: &mut [u8],
    parity: &mut [u8],
    found: &mut Scrubbed,
) -> Result<()> {
    let chunk = shape.chunk as usize;
    let member_offset = stripe * shape.chunk;
    let count = (shape.data + shape.parity) as usize;
    for (b, block) in blocks.chunks_exact_mut(chunk).take(count).enumerate() {
        let role = shape.member_of(stripe, b as u32) as usize;
        if !array.readable(role, member_offset, shape.chunk) {
            return Ok(());
        }
        let slot = array.slot(role).expect("readable means present");
        match slot
            .member
            .read_at(block, slot.data_offset_bytes() + member_offset)
        {
            Ok(()) => {}
            Err(e) if crate::array::is_member_failure(&e) => {
                array.fail_member(role, &e)?;
                return Ok(());
            }
            Err(e) => return Err(Error::io(slot.member.spec(), e)),
        }
    }
    let (data_blocks, stored) = blocks[..count * chunk].split_at(shape.data as usize * chunk);
    let mut data: Vec<&[u8]> = vec![&[]; shape.data as usize];
    for (d, block) in data_blocks.chunks_exact(chunk).enumerate() {
        data[shape.q_order(stripe, d as u32)] = block;
    }
    let parity = &mut parity[..shape.parity as usize * chunk];
    shape.generate(nvraid_parity::Kernel::best(), &data, parity, chunk);
    let sector = 512;
    let differing = parity
        .chunks(chunk)
        .zip(stored.chunks(chunk))
        .map(|(want, have)| {
            want.chunks(sector)
                .zip(have.chunks(sector))
                .map(|(a, b)| a != b)
                .collect::<Vec<bool>>()
        })
        .reduce(|p, q| p.iter().zip(q).map(|(a, b)| *a || b).collect())
        .map_or(0, |bad| bad.iter().filter(|&&b| b).count() as u64);
    if differing == 0 {
        return Ok(());
    }
    found.mismatch_sectors += differing;
    let width = shape.stripe_data_bytes();
    let range = (stripe * width, (stripe + 1) * width);
    match found.regions.last_mut() {
        Some(last) if last.1 >= range.0 => last.1 = last.1.max(range.1),
        _ => found.regions.push(range),
    }
    if mode == Mode::Repair {
        for (k, (want, have)) in parity.chunks(chunk).zip(stored.chunks(chunk)).enumerate() {
            if want == have {
                continue;
            }
            let role = shape.member_of(stripe, shape.data + k as u32) as usize;
            let slot = array.slot(role).expect("read above");
            match slot
                .member
                .write_at(want, slot.data_offset_bytes() + member_offset)
            {
                Ok(()) => {}
                Err(e) if crate::array::is_member_failure(&e) => array.fail_member(role, &e)?,
                Err(e) => return Err(Error::io(slot.member.spec(), e)),
            }
        }
        found.repaired_sectors += differing;
    }
    Ok(())
}
