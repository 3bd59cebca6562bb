//! md's RAID 5 partial parity log (PPL): where it lives and what its
//! headers say.
//!
//! PPL closes the RAID 5 write hole without a journal device. Before md
//! writes a stripe that is only partly overwritten, it stores the stripe's
//! *partial parity* on the member that holds the stripe's parity: the XOR of
//! the data blocks the write leaves alone. After a crash the parity of such
//! a stripe is rebuilt as partial parity XOR the blocks that were being
//! written, whatever state those writes reached, so the parity again covers
//! the blocks that were never touched. Full-stripe writes are logged without
//! partial parity: their parity is simply recomputed from the data.
//!
//! **Where.** Each member has its own log area, `ppl.offset` sectors (signed,
//! 16 bits) from the superblock and `ppl.size` sectors long (16 bits). The
//! two fields share the superblock's 4 bytes at offset 96 with
//! `bitmap_offset` (offset in the low half, size in the high half; PPL and a
//! bitmap exclude each other). mdadm creates a v1.2 array with the area
//! right behind the superblock: offset 8, size 2048 (1 MiB), data at 2 MiB
//! or later ([`PplArea::MDADM_V12`], [`mdadm_data_offset_sectors`]).
//!
//! **Feature bits.** mdadm writes `PPL` (0x400). The kernel rewrites it as
//! `MULTIPLE_PPLS` (0x800) on its next superblock update when the area is
//! big enough for a ring of logs (at least 264 KiB; mdadm's 1 MiB is), and
//! refuses a superblock carrying both bits, or either bit with a bitmap or
//! a journal.
//!
//! **The ring.** With `MULTIPLE_PPLS` each log write (one header and the
//! partial parity of its entries, at most [`SPACE_BYTES`] of it) goes right
//! behind the previous one, starting again at the start of the area when the
//! next one would not fit. With `PPL` alone every log write lands at the
//! start of the area. Headers are never erased after their stripes are
//! written: assembly walks the chain from the start of the area, following
//! the headers while their checksums and signatures hold and their
//! generations do not fall, and the last one it reaches is the newest
//! ([`newest`]). If the array was not shut down cleanly, the kernel replays
//! that header's entries, then zeroes the whole area and writes an empty
//! header (generation 0) at its start; mdadm writes the same empty header
//! when it creates the array.
//!
//! Header (4 KiB, little endian):
//!
//! | offset | size | field | meaning |
//! |---|---|---|---|
//! | 0 | 512 | reserved | all `0xff` |
//! | 512 | 4 | signature | crc32c of the array UUID ([`signature_for`]) |
//! | 516 | 4 | padding | 0 |
//! | 520 | 8 | generation | log write sequence number (restarts at 1 per assembly) |
//! | 528 | 4 | entries_count | entries in use, at most [`MAX_ENTRIES`] (148) |
//! | 532 | 4 | checksum | crc32c of the 4096 bytes with this field taken as 0 |
//! | 536 | 24 × 148 | entries | below; unused entries are zero |
//! | 4088 | 8 | – | zero |
//!
//! Entry (24 bytes):
//!
//! | offset | size | field | meaning |
//! |---|---|---|---|
//! | 0 | 8 | data_sector | first array sector (512 bytes) the logged write changes |
//! | 8 | 4 | pp_size | bytes of partial parity (0 for full-stripe writes) |
//! | 12 | 4 | data_size | bytes of data the entry covers, over all data members |
//! | 16 | 4 | parity_disk | role of the member holding the parity (and this log) |
//! | 20 | 4 | checksum | crc32c of the entry's partial parity (0 when there is none) |
//!
//! An entry covers one or more consecutive 4 KiB rows of one stripe that
//! change the same data members: `data_size` is 4 KiB × members written ×
//! rows, `pp_size` 4 KiB × rows (or 0). The partial parity of the entries
//! follows the header directly, in entry order. Every crc32c here is the
//! standard CRC-32C (Castagnoli, reflected, initial value and final XOR all
//! ones: `"123456789"` gives `0xe3069283`).

use crate::features;
use crate::Superblock;

/// A header's length; the partial parity of its entries follows it.
pub const HEADER_BYTES: usize = 4096;
/// The `0xff` bytes that open a header.
pub const RESERVED_BYTES: usize = 512;
/// One entry's length.
pub const ENTRY_BYTES: usize = 24;
/// Entries a header has room for: (4096 - 512 - 24) / 24.
pub const MAX_ENTRIES: usize = 148;
/// The most partial parity one log write holds in a ring of logs (the
/// kernel's PPL_SPACE_SIZE).
pub const SPACE_BYTES: u32 = 128 << 10;
/// A header in 512-byte sectors.
pub const HEADER_SECTORS: u64 = (HEADER_BYTES / 512) as u64;
/// md writes partial parity in pages of this size, one per 4 KiB row.
pub const PAGE_BYTES: u32 = 4096;

