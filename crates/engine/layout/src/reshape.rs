//! An array part-way through a reshape, as md records it: which array
//! bytes are already in the new geometry and which are still in the old,
//! and where on each member each of them lives.
//!
//! ## What md records (v1.2 superblock, `RESHAPE_ACTIVE`)
//! - `level`, `layout`, `chunk_size` are the **old** shape; `new_level`,
//!   `new_layout`, `new_chunk` the **new** one.
//! - `raid_disks` is the **new** member count; `delta_disks` (signed) is
//!   new minus old, so the old count is `raid_disks - delta_disks`.
//! - `reshape_position` is an array address in sectors (the same address
//!   means the same byte of the array in both shapes: a reshape moves
//!   bytes between members, never within the array).
//! - each member's `data_offset` is where the old shape's data starts on
//!   it; with `NEW_OFFSET`, `data_offset + new_offset` (a signed 32-bit
//!   sector count) is where the new shape's data starts. Without it both
//!   shapes start at `data_offset`.
//! - the reshape runs backwards (from the end of the array towards its
//!   start) when `delta_disks < 0`, or when `delta_disks == 0` and
//!   `RESHAPE_BACKWARDS` is set (the kernel's `super_1_validate`).
//!
//! ## Which bytes are where
//! The kernel keeps two positions while it runs: `reshape_progress`
//! (how far stripes have been read into its cache) and `reshape_safe`
//! (what the superblocks record); a request between the two waits. Once
//! the array is stopped both equal the recorded `reshape_position`, so on
//! disk, with `P` that position:
//!
//! | direction | new shape, `new_data_offset` | old shape, `data_offset` |
//! |---|---|---|
//! | forwards  | `[0, P)`    | `[P, size)` |
//! | backwards | `[P, size)` | `[0, P)`    |
//!
//! (raid5's `ahead_of_reshape` and raid10's `raid10_find_phys`: an
//! address "ahead" of the reshape is read in the previous geometry, with
//! the member's old data offset.) While reshaping, md's array is as large
//! as the smaller of the two shapes ([`Reshape::array_bytes`]).
//!
//! ## Safe steps
//! A step moves the array bytes `[p, q)` (forwards; `[q, p)` backwards)
//! from the old shape to the new and only then records the new position.
//! Until the record is written, a crash must find every byte of the old
//! shape that is not yet behind the recorded position intact: the member
//! rows the step writes in the new shape must lie wholly before
//! (forwards; after, backwards) the rows still holding old data.
//! [`Reshape::step_is_safe`] is that test, in member bytes, and it is the
//! kernel's own refusal at assembly ("reshape_position too early for
//! auto-recovery") applied to every step.

use crate::geometry::{Geometry, Location};

/// Which way a reshape runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// From the start of the array to its end (md's default: more members).
    Forwards,
    /// From the end towards the start (`RESHAPE_BACKWARDS`; fewer members).
    Backwards,
}

/// One of the two shapes of a reshaping array.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Shape {
    /// The shape the array had (superblock `level`/`layout`/`chunk_size`,
    /// each member's `data_offset`).
    Old,
    /// The shape it is reshaped to (`new_*`, `data_offset + new_offset`).
    New,
}

/// A piece of a request on a reshaping array: wholly in one shape, and
/// within one chunk of that shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReshapePiece {
    /// The shape these bytes are in.
    pub shape: Shape,
    /// Offset in the array.
    pub logical_offset: u64,
    /// Length.
    pub len: u64,
}

/// Why a reshape record was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReshapeError {
    #[error("the old shape has {members} members but {offsets} old data offsets were given")]
    OldOffsets { members: u32, offsets: usize },
    #[error("the new shape has {members} members but {offsets} new data offsets were given")]
    NewOffsets { members: u32, offsets: usize },
    #[error("reshape position {position} bytes is past the end of the larger shape ({array_bytes} bytes)")]
    PastEnd { position: u64, array_bytes: u64 },
    #[error("reshape position {position} bytes is not on a boundary of {unit} bytes (a whole stripe of the new shape in chunks of the larger chunk size), as md requires")]
    NotOnBoundary { position: u64, unit: u64 },
    #[error("a reshape from {old} to {new} changes the kind of array; nvraid reshapes within RAID 0, within RAID 10 (near) and within RAID 4/5/6")]
    Kind { old: String, new: String },
}

