//! md's RAID 4/5/6 write journal ("raid5-cache"): the log on a journal member.
//!
//! A journal member holds a ring of *io units* in its data area (from the
//! member's `data_offset`, `data_size` sectors rounded down to whole pages).
//! Each unit is one 4 KiB meta block followed by the pages it describes, in
//! the order of its payloads; a page that would pass the end of the ring
//! continues at its start. Positions are sectors from the start of the data
//! area. The member's superblock keeps `journal_tail` (the field md shares
//! with `recovery_offset`): the position of the oldest meta block whose
//! stripes may not be on the array's members yet. Recovery reads units from
//! there while each one is valid and carries the next sequence number.
//!
//! Meta block (little-endian, byte offsets):
//!
//! | offset | size | field | meaning |
//! |---|---|---|---|
//! | 0 | 4 | magic | `0x6433c509` |
//! | 4 | 4 | checksum | see below, with this field taken as 0 |
//! | 8 | 1 | version | 1 |
//! | 9 | 3 | padding | 0 |
//! | 12 | 4 | meta_size | bytes of the block in use (header and payloads) |
//! | 16 | 8 | seq | sequence number, one more than the previous unit's |
//! | 24 | 8 | position | where this block is, in sectors of the ring |
//! | 32 | … | payloads | back to back up to `meta_size` |
//!
//! Payloads start with `type` (le16: 0 data, 1 parity, 2 flush) and `flags`
//! (le16). A data or parity payload then has `size` (le32, sectors of pages
//! that follow the block), `location` (le64) and one le32 checksum per page.
//! A data payload's location is the *array* sector of its one page; a parity
//! payload's is the stripe's sector on the members, and its pages are P, and
//! Q on RAID 6. A flush payload has `size` (le32, bytes) and that many bytes
//! of le64 stripe sectors whose cached data reached the members.
//!
//! **Checksums** are CRC-32C as md computes them: a register seeded with a
//! value and no final inversion. The seed of every checksum in a log is
//! `~crc32c(set_uuid)` (the register after the 16 UUID bytes, starting from
//! all ones); a meta block's checksum covers the whole 4 KiB block, a page's
//! its 4096 bytes. In terms of the standard CRC-32C (which inverts at both
//! ends): `md_crc(seed, bytes) = !crc32c_append(!seed, bytes)`.

/// Meta block magic.
pub const MAGIC: u32 = 0x6433_c509;
/// Meta block version.
pub const VERSION: u8 = 1;
/// A meta block and every page are 4 KiB.
pub const PAGE_BYTES: usize = 4096;
/// Sectors of a page.
pub const PAGE_SECTORS: u64 = (PAGE_BYTES / 512) as u64;
/// Bytes of the meta block header before the payloads.
pub const HEADER_BYTES: usize = 32;
/// Bytes of a data or parity payload before its checksums.
pub const DATA_PARITY_BYTES: usize = 16;
/// Bytes of a flush payload before its stripe list.
pub const FLUSH_BYTES: usize = 8;

const TYPE_DATA: u16 = 0;
const TYPE_PARITY: u16 = 1;
const TYPE_FLUSH: u16 = 2;

/// Payload flag: the data payload is a discard (md never writes it today).
pub const FLAG_DISCARD: u16 = 1;

/// Why bytes are not a meta block of this log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    #[error("no meta block (magic {found:#010x}, expected {MAGIC:#010x})")]
    BadMagic { found: u32 },
    #[error("meta block version {0} is not 1")]
    BadVersion(u8),
    #[error("meta block checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    BadChecksum { stored: u32, computed: u32 },
    #[error("meta block says it uses {0} bytes (must be 32..=4096)")]
    BadMetaSize(u32),
    #[error("meta block payload at byte {at} runs past the block's {meta_size} bytes in use")]
    PayloadOverrun { at: usize, meta_size: u32 },
    #[error("meta block payload at byte {at} has unknown type {kind}")]
    UnknownPayload { at: usize, kind: u16 },
    #[error("{what} payload at byte {at} covers {sectors} sectors, not whole pages")]
    BadPayloadSize {
        what: &'static str,
        at: usize,
        sectors: u32,
    },
    #[error("the payloads do not fit one meta block")]
    TooManyPayloads,
    #[error("meta block says it is at sector {position} of the ring, but was read at {read_at}")]
    Misplaced { position: u64, read_at: u64 },
    #[error("buffer of {0} bytes is too short for a meta block")]
    Short(usize),
}

