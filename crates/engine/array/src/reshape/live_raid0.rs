//! A served RAID 0 gaining members (`nvraid grow --socket CTL -n N+k
//! --add NEW...`), md's way: taken over as a RAID 4 (md level 4,
//! parity-last) of one more member, that member missing, grown as that
//! degraded RAID 4, and back to RAID 0 at the end (`takeover` does the
//! same offline).
//!
//! The grow is a [`LiveGrow`] whose old shape is the RAID 4 of N + 1 and
//! whose new shape is the RAID 4 of N + k + 1. The served array holds the
//! N data members (roles 0..N) and serves its RAID 0 map, which puts every
//! data chunk where the RAID 4 does (one zone, parity last), so bytes past
//! the position go on through the array's own path. The added members
//! take roles N..N+k; role N+k, the new parity, has no member (a stand-in
//! never read or written, always failed), and role N, the old parity, is
//! held in no old row (a step never reads it there): nothing writes
//! parity. The superblocks say what the offline grow's say (level and new
//! level 4, layout 5, `raid_disks` N + k + 1, the first added member
//! recovering behind the position); the finished shape is taken back to
//! RAID 0 of N + k in the same superblock write that records it.
//!
//! A RAID 0 has no redundancy, so a member failing (an old one or an added
//! one) stops the grow at the position its superblocks record, the member
//! not recorded faulty (`holds_every_byte` is false with any member gone):
//! client requests touching it fail, the others go on in both shapes, and
//! `nvraid grow --continue` finishes it once the member answers again.
//!
//! A served RAID 0's chunk change (`nvraid grow --socket CTL --chunk
//! SIZE`, [`LiveGrow::start_raid0_shape`]) is the same with no member
//! added, as the offline restripe (`shape`) records it: the RAID 4 of
//! N + 1 in both shapes (`delta_disks` 0, md's `new_chunk`), the parity
//! role N named by no member and a stand-in in both, the data offset
//! moved down (forwards only, as offline); the end takes it back to a
//! RAID 0 of N in the new chunk. A server killed mid-way leaves md's
//! record, which the next `serve` finishes offline before it serves
//! (`resume`), as it finishes a RAID 0 grow.

use super::grow::{free_dev_numbers, new_member_superblock, room_for};
use super::live::{
    check_count, check_settled, move_bblogs, open_added, Begin, LiveGrow, LiveGrowOptions, Parts,
};
use super::live_shape::LiveShapeOptions;
use super::shape::{choose_move, new_geometry, RAID0_FORWARDS_ONLY};
use super::takeover::{
    finish_as_raid0, follow_position, raid4_of_raid0, record_as_raid4, record_recovering,
};
use crate::array::Array;
use crate::error::{Error, Result};
use nvraid_layout::{Direction, Geometry, Level};
use nvraid_member::Member;
use nvraid_metadata::{Role, Superblock};
use std::sync::Arc;

/// What a RAID 0's served grow keeps beside the [`LiveGrow`]: the RAID 0's
/// md layout word (restored at the end), the member rows its RAID 4
/// records as `size`, and the stand-in for the new parity role.
#[derive(Debug)]
pub(crate) struct Raid0Grow {
    layout: u32,
    member_rows: u64,
    pub(super) stand_in: Member,
}

