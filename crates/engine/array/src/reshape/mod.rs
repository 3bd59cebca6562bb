//! Arrays part-way through a reshape, in md's format.
//!
//! - `record`: md's record of a reshape in the superblocks (the old and
//!   the new shape, the position, the direction, each member's old and new
//!   data offset) read into nvraid-layout's [`Reshape`], and refused with
//!   the field named when nvraid cannot honour it;
//! - `step`: the member I/O: reading through a reshape's map, and one step
//!   of a grow (old rows read, whole new stripes with their parity written
//!   at the new data offset, every member flushed), each of the three a
//!   batch with every member in flight together (`nvraid_member::batch`);
//! - `read`: [`MidReshape`], such an array opened read-only: every byte
//!   read from the shape the position puts it in, and what `detail` shows;
//! - `grow`: [`grow`] and [`continue_grow`], nvraid's own reshape of a
//!   RAID 4/5/6 or RAID 10 near gaining members: the checks, md's record written, the
//!   steps with a checkpoint after each, the finished shape recorded;
//! - `backup`: a RAID 4/5/6 grown in place (no room to move the data
//!   offset): the rows each step of the critical section overwrites kept
//!   on the new members first, put back by `grow --continue`;
//! - `backup_file`: mdadm's `--backup-file`, the critical section kept in
//!   a file in mdadm's format (written by `grow`, restored by
//!   `grow --continue`);
//! - `md_backup`: beside it, mdadm's own backup of the whole critical
//!   section at the tail of the new members' data, which `mdadm
//!   --assemble` restores;
//! - `level`: `grow --level`, md's level changes that move no byte
//!   (RAID 1 of two <-> RAID 5 of two, RAID 4 <-> RAID 5 parity-last,
//!   RAID 6 -> 5 dropping a last-member Q; a RAID 0 <-> 10 takeover a
//!   crash cut short on a served array finished);
//! - `shape`: `grow --chunk`/`--layout`, a RAID 4/5/6 or RAID 10 near
//!   restriped with its members kept, the data offset moved down or up
//!   (the steps backwards are its own);
//! - `shrink`: `grow -n` with fewer members, a RAID 4/5/6 shrunk by a
//!   backwards reshape (the data offset moved up, the members that leave
//!   made spares), and the shrink to two before a RAID 5 -> 1 takeover;
//! - `size`: `grow --size`, how much of each member the array uses
//!   (`max` after the members grew, the new region resynced; smaller with
//!   `--force`); nothing moves;
//! - `live`: [`LiveGrow`], the grow of a RAID 4/5/6 or RAID 10 near while it is served:
//!   the record kept in every superblock update of the running array,
//!   client requests split between the two shapes at the position, each
//!   step's window closed to them and earlier requests drained;
//! - `live_shape`: [`LiveGrow::start_shape`], a served RAID 4/5/6 or
//!   RAID 10 near restriped (chunk, layout) as a served grow keeping its members, the
//!   data offset moved down (a served RAID 0's chunk through `live_raid0`);
//! - `live_shrink`: [`LiveGrow::start_shrink`], a served RAID 4/5/6 or
//!   RAID 10 near shrunk by members: the offline shrink's checks, the
//!   served size capped first (lifted again, the record forgotten, when
//!   the launch fails), md's backwards record, the steps
//!   `live_backwards`'s (a leaving member that failed recorded faulty,
//!   not a spare);
//! - `live_size`: [`LiveSize`], `grow --socket CTL --size` on a served
//!   RAID 1/4/5/6/10: the superblocks and the bitmap changed as `size`
//!   changes them (requests held meanwhile), the served shape swapped to
//!   the new size, then the new region resynced beside the clients from
//!   md's `resync_offset` at the old end, its progress reported as the
//!   server's resync (a smaller size with `force` only, cut at once);
//! - `live_degraded`: a served grow going on degraded (an old member or
//!   one the grow added failing recorded faulty, read around, parity
//!   written covering it);
//! - `live_copy`: [`LiveMirror`], a served RAID 1 gaining mirrors (the
//!   count raised, the new members recorded recovering, client writes
//!   reaching them below the copy's position), and [`start_live`], which
//!   picks the served grow a level takes;
//! - `live_level`: [`LiveLevel`], md's takeovers that move no byte made on
//!   a served array (requests drained, every kept member's superblock
//!   written as `level` writes it, a RAID 6's Q member leaving, then the
//!   new level recorded in every update), RAID 0 <-> RAID 10 near=2 among
//!   them with the roles renumbered (RAID 0 role k is RAID 10 role 2k; a
//!   RAID 10's second copies leave; each member's I/O counters follow
//!   it to its new role), the served RAID 10's missing copies
//!   added by the server's online recovery; and [`check_raid5_grown`],
//!   every check of a served RAID 1 of two taken over and grown to a
//!   RAID 5 of N (the takeover, then [`start_live`]) made before either
//!   writes (the server chains a RAID 5's shrink to two and the takeover
//!   to RAID 1 itself: `cmd/grow_online.rs`);
//! - `live_raid0`: a served RAID 0 grown (members added) or restriped (its
//!   chunk changed) as md's RAID 4 with its parity missing (a [`LiveGrow`]
//!   writing no parity) and taken back to RAID 0 in the superblock write
//!   that records the end;
//! - `live_raid6`: [`LiveQ`], a served RAID 5 taken over as md's RAID 6
//!   in a `-6` layout with Q on an added member, Q rebuilt there while
//!   clients read and write (their writes below the position writing Q);
//! - `live_backwards`: [`LiveGrow`]'s route and steps running backwards
//!   (a shrink, a restripe moving the data offset up), around failed
//!   members, the leaving members released at the end;
//! - `resume`: `serve` of an array recorded mid-grow: the old shape
//!   assembled and a `LiveGrow` made from the record going on (clean), or
//!   the grow finished offline before the array is served (dirty);
//! - `degraded`: a member failing during a grow, recorded faulty on the
//!   others and read around; roles missing at `--continue`;
//! - `takeover`: a RAID 0 grown (or restriped, `shape`) as md's RAID 4
//!   with its parity missing and taken back; RAID 5 -> 6 with Q on an
//!   added member;
//! - `bitmap`: a write-intent bitmap resized as md resizes it (a RAID 10
//!   gaining members, `grow --size`): the chunk doubled until the bits fit
//!   the room md allows, the set bits carried over;
//! - `mirror`: `grow` of a RAID 1 (another mirror): the member count
//!   raised in every superblock, the new member added and rebuilt.
//!
//! `record` and `step` are the floor; `read` and `grow` stand on them and
//! not on each other.
//!
//! [`Reshape`]: nvraid_layout::Reshape

