//! A write-intent bitmap resized for a larger (or smaller) space, as md
//! resizes it (the kernel's bitmap resize with no chunk asked for): when a
//! RAID 10 starts to gain members (its bits count array bytes) and when
//! `grow --size` changes how much of each member is used.
//!
//! md's rule, in nvraid's words:
//! - The room the bitmap may take is the header's `sectors_reserved` when
//!   it is set; otherwise (mdadm writes 0) the sectors the bitmap occupies
//!   now, the header and its bits rounded up to 512 bytes. md then records
//!   that room in `sectors_reserved`, so a later resize uses the same.
//! - The chunk is kept when the header and the bits of the new space fit
//!   in that room, and doubled until they do otherwise.
//! - Each bit set before sets the new bit whose chunk holds the start of
//!   the old one (the same bit when the chunk is kept); bits past the old
//!   space stay clear on disk (md marks them for resync in memory only; a
//!   RAID 10 grow writes that region itself, and `grow --size` records it
//!   for resync with `resync_offset`).

use crate::error::{Error, Result};
use crate::intent::MemberBitmap;
use nvraid_io::AlignedBuf;
use nvraid_member::Member;
use nvraid_metadata::{bitmap, Superblock};

/// Sectors md allows the bitmap: its header's `sectors_reserved`, or what
/// the header and `bits` bits occupy, in whole sectors.
pub(super) fn room_sectors(b: &MemberBitmap, bits: u64) -> u64 {
    match b.header.sectors_reserved {
        0 => (bitmap::HEADER_BYTES as u64 + bits.div_ceil(8)).div_ceil(512),
        reserved => u64::from(reserved),
    }
}

/// The chunk md picks for `new_space` bytes: the current one, doubled
/// until the header and the bits fit in `room` sectors (md stops at 2^31
/// bytes, the largest its header's field holds as a power of two).
pub(super) fn chunk_for(chunk: u32, new_space: u64, room: u64) -> u32 {
    let mut chunk = u64::from(chunk);
    while bitmap::HEADER_BYTES as u64 + bitmap::bits_for(new_space, chunk as u32).div_ceil(8)
        > room * 512
        && chunk < 1 << 31
    {
        chunk *= 2;
    }
    chunk as u32
}

/// `b` (over `old_space` bytes) resized for `new_space` bytes as md
/// resizes it: the chunk kept or doubled (see the module), the set bits
/// carried over, `sectors_reserved` recorded, the header's size
/// `new_space`. The image covers `new_space` in whole 4 KiB pages.
pub(super) fn resized(b: &MemberBitmap, old_space: u64, new_space: u64) -> MemberBitmap {
    let old_chunk = b.header.chunk_bytes;
    let old_bits = bitmap::bits_for(old_space, old_chunk);
    let room = room_sectors(b, old_bits);
    let chunk = chunk_for(old_chunk, new_space, room);
    let bits = bitmap::bits_for(new_space, chunk);
    let mut storage = AlignedBuf::zeroed(bitmap::storage_bytes(bits) as usize);
    storage[..bitmap::HEADER_BYTES].copy_from_slice(&b.storage[..bitmap::HEADER_BYTES]);
    // The bits md carries over: those of chunks starting below both ends.
    let carried = old_space.min(new_space);
    for old in 0..old_bits {
        let start = old * u64::from(old_chunk);
        if start < carried && bitmap::test_bit(&b.storage, old) {
            bitmap::put_bit(&mut storage, start / u64::from(chunk), true);
        }
    }
    let mut header = b.header.clone();
    header.chunk_bytes = chunk;
    header.sectors_reserved = room as u32;
    header.sync_size_sectors = new_space / 512;
    MemberBitmap {
        header,
        storage,
        at: b.at,
    }
}

/// Refuse (naming the member) a bitmap image of `len` bytes at `at` that
/// would run into the data or a bad-block log after it on some member.
pub(super) fn check_fits(at: u64, len: u64, found: &[(&Member, &Superblock)]) -> Result<()> {
    for (member, sb) in found {
        let data = sb.data_offset_sectors * 512;
        let mut limit = data;
        if sb.bblog_size > 0 && sb.bblog_offset != 0 {
            let log = (sb.super_offset_sectors as i64 + i64::from(sb.bblog_offset as i32)) * 512;
            if log as u64 > at {
                limit = limit.min(log as u64);
            }
        }
        if at + len > limit {
            return Err(Error::NotStartable(format!(
                "{}: the write-intent bitmap would need {len} bytes at byte {at}, but only {} are free before {} (its header's sectors_reserved is larger than its room): remove the bitmap and add it again afterwards. Nothing was written",
                member.spec(),
                limit.saturating_sub(at),
                if limit == data { "the data" } else { "the bad-block log" }
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvraid_metadata::bitmap::BitmapHeader;

    fn image(chunk: u32, space: u64, set: &[u64]) -> MemberBitmap {
        let bits = bitmap::bits_for(space, chunk);
        let mut storage = AlignedBuf::zeroed(bitmap::storage_bytes(bits) as usize);
        for &bit in set {
            bitmap::put_bit(&mut storage, bit, true);
        }
        MemberBitmap {
            header: BitmapHeader::new([1; 16], 5, space / 512, chunk),
            storage,
            at: 8192,
        }
    }

    #[test]
    fn md_keeps_the_chunk_while_the_bits_fit_in_the_sectors_they_had() {
        // The kernel's own RAID 10 grow (tools/mdvm): 4 KiB chunks over 30
        // MiB (7680 bits, 1216 bytes: 3 sectors) grown to 37.5 MiB (9600
        // bits, 1456 bytes): the chunk stays, sectors_reserved becomes 3.
        let b = image(4096, 30 << 20, &[0, 7679]);
        let r = resized(&b, 30 << 20, 75 << 19);
        assert_eq!(r.header.chunk_bytes, 4096);
        assert_eq!(r.header.sectors_reserved, 3);
        assert_eq!(r.header.sync_size_sectors, (75 << 19) / 512);
        assert!(bitmap::test_bit(&r.storage, 0) && bitmap::test_bit(&r.storage, 7679));
        assert!((7680..9600).all(|bit| !bitmap::test_bit(&r.storage, bit)));
    }

    #[test]
    fn md_doubles_the_chunk_when_the_bits_outgrow_their_sectors() {
        // 64 KiB chunks over 28 MiB: 448 bits, 312 bytes, one sector; at
        // 128 MiB 2048 bits (256 bytes + the header: 512) still fit; at
        // 256 MiB 4096 bits (768 bytes) do not, so 128 KiB chunks (2048).
        let b = image(64 << 10, 28 << 20, &[1, 3, 447]);
        assert_eq!(
            resized(&b, 28 << 20, 128 << 20).header.chunk_bytes,
            64 << 10
        );
        let r = resized(&b, 28 << 20, 256 << 20);
        assert_eq!(r.header.chunk_bytes, 128 << 10);
        assert_eq!(r.header.sectors_reserved, 1);
        // Old bits 1 and 3 lie in new chunks 0 and 1; 447 in 223.
        let set: Vec<u64> = (0..2048)
            .filter(|&k| bitmap::test_bit(&r.storage, k))
            .collect();
        assert_eq!(set, vec![0, 1, 223]);
        // A room recorded before is used as it is.
        let mut b = b;
        b.header.sectors_reserved = 8;
        assert_eq!(
            resized(&b, 28 << 20, 256 << 20).header.chunk_bytes,
            64 << 10
        );
    }
}