/// A reshaping array: both shapes, the recorded position, the direction
/// and each member's data offset in each shape (bytes from the start of
/// the device; by role).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reshape {
    old: Geometry,
    new: Geometry,
    position: u64,
    direction: Direction,
    old_offsets: Vec<u64>,
    new_offsets: Vec<u64>,
}

impl Reshape {
    /// A reshape from `old` to `new` recorded at `position` (array bytes).
    /// `old_offsets` has one data offset per member of the old shape,
    /// `new_offsets` one per member of the new shape (by role). Refused:
    /// offsets that do not match the member counts, a position past the
    /// end of the reshaping array, and a position md would refuse (not a
    /// whole stripe of the new shape, counted in the larger of the two
    /// chunk sizes; a chunk for RAID 0/10), other than the array's end.
    pub fn new(
        old: Geometry,
        new: Geometry,
        position: u64,
        direction: Direction,
        old_offsets: Vec<u64>,
        new_offsets: Vec<u64>,
    ) -> Result<Reshape, ReshapeError> {
        if old_offsets.len() != old.members() as usize {
            return Err(ReshapeError::OldOffsets {
                members: old.members(),
                offsets: old_offsets.len(),
            });
        }
        if new_offsets.len() != new.members() as usize {
            return Err(ReshapeError::NewOffsets {
                members: new.members(),
                offsets: new_offsets.len(),
            });
        }
        let family = |g: &Geometry| match g.level() {
            crate::Level::Raid0 => 0,
            crate::Level::Raid1 => 1,
            crate::Level::Raid10 { .. } | crate::Level::Raid10Far { .. } => 10,
            crate::Level::Raid5 { .. } | crate::Level::Raid6 { .. } => 5,
        };
        if family(&old) != family(&new) {
            return Err(ReshapeError::Kind {
                old: old.level().to_string(),
                new: new.level().to_string(),
            });
        }
        let reshape = Reshape {
            old,
            new,
            position,
            direction,
            old_offsets,
            new_offsets,
        };
        // A grow's position runs on past the old shape's end, through the
        // new shape's rows beyond it (md fills them with zeros and parity).
        let array_bytes = reshape.array_bytes();
        let end = reshape.old.array_bytes().max(reshape.new.array_bytes());
        if position > end {
            return Err(ReshapeError::PastEnd {
                position,
                array_bytes: end,
            });
        }
        let unit = reshape.position_unit();
        // The array's end is a position too: where a backwards reshape
        // starts and a forwards one ends.
        if !position.is_multiple_of(unit) && position != array_bytes && position != end {
            return Err(ReshapeError::NotOnBoundary { position, unit });
        }
        Ok(reshape)
    }

    /// The shape the array had.
    pub fn old(&self) -> &Geometry {
        &self.old
    }

    /// The shape it is reshaped to.
    pub fn new_shape(&self) -> &Geometry {
        &self.new
    }

    /// The recorded position (array bytes).
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Which way it runs.
    pub fn direction(&self) -> Direction {
        self.direction
    }

    /// The same reshape recorded at another position (a step done).
    pub fn at(&self, position: u64) -> Result<Reshape, ReshapeError> {
        Reshape::new(
            self.old.clone(),
            self.new.clone(),
            position,
            self.direction,
            self.old_offsets.clone(),
            self.new_offsets.clone(),
        )
    }

    /// The geometry of one shape.
    pub fn geometry(&self, shape: Shape) -> &Geometry {
        match shape {
            Shape::Old => &self.old,
            Shape::New => &self.new,
        }
    }

    /// Member `role`'s data offset in `shape` (bytes from the device's
    /// start); `None` for a member the shape does not have.
    pub fn data_offset(&self, shape: Shape, role: u32) -> Option<u64> {
        let offsets = match shape {
            Shape::Old => &self.old_offsets,
            Shape::New => &self.new_offsets,
        };
        offsets.get(role as usize).copied()
    }

    /// The array's size while it reshapes: the smaller of the two shapes
    /// (md's `raid5_size` over the smaller member count; a shrink has its
    /// array size cut to the new shape's before it starts).
    pub fn array_bytes(&self) -> u64 {
        self.old.array_bytes().min(self.new.array_bytes())
    }

