//! The journal's on-disk format (nvraid's own, version 1; pure encoding, no
//! I/O). docs/on-disk-format.md describes it for readers.
//!
//! Block 0 is the superblock; the rest of the member is a ring of 4 KiB
//! blocks holding records. A record is one header block followed by its
//! payload blocks: the data of the writes it carries, in order. Positions
//! in the ring are *linear* byte counts that only grow; a position's place
//! on the member is `RING_START + linear % ring_bytes`. A record never
//! wraps: when one would run past the end of the ring, a skip record fills
//! the rest of the lap and the record starts the next lap.
//!
//! Every header carries the journal's uuid and a sequence number one above
//! its predecessor's, and a crc32c over the header and the payload, so that
//! replay stops at the first block that is not the record it expects:
//! stale records from an earlier lap, a torn record, or zeros.

use nvraid_metadata::ppl::crc32c_pieces;

/// The unit of the ring and of cached data.
pub const BLOCK_BYTES: usize = 4096;
/// Where the ring starts on the journal member.
pub const RING_START: u64 = BLOCK_BYTES as u64;
/// The superblock's magic.
pub const SUPER_MAGIC: [u8; 8] = *b"NVRJRNL\x01";
/// A record header's magic.
pub const RECORD_MAGIC: [u8; 8] = *b"NVRJREC\x01";
/// The format version this code writes and reads.
pub const VERSION: u32 = 1;
/// The most extents one header lists.
pub const EXTENTS_MAX: usize = (BLOCK_BYTES - EXTENTS_AT) / 16;
/// Where the extent list starts in a header.
const EXTENTS_AT: usize = 64;

/// The journal superblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// This journal's identity; every record carries it.
    pub uuid: [u8; 16],
    /// The uuid of the array whose writes it holds.
    pub array_uuid: [u8; 16],
    /// Bytes of ring after the superblock (a multiple of the block).
    pub ring_bytes: u64,
    /// Linear position of the first record not yet known to be on the
    /// array (replay starts here).
    pub tail: u64,
    /// Sequence number of the record at `tail`.
    pub tail_seq: u64,
}

/// Why a superblock block is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SuperError {
    /// Not a journal at all.
    #[error("no nvraid journal superblock")]
    NotJournal,
    /// A journal of a format this build does not know.
    #[error("journal format version {0}; this nvraid reads version {VERSION}")]
    Version(u32),
    /// The checksum does not match.
    #[error("journal superblock checksum mismatch")]
    Checksum,
    /// The fields contradict each other.
    #[error("journal superblock is inconsistent: {0}")]
    Inconsistent(&'static str),
}

