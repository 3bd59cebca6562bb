//! Golden vectors: the md mapping pinned as tables. Append only — a changed
//! row means a changed on-disk format.
//!
//! Rows were derived by hand from md's rules (drivers/md/raid0.c: one zone,
//! chunk c on disk c % n at member chunk c / n; drivers/md/raid10.c near
//! layout: copy j of chunk c at slot c*k + j, disk slot % n, row slot / n) and
//! agree with the kernel-written fixtures in tests/fixtures/md (see the
//! array crate's fixture test).

use nvraid_layout::{Geometry, Level, Location};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

fn loc(member: u32, member_offset: u64) -> Location {
    Location {
        member,
        member_offset,
    }
}

fn check(geometry: &Geometry, rows: &[(u64, u32, Location)]) {
    for &(logical, copy, expected) in rows {
        assert_eq!(
            geometry.locate(logical, copy),
            expected,
            "logical {logical} copy {copy}"
        );
        assert_eq!(
            geometry.logical_of(expected.member, expected.member_offset),
            Some((logical, copy)),
            "inverse of {expected:?}"
        );
    }
}

#[test]
fn raid0_four_members_64k() {
    let g = Geometry::new(Level::Raid0, 4, 64 * KIB, 15 * MIB).unwrap();
    assert_eq!(g.array_bytes(), 60 * MIB);
    check(
        &g,
        &[
            (0, 0, loc(0, 0)),
            (4096, 0, loc(0, 4096)),
            (64 * KIB, 0, loc(1, 0)),
            (128 * KIB, 0, loc(2, 0)),
            (192 * KIB + 512, 0, loc(3, 512)),
            (256 * KIB, 0, loc(0, 64 * KIB)),
            (300 * KIB, 0, loc(0, 108 * KIB)),
            (60 * MIB - 1, 0, loc(3, 15 * MIB - 1)),
        ],
    );
}

#[test]
fn raid0_two_members_256k_like_the_seeds_mdadm_command() {
    let g = Geometry::new(Level::Raid0, 2, 256 * KIB, 10 * MIB).unwrap();
    check(
        &g,
        &[
            (0, 0, loc(0, 0)),
            (256 * KIB, 0, loc(1, 0)),
            (512 * KIB + 7 * 512, 0, loc(0, 256 * KIB + 3584)),
        ],
    );
}

#[test]
fn raid0_rounds_member_down_to_chunks() {
    let g = Geometry::new(Level::Raid0, 3, 64 * KIB, 64 * KIB * 10 + 4096).unwrap();
    assert_eq!(g.member_used_bytes(), 640 * KIB);
    assert_eq!(g.array_bytes(), 3 * 640 * KIB);
}

#[test]
fn raid1_two_and_three_mirrors() {
    let g = Geometry::new(Level::Raid1, 2, 0, 15 * MIB).unwrap();
    assert_eq!(g.array_bytes(), 15 * MIB);
    assert_eq!(g.chunk_bytes(), None);
    check(
        &g,
        &[
            (0, 0, loc(0, 0)),
            (0, 1, loc(1, 0)),
            (12345 * 512, 1, loc(1, 12345 * 512)),
        ],
    );
    let g = Geometry::new(Level::Raid1, 3, 0, MIB).unwrap();
    check(&g, &[(MIB - 512, 2, loc(2, MIB - 512))]);
    assert_eq!(g.pieces(0, MIB).count(), 1);
}

#[test]
fn raid10_near2_four_members() {
    // 4 members of 15 MiB, 64 KiB chunks: 240 member chunks, 480 array chunks.
    let g = Geometry::new(Level::Raid10 { near: 2 }, 4, 64 * KIB, 15 * MIB).unwrap();
    assert_eq!(g.array_bytes(), 30 * MIB);
    check(
        &g,
        &[
            (0, 0, loc(0, 0)),
            (0, 1, loc(1, 0)),
            (64 * KIB, 0, loc(2, 0)),
            (64 * KIB, 1, loc(3, 0)),
            (128 * KIB + 4096, 0, loc(0, 64 * KIB + 4096)),
            (128 * KIB + 4096, 1, loc(1, 64 * KIB + 4096)),
            (30 * MIB - 512, 1, loc(3, 15 * MIB - 512)),
        ],
    );
}

