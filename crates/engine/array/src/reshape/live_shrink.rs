//! A served RAID 4/5/6 or RAID 10 near shrunk by members (`nvraid grow
//! --socket CTL -n N --array-size SIZE`): [`LiveGrow::start_shrink`], the
//! offline shrink's checks and record (`shrink`) made on the running
//! array, its steps run backwards by `live_backwards` while clients read
//! and write.
//!
//! - **Checks**, before any write, with the offline shrink's words: a
//!   level md shrinks (not RAID 0, RAID 1, RAID 10 far/offset), fewer
//!   members but no fewer than the level runs with, `--array-size` given
//!   and no larger than the smaller shape holds, no filesystem at the
//!   array's start larger than it (unless `force`), room after the data
//!   to move the data offset up by at least a chunk, every step down
//!   crash-safe; and the served grow's: served writable, whole, no
//!   rebuild, check or resync running, no partial parity log or write
//!   journal, no other reshape running.
//! - **The size first.** The array is capped to the smaller shape's size
//!   (`Members::cap_size`) before the record is written: NBD connections
//!   made from then on are told that size, and a request past it from an
//!   earlier connection fails (`ENOSPC` for a write, `EINVAL` for a read:
//!   the route's bound) while those below it go on. A launch that fails
//!   (a superblock update refused, say) lifts the cap again: the array is
//!   served at its old size, the record forgotten (`LiveGrow::launch`).
//! - **The record** is md's backwards one (`RESHAPE_BACKWARDS`, the new
//!   member count, `reshape_position` at the new size, `new_offset` > 0),
//!   written with the array marked dirty by the served grow's `launch`;
//!   then the steps move the position down to 0, paced as every served
//!   reshape is (`serve --reshape-speed`), and the end releases the
//!   leaving members as spares and swaps the smaller shape in.

use super::live::{check_growable, refuse_second, Begin, LiveGrow, Parts};
use super::shrink::{check_filesystem, check_steps, refuse_level, room_after, smaller_shape};
use crate::array::Array;
use crate::error::{Error, Result};
use nvraid_layout::Direction;
use nvraid_member::Member;
use nvraid_metadata::Superblock;
use std::sync::Arc;

/// How to shrink a served array.
#[derive(Clone, Debug)]
pub struct LiveShrinkOptions {
    /// The member count after the shrink.
    pub raid_devices: u32,
    /// The size the array's data fits in (mdadm's `--array-size`); `None`
    /// is refused, naming the smaller shape's size.
    pub array_size: Option<u64>,
    /// Shrink though a filesystem at the array's start is larger.
    pub force: bool,
    /// The most array bytes one step moves.
    pub step_bytes: u64,
    /// While clients are busy, no faster than this (bytes per second).
    pub min_bytes_per_sec: Option<u64>,
    /// Never faster than this (bytes per second).
    pub max_bytes_per_sec: Option<u64>,
}

impl LiveGrow {
    /// Check that the served `array` can shrink as asked, cap its size,
    /// record the backwards reshape on every member and route client
    /// requests through it; the steps run on a thread of their own, which
    /// is returned. Refused with nothing written: see the module's text.
    pub fn start_shrink(
        array: &Arc<Array>,
        options: &LiveShrinkOptions,
    ) -> Result<(Arc<LiveGrow>, std::thread::JoinHandle<()>)> {
        let spec0 = array
            .slot(0)
            .map_or("(missing)", |s| s.member.spec())
            .to_string();
        refuse_second(array, &spec0, "reshape")?;
        let old = array.geometry().clone();
        // A count that is no shrink is named as such (with the grow's
        // `--add`) before the level's refusal.
        let reference = array.superblock().clone();
        if options.raid_devices < old.members() {
            refuse_level(old.level(), &spec0)?;
        } else {
            smaller_shape(
                old.level(),
                &old,
                options.raid_devices,
                &reference,
                options.array_size,
            )?;
        }
        check_growable(array)?;
        let new = smaller_shape(
            old.level(),
            &old,
            options.raid_devices,
            &reference,
            options.array_size,
        )?;
        let array_size = options.array_size.expect("checked by smaller_shape");
        let data_offset = reference.data_offset_sectors * 512;
        if (0..array.roles()).any(|r| {
            array
                .slot(r)
                .is_some_and(|s| s.data_offset_bytes() != data_offset)
        }) {
            return Err(Error::Unsupported {
                spec: spec0,
                what: "members with different data offsets (nvraid shrinks a served array whose members start their data at one offset); stop serve and use `nvraid grow -n N --array-size SIZE MEMBERS`".into(),
            });
        }
        let sbs: Vec<Superblock> = (0..array.roles())
            .map(|r| array.slot(r).expect("whole").superblock.clone())
            .collect();
        let held: Vec<(&Member, &Superblock)> = (0..array.roles())
            .map(|r| (&*array.slot(r).expect("whole").member, &sbs[r]))
            .collect();
        let chunk = old.chunk_bytes().expect("the levels shrunk have chunks");
        let moved_sectors = room_after(&held, &old, chunk)?;
        let new_offset = data_offset + moved_sectors * 512;
        let new_size = new.array_bytes();
        let reshape = super::live::uniform_reshape(
            &old,
            &new,
            new_size,
            Direction::Backwards,
            data_offset,
            new_offset,
        )?;
        {
            let members: Vec<&Member> = held.iter().map(|(m, _)| *m).collect();
            check_filesystem(&reshape, &members, array_size, options.force)?;
        }
        check_steps(&reshape, options.step_bytes, &spec0)?;
        // The smaller size holds from here on (see the module's text).
        array.cap_size(new_size);
        let parts = Parts {
            reshape,
            old_members: old.members(),
            added: Vec::new(),
            moved_sectors,
            bblog_offsets: sbs.iter().map(|sb| sb.bblog_offset).collect(),
            table_entries: Vec::new(),
        };
        let pace = (
            options.step_bytes,
            options.min_bytes_per_sec,
            options.max_bytes_per_sec,
        );
        // A launch that fails has recorded nothing (or forgotten what it
        // recorded): the array is served at its old size again.
        LiveGrow::launch(array, parts, pace, Begin::Fresh).inspect_err(|_| array.lift_size_cap())
    }
}