const SIGNATURE_AT: usize = 512;
const PADDING_AT: usize = 516;
const GENERATION_AT: usize = 520;
const COUNT_AT: usize = 528;
const CHECKSUM_AT: usize = 532;
const ENTRIES_AT: usize = 536;

/// Why bytes are not a PPL header (or a log area) nvraid can use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PplError {
    #[error("buffer of {0} bytes is too short for a PPL header (4096)")]
    Short(usize),
    #[error("PPL header checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    BadChecksum { stored: u32, computed: u32 },
    #[error(
        "PPL header signature {found:#010x} belongs to another array (expected {expected:#010x})"
    )]
    OtherArray { found: u32, expected: u32 },
    #[error("PPL header lists {0} entries (at most 148 fit)")]
    TooManyEntries(u32),
    #[error("PPL entry {entry}: {field} of {bytes} bytes is not a whole number of sectors")]
    Misaligned {
        entry: usize,
        field: &'static str,
        bytes: u32,
    },
    #[error("PPL entry {entry}: {pp_size} bytes of partial parity for {data_size} bytes of data")]
    ParityExceedsData {
        entry: usize,
        pp_size: u32,
        data_size: u32,
    },
    #[error("PPL entry {entry}: partial parity checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    EntryChecksum {
        entry: usize,
        stored: u32,
        computed: u32,
    },
    #[error("PPL entry {entry}: partial parity of {pp_size} bytes given, {given} bytes read")]
    ParityLength {
        entry: usize,
        pp_size: u32,
        given: usize,
    },
    #[error("PPL entry {entry}: partial parity ends at byte {end} of a {area} byte log area")]
    OutsideArea { entry: usize, end: u64, area: u64 },
    #[error("PPL header at sector {offset_sectors} of the log area: {reason}")]
    At {
        offset_sectors: u64,
        reason: Box<PplError>,
    },
    #[error("feature_map {0:#x}: a PPL bit with a second PPL bit, a bitmap or a journal (the kernel refuses it)")]
    Features(u32),
    #[error("PPL area of {0} sectors cannot hold a header and one page of partial parity")]
    AreaTooSmall(u16),
    #[error("PPL area (offset {offset} sectors, {sectors} sectors) overlaps the superblock")]
    OverlapsSuperblock { offset: i16, sectors: u64 },
    #[error("PPL area (device sectors {start}..{end}) overlaps the data area")]
    OverlapsData { start: u64, end: u64 },
    #[error("PPL area starts before the start of the device")]
    BeforeDevice,
}

// ---------------------------------------------------------------- crc32c

/// The standard CRC-32C of `data` (what iSCSI, ext4 and md's PPL use).
/// The `crc32c` crate computes it with the CPU's CRC32 instruction where
/// there is one (SSE 4.2): every logged write checksums its header and its
/// partial parity, so a table-driven CRC showed as a fifth of the CPU of
/// 4 KiB random writes to a PPL array.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// The standard CRC-32C of several pieces taken as one run of bytes.
pub fn crc32c_pieces<'a>(pieces: impl IntoIterator<Item = &'a [u8]>) -> u32 {
    pieces.into_iter().fold(0, crc32c::crc32c_append)
}

/// The signature every PPL header of the array `set_uuid` carries: the
/// crc32c of the 16 UUID bytes as the superblock stores them.
pub fn signature_for(set_uuid: &[u8; 16]) -> u32 {
    crc32c(set_uuid)
}

/// A header's checksum: crc32c of its 4096 bytes, the checksum field taken
/// as zero.
pub fn header_checksum(header: &[u8]) -> u32 {
    let h = &header[..HEADER_BYTES];
    crc32c_pieces([&h[..CHECKSUM_AT], &[0u8; 4][..], &h[CHECKSUM_AT + 4..]])
}

// ---------------------------------------------------------------- header

/// One logged write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PplEntry {
    /// The first array sector (512 bytes, counted in the array's own
    /// address space) of the data the entry covers.
    pub data_sector: u64,
    /// Bytes of partial parity stored for this entry (4 KiB per row; 0 for
    /// a full-stripe write).
    pub pp_size: u32,
    /// Bytes of data the entry covers (4 KiB × data members written × rows).
    pub data_size: u32,
    /// Role of the member holding the stripe's parity, whose log this is.
    pub parity_disk: u32,
    /// crc32c of the entry's partial parity (0 when `pp_size` is 0).
    pub checksum: u32,
}

impl PplEntry {
    /// An entry for `data_size` bytes of data from `data_sector` with
    /// `partial_parity` (empty for a full-stripe write); the checksum is
    /// computed.
    pub fn new(data_sector: u64, data_size: u32, parity_disk: u32, partial_parity: &[u8]) -> Self {
        PplEntry {
            data_sector,
            pp_size: u32::try_from(partial_parity.len()).expect("partial parity under 4 GiB"),
            data_size,
            parity_disk,
            checksum: crc32c(partial_parity),
        }
    }

