//! A served reshape running backwards (a shrink of a RAID 4/5/6 or RAID 10
//! near, started on the served array by `live_shrink` or recorded and
//! gone on with by `serve`, or a RAID 4/5/6 restripe that moved the data
//! offset up):
//! [`LiveGrow`]'s route and steps with the two shapes the other way round.
//!
//! - **The shapes.** md's position `P` falls from the new shape's end to
//!   0: array bytes `[P, end)` are in the new shape (at the new, higher
//!   data offset), `[0, P)` still in the old. The route sends the first to
//!   the new-shape reads and writes (`new_read`/`new_write`, the same as
//!   a grow's below its position) and the second through the array's own
//!   old-shape path. The array serves the new, smaller size from the
//!   start (`Members::cap_size`): while it reshapes md gives it that size
//!   too.
//! - **A step** moves `[P', P)` down as the offline `shape::run_backwards`
//!   does: as large as `Reshape::step_is_safe` allows and md would go on
//!   from (`shrink::backwards_step`). It closes the window (the old
//!   stripes under `[P', P)` whole; a RAID 10's new rows it writes
//!   whole) and waits for every request that
//!   started before it, reads `[P', P)` from the old shape, writes the new
//!   shape's stripes at the new offset (above every old row still live),
//!   flushes, records `P'` in every superblock, and only then moves `P`.
//! - **The end.** Position 0 is recorded as the finished shape; then the
//!   members a shrink leaves out leave the running array (as a RAID 6's Q
//!   member leaves a served takeover: `Members::leave_role`) and the next
//!   update records them as spares in every role table, md's mark for the
//!   members a shrink released (their own superblocks are written once
//!   more, with the same events, saying so); a leaving member that failed
//!   during the shrink stays faulty in every role table, as md records
//!   it. From then on every byte is read and written in the new shape.
//!
//! A member failing (in a step, or under a client's request) is recorded
//! faulty and read around, as a served grow goes on degraded
//! (`live_degraded`): a step reads `[P', P)` through the array's own
//! old-shape path (which rebuilds a failed member's chunks from parity)
//! or a RAID 10's rows from a copy not failed, and writes the new stripes
//! to every member not failed; a member whose write fails is recorded
//! faulty and the step done again. More failures than the level covers
//! stop the reshape at the position last recorded (the record stays, and
//! `nvraid grow --continue` finishes it after `serve` stops). A leaving
//! member that failed gets no superblock at the end.

use super::live::{write_added_superblock, GrowPace, LiveGrow};
use super::step::{read_around, write_copy_rows, write_stripes, Unreadable};
use crate::array::Array;
use crate::error::{Error, Result};
use crate::members::ReshapeRecord;
use nvraid_io::AlignedBuf;
use nvraid_layout::{Direction, Geometry, Reshape};
use nvraid_metadata::Role;
use std::sync::atomic::Ordering;
use std::sync::Weak;

/// The devices (role-table indices) of the roles a backwards `reshape`
/// leaves out (none for any other reshape), from the served array's
/// slots.
pub(super) fn leaving_devs(array: &Array, reshape: &Reshape) -> Vec<usize> {
    if reshape.direction() != Direction::Backwards {
        return Vec::new();
    }
    (reshape.new_shape().members()..reshape.old().members())
        .filter_map(|role| array.slot(role as usize))
        .map(|slot| slot.superblock.dev_number as usize)
        .collect()
}

/// The new shape's RAID 10 near rows `[first, end)` that hold the array
/// chunks from `to` up to `p` (whole rows, as the offline backwards steps
/// write them).
fn copy_rows(new: &Geometry, to: u64, p: u64) -> (u64, u64) {
    let chunk = new.chunk_bytes().expect("RAID 10 has chunks");
    let (n, near) = (u64::from(new.members()), u64::from(new.copies()));
    (
        (to / chunk) * near / n,
        (p.div_ceil(chunk) * near).div_ceil(n),
    )
}

