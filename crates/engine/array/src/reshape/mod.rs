//! Arrays part-way through a reshape, in md's format.
//!
//! - `record`: md's record of a reshape in the superblocks (the old and
//!   the new shape, the position, the direction, each member's old and new
//!   data offset) read into nvraid-layout's [`Reshape`], and refused with
//!   the field named when nvraid cannot honour it;
//! - `read`: [`MidReshape`], such an array opened read-only: every byte
//!   read from the shape the position puts it in, and what `detail` shows.
//!
//! The two files do not import each other's items beyond `read` using
//! `record` (a floor below it).
//!
//! [`Reshape`]: nvraid_layout::Reshape

mod read;
mod record;

pub use read::{MidReshape, ReshapeDetail, ReshapeMember, ShapeDetail};
pub use record::{is_reshaping, reshape_of};