    /// Sectors of partial parity the entry occupies in the log.
    pub fn pp_sectors(&self) -> u64 {
        u64::from(self.pp_size) / 512
    }

    /// Check `partial_parity` (this entry's `pp_size` bytes, as read from
    /// the log) against the entry's checksum. `index` names the entry in
    /// the error.
    pub fn verify(&self, index: usize, partial_parity: &[u8]) -> Result<(), PplError> {
        if partial_parity.len() != self.pp_size as usize {
            return Err(PplError::ParityLength {
                entry: index,
                pp_size: self.pp_size,
                given: partial_parity.len(),
            });
        }
        let computed = crc32c(partial_parity);
        if computed != self.checksum {
            return Err(PplError::EntryChecksum {
                entry: index,
                stored: self.checksum,
                computed,
            });
        }
        Ok(())
    }

    fn decode(b: &[u8]) -> Self {
        PplEntry {
            data_sector: le64(b, 0),
            pp_size: le32(b, 8),
            data_size: le32(b, 12),
            parity_disk: le32(b, 16),
            checksum: le32(b, 20),
        }
    }

    fn encode(&self, b: &mut [u8]) {
        b[0..8].copy_from_slice(&self.data_sector.to_le_bytes());
        b[8..12].copy_from_slice(&self.pp_size.to_le_bytes());
        b[12..16].copy_from_slice(&self.data_size.to_le_bytes());
        b[16..20].copy_from_slice(&self.parity_disk.to_le_bytes());
        b[20..24].copy_from_slice(&self.checksum.to_le_bytes());
    }
}

/// A decoded PPL header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PplHeader {
    /// [`signature_for`] the array's UUID.
    pub signature: u32,
    /// The log write's sequence number; 0 for the empty header mdadm and
    /// the kernel write at the start of the area.
    pub generation: u64,
    /// At most [`MAX_ENTRIES`].
    pub entries: Vec<PplEntry>,
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The limits every entry keeps, whether read or about to be written: sizes
/// in whole sectors (md reads them as sector counts) and no more partial
/// parity than data.
fn check_entries(entries: &[PplEntry]) -> Result<(), PplError> {
    if entries.len() > MAX_ENTRIES {
        return Err(PplError::TooManyEntries(
            u32::try_from(entries.len()).unwrap_or(u32::MAX),
        ));
    }
    for (i, e) in entries.iter().enumerate() {
        for (field, bytes) in [("pp_size", e.pp_size), ("data_size", e.data_size)] {
            if bytes % 512 != 0 {
                return Err(PplError::Misaligned {
                    entry: i,
                    field,
                    bytes,
                });
            }
        }
        if e.pp_size > e.data_size {
            return Err(PplError::ParityExceedsData {
                entry: i,
                pp_size: e.pp_size,
                data_size: e.data_size,
            });
        }
    }
    Ok(())
}

impl PplHeader {
    /// The empty header mdadm writes at creation and the kernel writes at
    /// the start of the area on every assembly: generation 0, no entries.
    pub fn empty(set_uuid: &[u8; 16]) -> Self {
        PplHeader {
            signature: signature_for(set_uuid),
            generation: 0,
            entries: Vec::new(),
        }
    }

    /// Decode and check a header that must belong to the array `set_uuid`.
    pub fn decode(bytes: &[u8], set_uuid: &[u8; 16]) -> Result<Self, PplError> {
        Self::decode_with_signature(bytes, signature_for(set_uuid))
    }

    /// Decode and check a header that must carry `signature` (for logs whose
    /// signature is not derived from an md UUID).
    ///
    /// Checked, in order: length, checksum, signature, entry count, each
    /// used entry (sizes in whole sectors, partial parity no larger than the
    /// data). The reserved bytes, the padding and the unused entries are
    /// covered by the checksum but not otherwise checked (md does not check
    /// them either); [`PplHeader::encode`] writes them as md does.
    pub fn decode_with_signature(bytes: &[u8], signature: u32) -> Result<Self, PplError> {
        if bytes.len() < HEADER_BYTES {
            return Err(PplError::Short(bytes.len()));
        }
        let b = &bytes[..HEADER_BYTES];
        let stored = le32(b, CHECKSUM_AT);
        let computed = header_checksum(b);
        if stored != computed {
            return Err(PplError::BadChecksum { stored, computed });
        }
        let found = le32(b, SIGNATURE_AT);
        if found != signature {
            return Err(PplError::OtherArray {
                found,
                expected: signature,
            });
        }
        let count = le32(b, COUNT_AT);
        if count as usize > MAX_ENTRIES {
            return Err(PplError::TooManyEntries(count));
        }
        let entries: Vec<PplEntry> = b[ENTRIES_AT..]
            .chunks_exact(ENTRY_BYTES)
            .take(count as usize)
            .map(PplEntry::decode)
            .collect();
        check_entries(&entries)?;
        Ok(PplHeader {
            signature: found,
            generation: le64(b, GENERATION_AT),
            entries,
        })
    }