    /// The unit md's position moves in: a chunk of the larger chunk size
    /// (RAID 0/10), times the new shape's data chunks per stripe (parity).
    pub fn position_unit(&self) -> u64 {
        let chunk = self
            .old
            .chunk_bytes()
            .unwrap_or(1)
            .max(self.new.chunk_bytes().unwrap_or(1));
        match self.new.level().parity_chunks() {
            0 => chunk,
            p => chunk * u64::from(self.new.members() - p),
        }
    }

    /// Which shape array byte `logical` is in (see the module's table).
    pub fn shape_of(&self, logical: u64) -> Shape {
        let below = logical < self.position;
        match (self.direction, below) {
            (Direction::Forwards, true) | (Direction::Backwards, false) => Shape::New,
            _ => Shape::Old,
        }
    }

    /// Split `[offset, offset + len)` at the position and at each chunk
    /// boundary of the shape each part is in. The pieces cover the range
    /// in order, none empty.
    pub fn pieces(&self, offset: u64, len: u64) -> Vec<ReshapePiece> {
        let end = offset + len;
        debug_assert!(end <= self.array_bytes());
        let mut parts = Vec::with_capacity(2);
        if offset < self.position && self.position < end {
            parts.push((offset, self.position));
            parts.push((self.position, end));
        } else if len > 0 {
            parts.push((offset, end));
        }
        let mut out = Vec::new();
        for (start, stop) in parts {
            let shape = self.shape_of(start);
            for piece in self.geometry(shape).pieces(start, stop - start) {
                out.push(ReshapePiece {
                    shape,
                    logical_offset: piece.logical_offset,
                    len: piece.len,
                });
            }
        }
        out
    }

    /// Where copy `copy` of `piece`'s first byte is on the device: the
    /// member's role and the byte offset from the device's start (the
    /// shape's data offset added).
    pub fn locate(&self, piece: &ReshapePiece, copy: u32) -> Location {
        let at = self
            .geometry(piece.shape)
            .locate(piece.logical_offset, copy);
        let base = self
            .data_offset(piece.shape, at.member)
            .expect("a shape's member has an offset in it");
        Location {
            member: at.member,
            member_offset: base + at.member_offset,
        }
    }

    /// Device bytes of member rows `[first_row, end_row)` of a shape's
    /// data area, on the member with `role`.
    fn rows_on(&self, shape: Shape, role: u32, first_row: u64, end_row: u64) -> (u64, u64) {
        let g = self.geometry(shape);
        let row = g.chunk_bytes().unwrap_or(g.member_used_bytes());
        let base = self.data_offset(shape, role).unwrap_or(0);
        (base + first_row * row, base + end_row * row)
    }

    /// The member rows `[first, end)` of a shape that hold array bytes
    /// `[start, end)`, rounded out to whole rows (every member of the shape
    /// has its part of a row's chunks in that row). A row holds `members -
    /// parity` chunk slots; each array chunk takes `copies` consecutive
    /// slots (md's near layout; one for RAID 0/4/5/6).
    fn rows_of(&self, shape: Shape, start: u64, end: u64) -> (u64, u64) {
        let g = self.geometry(shape);
        let chunk = g.chunk_bytes().unwrap_or(g.member_used_bytes());
        let slots_per_row = u64::from(g.members() - g.level().parity_chunks());
        let copies = u64::from(g.copies());
        let first_chunk = start / chunk;
        let end_chunk = end.div_ceil(chunk);
        (
            first_chunk * copies / slots_per_row,
            (end_chunk * copies).div_ceil(slots_per_row),
        )
    }

    /// Whether moving the array bytes between the recorded position and
    /// `to` (forwards: `[position, to)`; backwards: `[to, position)`) in
    /// one step is crash-safe: on every member both shapes have, the rows
    /// the step writes in the new shape end before (forwards; begin after,
    /// backwards) the rows of the old shape that hold bytes not yet moved
    /// by this step or any before it, counted with each shape's data
    /// offset. The kernel's assembly applies the same test to the recorded
    /// position alone.
    pub fn step_is_safe(&self, to: u64) -> bool {
        let p = self.position;
        let members = self.old.members().min(self.new.members());
        match self.direction {
            Direction::Forwards => {
                let end = self.old.array_bytes().max(self.new.array_bytes());
                if to < p || to > end {
                    return false;
                }
                if p >= self.old.array_bytes() {
                    // Every byte of the old shape has moved: the rows left
                    // hold nothing live.
                    return true;
                }
                let (_, new_end) = self.rows_of(Shape::New, 0, to);
                let (old_first, _) = self.rows_of(Shape::Old, p, self.old.array_bytes());
                (0..members).all(|role| {
                    let (_, written_end) = self.rows_on(Shape::New, role, 0, new_end);
                    let (live_start, _) = self.rows_on(Shape::Old, role, old_first, old_first);
                    written_end <= live_start
                })
            }
            Direction::Backwards => {
                if to > p {
                    return false;
                }
                let size = self.array_bytes();
                let (new_first, _) = self.rows_of(Shape::New, to, size);
                let (_, old_end) = self.rows_of(Shape::Old, 0, p);
                (0..members).all(|role| {
                    let (written_start, _) = self.rows_on(Shape::New, role, new_first, new_first);
                    let (_, live_end) = self.rows_on(Shape::Old, role, 0, old_end);
                    written_start >= live_end
                })
            }
        }
    }
}

