//! md's bad-block log as the array writes it while it runs.
//!
//! A write can fail on a member the array cannot lose (a degraded RAID 5, a
//! RAID 6 missing two): the member stays, and the request fails. The stripe
//! rows that write touched may now hold new data beside old parity (or the
//! reverse), so a block rebuilt from them would be bytes nobody wrote. md's
//! answer, and nvraid's: the failed range is recorded in that member's
//! bad-block log before the request completes, and from then on no read
//! uses the member there, neither directly nor to rebuild another block; a
//! read that has no other way answers EIO. The log is md's format, so the
//! kernel's md honours the same ranges after a move.
//!
//! Where the log lives: md puts it `bblog_offset` sectors from the
//! superblock; nvraid creates it in the 4 KiB right below the data (see
//! [`nvraid_place`]). A member with no log cannot record a bad block; md then
//! fails the member even though the array needs it, and so does nvraid
//! ([`crate::Array::write_failed`]).

use crate::error::{Error, Result};
use nvraid_member::Member;
use nvraid_metadata::{badblocks, Superblock};

/// Sectors of the log nvraid creates (4 KiB: 512 entries), as mdadm does.
pub(crate) const LOG_SECTORS: u16 = 8;

/// The longest range one entry holds (10 bits of length).
const ENTRY_MAX_UNITS: u64 = 0x3ff;

/// Where nvraid puts a member's bad-block log: the last 4 KiB below the
/// data, in sectors from the superblock (`bblog_offset`). `None` when the
/// data starts too close to the superblock to leave room.
pub(crate) fn nvraid_place(sb: &Superblock) -> Option<u32> {
    let end = sb.data_offset_sectors.checked_sub(u64::from(LOG_SECTORS))?;
    let offset = end.checked_sub(sb.super_offset_sectors)?;
    // Behind the superblock's own 4 KiB, and inside the signed 32 bits.
    (offset >= 8 && offset <= i32::MAX as u64).then_some(offset as u32)
}

/// The member's log: its byte offset on the member and its length, when
/// the superblock gives it one.
pub(crate) fn place(sb: &Superblock) -> Option<(u64, usize)> {
    if sb.bblog_size == 0 {
        return None;
    }
    let at = i64::try_from(sb.super_offset_sectors).ok()? + i64::from(sb.bblog_offset as i32);
    (at > 0).then(|| (at as u64 * 512, usize::from(sb.bblog_size) * 512))
}

/// md's entries for `ranges` (data-area bytes of a member whose data starts
/// at `data_start` bytes), in units of `2^shift` sectors rounded outwards,
/// each at most 1023 units long. `None` when they do not fit in
/// `capacity` entries (the last one is kept for the end marker).
pub(crate) fn entries(
    ranges: &[(u64, u64)],
    data_start: u64,
    shift: u8,
    capacity: usize,
) -> Option<Vec<badblocks::BadRange>> {
    let unit = 512u64 << shift;
    let mut out = Vec::new();
    for &(start, end) in ranges {
        let mut first = (data_start + start) / unit;
        let last = (data_start + end).div_ceil(unit);
        while first < last {
            let units = (last - first).min(ENTRY_MAX_UNITS);
            out.push(badblocks::BadRange {
                sector: first << shift,
                sectors: units << shift,
            });
            first += units;
        }
    }
    (out.len() < capacity).then_some(out)
}

/// Write `ranges` (data-area bytes) as the member's whole log, durably.
pub(crate) fn write(member: &Member, sb: &Superblock, ranges: &[(u64, u64)]) -> Result<()> {
    let Some((at, len)) = place(sb) else {
        return Err(Error::Unsupported {
            spec: member.spec().into(),
            what: "recording a bad block on a member with no bad-block log".into(),
        });
    };
    let data_start = sb.data_offset_sectors * 512;
    let Some(list) = entries(ranges, data_start, sb.bblog_shift, len / 8) else {
        return Err(Error::Unsupported {
            spec: member.spec().into(),
            what: format!(
                "more bad ranges than its bad-block log holds ({} entries)",
                len / 8 - 1
            ),
        });
    };
    let mut log = nvraid_io::AlignedBuf::zeroed(len.next_multiple_of(4096));
    badblocks::encode(&list, sb.bblog_shift, &mut log[..len]);
    // Paired with assembly's reading of it: the log says what was recorded.
    assert_eq!(badblocks::decode(&log[..len], sb.bblog_shift), list);
    member
        .write_at(&log[..len], at)
        .and_then(|()| member.flush())
        .map_err(|e| Error::io(member.spec(), e))
}

/// An empty log (all ones, as mdadm writes it) at the member's place, for a
/// member that is new to the array. Not flushed.
pub(crate) fn write_empty(member: &Member, sb: &Superblock) -> Result<()> {
    let Some((at, len)) = place(sb) else {
        return Ok(());
    };
    let mut log = nvraid_io::AlignedBuf::zeroed(len.next_multiple_of(4096));
    log[..len].fill(0xff);
    member
        .write_at(&log[..len], at)
        .map_err(|e| Error::io(member.spec(), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_become_absolute_entries_of_at_most_1023_units() {
        let got = entries(
            &[(0, 4096), (1 << 20, (1 << 20) + 600 * 1024)],
            1 << 20,
            0,
            512,
        )
        .unwrap();
        assert_eq!(
            got,
            vec![
                badblocks::BadRange {
                    sector: 2048,
                    sectors: 8
                },
                badblocks::BadRange {
                    sector: 4096,
                    sectors: 1023
                },
                badblocks::BadRange {
                    sector: 5119,
                    sectors: 177
                },
            ]
        );
        // A shift rounds outwards.
        let got = entries(&[(512, 1024)], 0, 3, 512).unwrap();
        assert_eq!(
            got,
            vec![badblocks::BadRange {
                sector: 0,
                sectors: 8
            }]
        );
        // The end marker needs one entry.
        assert!(entries(&[(0, 512)], 0, 0, 1).is_none());
    }
}