    /// Write the header into `out[..4096]` as md writes it (reserved bytes
    /// `0xff`, everything unused zero, checksum computed); the rest of `out`
    /// is untouched. The bytes read back as `self`, field by field
    /// (asserted, in release builds too).
    pub fn encode(&self, out: &mut [u8]) -> Result<(), PplError> {
        if out.len() < HEADER_BYTES {
            return Err(PplError::Short(out.len()));
        }
        check_entries(&self.entries)?;
        let h = &mut out[..HEADER_BYTES];
        h.fill(0);
        h[..RESERVED_BYTES].fill(0xff);
        h[SIGNATURE_AT..PADDING_AT].copy_from_slice(&self.signature.to_le_bytes());
        h[GENERATION_AT..COUNT_AT].copy_from_slice(&self.generation.to_le_bytes());
        let count = self.entries.len() as u32;
        h[COUNT_AT..CHECKSUM_AT].copy_from_slice(&count.to_le_bytes());
        for (e, slot) in self
            .entries
            .iter()
            .zip(h[ENTRIES_AT..].chunks_exact_mut(ENTRY_BYTES))
        {
            e.encode(slot);
        }
        let csum = header_checksum(h);
        h[CHECKSUM_AT..CHECKSUM_AT + 4].copy_from_slice(&csum.to_le_bytes());
        // Paired with the decoder, field by field (a log write is on the
        // data path: no allocation here, as a whole decode would make).
        assert_eq!(
            header_checksum(h),
            le32(h, CHECKSUM_AT),
            "PPL header checksum"
        );
        assert_eq!(
            le32(h, SIGNATURE_AT),
            self.signature,
            "PPL header signature"
        );
        assert_eq!(
            le64(h, GENERATION_AT),
            self.generation,
            "PPL header generation"
        );
        assert_eq!(le32(h, COUNT_AT), count, "PPL header entry count");
        for (e, slot) in self
            .entries
            .iter()
            .zip(h[ENTRIES_AT..].chunks_exact(ENTRY_BYTES))
        {
            assert_eq!(&PplEntry::decode(slot), e, "PPL header entry");
        }
        Ok(())
    }

    /// Bytes of partial parity behind the header.
    pub fn pp_bytes(&self) -> u64 {
        self.entries.iter().map(|e| u64::from(e.pp_size)).sum()
    }

    /// Sectors the log write occupies: the header and its partial parity.
    pub fn sectors(&self) -> u64 {
        HEADER_SECTORS + self.entries.iter().map(PplEntry::pp_sectors).sum::<u64>()
    }
}

// ---------------------------------------------------------------- the area

/// A member's log area, as its superblock records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PplArea {
    /// Sectors from the superblock to the start of the area (signed).
    pub offset_sectors: i16,
    /// Sectors reserved for the area.
    pub size_sectors: u16,
}

/// mdadm's MULTIPLE_PPL_AREA_SIZE_SUPER1: the area it reserves, 1 MiB.
pub const MDADM_AREA_SECTORS: u16 = 2048;

/// The mdadm (4.2) rule for the data offset of a new v1.2 array with PPL,
/// in sectors, on a member of `dev_sectors` sectors with chunks of
/// `chunk_sectors`: room for 12 KiB of superblock and bad-block log, the
/// 1 MiB area and a reshape headroom (128 MiB, halved while it is more than
/// a thousandth of the member and at least four chunks), rounded up to
/// 1 MiB. 16 MiB members with 64 KiB chunks get 2 MiB; from 128 GiB on it is
/// always 130 MiB.
pub fn mdadm_data_offset_sectors(dev_sectors: u64, chunk_sectors: u32) -> u64 {
    let mut headroom: u64 = 128 << 11;
    while (headroom << 10) > dev_sectors
        && (chunk_sectors == 0 || headroom / 2 >= 2 * u64::from(chunk_sectors))
    {
        headroom >>= 1;
    }
    (24 + u64::from(MDADM_AREA_SECTORS) + headroom).div_ceil(2048) * 2048
}

impl PplArea {
    /// Where mdadm (4.2, `write_init_super1`) puts the area of a v1.2
    /// array: right behind the superblock (8 sectors from it, device sector
    /// 16), 1 MiB long. mdadm's bad-block log follows it (2056 sectors from
    /// the superblock, 8 sectors) when the data offset leaves room, and the
    /// data starts at [`mdadm_data_offset_sectors`] (2 MiB or more, never
    /// the 1 MiB of an array without PPL). A v1.0 superblock (at the end)
    /// gets the area in front of it, at offset -(2048 + 8).
    pub const MDADM_V12: PplArea = PplArea {
        offset_sectors: 8,
        size_sectors: MDADM_AREA_SECTORS,
    };

