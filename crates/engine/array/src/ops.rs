//! The operations table: the simple path's reads, writes and discards,
//! scrub and rebuild, each one `match` on the personality chosen at
//! assembly that hands the work to its family (`copies`, `parity`).

use crate::array::Array;
use crate::error::{Error, Result};
use crate::personality::{Personality, ScrubState};
use crate::recovery::common::{Mode as ScrubMode, Scrubbed};
use nvraid_io::AlignedBuf;

impl Array {
    /// Read `buf.len()` bytes at `offset`.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.check(offset, buf.len() as u64)?;
        self.personality().read(self, buf, offset)
    }

    /// Write `buf` at `offset` to every copy; with `fua`, the data is durable
    /// when this returns.
    pub fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        self.check(offset, buf.len() as u64)?;
        if !self.is_writable() {
            return Err(Error::ReadOnly);
        }
        let written = self.while_admitted(offset, buf.len() as u64, || {
            self.personality().write(self, buf, offset)
        });
        if fua {
            self.flush_slots(|role| written.as_ref().is_ok_and(|touched| touched[role]))?;
        }
        written.map(|_| ())
    }

    /// Discard `[offset, offset + len)` (a hint: see each family's
    /// `discard`).
    pub fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.check(offset, len)?;
        if !self.is_writable() {
            return Err(Error::ReadOnly);
        }
        self.personality().discard(self, offset, len)
    }
}

impl Personality {
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

    /// Fill `piece` with what `role` holds at `at` of its data area (array
    /// bytes from `logical`, see [`Personality::array_bytes_of`]): one step
    /// of a rebuild that goes a step at a time (copies: within a chunk;
    /// parity: whole stripes or part of one). `sources` is the parity
    /// family's buffers for the other members' bytes, kept between steps.
    pub(crate) fn rebuild_piece(
        &self,
        array: &Array,
        role: usize,
        (at, logical): (u64, u64),
        piece: &mut [u8],
        sources: &mut Vec<AlignedBuf>,
    ) -> Result<()> {
        match self {
            Personality::Copies(_) => {
                crate::copies::scrub::read_other_copy(array, role, logical, piece)
            }
            Personality::Parity(parity) => crate::parity::scrub::rebuild_from_parity(
                array,
                parity,
                role,
                at,
                at + piece.len() as u64,
                piece,
                sources,
            ),
        }
    }

    /// The most bytes of a member one step of a rebuild beside clients may
    /// copy for the family: a chunk for the copies (a member's next chunk
    /// may hold array bytes far from this one's), unlimited for parity
    /// (a member's rows are whole stripes, contiguous in the array).
    pub(crate) fn rebuild_step_limit(&self, geometry: &nvraid_layout::Geometry) -> Option<u64> {
        match self {
            Personality::Copies(_) => geometry.chunk_bytes(),
            Personality::Parity(_) => None,
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
