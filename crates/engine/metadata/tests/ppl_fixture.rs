//! A partial parity log written by the Linux kernel (tests/fixtures/md-states/
//! ppl: a 3-member RAID 5 made by mdadm 4.2 with `--consistency-policy=ppl`,
//! filled with the test pattern, given four small direct writes and then
//! reset with the array running). Every member's log decodes with nvraid's
//! codec: the feature bit and the area where mdadm puts them, the signature
//! of the array UUID, valid header and entry checksums, headers that
//! re-encode to the kernel's bytes, and partial parity that is what md
//! says it is: the XOR of the data blocks the logged write left alone.

use nvraid_metadata::features;
use nvraid_metadata::ppl::{self, PplArea, PplError, PplHeader, HEADER_BYTES};
use nvraid_metadata::{Role, Superblock, RESYNC_CLEAN};
use std::path::PathBuf;
use std::process::Command;

const MEMBERS: u16 = 3;
/// Sectors per chunk (64 KiB).
const CHUNK: u64 = 128;

struct Member {
    image: Vec<u8>,
    sb: Superblock,
    role: u16,
}

fn members() -> Vec<Member> {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../tests/fixtures/md-states/ppl");
    let mut found: Vec<Member> = (0..MEMBERS)
        .map(|disk| {
            let xz = dir.join(format!("disk{disk}.img.xz"));
            let out = Command::new("xz")
                .arg("-dc")
                .arg(&xz)
                .output()
                .expect("xz must be installed (apt-get install xz-utils)");
            assert!(out.status.success(), "xz -dc {}", xz.display());
            let sb = Superblock::decode(&out.stdout[4096..8192]).expect("kernel superblock");
            let role = match sb.role() {
                Role::Active(r) => r,
                other => panic!("disk{disk}: role {other:?}"),
            };
            Member {
                image: out.stdout,
                sb,
                role,
            }
        })
        .collect();
    found.sort_by_key(|m| m.role);
    found
}

/// The member's log area, as many bytes as the kernel uses.
fn area(m: &Member) -> &[u8] {
    let a = PplArea::from_superblock(&m.sb).unwrap().unwrap();
    let start = a.start_sector(m.sb.super_offset_sectors).unwrap() as usize * 512;
    &m.image[start..start + a.usable_sectors() as usize * 512]
}

/// md's left-symmetric RAID 5 over 3 members: the member and member sector
/// (from the start of the device) of array sector `s`, and the parity
/// member of its row.
fn locate(s: u64, data_offset: u64) -> (usize, u64, usize) {
    let per_row = CHUNK * u64::from(MEMBERS - 1);
    let row = s / per_row;
    let index = (s % per_row) / CHUNK;
    let parity = (u64::from(MEMBERS) - 1 - row % u64::from(MEMBERS)) as usize;
    let member = (parity + 1 + index as usize) % usize::from(MEMBERS);
    (member, data_offset + row * CHUNK + s % CHUNK, parity)
}

fn block(image: &[u8], sector: u64) -> &[u8] {
    &image[sector as usize * 512..sector as usize * 512 + 4096]
}

/// `pattern cat -s SEED`: block N holds the little-endian u64 N ^ SEED.
fn pattern_block(n: u64, seed: u64) -> Vec<u8> {
    (n ^ seed).to_le_bytes().repeat(512)
}

#[test]
fn kernel_log_areas_are_where_mdadm_puts_them() {
    for m in members() {
        // mdadm wrote PPL; the kernel's first superblock update turned it
        // into MULTIPLE_PPLS, as the 1 MiB area holds a ring.
        assert_eq!(m.sb.feature_map, features::MULTIPLE_PPLS, "role {}", m.role);
        let a = PplArea::from_superblock(&m.sb).unwrap().unwrap();
        assert_eq!(a, PplArea::MDADM_V12);
        assert_eq!(a.start_sector(m.sb.super_offset_sectors), Some(16));
        assert!(a.is_ring());
        // Data at 2 MiB, as mdadm's rule gives for 16 MiB members.
        assert_eq!(m.sb.data_offset_sectors, 4096);
        assert_eq!(
            ppl::mdadm_data_offset_sectors(m.image.len() as u64 / 512, m.sb.chunk_sectors),
            4096
        );
        // mdadm's bad-block log sits right behind the area.
        assert_eq!((m.sb.bblog_offset, m.sb.bblog_size), (2056, 8));
        // The VM was reset with the array running.
        assert_ne!(m.sb.resync_offset, RESYNC_CLEAN);
        assert_eq!(m.sb.level, 5);
    }
}