    /// Split the superblock word at offset 96 (`Superblock::bitmap_offset`
    /// as decoded) into the PPL offset (low half) and size (high half).
    pub fn from_raw(word: u32) -> Self {
        PplArea {
            offset_sectors: (word & 0xffff) as u16 as i16,
            size_sectors: (word >> 16) as u16,
        }
    }

    /// The superblock word at offset 96 for this area.
    pub fn to_raw(self) -> u32 {
        u32::from(self.offset_sectors as u16) | (u32::from(self.size_sectors) << 16)
    }

    /// The area of a member, if its superblock has PPL, checked as the
    /// kernel checks it when the array starts (`super_1_validate`,
    /// `ppl_validate_rdev`): one PPL bit only, no bitmap or journal beside
    /// it, room for a header and a page of partial parity, no overlap with
    /// the superblock or the data.
    pub fn from_superblock(sb: &Superblock) -> Result<Option<Self>, PplError> {
        let map = sb.feature_map;
        let ppl_bits = map & (features::PPL | features::MULTIPLE_PPLS);
        if ppl_bits == 0 {
            return Ok(None);
        }
        if ppl_bits == features::PPL | features::MULTIPLE_PPLS
            || map & (features::BITMAP_OFFSET | features::JOURNAL) != 0
        {
            return Err(PplError::Features(map));
        }
        let area = PplArea::from_raw(sb.bitmap_offset);
        let usable = area.usable_sectors();
        if usable <= HEADER_SECTORS {
            return Err(PplError::AreaTooSmall(area.size_sectors));
        }
        let sb_sectors = (sb.encoded_len() as u64).div_ceil(512);
        let offset = i64::from(area.offset_sectors);
        if (offset > 0 && (offset as u64) < sb_sectors)
            || (offset <= 0 && offset + usable as i64 > 0)
        {
            return Err(PplError::OverlapsSuperblock {
                offset: area.offset_sectors,
                sectors: usable,
            });
        }
        let start = area
            .start_sector(sb.super_offset_sectors)
            .ok_or(PplError::BeforeDevice)?;
        let end = start + usable;
        let data = sb.data_offset_sectors;
        let data_end = data.saturating_add(sb.data_size_sectors);
        if (start < data && end > data) || (start >= data && data_end > start) {
            return Err(PplError::OverlapsData { start, end });
        }
        Ok(Some(area))
    }

    /// Device sector where the area starts, for a superblock at
    /// `super_offset_sectors` (None if that is before the device start).
    pub fn start_sector(&self, super_offset_sectors: u64) -> Option<u64> {
        let start = i128::from(super_offset_sectors) + i128::from(self.offset_sectors);
        u64::try_from(start).ok()
    }

    /// The sectors the kernel uses: a header and the largest whole number
    /// of 4 KiB pages behind it that fits (`ppl_validate_rdev` rounds the
    /// recorded size down so).
    pub fn usable_sectors(&self) -> u64 {
        let size = u64::from(self.size_sectors);
        if size <= HEADER_SECTORS {
            return size;
        }
        HEADER_SECTORS + (size - HEADER_SECTORS) / 8 * 8
    }

    /// Whether the kernel keeps a ring of log writes here (an area of at
    /// least two full log writes: 2 × (4 KiB + 128 KiB)); it then records
    /// MULTIPLE_PPLS. Otherwise every log write goes to the area's start.
    pub fn is_ring(&self) -> bool {
        self.usable_sectors() * 512 >= 2 * (HEADER_BYTES as u64 + u64::from(SPACE_BYTES))
    }

    /// The most partial parity one log write may hold in this area.
    pub fn entry_space_bytes(&self) -> u64 {
        if self.is_ring() {
            u64::from(SPACE_BYTES)
        } else {
            (self.usable_sectors() * 512).saturating_sub(HEADER_BYTES as u64)
        }
    }
}

// ---------------------------------------------------------------- the log

/// A header found in a log area.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedHeader {
    /// Sectors from the start of the area to the header.
    pub offset_sectors: u64,
    pub header: PplHeader,
}

impl LoggedHeader {
    /// Byte range of entry `index`'s partial parity within the area.
    fn pp_range(&self, index: usize) -> (u64, u64) {
        let before: u64 = self.header.entries[..index]
            .iter()
            .map(|e| u64::from(e.pp_size))
            .sum();
        let start = self.offset_sectors * 512 + HEADER_BYTES as u64 + before;
        (start, start + u64::from(self.header.entries[index].pp_size))
    }

