//! md's internal write-intent bitmap: its header and where its bits live.
//!
//! An internal bitmap lives `bitmap_offset` sectors (signed) from the md
//! superblock of every member (each member holds the same bitmap). Its first
//! 256 bytes are a header; the bits follow at byte 256. Bit `i` (byte
//! `256 + i / 8`, bit `i % 8`, little-endian bit order) covers array bytes
//! `[i * chunk, (i + 1) * chunk)`: the array's own address space for RAID 1
//! and RAID 10 alike. A set bit means "a write to this region may not have
//! reached every copy": md resyncs only those regions after a crash, and
//! recovers only those onto a member that comes back (re-add).
//!
//! Header fields (little endian):
//!
//! | offset | size | field | meaning |
//! |---|---|---|---|
//! | 0 | 4 | magic | `bitm` (0x6d746962) |
//! | 4 | 4 | version | 4 (md's BITMAP_MAJOR_HI); 3 read too |
//! | 8 | 16 | uuid | the array's UUID |
//! | 24 | 8 | events | the superblock events this bitmap is current with |
//! | 32 | 8 | events_cleared | events when bits were last allowed to clear |
//! | 40 | 8 | sync_size | sectors the bits cover (the array's size) |
//! | 48 | 4 | state | bit 1: STALE (bits cannot be trusted) |
//! | 52 | 4 | chunksize | bytes per bit, a power of two |
//! | 56 | 4 | daemon_sleep | seconds between clearing passes (5) |
//! | 60 | 4 | write_behind | 0 |
//! | 64 | 4 | sectors_reserved | 0 |
//! | 68 | 4 | nodes | 0 (clustered bitmaps are refused) |
//! | 72 | 64 | cluster_name | zero |
//!
//! There is no checksum. md treats a bitmap whose events are older than the
//! superblock's as stale and resyncs everything, so whoever moves the
//! superblock's events moves the bitmap's first.

/// `bitm`.
pub const MAGIC: u32 = 0x6d74_6962;
/// The header's length; the bits start here.
pub const HEADER_BYTES: usize = 256;
/// md's BITMAP_STALE state bit: the bits do not cover every write.
pub const STATE_STALE: u32 = 1 << 1;
/// The version nvraid writes (md's BITMAP_MAJOR_HI, as mdadm writes).
pub const VERSION: u32 = 4;
/// md's default seconds between clearing passes.
pub const DAEMON_SLEEP_SECONDS: u32 = 5;
/// mdadm's smallest default chunk for an internal bitmap: 64 MiB.
pub const DEFAULT_CHUNK_FLOOR: u64 = 64 << 20;
const STATE_AT: usize = 48;

/// Why bytes are not a bitmap header nvraid can use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BitmapError {
    #[error("no md bitmap header (magic {found:#010x}, expected {MAGIC:#010x})")]
    BadMagic { found: u32 },
    #[error("md bitmap belongs to array {found}, not this array")]
    OtherArray { found: String },
    #[error("buffer of {0} bytes is too short for the bitmap header")]
    Short(usize),
    #[error("md bitmap version {0} (nvraid reads versions 3 and 4; 5 is md-cluster's)")]
    Version(u32),
    #[error("md bitmap chunk of {0} bytes (must be a power of two, 512 bytes or more)")]
    Chunk(u32),
    #[error("a clustered md bitmap ({0} nodes)")]
    Clustered(u32),
    #[error("md bitmap field daemon_sleep is 0 seconds (the kernel refuses it)")]
    DaemonSleep,
    #[error("md bitmap field write_behind is {0} (the kernel allows 0 to {WRITE_BEHIND_MAX})")]
    WriteBehind(u32),
}

/// The most writes md lets lag behind on write-mostly members (its
/// COUNTER_MAX); a header with more is refused.
pub const WRITE_BEHIND_MAX: u32 = 16383;

