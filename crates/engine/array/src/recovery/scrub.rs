//! Scrub: compare every copy of every block (`check`), rewrite the copies
//! that differ from the first (`repair`), which on an array assembled dirty
//! is also its resync.

use super::common::{Mode, Scrubbed, REGION_BYTES};
use super::{keep_to_rate, Checkpoints, Progress};
use crate::array::Array;
use crate::barrier::BARRIER_REGION_BYTES;
use crate::error::{Error, Result};
use std::time::Instant;

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
    check_scrubbable(array, mode)?;
    let resync_from = match mode {
        Mode::Repair => array.resync_from(),
        Mode::Check => None,
    };
    let from = resync_from.unwrap_or(0);
    let total = array.size_bytes();
    let started = Instant::now();
    let mut checkpoints = Checkpoints::start();
    let mut found = Scrubbed {
        mismatch_sectors: 0,
        regions: Vec::new(),
        repaired_sectors: 0,
        bytes: 0,
        seconds: 0.0,
        resynced: false,
        parity: array.personality().parity().is_some(),
    };
    let personality = array.personality();
    let mut state = personality.scrub_state(array.geometry(), REGION_BYTES as usize);
    let mut at = from;
    while at < total {
        if pace
            .stop
            .is_some_and(|stop| stop.load(std::sync::atomic::Ordering::Acquire))
        {
            break;
        }
        let region = at / BARRIER_REGION_BYTES;
        let region_end = ((region + 1) * BARRIER_REGION_BYTES).min(total);
        let end = match resync_from {
            Some(_) => match marked_run(array, at, region_end) {
                Some(end) => end,
                None => {
                    at = next_bitmap_chunk(array, at, region_end);
                    continue;
                }
            },
            None => region_end,
        };
        found.bytes += end - at;
        let held = array.hold_region(region);
        personality.scrub(array, (at, end), mode, &mut state, &mut found)?;
        drop(held);
        at = end;
        keep_to_rate(pace.max_rate, at - from, started);
        if resync_from.is_some() && at < total && checkpoints.due() {
            array.flush()?;
            array.resync_checkpoint(Some(at))?;
        }
        progress(Progress {
            role: 0,
            done_bytes: at - from,
            total_bytes: total - from,
            elapsed: started.elapsed(),
        });
    }
    if mode == Mode::Repair {
        found.resynced = finish_repair(array, at, total, resync_from.is_some())?;
    }
    found.seconds = started.elapsed().as_secs_f64();
    Ok(found)
}

/// Whether `array` can be scrubbed in `mode`: it keeps copies or parity to
/// compare, and for a repair it is writable.
fn check_scrubbable(array: &Array, mode: Mode) -> Result<()> {
    if !array.geometry().level().is_redundant() {
        return Err(Error::Unsupported {
            spec: array.superblock().name(),
            what: "check or repair of a raid0 (it keeps no copies to compare)".into(),
        });
    }
    if mode == Mode::Repair && !array.is_writable() {
        return Err(Error::ReadOnly);
    }
    Ok(())
}

/// Where the bitmap chunk holding `at` ends (at most `limit`; `limit`
/// itself on an array without a bitmap).
fn next_bitmap_chunk(array: &Array, at: u64, limit: u64) -> u64 {
    match array.bitmap_step_bytes() {
        Some(chunk) => ((at / chunk + 1) * chunk).min(limit),
        None => limit,
    }
}

/// A resync visits only what the write-intent bitmap marks: the end of the
/// run of marked chunks from `at` (at most `limit`), or `None` when the
/// chunk at `at` is not marked. Without a bitmap, all of `[at, limit)`.
fn marked_run(array: &Array, at: u64, limit: u64) -> Option<u64> {
    if array.bitmap_step_bytes().is_none() {
        return Some(limit);
    }
    let next = |from: u64| next_bitmap_chunk(array, from, limit);
    if !array.resync_wanted(at, next(at) - at) {
        return None;
    }
    let mut run_end = next(at);
    while run_end < limit && array.resync_wanted(run_end, next(run_end) - run_end) {
        run_end = next(run_end);
    }
    Some(run_end)
}

/// The end of a repair stopped at `at` of `total`: what it rewrote made
/// durable; a resync records where it got to, or, having reached the end,
/// the array clean and the bitmap's bits cleared. Whether it resynced all.
fn finish_repair(array: &Array, at: u64, total: u64, resync: bool) -> Result<bool> {
    array.flush()?;
    if !resync {
        return Ok(false);
    }
    if at < total {
        // Stopped early: where it got to stands.
        array.resync_checkpoint(Some(at))?;
        return Ok(false);
    }
    array.resync_checkpoint(None)?;
    // In sync everywhere: the bitmap's bits may go.
    array.bitmap_pass(true, true)?;
    Ok(true)
}