#[test]
fn every_logged_header_decodes_and_reencodes_to_the_kernels_bytes() {
    let mut headers = 0;
    let mut with_pp = 0;
    for m in members() {
        let area = area(&m);
        let uuid = m.sb.set_uuid;
        let chain = ppl::chain(area, &uuid).unwrap();
        assert!(chain.len() > 10, "role {}: {} headers", m.role, chain.len());
        assert_eq!(
            chain[0].offset_sectors, 0,
            "the chain starts at the area's start"
        );
        let mut offset = 0;
        let mut generation = 0;
        for logged in &chain {
            let h = &logged.header;
            assert_eq!(logged.offset_sectors, offset, "headers follow each other");
            offset += h.sectors();
            assert!(
                h.generation > generation,
                "generations rise along the chain"
            );
            generation = h.generation;
            assert_eq!(h.signature, ppl::signature_for(&uuid));
            assert!(!h.entries.is_empty());
            // The kernel writes headers in exactly the form nvraid encodes.
            let at = logged.offset_sectors as usize * 512;
            let raw = &area[at..at + HEADER_BYTES];
            let mut again = vec![0u8; HEADER_BYTES];
            h.encode(&mut again).unwrap();
            assert_eq!(
                again, raw,
                "role {} header at sector {}",
                m.role, logged.offset_sectors
            );
            // Each log holds the entries of the stripes whose parity lives
            // on its member; every entry's partial parity checks out.
            for e in &h.entries {
                assert_eq!(e.parity_disk, u32::from(m.role));
                assert_eq!(locate(e.data_sector, 4096).2, usize::from(m.role));
                assert!(e.data_size > 0 && e.data_size % 4096 == 0);
                assert!(e.pp_size <= 128 << 10);
                if e.pp_size == 0 {
                    assert_eq!(e.checksum, 0);
                } else {
                    with_pp += 1;
                }
            }
            let pp = logged.partial_parity(area).unwrap();
            assert_eq!(pp.len(), h.entries.len());
            headers += 1;
        }
        // What follows the newest header is not a header of this array.
        let end = offset as usize * 512;
        assert!(PplHeader::decode(&area[end..], &uuid).is_err());
    }
    assert!(
        headers > 30 && with_pp > 10,
        "{headers} headers, {with_pp} with partial parity"
    );
}

/// The newest header of each member is the last direct write whose stripe
/// has its parity there; its partial parity is the block the write left
/// alone, and the parity on disk is that XOR the written block: what PPL
/// recovery would write back.
#[test]
fn newest_entries_hold_the_partial_parity_of_the_last_writes() {
    let members = members();
    // The last logged write of each member's stripes: (role, array block
    // written, its data as `pattern cat` (seed, block), the other data
    // block of that row as `pattern cat` (seed, block)). Block 123 is the
    // last of the 96 KiB write, which also rewrote its neighbour, block 107.
    let last_writes = [
        (0u16, 70u64, (0x1111u64, 0u64), (0u64, 86u64)),
        (1, 40, (0x1111, 0), (0, 56)),
        (2, 123, (0x2222, 23), (0x2222, 7)),
    ];
    for (role, written, (seed, n), (other_seed, other_n)) in last_writes {
        let m = &members[usize::from(role)];
        let area = area(m);
        let newest = ppl::newest(area, &m.sb.set_uuid).unwrap().unwrap();
        let h = &newest.header;
        assert_eq!(h.entries.len(), 1, "role {role}: {h:?}");
        let e = h.entries[0];
        assert_eq!(e.data_sector, written * 8, "array sectors of 512 bytes");
        assert_eq!((e.pp_size, e.data_size), (4096, 4096));
        let pp = newest.partial_parity(area).unwrap()[0];

        let data_offset = m.sb.data_offset_sectors;
        let (member, sector, parity) = locate(e.data_sector, data_offset);
        assert_eq!(parity, usize::from(role));
        let new_data = block(&members[member].image, sector);
        assert!(
            new_data == pattern_block(n, seed),
            "role {role}: written data"
        );
        // With 3 members one data block of the row was left alone: it is
        // the partial parity.
        let per_row = CHUNK * 2;
        let row_start = e.data_sector / per_row * per_row;
        let other = if (e.data_sector - row_start) < CHUNK {
            e.data_sector + CHUNK
        } else {
            e.data_sector - CHUNK
        };
        let (other_member, other_sector, _) = locate(other, data_offset);
        assert!(
            pp == block(&members[other_member].image, other_sector),
            "role {role}: partial parity is the untouched block"
        );
        assert!(
            pp == pattern_block(other_n, other_seed),
            "role {role}: partial parity holds array block {}",
            other / 8
        );
        // Parity = partial parity ^ the new data.
        let p = block(&members[parity].image, sector);
        let rebuilt: Vec<u8> = pp.iter().zip(new_data).map(|(a, b)| a ^ b).collect();
        assert!(p == rebuilt, "role {role}: parity");
    }
}