    /// The partial parity of every entry, as slices of `area` (the bytes
    /// of the log area the header was found in), checked against each
    /// entry's checksum. An entry whose partial parity would run past the
    /// area is an error; so is a checksum mismatch (the kernel skips such
    /// an entry and then resyncs the array instead of trusting the log).
    pub fn partial_parity<'a>(&self, area: &'a [u8]) -> Result<Vec<&'a [u8]>, PplError> {
        let mut out = Vec::with_capacity(self.header.entries.len());
        for (i, e) in self.header.entries.iter().enumerate() {
            let (start, end) = self.pp_range(i);
            if end > area.len() as u64 {
                return Err(PplError::OutsideArea {
                    entry: i,
                    end,
                    area: area.len() as u64,
                });
            }
            let pp = &area[start as usize..end as usize];
            e.verify(i, pp)?;
            out.push(pp);
        }
        Ok(out)
    }
}

/// Every header of the chain in `area` (the bytes of one member's log area,
/// [`PplArea::usable_sectors`] long), oldest first, found as the kernel's
/// `ppl_load_distributed` finds them: from the start of the area, a header
/// follows the previous one's partial parity; the walk stops at the first
/// place that holds no header of this array (checksum or signature wrong),
/// at a header whose generation is lower than the previous one's (an older
/// lap of the ring), or when no header fits before the end of the area.
///
/// A header with a good checksum and signature whose entries break the
/// limits [`PplHeader::decode`] checks is an error, not the end of the
/// chain: md wrote it, and nvraid must not guess what it meant.
pub fn chain(area: &[u8], set_uuid: &[u8; 16]) -> Result<Vec<LoggedHeader>, PplError> {
    let signature = signature_for(set_uuid);
    let sectors = (area.len() / 512) as u64;
    let mut found: Vec<LoggedHeader> = Vec::new();
    let mut offset = 0u64;
    while offset + HEADER_SECTORS < sectors {
        let at = (offset * 512) as usize;
        let header = match PplHeader::decode_with_signature(&area[at..], signature) {
            Ok(h) => h,
            Err(PplError::BadChecksum { .. } | PplError::OtherArray { .. }) => break,
            Err(e) => {
                return Err(PplError::At {
                    offset_sectors: offset,
                    reason: Box::new(e),
                })
            }
        };
        if found
            .last()
            .is_some_and(|prev| prev.header.generation > header.generation)
        {
            break;
        }
        let next = offset + header.sectors();
        found.push(LoggedHeader {
            offset_sectors: offset,
            header,
        });
        offset = next;
    }
    Ok(found)
}

