//! md's `feature_map` bits (v1 superblocks) and what nvraid does with each.
//!
//! Every bit the kernel defines is listed here with nvraid's answer: either
//! nvraid honours it (reads and writes the array the way md would), or
//! assembly refuses the array and names the bit. A bit the kernel does not
//! define is refused when the superblock is decoded, as the kernel does.

/// An internal write-intent bitmap lives at `bitmap_offset`.
pub const BITMAP_OFFSET: u32 = 1 << 0;
/// This member is being recovered: data is valid below `recovery_offset`.
pub const RECOVERY_OFFSET: u32 = 1 << 1;
/// A reshape is in progress (`reshape_position`, `new_*` fields).
pub const RESHAPE_ACTIVE: u32 = 1 << 2;
/// A bad-block log exists at `bblog_offset` and may list ranges.
pub const BAD_BLOCKS: u32 = 1 << 3;
/// This member is replacing another member of the same role.
pub const REPLACEMENT: u32 = 1 << 4;
/// The reshape runs from the end of the array towards its start.
pub const RESHAPE_BACKWARDS: u32 = 1 << 5;
/// `new_offset` holds the data offset the reshape moves to.
pub const NEW_OFFSET: u32 = 1 << 6;
/// Recovery of this member is driven by the bitmap (a re-add).
pub const RECOVERY_BITMAP: u32 = 1 << 7;
/// The array is shared by a cluster of hosts (md-cluster).
pub const CLUSTERED: u32 = 1 << 8;
/// The array has a raid5/6 write journal device.
pub const JOURNAL: u32 = 1 << 9;
/// raid5 partial parity log.
pub const PPL: u32 = 1 << 10;
/// raid5 partial parity log with several entries.
pub const MULTIPLE_PPLS: u32 = 1 << 11;
/// raid0: `layout` says how a multi-zone array maps (original/alternate).
pub const RAID0_LAYOUT: u32 = 1 << 12;

/// Every bit the kernel defines (`MD_FEATURE_ALL`).
pub const ALL: u32 = (1 << 13) - 1;

/// Bits nvraid honours; the rest of [`ALL`] make assembly refuse.
pub const HONOURED: u32 =
    BITMAP_OFFSET | RECOVERY_OFFSET | BAD_BLOCKS | RECOVERY_BITMAP | RAID0_LAYOUT;

const NAMES: [(u32, &str); 13] = [
    (BITMAP_OFFSET, "BITMAP_OFFSET (write-intent bitmap)"),
    (RECOVERY_OFFSET, "RECOVERY_OFFSET (member being recovered)"),
    (RESHAPE_ACTIVE, "RESHAPE_ACTIVE (reshape in progress)"),
    (BAD_BLOCKS, "BAD_BLOCKS (bad-block log)"),
    (REPLACEMENT, "REPLACEMENT (member replacing another)"),
    (RESHAPE_BACKWARDS, "RESHAPE_BACKWARDS (reshape in progress)"),
    (NEW_OFFSET, "NEW_OFFSET (reshape moving the data offset)"),
    (RECOVERY_BITMAP, "RECOVERY_BITMAP (re-add recovery)"),
    (CLUSTERED, "CLUSTERED (md-cluster array)"),
    (JOURNAL, "JOURNAL (raid5/6 write journal)"),
    (PPL, "PPL (raid5 partial parity log)"),
    (MULTIPLE_PPLS, "MULTIPLE_PPLS (raid5 partial parity log)"),
    (RAID0_LAYOUT, "RAID0_LAYOUT (raid0 zone layout)"),
];

/// The names of the bits set in `map`, in bit order (unknown bits as hex).
pub fn names(map: u32) -> Vec<String> {
    let mut out: Vec<String> = NAMES
        .iter()
        .filter(|(bit, _)| map & bit != 0)
        .map(|(_, name)| (*name).to_string())
        .collect();
    if map & !ALL != 0 {
        out.push(format!("unknown bits {:#x}", map & !ALL));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_defined_bit_has_a_name() {
        for bit in 0..13 {
            let names = super::names(1 << bit);
            assert_eq!(names.len(), 1);
            assert!(!names[0].starts_with("unknown"), "bit {bit}");
        }
        assert_eq!(super::names(1 << 20), vec!["unknown bits 0x100000"]);
    }
}
