//! Write journals written by the Linux kernel (tests/fixtures/md-states/
//! journal and journal_wt: a 3-member RAID 5 with a journal member, made by
//! mdadm 4.2 with `--write-journal`, filled with the test pattern, given
//! four small direct writes and then reset with the array running). In
//! write-back mode the writes stay in the log as data-only stripes; in
//! write-through mode each is logged with its parity. Every unit from the
//! journal tail decodes with nvraid's codec, every page matches its
//! checksum, blocks re-encode to the kernel's bytes, and the logged pages
//! are the bytes the writes carried.

use nvraid_metadata::r5log::{self, MetaBlock, Payload, Ring, ScanEnd, PAGE_BYTES};
use nvraid_metadata::{features, Role, Superblock};
use std::path::PathBuf;
use std::process::Command;

fn image(state: &str, disk: usize) -> Vec<u8> {
    let xz = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../tests/fixtures/md-states")
        .join(state)
        .join(format!("disk{disk}.img.xz"));
    let out = Command::new("xz")
        .arg("-dc")
        .arg(&xz)
        .output()
        .expect("xz must be installed (apt-get install xz-utils)");
    assert!(out.status.success(), "xz -dc {}", xz.display());
    out.stdout
}

/// md's test pattern block `index` of seed `seed`.
fn pattern_block(index: u64, seed: u64) -> Vec<u8> {
    (index ^ seed).to_le_bytes().repeat(PAGE_BYTES / 8)
}

struct Log {
    sb: Superblock,
    image: Vec<u8>,
    seed: u32,
    ring: Ring,
}

impl Log {
    fn open(state: &str) -> Log {
        let journal = image(state, 3);
        let sb = Superblock::decode(&journal[4096..8192]).unwrap();
        assert_eq!(sb.role(), Role::Journal, "disk3 is the journal");
        assert_ne!(sb.feature_map & features::JOURNAL, 0);
        for disk in 0..3 {
            let member = Superblock::decode(&image(state, disk)[4096..8192]).unwrap();
            assert_ne!(member.feature_map & features::JOURNAL, 0, "disk{disk}");
            assert_eq!(member.set_uuid, sb.set_uuid);
        }
        Log {
            seed: r5log::uuid_checksum(&sb.set_uuid),
            ring: Ring::new(sb.data_size_sectors),
            sb,
            image: journal,
        }
    }

    fn page(&self, position: u64) -> &[u8] {
        let at = ((self.sb.data_offset_sectors + position) * 512) as usize;
        &self.image[at..at + PAGE_BYTES]
    }

    fn scan(&self) -> r5log::Scan {
        r5log::scan(self.ring, self.sb.recovery_offset, self.seed, |pos, buf| {
            buf.copy_from_slice(self.page(pos));
            Ok(())
        })
        .unwrap()
        .expect("the block at journal_tail decodes")
    }
}

/// The writes the state script made: (array block, seed) per 4 KiB block.
fn written() -> Vec<(u64, u64, u64)> {
    let mut w = vec![(3, 0, 0x1111), (40, 0, 0x1111), (70, 0, 0x1111)];
    for i in 0..24 {
        w.push((100 + i, i, 0x2222));
    }
    w
}

#[test]
fn kernel_write_back_journal_decodes_and_holds_the_writes() {
    let log = Log::open("journal");
    let scan = log.scan();
    assert!(
        matches!(scan.end, ScanEnd::Invalid(_) | ScanEnd::Stale { .. }),
        "{:?}",
        scan.end
    );
    assert!(scan.units.len() > 27, "{} units", scan.units.len());
    // Every block re-encodes to the kernel's bytes.
    let mut pos = log.sb.recovery_offset;
    for unit in &scan.units {
        let mut buf = vec![0u8; PAGE_BYTES];
        unit.block.encode(&mut buf, log.seed).unwrap();
        assert_eq!(&buf[..], log.page(pos), "block at {pos}");
        assert_eq!(unit.block.position, pos);
        pos = log.ring.add(pos, unit.block.unit_sectors());
    }
    // The newest units are the writes, data only, one page each, carrying
    // the written bytes.
    let data_only: Vec<&r5log::Unit> = scan
        .units
        .iter()
        .filter(|u| {
            u.block
                .payloads
                .iter()
                .all(|p| matches!(p, Payload::Data { .. }))
        })
        .collect();
    let expect = written();
    assert_eq!(data_only.len(), expect.len());
    for (unit, (block, index, seed)) in data_only.iter().zip(expect) {
        let Payload::Data { location, .. } = unit.block.payloads[0] else {
            unreachable!()
        };
        assert_eq!(location, block * 8);
        assert_eq!(unit.pages[0], pattern_block(index, seed), "block {block}");
    }
}

#[test]
fn kernel_write_through_journal_logs_data_with_parity() {
    let log = Log::open("journal_wt");
    let scan = log.scan();
    let newest = &scan.units[scan.units.len() - expect_len()..];
    for (unit, (block, index, seed)) in newest.iter().zip(written()) {
        // One data page and the stripe's parity page; P = data XOR the
        // other data block of the row, as it is on the members.
        let [Payload::Data { location, .. }, Payload::Parity { checksums, .. }] =
            &unit.block.payloads[..]
        else {
            panic!("unit at {}: {:?}", unit.block.position, unit.block.payloads)
        };
        assert_eq!(*location, block * 8);
        assert_eq!(checksums.len(), 1);
        assert_eq!(unit.pages[0], pattern_block(index, seed));
        assert_ne!(unit.pages[1], unit.pages[0]);
    }
    // A block re-encodes to the kernel's bytes.
    let mut buf = vec![0u8; PAGE_BYTES];
    let last = scan.units.last().unwrap();
    last.block.encode(&mut buf, log.seed).unwrap();
    assert_eq!(&buf[..], log.page(last.block.position));
    let again = MetaBlock::decode(&buf, log.seed).unwrap();
    assert_eq!(again, last.block);
}

fn expect_len() -> usize {
    written().len()
}