/// md's CRC-32C register update: `seed` in, no inversion at either end.
pub fn md_crc(seed: u32, bytes: &[u8]) -> u32 {
    !crc32c::crc32c_append(!seed, bytes)
}

/// The seed of every checksum in an array's log.
pub fn uuid_checksum(set_uuid: &[u8; 16]) -> u32 {
    md_crc(!0, set_uuid)
}

/// One payload of a meta block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Payload {
    /// One page of data for array sector `location`.
    Data {
        flags: u16,
        location: u64,
        checksum: u32,
    },
    /// The parity pages (P, then Q) of the stripe at member sector `location`.
    Parity {
        flags: u16,
        location: u64,
        checksums: Vec<u32>,
    },
    /// Stripes whose cached data is on the members (write-back mode).
    Flush { flags: u16, stripes: Vec<u64> },
}

impl Payload {
    /// Pages that follow the meta block for this payload.
    pub fn pages(&self) -> usize {
        match self {
            Payload::Data { .. } => 1,
            Payload::Parity { checksums, .. } => checksums.len(),
            Payload::Flush { .. } => 0,
        }
    }

    /// Bytes the payload's entry takes in a meta block.
    pub fn encoded_bytes(&self) -> usize {
        match self {
            Payload::Data { .. } => DATA_PARITY_BYTES + 4,
            Payload::Parity { checksums, .. } => DATA_PARITY_BYTES + 4 * checksums.len(),
            Payload::Flush { stripes, .. } => FLUSH_BYTES + 8 * stripes.len(),
        }
    }
}

/// A decoded meta block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaBlock {
    pub seq: u64,
    pub position: u64,
    pub payloads: Vec<Payload>,
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
}
fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// The checksum a meta block's 4 KiB should carry.
pub fn block_checksum(block: &[u8], seed: u32) -> u32 {
    let mut crc = md_crc(seed, &block[..4]);
    crc = md_crc(crc, &[0; 4]);
    md_crc(crc, &block[8..PAGE_BYTES])
}

impl MetaBlock {
    /// An empty block (md writes one where a log starts over).
    pub fn empty(seq: u64, position: u64) -> Self {
        MetaBlock {
            seq,
            position,
            payloads: Vec::new(),
        }
    }

    /// Bytes of the block in use.
    pub fn meta_size(&self) -> usize {
        HEADER_BYTES
            + self
                .payloads
                .iter()
                .map(Payload::encoded_bytes)
                .sum::<usize>()
    }

    /// Whether one more payload of `pages` checksums still fits.
    pub fn fits(&self, extra: &Payload) -> bool {
        self.meta_size() + extra.encoded_bytes() <= PAGE_BYTES
    }

    /// Pages that follow the block.
    pub fn pages(&self) -> usize {
        self.payloads.iter().map(Payload::pages).sum()
    }

    /// Sectors the unit takes in the ring (block and pages).
    pub fn unit_sectors(&self) -> u64 {
        (1 + self.pages() as u64) * PAGE_SECTORS
    }

    /// Decode 4 KiB, checking magic, version, checksum and payload bounds.
    pub fn decode(bytes: &[u8], seed: u32) -> Result<Self, LogError> {
        if bytes.len() < PAGE_BYTES {
            return Err(LogError::Short(bytes.len()));
        }
        let b = &bytes[..PAGE_BYTES];
        let end = check_header(b, seed)?;
        let mut payloads = Vec::new();
        let mut at = HEADER_BYTES;
        while at < end {
            let (payload, next) = decode_payload(b, at, end)?;
            payloads.push(payload);
            at = next;
        }
        Ok(MetaBlock {
            seq: le64(b, 16),
            position: le64(b, 24),
            payloads,
        })
    }