/// The newest header in `area` (the last of [`chain`]), or None when the
/// area holds no header of this array at its start (the kernel then counts
/// a mismatch and does not trust the log of this member).
pub fn newest(area: &[u8], set_uuid: &[u8; 16]) -> Result<Option<LoggedHeader>, PplError> {
    Ok(chain(area, set_uuid)?.pop())
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: [u8; 16] = [
        0x18, 0x45, 0xae, 0xd2, 0xa8, 0x55, 0x8d, 0x47, 0xf2, 0x04, 0xc5, 0xbd, 0x48, 0x55, 0x1b,
        0x11,
    ];

    fn sample() -> PplHeader {
        let pp = vec![0x5au8; 8192];
        PplHeader {
            signature: signature_for(&UUID),
            generation: 107,
            entries: vec![
                PplEntry::new(560, 8192, 0, &pp),
                PplEntry::new(1280, 131072, 0, &[]),
            ],
        }
    }

    #[test]
    fn crc32c_matches_the_standard_check_values() {
        // The catalogue check value of CRC-32C.
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(b""), 0);
        // RFC 3720 (iSCSI) B.4 test vectors.
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62a8_ab43);
        let ascending: Vec<u8> = (0u8..32).collect();
        assert_eq!(crc32c(&ascending), 0x46dd_794e);
        let descending: Vec<u8> = (0u8..32).rev().collect();
        assert_eq!(crc32c(&descending), 0x113f_db5c);
        // Every split point gives the same value as one run (the 8-byte
        // path and the byte path agree).
        let data: Vec<u8> = (0..100u32).map(|i| (i * 37 + 11) as u8).collect();
        let whole = crc32c(&data);
        for cut in 0..data.len() {
            assert_eq!(
                crc32c_pieces([&data[..cut], &data[cut..]]),
                whole,
                "cut {cut}"
            );
        }
    }

    #[test]
    fn header_round_trips_in_md_form() {
        let h = sample();
        let mut buf = vec![0xeeu8; 4100];
        h.encode(&mut buf).unwrap();
        assert_eq!(&buf[4096..], &[0xee; 4], "bytes past the header untouched");
        assert!(buf[..512].iter().all(|&b| b == 0xff), "reserved bytes");
        assert_eq!(&buf[512..516], &signature_for(&UUID).to_le_bytes());
        assert_eq!(&buf[516..520], &[0; 4], "padding");
        assert_eq!(le64(&buf, 520), 107);
        assert_eq!(le32(&buf, 528), 2);
        assert_eq!(le64(&buf, 536), 560, "first entry's data_sector");
        assert_eq!(le32(&buf, 544), 8192, "first entry's pp_size");
        assert_eq!(
            le32(&buf, 536 + 24 + 8),
            0,
            "second entry: no partial parity"
        );
        assert_eq!(le32(&buf, 536 + 24 + 20), 0, "... and checksum 0");
        assert!(
            buf[536 + 48..4096].iter().all(|&b| b == 0),
            "unused entries"
        );
        assert_eq!(le32(&buf, 532), header_checksum(&buf));
        assert_eq!(PplHeader::decode(&buf, &UUID), Ok(h.clone()));
        assert_eq!(h.pp_bytes(), 8192);
        assert_eq!(h.sectors(), 8 + 16);

        let empty = PplHeader::empty(&UUID);
        empty.encode(&mut buf).unwrap();
        assert_eq!(PplHeader::decode(&buf, &UUID), Ok(empty));
    }

    #[test]
    fn corruption_is_detected() {
        let mut buf = vec![0u8; 4096];
        sample().encode(&mut buf).unwrap();
        for at in [0usize, 511, 512, 520, 536, 2000, 4095] {
            let mut bad = buf.clone();
            bad[at] ^= 0x10;
            assert!(
                matches!(
                    PplHeader::decode(&bad, &UUID),
                    Err(PplError::BadChecksum { .. })
                ),
                "byte {at}"
            );
        }
        assert!(matches!(
            PplHeader::decode(&buf[..4095], &UUID),
            Err(PplError::Short(4095))
        ));
    }

    #[test]
    fn another_arrays_header_is_refused() {
        let mut buf = vec![0u8; 4096];
        sample().encode(&mut buf).unwrap();
        let mut other = UUID;
        other[15] ^= 1;
        assert_eq!(
            PplHeader::decode(&buf, &other),
            Err(PplError::OtherArray {
                found: signature_for(&UUID),
                expected: signature_for(&other),
            })
        );
    }

    /// Re-seal a header after editing it, so only the edit is judged.
    fn resealed(buf: &[u8], edit: impl Fn(&mut [u8])) -> Vec<u8> {
        let mut b = buf.to_vec();
        edit(&mut b);
        let c = header_checksum(&b);
        b[CHECKSUM_AT..CHECKSUM_AT + 4].copy_from_slice(&c.to_le_bytes());
        b
    }

    #[test]
    fn lengths_from_disk_are_bounded() {
        let mut buf = vec![0u8; 4096];
        sample().encode(&mut buf).unwrap();
        for count in [149u32, 1000, u32::MAX] {
            let bad = resealed(&buf, |b| b[528..532].copy_from_slice(&count.to_le_bytes()));
            assert_eq!(
                PplHeader::decode(&bad, &UUID),
                Err(PplError::TooManyEntries(count))
            );
        }
        // 148 entries fit exactly (zero entries are valid).
        let full = resealed(&buf, |b| b[528..532].copy_from_slice(&148u32.to_le_bytes()));
        assert_eq!(PplHeader::decode(&full, &UUID).unwrap().entries.len(), 148);
        let bad = resealed(&buf, |b| b[544..548].copy_from_slice(&100u32.to_le_bytes()));
        assert!(matches!(
            PplHeader::decode(&bad, &UUID),
            Err(PplError::Misaligned {
                entry: 0,
                field: "pp_size",
                ..
            })
        ));
        let bad = resealed(&buf, |b| {
            b[544..548].copy_from_slice(&(1u32 << 20).to_le_bytes())
        });
        assert!(matches!(
            PplHeader::decode(&bad, &UUID),
            Err(PplError::ParityExceedsData { entry: 0, .. })
        ));
        let mut too_many = sample();
        too_many.entries = vec![too_many.entries[1]; 149];
        assert_eq!(
            too_many.encode(&mut buf),
            Err(PplError::TooManyEntries(149))
        );
    }

    #[test]
    fn entry_checksums_cover_the_partial_parity() {
        let pp: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
        let e = PplEntry::new(8, 4096, 2, &pp);
        assert_eq!(e.checksum, crc32c(&pp));
        assert_eq!(e.verify(3, &pp), Ok(()));
        let mut bad = pp.clone();
        bad[4000] ^= 1;
        assert!(matches!(
            e.verify(3, &bad),
            Err(PplError::EntryChecksum { entry: 3, .. })
        ));
        assert!(matches!(
            e.verify(3, &pp[..512]),
            Err(PplError::ParityLength { .. })
        ));
        assert_eq!(PplEntry::new(8, 8192, 2, &[]).checksum, 0);
    }

    /// A ring of three log writes, then a stale header of an older lap: the
    /// walk stops at the stale one, and the partial parity is where the
    /// entries say.
    #[test]
    fn chain_walks_the_ring_like_the_kernel() {
        let area_sectors = 2048usize;
        let mut area = vec![0u8; area_sectors * 512];
        let mut at = 0usize;
        let mut put = |gen: u64, pps: &[Vec<u8>], area: &mut Vec<u8>| {
            let h = PplHeader {
                signature: signature_for(&UUID),
                generation: gen,
                entries: pps
                    .iter()
                    .enumerate()
                    .map(|(i, pp)| PplEntry::new(i as u64 * 8, pp.len().max(4096) as u32, 1, pp))
                    .collect(),
            };
            h.encode(&mut area[at..]).unwrap();
            let mut p = at + 4096;
            for pp in pps {
                area[p..p + pp.len()].copy_from_slice(pp);
                p += pp.len();
            }
            let start = at;
            at = p;
            start
        };
        put(3, &[vec![1u8; 4096]], &mut area);
        put(5, &[vec![], vec![2u8; 8192]], &mut area);
        let third = put(9, &[vec![3u8; 4096], vec![4u8; 4096]], &mut area);
        // An older lap's header exactly where the next would go.
        put(2, &[], &mut area);
        let walked = chain(&area, &UUID).unwrap();
        let gens: Vec<u64> = walked.iter().map(|l| l.header.generation).collect();
        assert_eq!(gens, vec![3, 5, 9]);
        let last = newest(&area, &UUID).unwrap().unwrap();
        assert_eq!(last.offset_sectors as usize * 512, third);
        let pp = last.partial_parity(&area).unwrap();
        assert_eq!(pp, vec![&[3u8; 4096][..], &[4u8; 4096][..]]);
        // A corrupted page of partial parity is caught by its entry.
        let mut bad = area.clone();
        bad[third + 4096 + 4096 + 7] ^= 1;
        assert!(matches!(
            last.partial_parity(&bad),
            Err(PplError::EntryChecksum { entry: 1, .. })
        ));
        // Partial parity that would run past the area is refused.
        assert!(matches!(
            last.partial_parity(&area[..third + 4096 + 4096]),
            Err(PplError::OutsideArea { entry: 1, .. })
        ));
        // A zeroed area holds no header; another array's log is not ours.
        assert_eq!(newest(&vec![0u8; 1 << 20], &UUID), Ok(None));
        assert_eq!(newest(&area, &[9u8; 16]), Ok(None));
        // A sealed header with an impossible entry count is an error.
        let mut broken = area.clone();
        let sealed = resealed(&broken[third..third + 4096], |b| {
            b[528..532].copy_from_slice(&500u32.to_le_bytes())
        });
        broken[third..third + 4096].copy_from_slice(&sealed);
        assert!(matches!(
            chain(&broken, &UUID),
            Err(PplError::At { reason, .. }) if *reason == PplError::TooManyEntries(500)
        ));
    }

    #[test]
    fn area_placement_follows_mdadm_and_the_kernel() {
        let a = PplArea::MDADM_V12;
        assert_eq!(a.to_raw(), 0x0800_0008);
        assert_eq!(PplArea::from_raw(0x0800_0008), a);
        // v1.0: in front of a superblock at the end of the device.
        let v10 = PplArea::from_raw(
            PplArea {
                offset_sectors: -2056,
                size_sectors: 2048,
            }
            .to_raw(),
        );
        assert_eq!(v10.offset_sectors, -2056);
        assert_eq!(v10.start_sector(100_000), Some(100_000 - 2056));
        assert_eq!(v10.start_sector(2000), None);
        assert_eq!(a.start_sector(8), Some(16));
        assert_eq!(a.usable_sectors(), 2048);
        assert!(a.is_ring());
        assert_eq!(a.entry_space_bytes(), 128 << 10);
        // Rounded down to whole pages behind the header.
        let odd = PplArea {
            offset_sectors: 8,
            size_sectors: 300,
        };
        assert_eq!(odd.usable_sectors(), 8 + 288);
        assert!(!odd.is_ring());
        assert_eq!(odd.entry_space_bytes(), 288 * 512);
        // The ring needs two full log writes: 528 sectors.
        assert!(PplArea {
            offset_sectors: 8,
            size_sectors: 528
        }
        .is_ring());
        assert!(!PplArea {
            offset_sectors: 8,
            size_sectors: 527
        }
        .is_ring());
        // mdadm's data offsets: 2 MiB for the 16 MiB fixture members, and
        // 130 MiB once the headroom reaches its 128 MiB cap.
        assert_eq!(mdadm_data_offset_sectors(32768, 128), 4096);
        assert_eq!(mdadm_data_offset_sectors(1 << 31, 1024), 266_240);
        assert_eq!(mdadm_data_offset_sectors(4 << 21, 1024), 12288);
    }
}