impl LiveGrow {
    /// Start growing the served RAID 0 `array` as md's RAID 4 (see the
    /// module's text). Refused, with nothing written: an array not served
    /// writable, a second reshape, a RAID 0 of several zones (md takes
    /// only one zone over), a member count other than the old one plus
    /// one per `--add`, new members too small or carrying a signature, no
    /// room to move the data offset down.
    pub(super) fn start_raid0(
        array: &Arc<Array>,
        options: &LiveGrowOptions,
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
        if !array.is_writable() {
            return Err(Error::ReadOnly);
        }
        let raid0 = array.geometry().clone();
        assert_eq!(raid0.level(), Level::Raid0, "invariant: a served RAID 0");
        check_settled(array)?;
        let n = raid0.members();
        check_count(options, n)?;
        let reference = array.superblock().clone();
        let sbs: Vec<Superblock> = (0..array.roles())
            .map(|r| array.slot(r).expect("a RAID 0 is whole").superblock.clone())
            .collect();
        let held: Vec<(&str, &Superblock)> = (0..array.roles())
            .map(|r| array.slot(r).expect("a RAID 0 is whole").member.spec())
            .zip(sbs.iter())
            .collect();
        let old = raid4_of_raid0(&held, &raid0)?;
        let member_rows = old.member_used_bytes();
        let (moved_sectors, log_moves) = room_for(&sbs, &reference, &old, None)?;
        let data_offset = reference.data_offset_sectors * 512;
        if sbs
            .iter()
            .any(|sb| sb.data_offset_sectors * 512 != data_offset)
        {
            return Err(refuse(
                "members with different data offsets (nvraid grows a served array whose members start their data at one offset)".into(),
            ));
        }
        let adding = open_added(array, options, &reference, &old)?;
        let new = Geometry::new(
            old.level(),
            options.raid_devices + 1,
            old.chunk_bytes().expect("RAID 4 has chunks"),
            member_rows,
        )?;
        let new_offset = data_offset - moved_sectors * 512;
        let reshape = super::live::uniform_reshape(
            &old,
            &new,
            0,
            Direction::Forwards,
            data_offset,
            new_offset,
        )?;
        let stand_in = super::degraded::stand_in()?;
        // Nothing written before this line.
        let bblog_offsets = move_bblogs(array, &sbs, &log_moves)?;
        let free = free_dev_numbers(&reference, adding.len())?;
        let mut added = Vec::with_capacity(adding.len());
        let mut table_entries = Vec::with_capacity(adding.len());
        for (k, (member, dev)) in adding.into_iter().zip(free).enumerate() {
            let mut sb = new_member_superblock(&member, &reference, dev)?;
            sb.bblog_offset = reference.bblog_offset;
            table_entries.push((dev as usize, Role::Active((n as usize + k) as u16).to_raw()));
            super::live::ready_added(array, &member, &sb)?;
            added.push((member, sb));
        }
        let bblog_offsets = bblog_offsets
            .into_iter()
            .chain(added.iter().map(|(_, sb)| sb.bblog_offset))
            .collect();
        let parts = Parts {
            reshape,
            old_members: n,
            added,
            moved_sectors,
            bblog_offsets,
            table_entries,
        };
        let pace = (
            options.step_bytes,
            options.min_bytes_per_sec,
            options.max_bytes_per_sec,
        );
        let raid0 = Raid0Grow {
            layout: reference.layout,
            member_rows,
            stand_in,
        };
        LiveGrow::launch_as(array, parts, pace, Begin::Fresh, Some(raid0))
    }