    /// The parity of a stripe is one page (P) or two (P and Q): anything
    /// else would be written as a block md (and decode) refuses.
    fn check_parity_pages(&self) -> Result<(), LogError> {
        let mut at = HEADER_BYTES;
        for p in &self.payloads {
            if let Payload::Parity { checksums, .. } = p {
                if !(1..=2).contains(&checksums.len()) {
                    return Err(LogError::BadPayloadSize {
                        what: "parity",
                        at,
                        sectors: (checksums.len() as u64 * PAGE_SECTORS) as u32,
                    });
                }
            }
            at += p.encoded_bytes();
        }
        Ok(())
    }

    /// Encode into 4 KiB (bytes past `meta_size` are zero), with its checksum.
    pub fn encode(&self, out: &mut [u8], seed: u32) -> Result<(), LogError> {
        if out.len() < PAGE_BYTES {
            return Err(LogError::Short(out.len()));
        }
        let meta_size = self.meta_size();
        if meta_size > PAGE_BYTES {
            return Err(LogError::TooManyPayloads);
        }
        self.check_parity_pages()?;
        let b = &mut out[..PAGE_BYTES];
        b.fill(0);
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[8] = VERSION;
        b[12..16].copy_from_slice(&(meta_size as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.position.to_le_bytes());
        let mut at = HEADER_BYTES;
        for p in &self.payloads {
            encode_payload(p, &mut b[at..at + p.encoded_bytes()]);
            at += p.encoded_bytes();
        }
        assert_eq!(at, meta_size, "invariant: the payloads fill meta_size");
        let sum = block_checksum(b, seed);
        b[4..8].copy_from_slice(&sum.to_le_bytes());
        // Paired with decode: the block reads back as exactly this one (kept
        // in release builds; one block is written per unit of up to ~200
        // pages, and a block md misreads replays the wrong data).
        assert_eq!(
            MetaBlock::decode(b, seed).as_ref(),
            Ok(self),
            "invariant: an encoded meta block decodes to itself"
        );
        Ok(())
    }
}

/// Writes payload `p` into `b` (its [`Payload::encoded_bytes`]).
fn encode_payload(p: &Payload, b: &mut [u8]) {
    let (kind, flags) = match p {
        Payload::Data { flags, .. } => (TYPE_DATA, *flags),
        Payload::Parity { flags, .. } => (TYPE_PARITY, *flags),
        Payload::Flush { flags, .. } => (TYPE_FLUSH, *flags),
    };
    b[0..2].copy_from_slice(&kind.to_le_bytes());
    b[2..4].copy_from_slice(&flags.to_le_bytes());
    match p {
        Payload::Data {
            location, checksum, ..
        } => {
            b[4..8].copy_from_slice(&(PAGE_SECTORS as u32).to_le_bytes());
            b[8..16].copy_from_slice(&location.to_le_bytes());
            b[16..20].copy_from_slice(&checksum.to_le_bytes());
        }
        Payload::Parity {
            location,
            checksums,
            ..
        } => {
            let sectors = PAGE_SECTORS as u32 * checksums.len() as u32;
            b[4..8].copy_from_slice(&sectors.to_le_bytes());
            b[8..16].copy_from_slice(&location.to_le_bytes());
            for (i, c) in checksums.iter().enumerate() {
                let o = DATA_PARITY_BYTES + 4 * i;
                b[o..o + 4].copy_from_slice(&c.to_le_bytes());
            }
        }
        Payload::Flush { stripes, .. } => {
            b[4..8].copy_from_slice(&(8 * stripes.len() as u32).to_le_bytes());
            for (i, s) in stripes.iter().enumerate() {
                let o = FLUSH_BYTES + 8 * i;
                b[o..o + 8].copy_from_slice(&s.to_le_bytes());
            }
        }
    }
}

/// Checks a meta block's magic, version, checksum and size in use; returns
/// the end of its payloads (the bytes in use).
fn check_header(b: &[u8], seed: u32) -> Result<usize, LogError> {
    let magic = le32(b, 0);
    if magic != MAGIC {
        return Err(LogError::BadMagic { found: magic });
    }
    if b[8] != VERSION {
        return Err(LogError::BadVersion(b[8]));
    }
    let stored = le32(b, 4);
    let computed = block_checksum(b, seed);
    if stored != computed {
        return Err(LogError::BadChecksum { stored, computed });
    }
    let meta_size = le32(b, 12);
    if !(HEADER_BYTES as u32..=PAGE_BYTES as u32).contains(&meta_size) {
        return Err(LogError::BadMetaSize(meta_size));
    }
    Ok(meta_size as usize)
}

/// The payload at byte `at` of a block whose payloads end at `end`, and
/// where the next one starts; a payload that runs past `end`, has an
/// unknown type or a size md never writes is refused.
fn decode_payload(b: &[u8], at: usize, end: usize) -> Result<(Payload, usize), LogError> {
    let overrun = LogError::PayloadOverrun {
        at,
        meta_size: end as u32,
    };
    if at + 4 > end {
        return Err(overrun);
    }
    let kind = le16(b, at);
    let flags = le16(b, at + 2);
    match kind {
        TYPE_DATA | TYPE_PARITY => {
            if at + DATA_PARITY_BYTES > end {
                return Err(overrun);
            }
            let sectors = le32(b, at + 4);
            let what = if kind == TYPE_DATA { "data" } else { "parity" };
            let pages = u64::from(sectors) / PAGE_SECTORS;
            if u64::from(sectors) % PAGE_SECTORS != 0
                || pages == 0
                || (kind == TYPE_DATA && pages != 1)
                || pages > 2
            {
                return Err(LogError::BadPayloadSize { what, at, sectors });
            }
            let pages = pages as usize;
            let next = at + DATA_PARITY_BYTES + 4 * pages;
            if next > end {
                return Err(overrun);
            }
            let location = le64(b, at + 8);
            let mut sums: Vec<u32> = (0..pages)
                .map(|i| le32(b, at + DATA_PARITY_BYTES + 4 * i))
                .collect();
            let payload = if kind == TYPE_DATA {
                Payload::Data {
                    flags,
                    location,
                    checksum: sums.swap_remove(0),
                }
            } else {
                Payload::Parity {
                    flags,
                    location,
                    checksums: sums,
                }
            };
            Ok((payload, next))
        }
        TYPE_FLUSH => {
            if at + FLUSH_BYTES > end {
                return Err(overrun);
            }
            let bytes = le32(b, at + 4) as usize;
            if !bytes.is_multiple_of(8) || at + FLUSH_BYTES + bytes > end {
                return Err(overrun);
            }
            let stripes = (0..bytes / 8)
                .map(|i| le64(b, at + FLUSH_BYTES + 8 * i))
                .collect();
            Ok((Payload::Flush { flags, stripes }, at + FLUSH_BYTES + bytes))
        }
        kind => Err(LogError::UnknownPayload { at, kind }),
    }
}

/// The ring a journal member's data area forms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ring {
    /// Sectors of the ring: the member's `data_size` rounded down to pages.
    pub sectors: u64,
}

