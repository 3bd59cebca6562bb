//! Scrub: compare every copy of every block (`check`), rewrite the copies
//! that differ from the first (`repair`), which on an array assembled dirty
//! is also its resync.

use super::rebuild::{CHECKPOINT_EVERY, REGION_BYTES};
use super::Progress;
use crate::array::Array;
use crate::barrier::BARRIER_REGION_BYTES;
use crate::error::{Error, Result};
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
        parity: array.personality.parity().is_some(),
    };
    let personality = &array.personality;
    let mut state = personality.scrub_state(geometry, REGION_BYTES as usize);
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
        personality.scrub(array, (at, end), mode, &mut state, &mut found)?;
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
