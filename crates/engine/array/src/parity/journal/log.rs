//! The log on the journal member: payloads packed into meta blocks, a
//! block encoded and checked by decoding it back before it is written, the
//! ring read from the tail ([`r5log::scan`]), a batch's image written into
//! the ring, an empty log started (mdadm's at create, or where a replay
//! ends, with md's sequence jump), the tail, and the activation that turns
//! logging on.
//!
//! Not here: what the log's units mean at a replay (`replay.rs`), when
//! batches are written and the tail moved (`commit.rs`), what a write
//! cache holds (`cache.rs`, `held.rs`).

use super::{MdJournal, ACTIVE};
use crate::error::{Error, Result};
use nvraid_io::AlignedBuf;
use nvraid_metadata::r5log::{self, MetaBlock, Payload, HEADER_BYTES, PAGE_BYTES, PAGE_SECTORS};

/// Counts `payload` into a meta block with `size` bytes in use (what
/// `MetaBlock::fits` decides, without summing the block again): true when
/// it does not fit there and begins the next block, whose `size` it then
/// counts. The one packing rule of [`pack`] and [`packed_sectors`].
fn begins_block(size: &mut usize, payload: &Payload) -> bool {
    let bytes = payload.encoded_bytes();
    let next = *size + bytes > PAGE_BYTES;
    if next {
        *size = HEADER_BYTES;
    }
    *size += bytes;
    next
}

/// Payloads in units: as many per meta block as fit.
pub(super) fn pack(payloads: Vec<Payload>) -> Vec<MetaBlock> {
    let mut units = Vec::new();
    let mut unit = MetaBlock::empty(0, 0);
    let mut size = HEADER_BYTES;
    for payload in payloads {
        if begins_block(&mut size, &payload) {
            units.push(std::mem::replace(&mut unit, MetaBlock::empty(0, 0)));
        }
        unit.payloads.push(payload);
    }
    units.push(unit);
    units
}

/// Sectors of ring that [`pack`] would make of `payloads` (meta blocks
/// and pages), without making them.
pub(super) fn packed_sectors(payloads: &[Payload]) -> u64 {
    let (mut blocks, mut pages, mut size) = (1u64, 0u64, HEADER_BYTES);
    for payload in payloads {
        blocks += u64::from(begins_block(&mut size, payload));
        pages += payload.pages() as u64;
    }
    (blocks + pages) * PAGE_SECTORS
}

