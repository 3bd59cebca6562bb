//! What recovery shares with the level families that do its work
//! (`copies/scrub.rs`, `parity/scrub.rs`): the scrub's mode and findings,
//! and the unit a rebuild or scrub reads. Nothing here knows an array.

/// Bytes copied per step of a rebuild (and compared per scrub buffer).
pub(crate) const REGION_BYTES: u64 = 4 << 20;

/// What a scrub does with copies that differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Count them only (reads every copy, writes nothing).
    Check,
    /// Rewrite them from the first readable copy (md's `repair`); on an
    /// array assembled dirty, resync it and record it clean.
    Repair,
}

/// What a scrub found (and, in repair mode, put right).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Scrubbed {
    /// Sectors (512 bytes) of some copy that differed from the first copy (RAID
    /// 4/5/6: of a chunk whose P or Q differed from its stripe's data).
    pub mismatch_sectors: u64,
    /// Array byte ranges `[start, end)` where some copy differed (adjacent
    /// ranges merged).
    pub regions: Vec<(u64, u64)>,
    /// Sectors rewritten (repair mode).
    pub repaired_sectors: u64,
    /// Bytes of the array compared (a resync of an array with a bitmap
    /// compares only the regions whose bits are set).
    pub bytes: u64,
    pub seconds: f64,
    /// The array was dirty and is now resynced and recorded clean.
    pub resynced: bool,
    /// RAID 4/5/6: mismatches are parity that disagrees with the data,
    /// repaired by recomputing the parity.
    pub parity: bool,
}

impl Scrubbed {
    /// `sectors` 512-byte sectors differ within the array bytes `range`:
    /// counted, and the range added to the list (merged with the last one
    /// when they touch; a scrub finds them in ascending order).
    pub(crate) fn mismatch(&mut self, range: (u64, u64), sectors: u64) {
        assert!(range.0 < range.1, "invariant: a mismatch covers some bytes");
        self.mismatch_sectors += sectors;
        match self.regions.last_mut() {
            Some(last) if last.1 >= range.0 && last.0 <= range.1 => {
                *last = (last.0.min(range.0), last.1.max(range.1))
            }
            _ => self.regions.push(range),
        }
    }
}
