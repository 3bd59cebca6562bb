//! A served RAID 4/5/6 (or RAID 0, RAID 10 near: its chunk) restriped in place
//! (`nvraid grow --socket --chunk SIZE --layout NAME`): [`LiveGrow`] with
//! the member count kept and the chunk and/or layout changed, md's `new_chunk`/`new_layout` recorded
//! with the data offset moved down (`new_offset` < 0), running forwards.
//!
//! - **Checks**, before any write: the offline restripe's (`shape`: the
//!   level md restripes, the layout it accepts for the level, a chunk that
//!   keeps the array's size, something to change) and the served grow's
//!   (`live::check_growable`: served writable, whole, clean, no partial
//!   parity log or write journal); no other reshape running.
//! - **Room.** The offline restripe moves the data offset towards the side
//!   with more room (`shape::choose_move`); served, only down: the steps
//!   and the route run forwards. With less than the larger chunk free
//!   below the data it is refused, naming the offline command (which
//!   also moves up). The offset moves by about half the room below, as
//!   the offline restripe moves it; a bad-block log in the way is copied
//!   below first, as a served grow copies it.
//! - **Then** it is a served grow without added members (`live`): the
//!   record in every superblock update, the route split at the position,
//!   each step's window closed and drained; the finished record takes
//!   the new chunk and layout as the array's.
//!
//! A RAID 10 near takes the copies' route and steps of its served grow
//! (`live_copy`; its bitmap counts array bytes, the same in both shapes).
//! A RAID 0's chunk changes as the offline restripe changes it, as md's
//! RAID 4 of one more member with its parity missing
//! (`LiveGrow::start_raid0_shape` in `live_raid0`): the same served grow
//! with no member added, writing no parity, taken back to RAID 0 in the
//! new chunk in the superblock write that ends it; a layout is refused
//! (md's RAID 0 has none), and so is a move of the data offset up (the
//! offline restripe of a RAID 0 runs forwards only too).

use super::grow::room_for;
use super::live::{check_growable, move_bblogs, Begin, LiveGrow, Parts};
use super::shape::{choose_move, new_geometry, new_level};
use crate::array::Array;
use crate::error::{Error, Result};
use nvraid_layout::{Direction, Level};
use nvraid_member::Member;
use nvraid_metadata::Superblock;
use std::sync::Arc;

/// How to restripe a served array.
#[derive(Clone, Debug)]
pub struct LiveShapeOptions {
    /// The new chunk size in bytes (`None`: keep it).
    pub chunk_bytes: Option<u64>,
    /// The new layout, in md's names (`None`: keep it).
    pub layout: Option<String>,
    /// The most array bytes one step moves.
    pub step_bytes: u64,
    /// While clients are busy, no faster than this (bytes per second).
    pub min_bytes_per_sec: Option<u64>,
    /// Never faster than this (bytes per second).
    pub max_bytes_per_sec: Option<u64>,
}

/// Why a served restripe needs room below the data (see
/// `shape::choose_move`).
const SERVED_FORWARDS_ONLY: &str = "a served restripe moves the data offset down by at least that (it runs forwards only), and cannot here; stop serve and restripe offline with `nvraid grow --chunk SIZE --layout NAME MEMBERS`, which also moves the data offset up where there is room after the data";

impl LiveGrow {
    /// Check that the served `array` can be restriped as asked, record the
    /// reshape on every member and route client requests through it; the
    /// steps run on a thread of their own, which is returned. Refused with
    /// nothing written: see the module's text.
    pub fn start_shape(
        array: &Arc<Array>,
        options: &LiveShapeOptions,
    ) -> Result<(Arc<LiveGrow>, std::thread::JoinHandle<()>)> {
        let spec0 = array
            .slot(0)
            .map_or("(missing)", |s| s.member.spec())
            .to_string();
        let refuse = |what: String| Error::Unsupported {
            spec: spec0.clone(),
            what,
        };
        super::live::refuse_second(array, &spec0, "reshape")?;
        let reference = array.superblock().clone();
        let old = array.geometry().clone();
        // md's rules for the level and the layout (the offline restripe's).
        let level = new_level(
            old.level(),
            reference.level,
            options.layout.as_deref(),
            &spec0,
        )?;
        // (A RAID 10 far/offset is refused by `new_level`, a RAID 0's
        // layout too.) A RAID 0's chunk changes as md's RAID 4 with its
        // parity missing (`live_raid0`).
        if old.level() == Level::Raid0 {
            return LiveGrow::start_raid0_shape(array, options);
        }
        if !matches!(
            old.level(),
            Level::Raid5 { .. } | Level::Raid6 { .. } | Level::Raid10 { .. }
        ) {
            return Err(refuse(format!(
                "changing the chunk or layout of a served {} (nvraid restripes a served RAID 0/4/5/6 or RAID 10 near); stop serve and restripe it offline with `nvraid grow --chunk SIZE MEMBERS`",
                old.level()
            )));
        }
        check_growable(array)?;
        let (new, _) = new_geometry(
            &old,
            level,
            options.chunk_bytes,
            options.layout.is_some(),
            crate::assemble::member_data_bytes(&reference),
            &spec0,
        )?;
        let data_offset = reference.data_offset_sectors * 512;
        if (0..array.roles()).any(|r| {
            array
                .slot(r)
                .is_some_and(|s| s.data_offset_bytes() != data_offset)
        }) {
            return Err(refuse(
                "members with different data offsets (nvraid restripes a served array whose members start their data at one offset); stop serve and use `nvraid grow --chunk SIZE --layout NAME MEMBERS`".into(),
            ));
        }
        let sbs: Vec<Superblock> = (0..array.roles())
            .map(|r| array.slot(r).expect("whole").superblock.clone())
            .collect();
        let bitmap_bytes = super::live_copy::bitmap_bytes(array, &old, old.members())?;
        let held: Vec<(&Member, &Superblock)> = (0..array.roles())
            .map(|r| {
                let slot = array.slot(r).expect("whole");
                (&*slot.member, &sbs[r])
            })
            .collect();
        let (direction, moved_sectors) =
            choose_move(&held, &old, &new, bitmap_bytes, Some(SERVED_FORWARDS_ONLY))?;
        debug_assert_eq!(direction, Direction::Forwards);
        // The bad-block logs the move would overwrite, and where they go.
        let (_, log_moves) = room_for(&sbs, &reference, &old, bitmap_bytes)?;
        let new_offset = data_offset - moved_sectors * 512;
        let reshape = super::live::uniform_reshape(
            &old,
            &new,
            0,
            Direction::Forwards,
            data_offset,
            new_offset,
        )?;
        let bblog_offsets = move_bblogs(array, &sbs, &log_moves)?;
        let parts = Parts {
            reshape,
            old_members: old.members(),
            added: Vec::new(),
            moved_sectors,
            bblog_offsets,
            table_entries: Vec::new(),
        };
        let pace = (
            options.step_bytes,
            options.min_bytes_per_sec,
            options.max_bytes_per_sec,
        );
        LiveGrow::launch(array, parts, pace, Begin::Fresh)
    }
}