impl Ring {
    pub fn new(data_size_sectors: u64) -> Self {
        Ring {
            sectors: data_size_sectors / PAGE_SECTORS * PAGE_SECTORS,
        }
    }

    /// `start + inc`, wrapping at the end of the ring.
    pub fn add(&self, start: u64, inc: u64) -> u64 {
        let p = start + inc;
        if p >= self.sectors {
            p - self.sectors
        } else {
            p
        }
    }

    /// The positions of a unit's pages that start at `block` (page 0 is the
    /// first page after the meta block).
    pub fn page_position(&self, block: u64, page: usize) -> u64 {
        self.add(block, (1 + page as u64) * PAGE_SECTORS % self.sectors)
    }

    /// Sectors from `from` forward to `to`.
    pub fn distance(&self, from: u64, to: u64) -> u64 {
        if to >= from {
            to - from
        } else {
            to + self.sectors - from
        }
    }
}

/// One unit found in a log: its block and the bytes of its pages.
#[derive(Clone, Debug)]
pub struct Unit {
    pub block: MetaBlock,
    /// One 4 KiB page per [`Payload::pages`], in payload order.
    pub pages: Vec<Vec<u8>>,
}

/// The pages of the unit whose meta block `b` is at `pos`, read with
/// `read`, and the first payload whose page does not match its checksum.
fn read_unit_pages(
    ring: Ring,
    pos: u64,
    b: &MetaBlock,
    seed: u32,
    read: &mut impl FnMut(u64, &mut [u8]) -> std::io::Result<()>,
) -> std::io::Result<(Vec<Vec<u8>>, Option<usize>)> {
    let mut pages = Vec::with_capacity(b.pages());
    let mut bad = None;
    for (n, p) in b.payloads.iter().enumerate() {
        let sums: &[u32] = match p {
            Payload::Data { checksum, .. } => std::slice::from_ref(checksum),
            Payload::Parity { checksums, .. } => checksums,
            Payload::Flush { .. } => &[],
        };
        for &sum in sums {
            let mut buf = vec![0u8; PAGE_BYTES];
            read(ring.page_position(pos, pages.len()), &mut buf)?;
            if md_crc(seed, &buf) != sum && bad.is_none() {
                bad = Some(n);
            }
            pages.push(buf);
        }
    }
    Ok((pages, bad))
}

