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
//! This file is the only place that chooses between the families, and it
//! holds what each family keeps; the operations (one `match` each that
//! hands the work to the family) are in `ops`, above the array they take.

use crate::parity::{ParityShape, StripeLocks};
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
                let (first, last) = (
                    at / parity.shape.chunk,
                    (at + len.max(1) - 1) / parity.shape.chunk,
                );
                (first * width, (last - first + 1) * width)
            }
        }
    }
}