    /// Start restriping the served RAID 0 `array` to a new chunk as md's
    /// RAID 4 of one more member with its parity missing (`nvraid grow
    /// --socket CTL --chunk SIZE`; see the module's text). The offline
    /// restripe's checks (`shape`): md's chunk rules, the array's size
    /// kept, something to change, one zone, room to move the data offset
    /// down by at least the larger chunk. Refused, with nothing written:
    /// those, an array not served writable, a member missing or being
    /// recovered, a second reshape. (A layout is refused before this, by
    /// `shape::new_level`.)
    pub(super) fn start_raid0_shape(
        array: &Arc<Array>,
        options: &LiveShapeOptions,
    ) -> Result<(Arc<LiveGrow>, std::thread::JoinHandle<()>)> {
        let spec0 = array
            .slot(0)
            .map_or("(missing)", |s| s.member.spec())
            .to_string();
        super::live::refuse_second(array, &spec0, "reshape")?;
        if !array.is_writable() {
            return Err(Error::ReadOnly);
        }
        let raid0 = array.geometry().clone();
        assert_eq!(raid0.level(), Level::Raid0, "invariant: a served RAID 0");
        if array.is_degraded() || (0..array.roles()).any(|r| !array.is_usable(r)) {
            return Err(Error::NotStartable(
                "a member of the RAID 0 is missing; a RAID 0 has no redundancy to restripe around it: bring the member back first".into(),
            ));
        }
        check_settled(array)?;
        let n = raid0.members();
        let reference = array.superblock().clone();
        let sbs: Vec<Superblock> = (0..array.roles())
            .map(|r| array.slot(r).expect("a RAID 0 is whole").superblock.clone())
            .collect();
        let held: Vec<(&str, &Superblock)> = (0..array.roles())
            .map(|r| array.slot(r).expect("a RAID 0 is whole").member.spec())
            .zip(sbs.iter())
            .collect();
        let old = raid4_of_raid0(&held, &raid0)?;
        let member_rows = old.member_used_bytes();
        let (new, _) = new_geometry(
            &old,
            old.level(),
            options.chunk_bytes,
            options.layout.is_some(),
            member_rows,
            &spec0,
        )?;
        let data_offset = reference.data_offset_sectors * 512;
        if sbs
            .iter()
            .any(|sb| sb.data_offset_sectors * 512 != data_offset)
        {
            return Err(Error::Unsupported {
                spec: spec0.clone(),
                what: "members with different data offsets (nvraid restripes a served array whose members start their data at one offset); stop serve and use `nvraid grow --chunk SIZE MEMBERS`".into(),
            });
        }
        let members: Vec<(&Member, &Superblock)> = (0..array.roles())
            .map(|r| &*array.slot(r).expect("a RAID 0 is whole").member)
            .zip(sbs.iter())
            .collect();
        // Forwards only, as offline: nvraid reads around the RAID 4's
        // missing parity member only forwards.
        let (direction, moved_sectors) =
            choose_move(&members, &old, &new, None, Some(RAID0_FORWARDS_ONLY))?;
        debug_assert_eq!(direction, Direction::Forwards);
        drop(members);
        // The bad-block logs the move would overwrite, and where they go.
        let (_, log_moves) = room_for(&sbs, &reference, &old, None)?;
        let new_offset = data_offset - moved_sectors * 512;
        let reshape = super::live::uniform_reshape(
            &old,
            &new,
            0,
            Direction::Forwards,
            data_offset,
            new_offset,
        )?;
        let stand_in = super::degraded::stand_in()?;
        // Nothing written before this line.
        let bblog_offsets = move_bblogs(array, &sbs, &log_moves)?;
        let parts = Parts {
            reshape,
            old_members: n,
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
        let raid0 = Raid0Grow {
            layout: reference.layout,
            member_rows,
            stand_in,
        };
        LiveGrow::launch_as(array, parts, pace, Begin::Fresh, Some(raid0))
    }

    /// A RAID 0's grow: the new shape's parity role, which no member holds.
    pub(super) fn raid0_parity_role(&self) -> Option<usize> {
        self.raid0
            .as_ref()
            .map(|_| self.reshape.new_shape().members() as usize - 1)
    }

    /// A RAID 0's grow: a superblock recorded as md's RAID 4 (before the
    /// record's own fields are put in).
    pub(super) fn raid0_as_raid4(&self, sb: &mut Superblock) {
        if let Some(r) = &self.raid0 {
            record_as_raid4(sb, r.member_rows);
        }
    }

    /// A RAID 0's grow, after the record was put into the superblock of
    /// the member in `role` (recorded at `position` bytes, or `finished`):
    /// the first added member (the old parity role) recovering behind the
    /// position, as md records it; the finished shape taken back to RAID 0.
    pub(super) fn raid0_record(
        &self,
        role: usize,
        sb: &mut Superblock,
        position: u64,
        finished: bool,
    ) {
        let Some(r) = &self.raid0 else {
            return;
        };
        if finished {
            finish_as_raid0(sb, r.layout);
            return;
        }
        if role == self.old_members as usize {
            record_recovering(sb);
            let data_members = self.reshape.new_shape().members() - 1;
            follow_position(sb, position, data_members);
        }
    }

    /// A RAID 0's grow stopped by `error` at `position` (a member it
    /// cannot go on without): the error saying so, and what finishes it.
    pub(super) fn raid0_stopped(&self, error: Error, position: u64) -> Error {
        if self.raid0.is_none() {
            return error;
        }
        if self.reshape.old().members() == self.reshape.new_shape().members() {
            return Error::NotStartable(format!(
                "{error}; a RAID 0 has no redundancy to restripe on without that member: the restripe stopped at {position} bytes, the position its superblocks record, the member not recorded faulty; once it answers again, stop serve and run `nvraid grow --continue` with every member (or `nvraid serve`, which finishes it first)"
            ));
        }
        Error::NotStartable(format!(
            "{error}; a RAID 0 has no redundancy to grow on without that member: the grow stopped at {position} bytes, the position its superblocks record, the member not recorded faulty; once it answers again, stop serve and run `nvraid grow --continue` with every member (the added ones too)"
        ))
    }
}
