//! md's bad-block log: the ranges of a member that md will not read again.
//!
//! The log lives `bblog_offset` sectors from the superblock (signed) and is
//! `bblog_size` sectors long. Each entry is a little-endian u64: the first
//! sector in the top 54 bits and the length in the low 10 bits, both in
//! units of `2^bblog_shift` sectors. Sectors count from the
//! start of the member (not from the data offset). An all-ones entry ends
//! the list; an all-zero entry is empty and skipped.

/// A range of a member's sectors, counted from the start of the member.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BadRange {
    pub sector: u64,
    pub sectors: u64,
}

impl BadRange {
    /// Whether the byte range `[offset, offset + len)` of the member touches
    /// this range.
    pub fn overlaps(&self, offset: u64, len: u64) -> bool {
        let start = self.sector * 512;
        let end = start + self.sectors * 512;
        offset < end && start < offset + len
    }
}

/// Decode a bad-block log (the `bblog_size` sectors at `bblog_offset`).
pub fn decode(log: &[u8], shift: u8) -> Vec<BadRange> {
    let mut out = Vec::new();
    for word in log.chunks_exact(8) {
        let entry = u64::from_le_bytes(word.try_into().expect("8 bytes"));
        if entry == u64::MAX {
            break;
        }
        if entry == 0 {
            continue;
        }
        let sectors = (entry & 0x3ff) << shift;
        let sector = (entry >> 10) << shift;
        if sectors > 0 {
            out.push(BadRange { sector, sectors });
        }
    }
    out
}

/// Encode `ranges` as md does (for tests and tools): entries then all-ones.
pub fn encode(ranges: &[BadRange], shift: u8, log: &mut [u8]) {
    log.fill(0xff);
    for (range, word) in ranges.iter().zip(log.chunks_exact_mut(8)) {
        let entry = ((range.sector >> shift) << 10) | ((range.sectors >> shift) & 0x3ff);
        word.copy_from_slice(&entry.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_end_marker() {
        let ranges = [
            BadRange {
                sector: 4096,
                sectors: 512,
            },
            BadRange {
                sector: 8192,
                sectors: 1000,
            },
        ];
        let mut log = vec![0u8; 4096];
        encode(&ranges, 0, &mut log);
        assert_eq!(decode(&log, 0), ranges);
        // An empty log (as mdadm writes it) is all ones.
        assert!(decode(&[0xff; 64], 0).is_empty());
        // Shift scales both fields.
        let mut log = vec![0u8; 16];
        encode(
            &[BadRange {
                sector: 64,
                sectors: 16,
            }],
            3,
            &mut log,
        );
        assert_eq!(
            decode(&log, 3),
            vec![BadRange {
                sector: 64,
                sectors: 16
            }]
        );
        assert!(ranges[0].overlaps(4096 * 512 + 511 * 512, 4096));
        assert!(!ranges[0].overlaps(4608 * 512, 4096));
        assert!(!ranges[0].overlaps(4095 * 512, 512));
    }
}