impl MdJournal {
    /// `journal_tail` now (sectors into the ring).
    pub fn tail(&self) -> u64 {
        *self.tail.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Move the tail to `position`, the block of a unit this journal placed
    /// (the caller then writes it to the superblocks).
    pub(super) fn set_tail(&self, position: u64) {
        self.assert_in_ring(position, "the tail");
        *self.tail.lock().unwrap_or_else(|p| p.into_inner()) = position;
    }

    /// A position this journal computed (head, tail, a unit's block) is a
    /// page of its ring: never past its end, never inside a page. (A tail
    /// read from a superblock is not one: a bad one starts the log over.)
    pub(super) fn assert_in_ring(&self, position: u64, what: &str) {
        assert!(
            position < self.ring.sectors && position.is_multiple_of(PAGE_SECTORS),
            "invariant: {what} (sector {position}) is a page of the ring of {} sectors",
            self.ring.sectors
        );
    }

    /// Units with payloads from the tail on (what a replay would read).
    pub fn units_logged(&self) -> Result<usize> {
        Ok(match self.scan()? {
            Ok(scan) => scan
                .units
                .iter()
                .filter(|u| !u.block.payloads.is_empty())
                .count(),
            Err(_) => 0,
        })
    }

    fn io_error(&self, e: std::io::Error) -> Error {
        Error::io(self.spec(), e)
    }

    fn ring_offset(&self, position: u64) -> u64 {
        (self.slot.superblock.data_offset_sectors + position) * 512
    }

    /// Read the log from the tail (`Err` inside: no valid block there).
    /// What the scan returns is checked as [`check_scan`] says.
    pub(super) fn scan(&self) -> Result<std::result::Result<r5log::Scan, r5log::LogError>> {
        let tail = self.tail();
        let tail = if tail >= self.ring.sectors || !tail.is_multiple_of(PAGE_SECTORS) {
            // md starts over at 0 from a tail outside the ring.
            0
        } else {
            tail
        };
        let mut page = AlignedBuf::zeroed(PAGE_BYTES);
        let scan = r5log::scan(self.ring, tail, self.seed, |pos, buf| {
            self.slot.member.read_at(&mut page, self.ring_offset(pos))?;
            buf.copy_from_slice(&page);
            Ok(())
        })
        .map_err(|e| self.io_error(e))?;
        if let Ok(scan) = &scan {
            check_scan(self.ring, tail, scan);
        }
        Ok(scan)
    }

    /// Write `image` into the ring from `start` (two writes when it passes
    /// the ring's end), then flush the journal member.
    pub(super) fn write_ring(&self, start: u64, image: &[u8]) -> std::io::Result<()> {
        self.assert_in_ring(start, "a batch's first block");
        assert!(
            image.len() as u64 <= self.ring.sectors * 512,
            "invariant: a batch of {} bytes fits the ring of {} sectors",
            image.len(),
            self.ring.sectors
        );
        let member = &self.slot.member;
        let first = ((self.ring.sectors - start) * 512).min(image.len() as u64) as usize;
        member.write_at(&image[..first], self.ring_offset(start))?;
        if first < image.len() {
            member.write_at(&image[first..], self.ring_offset(0))?;
        }
        member.flush()
    }

    /// Start an empty log at `position` with sequence `seq`: the block,
    /// flushed; the caller then writes the superblocks with the new tail.
    pub(super) fn start_log(&self, position: u64, seq: u64) -> Result<()> {
        self.assert_in_ring(position, "a new log's block");
        let mut page = AlignedBuf::zeroed(PAGE_BYTES);
        encode_block(&MetaBlock::empty(seq, position), &mut page, self.seed);
        let member = &self.slot.member;
        member
            .write_at(&page, self.ring_offset(position))
            .and_then(|()| member.flush())
            .map_err(|e| self.io_error(e))?;
        self.set_tail(position);
        self.activate(position, seq);
        Ok(())
    }

    /// Log from here on: the log is the empty block at `position` (the
    /// tail) with sequence `seq`.
    pub(crate) fn activate(&self, position: u64, seq: u64) {
        self.assert_in_ring(position, "a new log's block");
        assert_eq!(
            self.tail(),
            position,
            "invariant: a log is activated at its tail"
        );
        let mut w = self.writer();
        assert!(
            seq + 1 > w.seq,
            "invariant: sequence numbers only move forward ({} to {})",
            w.seq,
            seq + 1
        );
        w.head = self.ring.add(position, PAGE_SECTORS);
        w.seq = seq + 1;
        w.last_written = Some(position);
        w.next_group = w.next_group.max(w.durable + 1);
        w.active = true;
        self.set_flag(ACTIVE);
    }
}

/// A new journal's log: one empty meta block at its start, with a random
/// sequence number (what mdadm writes at create), which it returns.
pub(crate) fn write_empty_log(
    member: &nvraid_member::Member,
    sb: &nvraid_metadata::Superblock,
) -> Result<u64> {
    let seq = random_seq()?;
    let mut page = AlignedBuf::zeroed(PAGE_BYTES);
    let seed = r5log::uuid_checksum(&sb.set_uuid);
    encode_block(&MetaBlock::empty(seq, 0), &mut page, seed);
    member
        .write_at(&page, sb.data_offset_sectors * 512)
        .map_err(|e| Error::io(member.spec(), e))?;
    Ok(seq)
}

/// A random 32-bit start for a log's sequence numbers, as md picks.
pub(super) fn random_seq() -> Result<u64> {
    let [a, b, c, d, ..] = crate::create::random_uuid()?;
    Ok(u64::from(u32::from_le_bytes([a, b, c, d])))
}

/// Encode `block` into `out` (4 KiB) with the log's `seed`, and check it
/// by decoding it back, field by field, before it goes to the member: a
/// block this journal writes is one a replay (nvraid's or the kernel's)
/// reads as that block. Every block it writes is packed to fit.
pub(super) fn encode_block(block: &MetaBlock, out: &mut [u8], seed: u32) {
    if let Err(e) = block.encode(out, seed) {
        panic!("invariant: a meta block the journal packed encodes ({e})");
    }
    match MetaBlock::decode(out, seed) {
        Ok(back) => assert!(
            back == *block,
            "invariant: a meta block decodes as it was encoded (seq {}, position {})",
            block.seq,
            block.position
        ),
        Err(e) => panic!("invariant: a meta block the journal encoded decodes ({e})"),
    }
}

/// What [`r5log::scan`] promises of a log it read from `tail`, checked as
/// the journal takes it (the write side is [`encode_block`] and the batch's
/// placement): units one after the other in the ring from the tail, each
/// with the next sequence number and one page per checksum, and the scan's
/// end where the last one ends. A bad disk ends a scan early; it cannot
/// break these.
fn check_scan(ring: r5log::Ring, tail: u64, scan: &r5log::Scan) {
    let (mut position, mut seq) = (tail, scan.units.first().map_or(0, |u| u.block.seq));
    for unit in &scan.units {
        assert!(
            unit.block.position == position && unit.block.seq == seq,
            "invariant: a scanned unit follows the one before it (seq {} at {}, expected {seq} at \
             {position})",
            unit.block.seq,
            unit.block.position
        );
        assert_eq!(
            unit.pages.len(),
            unit.block.pages(),
            "invariant: a scanned unit has one page per checksum"
        );
        position = ring.add(position, unit.block.unit_sectors());
        seq += 1;
    }
    assert!(
        position < ring.sectors && position.is_multiple_of(PAGE_SECTORS),
        "invariant: a scan ends on a page of the ring (sector {position})"
    );
    assert!(
        scan.next_position == position && (scan.units.is_empty() || scan.next_seq == seq),
        "invariant: a scan ends where its last unit ends"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(i: u64) -> Payload {
        Payload::Data {
            flags: 0,
            location: i * 8,
            checksum: i as u32,
        }
    }

    fn parity(i: u64, pages: usize) -> Payload {
        Payload::Parity {
            flags: 0,
            location: i * 8,
            checksums: vec![7; pages],
        }
    }

    /// `pack` fills each meta block as far as `MetaBlock::fits` allows, and
    /// `packed_sectors` says what `pack` makes, for lists that fill one
    /// block, cross into more, and mix data with P and P+Q pages.
    #[test]
    fn packing_fills_blocks_and_its_size_is_known_beforehand() {
        let lists: Vec<Vec<Payload>> = vec![
            vec![],
            vec![data(1)],
            (0..203).map(data).collect(),
            (0..204).map(data).collect(),
            (0..700).map(data).collect(),
            (0..300)
                .map(|i| match i % 3 {
                    0 => data(i),
                    1 => parity(i, 1),
                    _ => parity(i, 2),
                })
                .collect(),
        ];
        for payloads in lists {
            let n = payloads.len();
            let expected = packed_sectors(&payloads);
            let units = pack(payloads.clone());
            assert_eq!(
                units.iter().map(MetaBlock::unit_sectors).sum::<u64>(),
                expected,
                "{n} payloads"
            );
            let flat: Vec<Payload> = units.iter().flat_map(|u| u.payloads.clone()).collect();
            assert_eq!(flat, payloads, "order kept");
            for pair in units.windows(2) {
                assert!(pair[0].meta_size() <= PAGE_BYTES);
                assert!(
                    !pair[0].fits(&pair[1].payloads[0]),
                    "{n} payloads: a block closed before it was full"
                );
            }
        }
    }

    /// A meta block is checked before it is written: one that does not fit
    /// its 4 KiB (which packing never makes) stops the journal rather than
    /// reaching the member.
    #[test]
    #[should_panic(expected = "invariant: a meta block the journal packed encodes")]
    fn an_overfull_meta_block_is_never_written() {
        let mut block = MetaBlock::empty(1, 0);
        block.payloads = (0..300).map(data).collect();
        encode_block(&block, &mut [0u8; PAGE_BYTES], 7);
    }

    /// An encoded block decodes as it was (the check `encode_block` makes
    /// of every block the journal writes), for data, P and P+Q payloads.
    #[test]
    fn a_packed_meta_block_decodes_as_encoded() {
        let payloads = (0..120)
            .map(|i| match i % 3 {
                0 => data(i),
                1 => parity(i, 1),
                _ => parity(i, 2),
            })
            .collect();
        for mut block in pack(payloads) {
            block.seq = 41;
            block.position = 8;
            let mut page = [0u8; PAGE_BYTES];
            encode_block(&block, &mut page, 7);
            assert_eq!(MetaBlock::decode(&page, 7), Ok(block));
        }
    }

    /// What a scan returns is checked as the journal takes it: a unit that
    /// does not carry the next sequence number (which `r5log::scan` never
    /// returns) stops the journal.
    #[test]
    #[should_panic(expected = "invariant: a scanned unit follows the one before it")]
    fn a_scan_that_skips_a_sequence_number_is_refused() {
        let ring = r5log::Ring::new(64);
        let unit = |seq, position| r5log::Unit {
            block: MetaBlock::empty(seq, position),
            pages: Vec::new(),
        };
        let scan = r5log::Scan {
            units: vec![unit(5, 0), unit(7, 8)],
            next_position: 16,
            next_seq: 8,
            end: r5log::ScanEnd::Wrapped,
        };
        check_scan(ring, 0, &scan);
    }
}