#[test]
fn damage_to_a_kernel_log_is_caught() {
    let m = &members()[0];
    let uuid = m.sb.set_uuid;
    let mut area = area(m).to_vec();
    let newest = ppl::newest(&area, &uuid).unwrap().unwrap();
    let at = newest.offset_sectors as usize * 512;
    // Another array's UUID: no header of that array here.
    let mut other = uuid;
    other[0] ^= 1;
    assert!(matches!(
        PplHeader::decode(&area[at..], &other),
        Err(PplError::OtherArray { .. })
    ));
    assert_eq!(ppl::newest(&area, &other), Ok(None));
    // A flipped bit in the partial parity fails its entry's checksum.
    area[at + HEADER_BYTES + 100] ^= 4;
    assert!(matches!(
        newest.partial_parity(&area),
        Err(PplError::EntryChecksum { entry: 0, .. })
    ));
    // A flipped bit in the header ends the chain before it.
    area[at + 600] ^= 4;
    assert!(matches!(
        PplHeader::decode(&area[at..], &uuid),
        Err(PplError::BadChecksum { .. })
    ));
    let walked = ppl::chain(&area, &uuid).unwrap();
    assert_eq!(
        walked.last().unwrap().offset_sectors + walked.last().unwrap().header.sectors(),
        newest.offset_sectors
    );
}

/// The kernel's checks on the area, applied to a kernel superblock with one
/// field changed at a time.
#[test]
fn area_checks_follow_the_kernel() {
    let sb = members().remove(0).sb;
    let with = |edit: &dyn Fn(&mut Superblock)| {
        let mut s = sb.clone();
        edit(&mut s);
        PplArea::from_superblock(&s)
    };
    assert_eq!(with(&|_| {}), Ok(Some(PplArea::MDADM_V12)));
    assert_eq!(
        with(&|s| s.feature_map = features::PPL),
        Ok(Some(PplArea::MDADM_V12))
    );
    assert_eq!(with(&|s| s.feature_map = 0), Ok(None));
    for map in [
        features::PPL | features::MULTIPLE_PPLS,
        features::MULTIPLE_PPLS | features::BITMAP_OFFSET,
        features::PPL | features::JOURNAL,
    ] {
        assert_eq!(with(&|s| s.feature_map = map), Err(PplError::Features(map)));
    }
    let area = |offset: i16, size: u16| {
        PplArea {
            offset_sectors: offset,
            size_sectors: size,
        }
        .to_raw()
    };
    assert_eq!(
        with(&|s| s.bitmap_offset = area(8, 8)),
        Err(PplError::AreaTooSmall(8))
    );
    assert!(matches!(
        with(&|s| s.bitmap_offset = area(0, 2048)),
        Err(PplError::OverlapsSuperblock { .. })
    ));
    assert!(matches!(
        with(&|s| s.bitmap_offset = area(-8, 16)),
        Err(PplError::OverlapsSuperblock { .. })
    ));
    assert_eq!(
        with(&|s| s.bitmap_offset = area(8, 5000)),
        Err(PplError::OverlapsData {
            start: 16,
            end: 5016
        })
    );
    assert_eq!(
        with(&|s| s.bitmap_offset = area(-16, 8)),
        Err(PplError::AreaTooSmall(8))
    );
    assert_eq!(
        with(&|s| s.bitmap_offset = area(-24, 16)),
        Err(PplError::BeforeDevice)
    );
    // Rounded to whole pages: 2051 sectors are used as 2048.
    let odd = with(&|s| s.bitmap_offset = area(8, 2051)).unwrap().unwrap();
    assert_eq!(odd.usable_sectors(), 2048);
}