#[test]
fn raid10_near2_three_members_odd_count() {
    // 3 members of 5 chunks: floor(5 * 3 / 2) = 7 array chunks.
    let g = Geometry::new(Level::Raid10 { near: 2 }, 3, 64 * KIB, 5 * 64 * KIB).unwrap();
    assert_eq!(g.array_bytes(), 7 * 64 * KIB);
    check(
        &g,
        &[
            (0, 0, loc(0, 0)),
            (0, 1, loc(1, 0)),
            (64 * KIB, 0, loc(2, 0)),
            (64 * KIB, 1, loc(0, 64 * KIB)),
            (2 * 64 * KIB, 0, loc(1, 64 * KIB)),
            (2 * 64 * KIB, 1, loc(2, 64 * KIB)),
            (6 * 64 * KIB + 100, 0, loc(0, 4 * 64 * KIB + 100)),
            (6 * 64 * KIB + 100, 1, loc(1, 4 * 64 * KIB + 100)),
        ],
    );
    // Member 2, row 4 would be the first copy of chunk 7, which is past the end.
    assert_eq!(g.logical_of(2, 4 * 64 * KIB), None);
}

#[test]
fn raid10_near3_five_members() {
    let g = Geometry::new(Level::Raid10 { near: 3 }, 5, 4 * KIB, 12 * KIB).unwrap();
    // 3 rows * 5 members / 3 copies = 5 chunks.
    assert_eq!(g.array_bytes(), 5 * 4 * KIB);
    check(
        &g,
        &[
            (0, 2, loc(2, 0)),
            (4 * KIB, 0, loc(3, 0)),
            (4 * KIB, 2, loc(0, 4 * KIB)),
            (4 * 4 * KIB, 2, loc(4, 2 * 4 * KIB)),
        ],
    );
}

/// md's far layout (f2) over 3 members with 64 KiB chunks and 15 MiB of
/// data each (240 chunks: two bands of 120). Agrees with the kernel-made
/// arrays in tests/fixtures/md-states/raid10_f2_*.
#[test]
fn raid10_far2_three_members() {
    let far = Level::Raid10Far {
        copies: 2,
        offset: false,
    };
    let g = Geometry::new(far, 3, 64 * KIB, 15 * MIB).unwrap();
    // 120 chunks per band * 3 members.
    assert_eq!(g.array_bytes(), 360 * 64 * KIB);
    let band = 120 * 64 * KIB;
    check(
        &g,
        &[
            // Chunk 0: member 0 row 0; its far copy on member 1 in band 2.
            (0, 0, loc(0, 0)),
            (0, 1, loc(1, band)),
            // Chunk 2: member 2 row 0; far copy wraps to member 0.
            (2 * 64 * KIB + 100, 0, loc(2, 100)),
            (2 * 64 * KIB + 100, 1, loc(0, band + 100)),
            // Chunk 4: member 1 row 1; far copy on member 2, band row 1.
            (4 * 64 * KIB, 0, loc(1, 64 * KIB)),
            (4 * 64 * KIB, 1, loc(2, band + 64 * KIB)),
        ],
    );
}

/// md's offset layout (o2) over 3 members, 64 KiB chunks: each stripe of
/// chunks is followed by its copy, shifted one member, in the next row.
/// Agrees with tests/fixtures/md-states/raid10_o2_*.
#[test]
fn raid10_offset2_three_members() {
    let offset = Level::Raid10Far {
        copies: 2,
        offset: true,
    };
    let g = Geometry::new(offset, 3, 64 * KIB, 15 * MIB).unwrap();
    assert_eq!(g.array_bytes(), 360 * 64 * KIB);
    check(
        &g,
        &[
            (0, 0, loc(0, 0)),
            (0, 1, loc(1, 64 * KIB)),
            (2 * 64 * KIB, 1, loc(0, 64 * KIB)),
            // Chunk 4: stripe 1 starts at row 2; member 1, copy on member 2 row 3.
            (4 * 64 * KIB + 7, 0, loc(1, 2 * 64 * KIB + 7)),
            (4 * 64 * KIB + 7, 1, loc(2, 3 * 64 * KIB + 7)),
        ],
    );
}
