//! A served reshape running backwards (`serve` going on with a recorded
//! shrink of a RAID 4/5/6, or a restripe that moved the data offset up):
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
//!   stripes under `[P', P)` whole) and waits for every request that
//!   started before it, reads `[P', P)` from the old shape, writes the new
//!   shape's stripes at the new offset (above every old row still live),
//!   flushes, records `P'` in every superblock, and only then moves `P`.
//! - **The end.** Position 0 is recorded as the finished shape; then the
//!   members a shrink leaves out leave the running array (as a RAID 6's Q
//!   member leaves a served takeover: `Members::leave_role`) and the next
//!   update records them as spares in every role table, md's mark for the
//!   members a shrink released (their own superblocks are written once
//!   more, with the same events, saying so). From then on every byte is
//!   read and written in the new shape.
//!
//! A member failing during a backwards step stops the reshape at the
//! position last recorded (the record stays; clients go on through both
//! shapes, and `nvraid grow --continue` finishes it after `serve` stops).

use super::live::{write_added_superblock, GrowPace, LiveGrow};
use super::step::{read_through, write_stripes};
use crate::array::Array;
use crate::error::{Error, Result};
use crate::members::ReshapeRecord;
use nvraid_io::AlignedBuf;
use nvraid_layout::{Direction, Reshape};
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

impl LiveGrow {
    /// A shrink's leaving devices recorded as spares, once they left.
    pub(super) fn leaving_table(&self, table: &mut [u16]) {
        if !self.left.load(Ordering::Acquire) {
            return;
        }
        for &dev in &self.leaving_devs {
            if let Some(entry) = table.get_mut(dev) {
                *entry = Role::Spare.to_raw();
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
            let old = reshape.old();
            let old_unit = old.chunk_bytes().expect("parity levels have chunks")
                * u64::from(old.members() - old.level().parity_chunks());
            self.gate.close_window(to / old_unit * old_unit, p);
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

    /// Move `[to, position)` of `reshape` to the new shape (the window
    /// closed): read from the old shape, the new stripes written at the
    /// new offset, every member flushed.
    fn move_down(
        &self,
        array: &Array,
        reshape: &Reshape,
        to: u64,
        kernel: nvraid_parity::Kernel,
    ) -> Result<()> {
        let p = reshape.position();
        if let Some(role) = (0..self.old_members as usize).find(|&r| !array.is_usable(r)) {
            return Err(Error::NotStartable(format!(
                "the member in role {role} failed: the reshape stopped at {p} bytes, the position \
                 its superblocks record; `nvraid grow --continue` finishes it after `serve` stops"
            )));
        }
        let members = self.members_of(array);
        let new = reshape.new_shape();
        let new_unit = new.chunk_bytes().expect("parity levels have chunks")
            * u64::from(new.members() - new.level().parity_chunks());
        let mut data = AlignedBuf::zeroed((p - to) as usize);
        read_through(reshape, &members, &mut data, to)?;
        write_stripes(
            reshape,
            &members,
            to / new_unit,
            &data,
            &[],
            kernel,
            &|| crate::failpoint::hit("reshape-write"),
        )
        .map_err(|failure| failure.error)
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
        for role in new..self.old_members {
            array.leave_role(
                role as usize,
                format!("left the array: the shrink to {new} members finished (recorded a spare)"),
            );
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