fn put_u32(block: &mut [u8], at: usize, value: u32) {
    block[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

fn put_u64(block: &mut [u8], at: usize, value: u64) {
    block[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

fn get_u32(block: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(block[at..at + 4].try_into().expect("4 bytes"))
}

fn get_u64(block: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(block[at..at + 8].try_into().expect("8 bytes"))
}

// Superblock layout: magic 0..8, version 8..12, block bytes 12..16,
// uuid 16..32, array uuid 32..48, ring bytes 48..56, tail 56..64,
// tail seq 64..72, crc32c 72..76 (over the block with this field zero).
const SUPER_CRC_AT: usize = 72;

impl Superblock {
    /// The superblock as its block.
    pub fn encode(&self) -> Vec<u8> {
        let mut block = vec![0u8; BLOCK_BYTES];
        block[0..8].copy_from_slice(&SUPER_MAGIC);
        put_u32(&mut block, 8, VERSION);
        put_u32(&mut block, 12, BLOCK_BYTES as u32);
        block[16..32].copy_from_slice(&self.uuid);
        block[32..48].copy_from_slice(&self.array_uuid);
        put_u64(&mut block, 48, self.ring_bytes);
        put_u64(&mut block, 56, self.tail);
        put_u64(&mut block, 64, self.tail_seq);
        let crc = crc32c_pieces([&block[..]]);
        put_u32(&mut block, SUPER_CRC_AT, crc);
        block
    }

    /// Reads a superblock block.
    pub fn decode(block: &[u8]) -> Result<Superblock, SuperError> {
        if block.len() < BLOCK_BYTES || block[0..8] != SUPER_MAGIC {
            return Err(SuperError::NotJournal);
        }
        let version = get_u32(block, 8);
        if version != VERSION {
            return Err(SuperError::Version(version));
        }
        let mut copy = block[..BLOCK_BYTES].to_vec();
        put_u32(&mut copy, SUPER_CRC_AT, 0);
        if crc32c_pieces([&copy[..]]) != get_u32(block, SUPER_CRC_AT) {
            return Err(SuperError::Checksum);
        }
        if get_u32(block, 12) as usize != BLOCK_BYTES {
            return Err(SuperError::Inconsistent("block size is not 4096"));
        }
        let superblock = Superblock {
            uuid: block[16..32].try_into().expect("16 bytes"),
            array_uuid: block[32..48].try_into().expect("16 bytes"),
            ring_bytes: get_u64(block, 48),
            tail: get_u64(block, 56),
            tail_seq: get_u64(block, 64),
        };
        if superblock.ring_bytes == 0 || !superblock.ring_bytes.is_multiple_of(BLOCK_BYTES as u64) {
            return Err(SuperError::Inconsistent("ring size"));
        }
        if !superblock.tail.is_multiple_of(BLOCK_BYTES as u64) {
            return Err(SuperError::Inconsistent("tail not block aligned"));
        }
        Ok(superblock)
    }
}

/// What a record is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    /// Writes: extents and their data.
    Data,
    /// Nothing until the end of the lap.
    Skip,
}

/// One write a record carries: `len` bytes at array byte `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub offset: u64,
    pub len: u32,
}

/// A record header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: RecordKind,
    pub seq: u64,
    pub extents: Vec<Extent>,
}

// Header layout: magic 0..8, kind 8..12, extent count 12..16, seq 16..24,
// journal uuid 24..40, payload bytes 40..48, crc32c 48..52 (over the
// header with this field zero, then the payload), extents from 64: offset
// u64, len u32, 4 bytes zero.
const HEADER_CRC_AT: usize = 48;

impl Header {
    /// Payload bytes: the extents' lengths, each rounded up to a block.
    pub fn payload_bytes(&self) -> u64 {
        self.extents
            .iter()
            .map(|e| (e.len as u64).next_multiple_of(BLOCK_BYTES as u64))
            .sum()
    }

    /// The header block for `payload` (its data, `payload_bytes` long),
    /// stamped with the journal `uuid`.
    pub fn encode(&self, uuid: &[u8; 16], payload: &[u8]) -> Vec<u8> {
        assert!(self.extents.len() <= EXTENTS_MAX, "too many extents");
        let mut block = vec![0u8; BLOCK_BYTES];
        block[0..8].copy_from_slice(&RECORD_MAGIC);
        let kind = match self.kind {
            RecordKind::Data => 1,
            RecordKind::Skip => 2,
        };
        put_u32(&mut block, 8, kind);
        put_u32(&mut block, 12, self.extents.len() as u32);
        put_u64(&mut block, 16, self.seq);
        block[24..40].copy_from_slice(uuid);
        put_u64(&mut block, 40, self.payload_bytes());
        for (i, extent) in self.extents.iter().enumerate() {
            let at = EXTENTS_AT + i * 16;
            put_u64(&mut block, at, extent.offset);
            put_u32(&mut block, at + 8, extent.len);
        }
        let crc = crc32c_pieces([&block[..], payload]);
        put_u32(&mut block, HEADER_CRC_AT, crc);
        block
    }

    /// Reads a header block when it is the record `seq` of journal `uuid`;
    /// `None` otherwise. The payload's checksum is checked separately
    /// ([`Header::payload_matches`]) once it has been read.
    pub fn decode(block: &[u8], uuid: &[u8; 16], seq: u64) -> Option<(Header, u32)> {
        if block.len() < BLOCK_BYTES || block[0..8] != RECORD_MAGIC || block[24..40] != uuid[..] {
            return None;
        }
        if get_u64(block, 16) != seq {
            return None;
        }
        let kind = match get_u32(block, 8) {
            1 => RecordKind::Data,
            2 => RecordKind::Skip,
            _ => return None,
        };
        let count = get_u32(block, 12) as usize;
        if count > EXTENTS_MAX {
            return None;
        }
        let extents = (0..count)
            .map(|i| {
                let at = EXTENTS_AT + i * 16;
                Extent {
                    offset: get_u64(block, at),
                    len: get_u32(block, at + 8),
                }
            })
            .collect();
        let header = Header { kind, seq, extents };
        if header.payload_bytes() != get_u64(block, 40) {
            return None;
        }
        Some((header, get_u32(block, HEADER_CRC_AT)))
    }

    /// Whether `crc` (from [`Header::decode`]) covers `header_block` and
    /// `payload`.
    pub fn payload_matches(header_block: &[u8], payload: &[u8], crc: u32) -> bool {
        let mut copy = header_block[..BLOCK_BYTES].to_vec();
        put_u32(&mut copy, HEADER_CRC_AT, 0);
        crc32c_pieces([&copy[..], payload]) == crc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: [u8; 16] = [7; 16];

    #[test]
    fn superblock_round_trips_and_rejects_damage() {
        let sb = Superblock {
            uuid: UUID,
            array_uuid: [9; 16],
            ring_bytes: 1 << 20,
            tail: 8192,
            tail_seq: 42,
        };
        let block = sb.encode();
        assert_eq!(Superblock::decode(&block), Ok(sb));
        let mut bad = block.clone();
        bad[60] ^= 1;
        assert_eq!(Superblock::decode(&bad), Err(SuperError::Checksum));
        assert_eq!(
            Superblock::decode(&[0u8; BLOCK_BYTES]),
            Err(SuperError::NotJournal)
        );
        let mut newer = block;
        put_u32(&mut newer, 8, 2);
        assert_eq!(Superblock::decode(&newer), Err(SuperError::Version(2)));
    }

    #[test]
    fn header_round_trips_and_checks_seq_uuid_and_payload() {
        let header = Header {
            kind: RecordKind::Data,
            seq: 5,
            extents: vec![
                Extent {
                    offset: 4096,
                    len: 4096,
                },
                Extent {
                    offset: 1 << 20,
                    len: 8192,
                },
            ],
        };
        let payload = vec![0xa5u8; header.payload_bytes() as usize];
        let block = header.encode(&UUID, &payload);
        let (decoded, crc) = Header::decode(&block, &UUID, 5).unwrap();
        assert_eq!(decoded, header);
        assert!(Header::payload_matches(&block, &payload, crc));
        let mut torn = payload.clone();
        torn[8191] = 0;
        assert!(!Header::payload_matches(&block, &torn, crc));
        assert!(Header::decode(&block, &UUID, 6).is_none(), "stale seq");
        assert!(
            Header::decode(&block, &[8; 16], 5).is_none(),
            "other journal"
        );
    }
}