impl Reshape {
    /// The kernel's `min_offset_diff`: of each member's move of its data
    /// offset (new minus old, bytes), the one nearest zero in the
    /// reshape's direction (forwards the offsets move down, so the
    /// largest; backwards the smallest). Members only one shape has are
    /// not counted.
    fn min_offset_diff(&self) -> i128 {
        let both = self.old.members().min(self.new.members()) as usize;
        let diffs = (0..both).map(|r| self.new_offsets[r] as i128 - self.old_offsets[r] as i128);
        match self.direction {
            Direction::Forwards => diffs.max(),
            Direction::Backwards => diffs.min(),
        }
        .unwrap_or(0)
    }

    /// Whether md would continue this reshape from its recorded position.
    /// - RAID 4/5/6 changing the member count: the kernel's raid5 refuses
    ///   to assemble a reshape whose next stripe write would land on a
    ///   stripe it still has to read ("reshape_position too early for
    ///   auto-recovery"), counted in rows of the larger chunk, with the
    ///   smallest move of a data offset between the shapes.
    /// - RAID 4/5/6 keeping the member count (a chunk or layout change):
    ///   every row holds the same array bytes in both shapes, so the gap
    ///   between them never widens; the kernel continues one only when the
    ///   data offset moved by at least the larger of the two chunks (any
    ///   less, and mdadm must back the stripes up: the kernel then wants
    ///   the array started read-only).
    /// - RAID 10: the offset moved by at least the larger chunk in the
    ///   reshape's direction (raid10's "offset difference not enough to
    ///   continue reshape").
    pub fn md_can_continue(&self) -> bool {
        let chunk = self
            .old
            .chunk_bytes()
            .unwrap_or(1)
            .max(self.new.chunk_bytes().unwrap_or(1));
        let min_diff = self.min_offset_diff();
        let toward = match self.direction {
            Direction::Forwards => -min_diff,
            Direction::Backwards => min_diff,
        };
        if self.old.level().parity_chunks() == 0 {
            return match self.old.level() {
                crate::Level::Raid10 { .. } => toward >= chunk as i128,
                _ => true,
            };
        }
        if self.old.members() == self.new.members() {
            return min_diff.unsigned_abs() >= u128::from(chunk);
        }
        let data = |g: &Geometry| u64::from(g.members() - g.level().parity_chunks());
        let here_new = self.position / (chunk * data(&self.new));
        let here_old = self.position / (chunk * data(&self.old));
        let (new_at, old_at) = ((here_new * chunk) as i128, (here_old * chunk) as i128);
        match self.direction {
            Direction::Forwards => new_at < old_at - min_diff,
            Direction::Backwards => new_at + min_diff > old_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parity::ParityLayout;
    use crate::Level;

    const K: u64 = 1024;
    const M: u64 = 1024 * K;

    fn r5(members: u32) -> Geometry {
        Geometry::new(
            Level::Raid5 {
                layout: ParityLayout::LeftSymmetric,
            },
            members,
            64 * K,
            15 * M,
        )
        .unwrap()
    }

    /// md's RAID 5 4 -> 5 with the data offset moved down 1 MiB - 64 KiB.
    fn grow(position: u64) -> Reshape {
        Reshape::new(
            r5(4),
            r5(5),
            position,
            Direction::Forwards,
            vec![M; 4],
            vec![M - 960 * K; 5],
        )
        .unwrap()
    }

    #[test]
    fn forwards_the_bytes_below_the_position_are_in_the_new_shape() {
        let r = grow(12 * M);
        assert_eq!(r.shape_of(0), Shape::New);
        assert_eq!(r.shape_of(12 * M - 1), Shape::New);
        assert_eq!(r.shape_of(12 * M), Shape::Old);
        assert_eq!(r.array_bytes(), 45 * M, "the old 3 data members' size");
    }

    #[test]
    fn backwards_the_bytes_from_the_position_on_are_in_the_new_shape() {
        let r = Reshape::new(
            r5(5),
            r5(4),
            30 * M - 3 * 64 * K * 10,
            Direction::Backwards,
            vec![M; 5],
            vec![M + 512 * K; 4],
        )
        .unwrap();
        assert_eq!(r.shape_of(0), Shape::Old);
        assert_eq!(r.shape_of(r.position() - 1), Shape::Old);
        assert_eq!(r.shape_of(r.position()), Shape::New);
        assert_eq!(r.array_bytes(), 45 * M, "the new 3 data members' size");
    }

    #[test]
    fn a_request_across_the_position_is_split_there() {
        let r = grow(12 * M);
        let pieces = r.pieces(12 * M - 4 * K, 8 * K);
        assert_eq!(
            pieces,
            vec![
                ReshapePiece {
                    shape: Shape::New,
                    logical_offset: 12 * M - 4 * K,
                    len: 4 * K
                },
                ReshapePiece {
                    shape: Shape::Old,
                    logical_offset: 12 * M,
                    len: 4 * K
                },
            ]
        );
        // Array byte 12 MiB - 4 KiB: new chunk 191 = stripe 47, data chunk 3
        // of 4; left-symmetric parity of stripe 47 on member 4 - 47 % 5 = 2,
        // data starting after it: members 3, 4, 0, 1 -> member 1, row 47.
        let at = r.locate(&pieces[0], 0);
        assert_eq!(at.member, 1);
        assert_eq!(at.member_offset, M - 960 * K + 47 * 64 * K + 60 * K);
        // Array byte 12 MiB: old chunk 192 = stripe 64, data chunk 0 of 3;
        // parity on member 3 - 64 % 4 = 3, data from member 0: member 0.
        let at = r.locate(&pieces[1], 0);
        assert_eq!(at.member, 0);
        assert_eq!(at.member_offset, M + 64 * 64 * K);
    }

    #[test]
    fn md_refuses_a_position_inside_a_new_stripe() {
        let e = Reshape::new(
            r5(4),
            r5(5),
            3 * 64 * K,
            Direction::Forwards,
            vec![M; 4],
            vec![M; 5],
        )
        .unwrap_err();
        assert_eq!(
            e,
            ReshapeError::NotOnBoundary {
                position: 3 * 64 * K,
                unit: 4 * 64 * K
            }
        );
        assert!(matches!(
            Reshape::new(
                r5(4),
                r5(5),
                61 * M,
                Direction::Forwards,
                vec![M; 4],
                vec![M; 5]
            ),
            Err(ReshapeError::PastEnd { .. })
        ));
        assert!(matches!(
            Reshape::new(r5(4), r5(5), 0, Direction::Forwards, vec![M; 3], vec![M; 5]),
            Err(ReshapeError::OldOffsets { .. })
        ));
    }

    #[test]
    fn without_a_moved_offset_the_first_step_overwrites_live_data() {
        // The case md needs a backup file for: with both shapes at one
        // offset, the first new stripe lands on old stripe 0's rows.
        let same =
            Reshape::new(r5(4), r5(5), 0, Direction::Forwards, vec![M; 4], vec![M; 5]).unwrap();
        assert!(!same.step_is_safe(4 * 64 * K));
        // Moved down by one chunk, one new stripe fits before old row 0.
        let moved = Reshape::new(
            r5(4),
            r5(5),
            0,
            Direction::Forwards,
            vec![M; 4],
            vec![M - 64 * K; 5],
        )
        .unwrap();
        assert!(moved.step_is_safe(4 * 64 * K));
        assert!(!moved.step_is_safe(8 * 64 * K));
        // Further on, the gap has grown: at 12 MiB, old row 64 and new row
        // 48; a step may write new rows up to 64 + 1.
        let later = moved.at(12 * M).unwrap();
        assert!(later.step_is_safe(12 * M + 17 * 4 * 64 * K));
        assert!(!later.step_is_safe(12 * M + 18 * 4 * 64 * K));
    }

    #[test]
    fn md_continues_the_kernels_own_mid_grow() {
        // tests/fixtures/md-states/reshape_r5_grow: 12 MiB, offset down 256 KiB.
        let r = Reshape::new(
            r5(4),
            r5(5),
            12 * M,
            Direction::Forwards,
            vec![M; 4],
            vec![M - 256 * K; 5],
        )
        .unwrap();
        assert!(r.md_can_continue());
        // With both shapes at one offset, md refuses position 0 (it needs
        // the backup file there) and accepts it once the rows have parted.
        let same =
            Reshape::new(r5(4), r5(5), 0, Direction::Forwards, vec![M; 4], vec![M; 5]).unwrap();
        assert!(!same.md_can_continue());
        assert!(same.at(4 * M).unwrap().md_can_continue());
    }

    fn r5_chunk(members: u32, chunk: u64) -> Geometry {
        Geometry::new(
            Level::Raid5 {
                layout: ParityLayout::LeftSymmetric,
            },
            members,
            chunk,
            14 * M,
        )
        .unwrap()
    }

    #[test]
    fn a_chunk_change_steps_no_further_than_the_offset_moved_in_either_direction() {
        // 4 members, 64 KiB -> 256 KiB chunks: each row holds the same
        // array bytes in both shapes, so a step may move at most the
        // offset's move (512 KiB of member rows, 1.5 MiB of the array).
        let unit = 3 * 256 * K;
        let fwd = Reshape::new(
            r5_chunk(4, 64 * K),
            r5_chunk(4, 256 * K),
            6 * unit,
            Direction::Forwards,
            vec![M; 4],
            vec![M - 512 * K; 4],
        )
        .unwrap();
        assert!(fwd.step_is_safe(8 * unit));
        assert!(!fwd.step_is_safe(9 * unit));
        assert!(fwd.md_can_continue());
        // Backwards (the offset moved up), from the array's end.
        let end = 3 * 14 * M;
        let back = Reshape::new(
            r5_chunk(4, 256 * K),
            r5_chunk(4, 64 * K),
            end,
            Direction::Backwards,
            vec![M; 4],
            vec![M + 512 * K; 4],
        )
        .unwrap();
        assert!(back.step_is_safe(end - 2 * unit));
        assert!(!back.step_is_safe(end - 3 * unit));
        assert!(back.md_can_continue());
    }

    #[test]
    fn md_continues_a_chunk_change_only_with_the_offset_moved_by_the_larger_chunk() {
        let moved = |by: u64| {
            Reshape::new(
                r5_chunk(4, 64 * K),
                r5_chunk(4, 256 * K),
                0,
                Direction::Forwards,
                vec![M; 4],
                vec![M - by; 4],
            )
            .unwrap()
        };
        assert!(moved(256 * K).md_can_continue());
        assert!(!moved(128 * K).md_can_continue(), "less than the new chunk");
        assert!(!moved(0).md_can_continue(), "in place: md needs a backup");
        // The member that moved least counts.
        let mixed = Reshape::new(
            r5_chunk(4, 64 * K),
            r5_chunk(4, 256 * K),
            0,
            Direction::Forwards,
            vec![M; 4],
            vec![M - 512 * K, M - 512 * K, M - 128 * K, M - 512 * K],
        )
        .unwrap();
        assert!(!mixed.md_can_continue());
    }

    #[test]
    fn a_grow_runs_on_past_the_old_end_through_the_new_rows() {
        let r = grow(45 * M);
        assert!(r.step_is_safe(60 * M));
        assert!(r.at(60 * M).is_ok());
        assert!(matches!(r.at(61 * M), Err(ReshapeError::PastEnd { .. })));
    }

    #[test]
    fn a_shrink_steps_safely_only_above_the_live_rows() {
        // 5 -> 4 members backwards, new data offset 64 KiB higher: the step
        // writes the new shape's last rows, above the old shape's live end.
        let r = Reshape::new(
            r5(5),
            r5(4),
            45 * M,
            Direction::Backwards,
            vec![M; 5],
            vec![M + 64 * K; 4],
        )
        .unwrap();
        // Old rows holding [0, 45 MiB): 180 rows of 4 data chunks = up to
        // device M + 180 * 64K; new rows of [to, 45 MiB) start at
        // M + 64K + (to / 192K) * 64K.
        assert!(r.step_is_safe(45 * M - 3 * 64 * K * 61));
        assert!(!r.step_is_safe(45 * M - 3 * 64 * K * 62));
    }
}