mod backup;
mod backup_file;
mod bitmap;
mod degraded;
mod grow;
mod level;
mod live;
mod live_backwards;
mod live_copy;
mod live_degraded;
mod live_level;
mod live_raid0;
mod live_raid6;
mod live_shape;
mod live_shrink;
mod live_size;
mod md_backup;
mod mirror;
mod policy;
mod read;
mod record;
mod resume;
mod shape;
mod shrink;
mod size;
mod step;
mod takeover;

pub use grow::{
    continue_grow, continue_grow_with_backup_file, grow, grow_with_backup_file, GrowOptions,
    GrowProgress, Grown,
};
pub use level::{change_level, raid1_to_raid5_grown, LevelChanged};
pub use live::{LiveGrow, LiveGrowOptions, LiveGrowStatus};
pub use live_copy::{start_live, LiveMirror, LiveReshape};
pub use live_level::{check_raid5_grown, LevelSwitched, LiveLevel};
pub use live_raid6::LiveQ;
pub use live_shape::LiveShapeOptions;
pub use live_shrink::LiveShrinkOptions;
pub use live_size::{LiveSize, LiveSizeOptions, SizeChanged};
pub use policy::{change_policy, Policy, PolicyChanged};
pub use read::{MidReshape, ReshapeDetail, ReshapeMember, ShapeDetail};
pub use record::{is_reshaping, reshape_of};
pub(crate) use resume::check_servable;
pub use resume::{assemble_serving, resumed_line, RecordedGrow, ResumeOptions};
pub use shape::{change_shape, ShapeOptions};
pub use shrink::{shrink, shrink_to_two, ShrinkOptions, Shrunk};
pub use size::{resize, Resized, SizeOptions, SizeTarget};
pub(crate) use takeover::last_role_unnamed;
pub use takeover::{add_q, raid0_to_raid10};
