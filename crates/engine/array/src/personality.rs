//! A personality per level family, chosen once at assembly
//! ([`Personality::of`]): the data paths, scrub and rebuild ask it what to
//! do instead of asking which level the array is.
//!
//! | family | levels | home |
//! |---|---|---|
//! | copies | RAID 0, 1, 10 | [`crate::copies`] |
//! | parity | RAID 4, 5, 6 | [`crate::parity`] |
//!
//! RAID 0 is the copies family with one copy: its reads, writes and
//! discards are those of a mirror that has nothing to fail over to.
//!
//! This file is the only place that chooses between the families; each
//! operation below is one `match` that hands the work to its family.

use crate::array::Array;
use crate::error::Result;
use crate::parity::{ParityShape, StripeLocks};
use crate::recovery::common::{Mode as ScrubMode, Scrubbed};
use nvraid_io::AlignedBuf;
use nvraid_layout::Geometry;
use std::sync::atomic::AtomicU32;

/// What an array's level family does.
#[derive(Debug)]
pub(crate) enum Personality {
    /// RAID 0, 1, 10: every chunk kept `copies` times.
    Copies(Copies),
    /// RAID 4, 5, 6: data chunks and parity in stripes.
    Parity(Parity),
}

/// The copies family's state: where the simple path's read balancing
/// starts its scan (ties between equally loaded copies rotate).
#[derive(Debug, Default)]
pub(crate) struct Copies {
    pub(crate) read_rotor: AtomicU32,
}

/// The parity family's state: the stripe geometry and the stripes that
/// requests in flight hold.
#[derive(Debug)]
pub(crate) struct Parity {
    pub(crate) shape: ParityShape,
    pub(crate) locks: StripeLocks,
}

/// What a scrub carries from one region to the next.
pub(crate) enum ScrubState {
    /// One region-sized buffer per copy (at least two).
    Copies(Vec<AlignedBuf>),
    /// The last stripe compared (a stripe can straddle two regions; it is
    /// compared once).
    Parity(Option<u64>),
}

impl Personality {
    pub(crate) fn of(geometry: &Geometry) -> Personality {
        match ParityShape::of(geometry) {
            Some(shape) => Personality::Parity(Parity {
                shape,
                locks: StripeLocks::new(),
            }),
            None => Personality::Copies(Copies::default()),
        }
    }

    /// The parity family's state, or `None` for the copies family.
    pub(crate) fn parity(&self) -> Option<&Parity> {
        match self {
            Personality::Parity(parity) => Some(parity),
            Personality::Copies(_) => None,
        }
    }

    /// The parity family's stripe geometry, or `None` for the copies
    /// family.
    pub(crate) fn shape(&self) -> Option<ParityShape> {
        self.parity().map(|parity| parity.shape)
    }

    pub(crate) fn read(&self, array: &Array, buf: &mut [u8], offset: u64) -> Result<()> {
        match self {
            Personality::Copies(_) => array.read_copies(buf, offset),
            Personality::Parity(_) => array.read_parity(buf, offset),
        }
    }

    /// Write `buf` at `offset`; which roles were written.
    pub(crate) fn write(&self, array: &Array, buf: &[u8], offset: u64) -> Result<Vec<bool>> {
        match self {
            Personality::Copies(_) => array.write_copies(buf, offset),
            Personality::Parity(_) => array.write_parity(buf, offset),
        }
    }

    pub(crate) fn discard(&self, array: &Array, offset: u64, len: u64) -> Result<()> {
        match self {
            Personality::Copies(_) => array.discard_copies(offset, len),
            // A discarded chunk may read back as anything, and parity would
            // no longer match it: RAID 4/5/6 keep their bytes (a discard is
            // a hint; md also ignores it unless members promise zeros).
            Personality::Parity(_) => Ok(()),
        }
    }

    /// Whether a write that fails on a member the array cannot lose is
    /// recorded as bad blocks (parity: the stripe's other blocks no longer
    /// rebuild it) rather than refused as the last copy (copies: another
    /// copy still holds the data, or none does and the write fails).
    pub(crate) fn records_lost_writes(&self) -> bool {
        matches!(self, Personality::Parity(_))
    }

    pub(crate) fn scrub_state(&self, geometry: &Geometry, region_bytes: usize) -> ScrubState {
        match self {
            Personality::Copies(_) => ScrubState::Copies(
                (0..geometry.copies().max(2))
                    .map(|_| AlignedBuf::zeroed(region_bytes))
                    .collect(),
            ),
            Personality::Parity(_) => ScrubState::Parity(None),
        }
    }

    /// Compare (and with [`ScrubMode::Repair`] rewrite) `[at, end)`, held
    /// against client writes by the caller.
    pub(crate) fn scrub(
        &self,
        array: &Array,
        (at, end): (u64, u64),
        mode: ScrubMode,
        state: &mut ScrubState,
        found: &mut Scrubbed,
    ) -> Result<()> {
        match (self, state) {
            (Personality::Copies(_), ScrubState::Copies(bufs)) => {
                crate::copies::scrub::compare_copies(array, at, end, mode, bufs, found)
            }
            (Personality::Parity(parity), ScrubState::Parity(done)) => {
                crate::parity::scrub::compare_parity(array, parity, at, end, mode, found, done)
            }
            _ => unreachable!("invariant: a scrub state is made by the personality that uses it"),
        }
    }

    /// The array bytes that `len` bytes of `role`'s data area at `at`
    /// belong to (parity: the data of their whole stripe), as
    /// `(offset, len)`: what a rebuild step holds against client writes
    /// and asks the bitmap about.
    pub(crate) fn array_bytes_of(
        &self,
        geometry: &Geometry,
        role: usize,
        at: u64,
        len: u64,
    ) -> (u64, u64) {
        match self {
            Personality::Copies(_) => {
                let Some((logical, _)) = geometry.logical_of(role as u32, at) else {
                    panic!("invariant: a member byte a rebuild copies holds array data");
                };
                (logical, len)
            }
            Personality::Parity(parity) => {
                let width = parity.shape.stripe_data_bytes();
                (at / parity.shape.chunk * width, width)
            }
        }
    }

    /// Fill `piece` with what `role` holds at `at` of its data area (array
    /// bytes from `logical`, see [`Personality::array_bytes_of`]): one step
    /// of a rebuild that goes a step at a time.
    pub(crate) fn rebuild_piece(
        &self,
        array: &Array,
        role: usize,
        at: u64,
        logical: u64,
        piece: &mut [u8],
    ) -> Result<()> {
        match self {
            Personality::Copies(_) => {
                crate::copies::scrub::read_other_copy(array, role, logical, piece)
            }
            Personality::Parity(_) => array.rebuild_block(role, at, piece),
        }
    }

    /// Fill `buf` with what `role` holds at `[at, end)` of its data area,
    /// from the other members (a rebuild's step).
    pub(crate) fn rebuild(
        &self,
        array: &Array,
        role: usize,
        (at, end): (u64, u64),
        buf: &mut [u8],
        sources: &mut Vec<AlignedBuf>,
    ) -> Result<()> {
        match self {
            Personality::Copies(_) => {
                crate::copies::scrub::rebuild_from_copies(array, role, at, end, buf)
            }
            Personality::Parity(parity) => crate::parity::scrub::rebuild_from_parity(
                array, parity, role, at, end, buf, sources,
            ),
        }
    }
}