/// The decoded header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BitmapHeader {
    pub version: u32,
    pub uuid: [u8; 16],
    pub events: u64,
    pub events_cleared: u64,
    pub sync_size_sectors: u64,
    pub state: u32,
    pub chunk_bytes: u32,
    pub daemon_sleep: u32,
    pub write_behind: u32,
    pub sectors_reserved: u32,
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn check(header: &[u8], set_uuid: &[u8; 16]) -> Result<(), BitmapError> {
    if header.len() < HEADER_BYTES {
        return Err(BitmapError::Short(header.len()));
    }
    let magic = le32(header, 0);
    if magic != MAGIC {
        return Err(BitmapError::BadMagic { found: magic });
    }
    if &header[8..24] != set_uuid {
        let uuid: [u8; 16] = header[8..24].try_into().expect("16 bytes");
        return Err(BitmapError::OtherArray {
            found: crate::format_uuid(&uuid),
        });
    }
    Ok(())
}

impl BitmapHeader {
    /// A new header for an array: version 4, no bits cleared yet.
    pub fn new(uuid: [u8; 16], events: u64, sync_size_sectors: u64, chunk_bytes: u32) -> Self {
        BitmapHeader {
            version: VERSION,
            uuid,
            events,
            events_cleared: events,
            sync_size_sectors,
            state: 0,
            chunk_bytes,
            daemon_sleep: DAEMON_SLEEP_SECONDS,
            write_behind: 0,
            sectors_reserved: 0,
        }
    }

    /// Decode and check a header that must belong to the array `set_uuid`.
    pub fn decode(header: &[u8], set_uuid: &[u8; 16]) -> Result<Self, BitmapError> {
        check(header, set_uuid)?;
        let version = le32(header, 4);
        if !(3..=4).contains(&version) {
            return Err(BitmapError::Version(version));
        }
        let chunk_bytes = le32(header, 52);
        if chunk_bytes < 512 || !chunk_bytes.is_power_of_two() {
            return Err(BitmapError::Chunk(chunk_bytes));
        }
        let nodes = le32(header, 68);
        if nodes > 1 {
            return Err(BitmapError::Clustered(nodes));
        }
        // md_bitmap_read_sb refuses both: the clearing daemon needs a period,
        // and the write-behind counter has 14 bits.
        let daemon_sleep = le32(header, 56);
        if daemon_sleep == 0 {
            return Err(BitmapError::DaemonSleep);
        }
        let write_behind = le32(header, 60);
        if write_behind > WRITE_BEHIND_MAX {
            return Err(BitmapError::WriteBehind(write_behind));
        }
        Ok(BitmapHeader {
            version,
            uuid: *set_uuid,
            events: le64(header, 24),
            events_cleared: le64(header, 32),
            sync_size_sectors: le64(header, 40),
            state: le32(header, STATE_AT),
            chunk_bytes,
            daemon_sleep,
            write_behind,
            sectors_reserved: le32(header, 64),
        })
    }