impl LiveGrow {
    /// The members a finished shrink released that had failed during it
    /// (recorded faulty, not spares).
    pub fn left_faulty(&self) -> Vec<String> {
        self.failed_leaving
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(_, spec)| spec.clone())
            .collect()
    }

    /// A shrink's leaving devices recorded as spares, once they left;
    /// those that failed before stay faulty.
    pub(super) fn leaving_table(&self, table: &mut [u16]) {
        if !self.left.load(Ordering::Acquire) {
            return;
        }
        let failed = self
            .failed_leaving
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for &dev in &self.leaving_devs {
            if let Some(entry) = table.get_mut(dev) {
                *entry = if failed.iter().any(|&(d, _)| d == dev) {
                    Role::Faulty.to_raw()
                } else {
                    Role::Spare.to_raw()
                };
            }
        }
    }

    /// The steps of a reshape running backwards (see the module's text),
    /// then its end. `Ok(false)`: stopped with the server.
    pub(super) fn steps_backwards(&self, array: &Weak<Array>) -> Result<bool> {
        let unit = self.reshape.position_unit();
        let step_bytes = self.step_bytes.max(unit);
        let kernel = nvraid_parity::Kernel::best();
        let mut pace = GrowPace::open(&self.pacing);
        loop {
            let p = self.gate.position();
            if p == 0 {
                break;
            }
            if !pace.may_step(&self.pacing) {
                return Ok(false);
            }
            let Some(array) = array.upgrade() else {
                return Ok(false);
            };
            let reshape = self
                .reshape
                .at(p)
                .map_err(|e| Error::NotStartable(e.to_string()))?;
            let Some(to) = super::shrink::backwards_step(&reshape, step_bytes) else {
                return Err(Error::NotStartable(format!(
                    "no step down from {p} is safe (the data offset moved too little); \
                     `nvraid grow --continue` finishes it after `serve` stops"
                )));
            };
            let (window_start, window_end) = self.window_down(p, to);
            self.gate.close_window(window_start, window_end);
            if let Err(e) = self.move_down(&array, &reshape, to, kernel) {
                self.gate.open_window(None);
                return Err(e);
            }
            *self.record.lock().unwrap_or_else(|p| p.into_inner()) = (to / 512, to == 0);
            if let Err(e) = array.rewrite_superblocks() {
                self.gate.open_window(None);
                return Err(e);
            }
            crate::failpoint::hit("reshape-superblock");
            if to == 0 {
                // Every byte is in the new shape: the leaving roles leave.
                let leaving = self.release_leaving(&array);
                self.gate.open_window(Some(0));
                leaving?;
                break;
            }
            self.gate.open_window(Some(to));
            pace.moved(&self.pacing, p - to);
        }
        Ok(true)
    }

    /// The array bytes a backwards step from `p` down to `to` must have
    /// no client request in: a parity level's old stripes under `[to, p)`
    /// whole (a degraded read rebuilds a chunk from its whole stripe); a
    /// RAID 10's new rows it writes whole (they hold chunks just above
    /// `p`, in the new shape already, and just below `to`).
    fn window_down(&self, p: u64, to: u64) -> (u64, u64) {
        let old = self.reshape.old();
        let new = self.reshape.new_shape();
        if new.level().parity_chunks() == 0 {
            let (first, end) = copy_rows(new, to, p);
            let chunk = new.chunk_bytes().expect("RAID 10 has chunks");
            // The array chunks those rows hold.
            let (n, near) = (u64::from(new.members()), u64::from(new.copies()));
            let (first_chunk, end_chunk) = (first * n / near, (end * n).div_ceil(near));
            let rows_end = (end_chunk * chunk).min(new.array_bytes());
            return ((first_chunk * chunk).min(to), rows_end.max(p));
        }
        let old_unit = old.chunk_bytes().expect("parity levels have chunks")
            * u64::from(old.members() - old.level().parity_chunks());
        (to / old_unit * old_unit, p)
    }

    /// Move `[to, position)` of `reshape` to the new shape (the window
    /// closed): read from the old shape around the members failed (the
    /// array's own degraded read; a RAID 10's rows from a copy not
    /// failed), the new stripes written at the new offset to every member
    /// not failed, every member flushed. A member whose I/O fails here is
    /// recorded faulty and the step done again without it, while the
    /// level's redundancy covers the members failed.
    fn move_down(
        &self,
        array: &Array,
        reshape: &Reshape,
        to: u64,
        kernel: nvraid_parity::Kernel,
    ) -> Result<()> {
        let p = reshape.position();
        let new = reshape.new_shape();
        loop {
            let failed = self.failed_roles(array);
            if !self.holds_every_byte(&failed) {
                return Err(Error::NotStartable(format!(
                    "more members failed than the array's redundancy covers: the reshape stopped at {p} bytes, the position its superblocks record"
                )));
            }
            let members = self.members_of(array);
            let hit = || crate::failpoint::hit("reshape-write");
            let moved = if new.level().parity_chunks() == 0 {
                let chunk = new.chunk_bytes().expect("RAID 10 has chunks");
                let (first, end) = copy_rows(new, to, p);
                let (n, near) = (u64::from(new.members()), u64::from(new.copies()));
                let (first_chunk, end_chunk) = (first * n / near, (end * n).div_ceil(near));
                let start = first_chunk * chunk;
                let mut data = AlignedBuf::zeroed(((end_chunk - first_chunk) * chunk) as usize);
                let readable = new
                    .array_bytes()
                    .min(end_chunk * chunk)
                    .saturating_sub(start);
                let unreadable = Unreadable {
                    old: &failed,
                    new: &failed,
                };
                read_around(
                    reshape,
                    &members,
                    unreadable,
                    &mut data[..readable as usize],
                    start,
                )
                .and_then(|()| write_copy_rows(reshape, &members, first..end, &data, &failed, &hit))
            } else {
                let new_unit = new.chunk_bytes().expect("parity levels have chunks")
                    * u64::from(new.members() - new.level().parity_chunks());
                // `[to, p)` is all in the old shape, which the array's own
                // path reads (around its failed members; one failing
                // here is recorded faulty by it).
                let mut data = AlignedBuf::zeroed((p - to) as usize);
                array.read_at(&mut data, to)?;
                write_stripes(
                    reshape,
                    &members,
                    to / new_unit,
                    &data,
                    &failed,
                    kernel,
                    &hit,
                )
            };
            let Err(failure) = moved else {
                return Ok(());
            };
            let role = failure.role as usize;
            if failed.get(role).copied().unwrap_or(false) {
                return Err(failure.error);
            }
            let error = match failure.error {
                Error::Io { source, .. } => source,
                other => std::io::Error::other(other.to_string()),
            };
            self.member_failed(array, role, error)?;
        }
    }

    /// The finished shrink's leaving roles leave the running array, the
    /// next superblock update records them as spares, and their own
    /// superblocks are written with it (the finished record, spares in
    /// their role table): the array writes them no more.
    fn release_leaving(&self, array: &Array) -> Result<()> {
        let new = self.reshape.new_shape().members();
        if self.old_members <= new {
            return Ok(());
        }
        // Those that failed during the shrink get no superblock either.
        let usable: Vec<bool> = (new..self.old_members)
            .map(|role| array.is_usable(role as usize))
            .collect();
        // They stay faulty in the role table (md's record of a member that
        // failed), not spares.
        *self
            .failed_leaving
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = (new..self.old_members)
            .filter(|&role| !usable[(role - new) as usize])
            .filter_map(|role| array.slot(role as usize))
            .map(|slot| {
                (
                    slot.superblock.dev_number as usize,
                    slot.member.spec().to_string(),
                )
            })
            .collect();
        for role in new..self.old_members {
            let why = if usable[(role - new) as usize] {
                format!("left the array: the shrink to {new} members finished (recorded a spare)")
            } else {
                format!("failed during the shrink to {new} members (recorded faulty)")
            };
            array.leave_role(role as usize, why);
        }
        self.left.store(true, Ordering::Release);
        array.rewrite_superblocks()?;
        // Their own superblocks say so too, with the others' events (as
        // the offline shrink writes them): the array writes them no more.
        let events = array.events();
        let mut table = array.role_table_now();
        self.leaving_table(&mut table);
        for role in new..self.old_members {
            let Some(slot) = array.slot(role as usize) else {
                continue;
            };
            if !usable[(role - new) as usize] {
                // It failed during the shrink: md writes it no more.
                continue;
            }
            let mut sb = slot.superblock.clone();
            ReshapeRecord::apply(self, role as usize, &mut sb);
            sb.roles_raw = table.clone();
            sb.utime = nvraid_metadata::Timestamp::now();
            write_added_superblock(&slot.member, &mut sb, events, None)
                .map_err(|e| Error::io(slot.member.spec(), e))?;
        }
        Ok(())
    }
}