/// Why a scan stopped (the first block that does not continue the log).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScanEnd {
    /// The block did not decode (torn, never written, foreign).
    Invalid(LogError),
    /// A valid block of another place or time (earlier lap, stale).
    Stale { seq: u64, position: u64 },
    /// A page's checksum does not match its payload (a torn unit).
    BadPage { payload: usize },
    /// The scan went once around the ring.
    Wrapped,
}

/// The result of reading a log from its tail.
#[derive(Clone, Debug)]
pub struct Scan {
    pub units: Vec<Unit>,
    /// Where the next unit would go, and its sequence number.
    pub next_position: u64,
    pub next_seq: u64,
    pub end: ScanEnd,
}

/// Read a log from `tail`: units while each decodes, sits where it says and
/// carries the next sequence number, and its pages match their checksums.
/// `read(position, buf)` fills `buf` from ring sector `position` (one page;
/// positions are already wrapped). The first block must decode and sit
/// at `tail` (it fixes the sequence); when it does not, the answer is that
/// error, and md takes the log as empty and starts a new one.
pub fn scan(
    ring: Ring,
    tail: u64,
    seed: u32,
    mut read: impl FnMut(u64, &mut [u8]) -> std::io::Result<()>,
) -> std::io::Result<Result<Scan, LogError>> {
    let mut page = vec![0u8; PAGE_BYTES];
    read(tail, &mut page)?;
    let first = match MetaBlock::decode(&page, seed) {
        Ok(b) if b.position == tail => b,
        Ok(b) => {
            return Ok(Err(LogError::Misplaced {
                position: b.position,
                read_at: tail,
            }))
        }
        Err(e) => return Ok(Err(e)),
    };
    let mut units = Vec::new();
    let mut pos = tail;
    let mut seq = first.seq;
    let mut block = Some(first);
    let mut travelled = 0u64;
    let end = loop {
        let b = match block.take() {
            Some(b) => b,
            None => {
                read(pos, &mut page)?;
                match MetaBlock::decode(&page, seed) {
                    Ok(b) if b.seq == seq && b.position == pos => b,
                    Ok(b) => {
                        break ScanEnd::Stale {
                            seq: b.seq,
                            position: b.position,
                        }
                    }
                    Err(e) => break ScanEnd::Invalid(e),
                }
            }
        };
        let sectors = b.unit_sectors();
        if travelled + sectors > ring.sectors {
            break ScanEnd::Wrapped;
        }
        let (pages, bad) = read_unit_pages(ring, pos, &b, seed, &mut read)?;
        if let Some(payload) = bad {
            break ScanEnd::BadPage { payload };
        }
        units.push(Unit { block: b, pages });
        travelled += sectors;
        pos = ring.add(pos, sectors);
        seq += 1;
    };
    Ok(Ok(Scan {
        units,
        next_position: pos,
        next_seq: seq,
        end,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_matches_the_standard_definition() {
        // The standard check value, through md's register form.
        assert_eq!(!md_crc(!0, b"123456789"), 0xe306_9283);
        let uuid = [7u8; 16];
        assert_eq!(uuid_checksum(&uuid), !crc32c::crc32c(&uuid));
        // A register update continues where the last one stopped.
        let whole = md_crc(5, b"abcdef");
        assert_eq!(md_crc(md_crc(5, b"abc"), b"def"), whole);
    }

    #[test]
    fn blocks_round_trip_and_refuse_damage() {
        let seed = uuid_checksum(&[3u8; 16]);
        let block = MetaBlock {
            seq: 77,
            position: 4096,
            payloads: vec![
                Payload::Data {
                    flags: 0,
                    location: 24,
                    checksum: 0xdead_beef,
                },
                Payload::Parity {
                    flags: 0,
                    location: 24,
                    checksums: vec![1, 2],
                },
                Payload::Flush {
                    flags: 0,
                    stripes: vec![8, 16],
                },
            ],
        };
        let mut buf = vec![0u8; PAGE_BYTES];
        block.encode(&mut buf, seed).unwrap();
        assert_eq!(MetaBlock::decode(&buf, seed).unwrap(), block);
        assert_eq!(block.pages(), 3);
        assert_eq!(block.unit_sectors(), 32);
        // Another array's seed, a flipped bit, a meta_size past the block.
        assert!(matches!(
            MetaBlock::decode(&buf, seed ^ 1),
            Err(LogError::BadChecksum { .. })
        ));
        let mut bent = buf.clone();
        bent[100] ^= 1;
        assert!(MetaBlock::decode(&bent, seed).is_err());
        let mut big = buf.clone();
        big[12..16].copy_from_slice(&5000u32.to_le_bytes());
        let sum = block_checksum(&big, seed);
        big[4..8].copy_from_slice(&sum.to_le_bytes());
        assert_eq!(
            MetaBlock::decode(&big, seed),
            Err(LogError::BadMetaSize(5000))
        );
        // A payload that claims more checksums than the block holds.
        let mut long = buf.clone();
        long[12..16].copy_from_slice(&(HEADER_BYTES as u32 + 20).to_le_bytes());
        long[HEADER_BYTES + 4..HEADER_BYTES + 8].copy_from_slice(&16u32.to_le_bytes());
        let sum = block_checksum(&long, seed);
        long[4..8].copy_from_slice(&sum.to_le_bytes());
        assert!(MetaBlock::decode(&long, seed).is_err());
    }

    /// A parity payload of no page or of three is refused on encode, naming
    /// the payload, before a byte is written (md and decode would refuse the
    /// block).
    #[test]
    fn a_parity_payload_of_no_page_or_three_is_refused_on_encode() {
        for pages in [0usize, 3] {
            let mut block = MetaBlock::empty(1, 0);
            block.payloads.push(Payload::Data {
                flags: 0,
                location: 0,
                checksum: 1,
            });
            block.payloads.push(Payload::Parity {
                flags: 0,
                location: 0,
                checksums: vec![2; pages],
            });
            let mut buf = vec![0xaau8; PAGE_BYTES];
            let e = block.encode(&mut buf, 0).unwrap_err();
            assert_eq!(
                e,
                LogError::BadPayloadSize {
                    what: "parity",
                    at: HEADER_BYTES + 20,
                    sectors: 8 * pages as u32,
                }
            );
            assert!(e.to_string().contains("parity"), "{e}");
            assert_eq!(buf, vec![0xaau8; PAGE_BYTES], "bytes written");
        }
    }

    #[test]
    fn a_full_block_is_refused_on_encode() {
        let mut block = MetaBlock::empty(1, 0);
        let page = Payload::Data {
            flags: 0,
            location: 0,
            checksum: 0,
        };
        while block.fits(&page) {
            block.payloads.push(page.clone());
        }
        assert_eq!(block.payloads.len(), (PAGE_BYTES - HEADER_BYTES) / 20);
        let mut buf = vec![0u8; PAGE_BYTES];
        block.encode(&mut buf, 0).unwrap();
        block.payloads.push(page);
        assert_eq!(block.encode(&mut buf, 0), Err(LogError::TooManyPayloads));
    }

    /// A ring in memory with units written where a log puts them.
    struct MemRing {
        ring: Ring,
        bytes: Vec<u8>,
        seed: u32,
    }

    impl MemRing {
        fn new(pages: u64) -> MemRing {
            MemRing {
                ring: Ring::new(pages * PAGE_SECTORS),
                bytes: vec![0; pages as usize * PAGE_BYTES],
                seed: uuid_checksum(&[9; 16]),
            }
        }

        fn page_mut(&mut self, pos: u64) -> &mut [u8] {
            let at = pos as usize * 512;
            &mut self.bytes[at..at + PAGE_BYTES]
        }

        /// A unit of one data page per fill byte at `pos`; its end.
        fn put(&mut self, pos: u64, seq: u64, fills: &[u8]) -> u64 {
            let mut block = MetaBlock::empty(seq, pos);
            for (i, &fill) in fills.iter().enumerate() {
                let page = vec![fill; PAGE_BYTES];
                block.payloads.push(Payload::Data {
                    flags: 0,
                    location: i as u64 * PAGE_SECTORS,
                    checksum: md_crc(self.seed, &page),
                });
                let at = self.ring.page_position(pos, i);
                self.page_mut(at).copy_from_slice(&page);
            }
            let seed = self.seed;
            block.encode(self.page_mut(pos), seed).unwrap();
            self.ring.add(pos, block.unit_sectors())
        }

        fn scan(&self, tail: u64) -> Result<Scan, LogError> {
            scan(self.ring, tail, self.seed, |pos, buf| {
                let at = pos as usize * 512;
                buf.copy_from_slice(&self.bytes[at..at + PAGE_BYTES]);
                Ok(())
            })
            .unwrap()
        }
    }

    #[test]
    fn scans_follow_the_chain_across_the_ring_end_and_stop_where_it_breaks() {
        let mut r = MemRing::new(8);
        // Units at page 5 (pages 6, 7, then 0 after the wrap), then 1.
        let next = r.put(5 * PAGE_SECTORS, 100, &[1, 2, 3]);
        assert_eq!(next, PAGE_SECTORS);
        let end = r.put(next, 101, &[4]);
        let scan = r.scan(5 * PAGE_SECTORS).unwrap();
        assert_eq!(scan.units.len(), 2);
        assert_eq!(scan.units[0].pages[2], vec![3u8; PAGE_BYTES]);
        assert_eq!((scan.next_position, scan.next_seq), (end, 102));
        assert!(matches!(scan.end, ScanEnd::Invalid(_)), "{:?}", scan.end);

        // A block of an earlier lap where the chain would go on.
        r.put(end, 90, &[]);
        assert_eq!(
            r.scan(5 * PAGE_SECTORS).unwrap().end,
            ScanEnd::Stale {
                seq: 90,
                position: end
            }
        );

        // A torn page: the unit holding it ends the scan, unreplayed.
        r.page_mut(0)[17] ^= 1;
        let scan = r.scan(5 * PAGE_SECTORS).unwrap();
        assert!(scan.units.is_empty());
        assert_eq!(scan.end, ScanEnd::BadPage { payload: 2 });
        assert_eq!(scan.next_position, 5 * PAGE_SECTORS);

        // The tail's own block decides whether there is a log at all.
        assert!(matches!(
            r.scan(2 * PAGE_SECTORS),
            Err(LogError::BadMagic { .. })
        ));
        assert!(matches!(
            r.scan(PAGE_SECTORS),
            Ok(Scan { ref units, .. }) if units.len() == 1
        ));
    }

    #[test]
    fn a_full_ring_ends_at_its_oldest_unit() {
        // Units chained all the way round: where the chain comes back to
        // the tail, the block there is the oldest unit, not the next one.
        let mut r = MemRing::new(4);
        let mut pos = 0;
        for seq in 0..2 {
            pos = r.put(pos, 7 + seq, &[seq as u8]);
        }
        assert_eq!(pos, 0);
        // The block at 0 now names seq 7, and the chain wants 9 there.
        let scan = r.scan(0).unwrap();
        assert_eq!(scan.units.len(), 2);
        assert!(matches!(scan.end, ScanEnd::Stale { seq: 7, .. }));
    }

    #[test]
    fn ring_positions_wrap() {
        let ring = Ring::new(30727);
        assert_eq!(ring.sectors, 30720);
        assert_eq!(ring.add(30712, 8), 0);
        assert_eq!(ring.page_position(30704, 0), 30712);
        assert_eq!(ring.page_position(30704, 1), 0);
        assert_eq!(ring.distance(30712, 8), 16);
    }
}