    /// Write the header into `out[..256]` (the rest of `out` is untouched);
    /// decoding the bytes gives `self` back (asserted, in release builds
    /// too: a header md would misread must never reach a member).
    pub fn encode(&self, out: &mut [u8]) {
        assert!(out.len() >= HEADER_BYTES, "bitmap header buffer too short");
        let h = &mut out[..HEADER_BYTES];
        h.fill(0);
        h[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        h[4..8].copy_from_slice(&self.version.to_le_bytes());
        h[8..24].copy_from_slice(&self.uuid);
        h[24..32].copy_from_slice(&self.events.to_le_bytes());
        h[32..40].copy_from_slice(&self.events_cleared.to_le_bytes());
        h[40..48].copy_from_slice(&self.sync_size_sectors.to_le_bytes());
        h[48..52].copy_from_slice(&self.state.to_le_bytes());
        h[52..56].copy_from_slice(&self.chunk_bytes.to_le_bytes());
        h[56..60].copy_from_slice(&self.daemon_sleep.to_le_bytes());
        h[60..64].copy_from_slice(&self.write_behind.to_le_bytes());
        h[64..68].copy_from_slice(&self.sectors_reserved.to_le_bytes());
        assert_eq!(
            BitmapHeader::decode(h, &self.uuid).as_ref(),
            Ok(self),
            "bitmap header does not round-trip"
        );
    }

    /// Whether md would trust the bits: not marked stale.
    pub fn is_stale(&self) -> bool {
        self.state & STATE_STALE != 0
    }

    /// Bits the header's chunk needs to cover `sync_size_sectors`.
    pub fn bits(&self) -> u64 {
        bits_for(self.sync_size_sectors * 512, self.chunk_bytes)
    }
}

/// Bits needed to cover `bytes` with chunks of `chunk_bytes`.
pub fn bits_for(bytes: u64, chunk_bytes: u32) -> u64 {
    bytes.div_ceil(u64::from(chunk_bytes))
}

/// Bytes the header and `bits` bits occupy on a member, rounded up to 4 KiB
/// (md reads and writes the bitmap in pages).
pub fn storage_bytes(bits: u64) -> u64 {
    (HEADER_BYTES as u64 + bits.div_ceil(8)).div_ceil(4096) * 4096
}

/// Whether bit `bit` is set in a bitmap's storage (`storage` starts with
/// the header).
pub fn test_bit(storage: &[u8], bit: u64) -> bool {
    let byte = HEADER_BYTES + (bit / 8) as usize;
    storage[byte] & (1 << (bit % 8)) != 0
}

/// Set or clear bit `bit` in a bitmap's storage.
pub fn put_bit(storage: &mut [u8], bit: u64, set: bool) {
    let byte = HEADER_BYTES + (bit / 8) as usize;
    let mask = 1u8 << (bit % 8);
    if set {
        storage[byte] |= mask;
    } else {
        storage[byte] &= !mask;
    }
}

/// The room mdadm reserves for an internal bitmap on a member of
/// `member_sectors` used sectors: 4 KiB up to 8 GiB, 64 KiB up to 200 GiB,
/// 128 KiB above.
pub fn default_room_bytes(member_sectors: u64) -> u64 {
    if member_sectors.saturating_sub(8) > 200 << 21 {
        128 << 10
    } else if member_sectors.saturating_sub(8) > 8 << 21 {
        64 << 10
    } else {
        4 << 10
    }
}

/// mdadm's default chunk for an internal bitmap over `array_bytes` (the space
/// its bits count: a member's data area for RAID 4/5/6, the array otherwise) with
/// `room_bytes` of space: the smallest power of two (from 4 KiB) whose bits
/// fit in the room, and never below 64 MiB.
pub fn default_chunk_bytes(array_bytes: u64, room_bytes: u64) -> u64 {
    let max_bits = (room_bytes.saturating_sub(HEADER_BYTES as u64)) * 8;
    let mut chunk = 4096u64;
    let mut bits = array_bytes / chunk + 1;
    while bits > max_bits {
        chunk *= 2;
        bits = bits.div_ceil(2);
    }
    chunk.max(DEFAULT_CHUNK_FLOOR)
}

/// The header's state word, after checking it belongs to `set_uuid`.
pub fn state(header: &[u8], set_uuid: &[u8; 16]) -> Result<u32, BitmapError> {
    check(header, set_uuid)?;
    Ok(le32(header, STATE_AT))
}

/// Set the STALE bit in a header of the array `set_uuid`; every other byte
/// stays as it was.
pub fn mark_stale(header: &mut [u8], set_uuid: &[u8; 16]) -> Result<(), BitmapError> {
    let state = state(header, set_uuid)? | STATE_STALE;
    header[STATE_AT..STATE_AT + 4].copy_from_slice(&state.to_le_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_only_the_state_word() {
        let uuid = [3u8; 16];
        let mut header = vec![0xa5u8; 512];
        header[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        header[8..24].copy_from_slice(&uuid);
        header[48..52].copy_from_slice(&0u32.to_le_bytes());
        let before = header.clone();
        mark_stale(&mut header, &uuid).unwrap();
        assert_eq!(state(&header, &uuid), Ok(STATE_STALE));
        let changed: Vec<usize> = (0..512).filter(|&i| header[i] != before[i]).collect();
        assert_eq!(changed, vec![48]);
        assert!(matches!(
            mark_stale(&mut header, &[4u8; 16]),
            Err(BitmapError::OtherArray { .. })
        ));
        header[0] = 0;
        assert!(matches!(
            state(&header, &uuid),
            Err(BitmapError::BadMagic { .. })
        ));
    }

    #[test]
    fn header_round_trips_and_checks_its_fields() {
        let uuid = [7u8; 16];
        let mut h = BitmapHeader::new(uuid, 9, 30720, 1 << 20);
        h.events_cleared = 3;
        let mut buf = vec![0xeeu8; 512];
        h.encode(&mut buf);
        assert_eq!(&buf[256..], &[0xeeu8; 256][..], "bits untouched");
        assert_eq!(BitmapHeader::decode(&buf, &uuid), Ok(h.clone()));
        assert_eq!(h.bits(), 15);
        let mut bad = buf.clone();
        bad[4] = 5;
        assert_eq!(
            BitmapHeader::decode(&bad, &uuid),
            Err(BitmapError::Version(5))
        );
        let mut bad = buf.clone();
        bad[52..56].copy_from_slice(&3000u32.to_le_bytes());
        assert_eq!(
            BitmapHeader::decode(&bad, &uuid),
            Err(BitmapError::Chunk(3000))
        );
        let mut bad = buf;
        bad[68] = 2;
        assert_eq!(
            BitmapHeader::decode(&bad, &uuid),
            Err(BitmapError::Clustered(2))
        );
    }

    /// As md_bitmap_read_sb: a header without a clearing period, or with
    /// more write-behind than md's 14-bit counter holds, is refused naming
    /// the field; the same header is never encoded.
    #[test]
    fn a_bitmap_header_without_a_daemon_period_or_with_too_much_write_behind_is_refused() {
        let uuid = [7u8; 16];
        let mut buf = vec![0u8; 512];
        BitmapHeader::new(uuid, 9, 30720, 1 << 20).encode(&mut buf);
        let mut bad = buf.clone();
        bad[56..60].copy_from_slice(&0u32.to_le_bytes());
        let e = BitmapHeader::decode(&bad, &uuid).unwrap_err();
        assert_eq!(e, BitmapError::DaemonSleep);
        assert!(e.to_string().contains("daemon_sleep"), "{e}");
        for (write_behind, ok) in [(WRITE_BEHIND_MAX, true), (WRITE_BEHIND_MAX + 1, false)] {
            let mut h = buf.clone();
            h[60..64].copy_from_slice(&write_behind.to_le_bytes());
            let got = BitmapHeader::decode(&h, &uuid);
            if ok {
                assert_eq!(got.map(|h| h.write_behind), Ok(write_behind));
            } else {
                let e = got.unwrap_err();
                assert_eq!(e, BitmapError::WriteBehind(write_behind));
                assert!(e.to_string().contains("write_behind"), "{e}");
            }
        }
        let mut h = BitmapHeader::new(uuid, 9, 30720, 1 << 20);
        h.daemon_sleep = 0;
        let encoded = std::panic::catch_unwind(move || h.encode(&mut vec![0u8; 512]));
        assert!(encoded.is_err(), "a header md refuses was encoded");
    }

    #[test]
    fn bits_are_little_endian_after_the_header() {
        let mut s = vec![0u8; 4096];
        put_bit(&mut s, 0, true);
        put_bit(&mut s, 15, true);
        assert_eq!(&s[256..258], &[0x01, 0x80]);
        assert!(test_bit(&s, 15) && !test_bit(&s, 14));
        put_bit(&mut s, 0, false);
        assert_eq!(s[256], 0);
    }

    #[test]
    fn default_chunk_and_room_follow_mdadm() {
        // Small members: 4 KiB of room; 64 MiB chunks (as the kernel-made
        // fixture of 15 MiB shows).
        assert_eq!(default_room_bytes(30720), 4096);
        assert_eq!(default_chunk_bytes(15 << 20, 4096), 64 << 20);
        // 4 KiB holds 30720 bits: up to 1.875 TiB at 64 MiB.
        assert_eq!(default_chunk_bytes(1 << 40, 4096), 64 << 20);
        assert_eq!(default_chunk_bytes(4 << 40, 4096), 256 << 20);
        assert_eq!(default_room_bytes(100 << 21), 64 << 10);
        assert_eq!(default_room_bytes(300 << 21), 128 << 10);
        assert_eq!(storage_bytes(15), 4096);
        assert_eq!(storage_bytes(30720), 4096);
        assert_eq!(storage_bytes(30721), 8192);
    }
}
