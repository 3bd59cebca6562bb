//! nvraid-layout: where each byte of an array lives on its members.
//!
//! Pure arithmetic, no I/O, no `unsafe`. The layouts are those of Linux md for
//! members of equal size, so that an array created by nvraid can be assembled
//! by the kernel's md driver and the other way round. The mapping is on-disk
//! format: it is pinned by golden vectors (`tests/golden.rs`) that may only be
//! appended to.
//!
//! All quantities are bytes. A request is split into [`Piece`]s that never
//! cross a chunk boundary; every copy of a piece is one contiguous extent on
//! one member ([`Geometry::locate`]). [`Geometry::logical_of`] is the inverse
//! map.
//!
//! A [`Level`] also knows itself in md's words (the `md` module): the
//! superblock's level and layout numbers both ways ([`Level::from_md`],
//! [`Level::md_layout`]), its layout's name ([`Level::layout_name`]) and the
//! names the command line takes ([`Level::with_layout`]).
//!
//! ## RAID 0 (md `raid0`, one zone)
//! Chunk `c` of the array (`c = offset / chunk`) lives on member `c % n` at
//! member chunk `c / n`. With 4 members and 64 KiB chunks, array offset
//! 300 KiB is in chunk 4 (256..320 KiB) at 44 KiB into it: member 0, member
//! offset 64 KiB + 44 KiB = 108 KiB.
//!
//! ## RAID 0 over members of unequal size (md's zones)
//! Each member's data size is rounded down to whole chunks. Zone 0 stripes over
//! all members up to the smallest size; zone 1 over the members still larger,
//! from that point on them, up to the next smallest size; and so on. Within a
//! zone of `z` members, array chunk `c` (counted from the array's start in md's
//! *original* layout, from the zone's start in the *alternate* one) lives on the
//! zone's member `c % z` (role order), at zone row `(chunk number in the zone) /
//! z`. Members of 16, 24 and 32 MiB with 64 KiB chunks (each less 1 MiB of
//! metadata) make zones of 3 × 15, 2 × 8 and 1 × 8 MiB: 69 MiB in all.
//!
//! ## RAID 1 (md `raid1`)
//! Every member holds the whole array at the same offset. There is no chunk;
//! a request is a single piece.
//!
//! ## RAID 10, near layout (md `raid10`, layout `n2` = 0x102)
//! Each array chunk is written `k` times (the near copies) to consecutive
//! members, wrapping to member 0 and the next member chunk at the end of a
//! row. Copy `j` of chunk `c` is at slot `i = c * k + j`: member `i % n`,
//! member chunk `i / n`. With 3 members and `k = 2` (odd member count), chunk 0
//! lives on members 0 and 1 (row 0), chunk 1 on member 2 (row 0) and member 0
//! (row 1), chunk 2 on members 1 and 2 (row 1).

mod geometry;
mod md;
pub mod parity;
mod reshape;

pub use geometry::{Geometry, GeometryError, Level, Location, Piece, Pieces, Raid0Layout};
pub use md::MdLevelError;
pub use reshape::{Direction, Reshape, ReshapeError, ReshapePiece, Shape};
